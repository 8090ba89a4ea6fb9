// Package rawio reads and writes a TCP connection with raw system calls.
//
// A Go program's system calls normally go through the runtime's syscall
// bookkeeping, and the first one after the whole process was idle wakes the
// runtime's monitor thread (sysmon), which sleeps while every P is idle: a
// futex wake-up per round trip for a server or client that idles between
// round trips. Reads and writes of a non-blocking socket never block, so
// they may be raw system calls (syscall.RawSyscall), which skip that
// bookkeeping; waiting for the socket still goes through the runtime's
// network poller (syscall.RawConn), deadlines included.
//
// Conn wraps a plain TCP connection (not TLS) on unix systems; elsewhere New
// reports false and callers use the connection itself.
package rawio

import (
	"io"
	"net"
	"os"
	"syscall"
)

// Conn reads and writes the socket of a net.Conn with raw system calls.
// Its methods are safe for concurrent use as the connection's are (one
// reader and one writer at a time). Close the net.Conn to end it.
type Conn struct {
	nc net.Conn
	rc syscall.RawConn
}

// New returns a Conn for nc, or false if nc has no socket of its own (TLS,
// a pipe) or the platform is not supported.
func New(nc net.Conn) (*Conn, bool) {
	if !supported {
		return nil, false
	}
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		return nil, false
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil, false
	}
	return &Conn{nc: nc, rc: rc}, true
}

// Read reads into p like net.Conn.Read: it waits for data (until the read
// deadline), returns io.EOF at the end of the stream, and errors that
// errors.Is matches like the connection's (os.ErrDeadlineExceeded,
// net.ErrClosed).
func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	var n int
	var errno syscall.Errno
	err := c.rc.Read(func(fd uintptr) bool {
		for {
			n, errno = rawRead(fd, p)
			switch errno {
			case syscall.EINTR:
				continue
			case syscall.EAGAIN:
				return false // wait until the socket is readable
			}
			return true
		}
	})
	switch {
	case err != nil:
		return 0, err
	case errno != 0:
		return 0, c.opError("read", errno)
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// Write writes all of p like net.Conn.Write, waiting for the socket to take
// it (until the write deadline).
func (c *Conn) Write(p []byte) (int, error) {
	written := 0
	var errno syscall.Errno
	err := c.rc.Write(func(fd uintptr) bool {
		for written < len(p) {
			var n int
			n, errno = rawWrite(fd, p[written:])
			switch errno {
			case 0:
				written += n
			case syscall.EINTR:
			case syscall.EAGAIN:
				errno = 0
				return false // wait until the socket is writable
			default:
				return true
			}
		}
		return true
	})
	if err != nil {
		return written, err
	}
	if errno != 0 {
		return written, c.opError("write", errno)
	}
	return written, nil
}

// TryWrite writes a prefix of p without waiting: as much as the socket
// takes now (0 when it is full).
func (c *Conn) TryWrite(p []byte) (int, error) {
	written := 0
	var errno syscall.Errno
	err := c.rc.Write(func(fd uintptr) bool {
		for written < len(p) {
			var n int
			n, errno = rawWrite(fd, p[written:])
			switch errno {
			case 0:
				written += n
			case syscall.EINTR:
			default:
				return true // EAGAIN included: never wait
			}
		}
		return true
	})
	if err != nil {
		return written, err
	}
	if errno != 0 && errno != syscall.EAGAIN {
		return written, c.opError("write", errno)
	}
	return written, nil
}

func (c *Conn) opError(op string, errno syscall.Errno) error {
	return &net.OpError{Op: op, Net: "tcp", Source: c.nc.LocalAddr(), Addr: c.nc.RemoteAddr(), Err: os.NewSyscallError(op, errno)}
}
