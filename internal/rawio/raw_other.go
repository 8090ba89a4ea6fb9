//go:build !(linux || freebsd || netbsd || dragonfly)

package rawio

import "syscall"

const supported = false

func rawRead(uintptr, []byte) (int, syscall.Errno)  { return 0, syscall.EINVAL }
func rawWrite(uintptr, []byte) (int, syscall.Errno) { return 0, syscall.EINVAL }
