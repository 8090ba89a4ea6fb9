package main

import "syscall"

// dieWithParent makes the kernel kill the command (SIGKILL) if mlock run
// dies before it, killed itself (SIGKILL, the OOM killer): its lock is no
// longer renewed, and no other run may be granted it while the command
// still runs. It covers the command's own process, not what that started.
func dieWithParent(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }
