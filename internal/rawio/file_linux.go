//go:build linux && !race

package rawio

import (
	"syscall"
	"unsafe"
)

const fileSupported = true

// rawPwrite and rawFsync are pwrite(2) and fsync(2) as raw system calls.
func rawPwrite(fd uintptr, p []byte, off int64) (int, syscall.Errno) {
	r, _, e := syscall.RawSyscall6(syscall.SYS_PWRITE64, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)), uintptr(off), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), 0
}

func rawFsync(fd uintptr) syscall.Errno {
	_, _, e := syscall.RawSyscall(syscall.SYS_FSYNC, fd, 0, 0)
	return e
}
