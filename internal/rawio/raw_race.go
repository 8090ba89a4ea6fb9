//go:build (linux || freebsd || netbsd || dragonfly) && race

package rawio

import "syscall"

const supported = true

// Under the race detector: the runtime's syscall path, which tells the
// detector that a write to a socket happens before the read that gets it.
func rawRead(fd uintptr, p []byte) (int, syscall.Errno) {
	n, err := syscall.Read(int(fd), p)
	return errnoOf(n, err)
}

func rawWrite(fd uintptr, p []byte) (int, syscall.Errno) {
	n, err := syscall.Write(int(fd), p)
	return errnoOf(n, err)
}

func errnoOf(n int, err error) (int, syscall.Errno) {
	if err != nil {
		if e, ok := err.(syscall.Errno); ok {
			return 0, e
		}
		return 0, syscall.EIO
	}
	return n, 0
}
