//go:build !linux

package main

import "syscall"

// dieWithParent does nothing here: only Linux kills a child when its parent
// dies (Pdeathsig).
func dieWithParent(*syscall.SysProcAttr) {}
