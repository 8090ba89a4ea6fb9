//go:build unix

package mlock

import (
	"net"
	"syscall"
)

// tryWriter returns a write to nc that never blocks: it writes what the
// socket takes at once and returns its length (0 when the socket's buffer
// is full). ok is false when nc offers no such write.
func tryWriter(nc net.Conn) (w func([]byte) (int, error), ok bool) {
	sc, isSC := nc.(syscall.Conn)
	if !isSC {
		return nil, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil, false
	}
	return func(b []byte) (int, error) {
		var n int
		var werr error
		if err := rc.Write(func(fd uintptr) bool {
			n, werr = syscall.Write(int(fd), b)
			return true // never wait for the socket
		}); err != nil {
			return 0, err
		}
		if werr == syscall.EAGAIN || werr == syscall.EINTR {
			return 0, nil
		}
		if werr != nil {
			return 0, &net.OpError{Op: "write", Net: "tcp", Err: werr}
		}
		return n, nil
	}, true
}
