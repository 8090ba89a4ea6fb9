//go:build (linux || freebsd || netbsd || dragonfly) && !race

package rawio

import (
	"syscall"
	"unsafe"
)

const supported = true

// rawRead and rawWrite are read(2) and write(2) as raw system calls: the
// socket is non-blocking, so they never block.
func rawRead(fd uintptr, p []byte) (int, syscall.Errno) {
	r, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	if e != 0 {
		return 0, e
	}
	return int(r), 0
}

func rawWrite(fd uintptr, p []byte) (int, syscall.Errno) {
	r, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	if e != 0 {
		return 0, e
	}
	return int(r), 0
}
