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
// Conn wraps a plain TCP connection (not TLS) on Linux and the BSDs whose Go
// port makes raw system calls (FreeBSD, NetBSD, DragonFly); elsewhere New
// reports false and callers use the connection itself. Under the race
// detector the calls go through the runtime's syscall path (syscall.Read and
// Write), so that the detector sees the ordering a socket gives.
package rawio

import (
	"io"
	"net"
	"os"
	"syscall"
)

// Conn reads and writes the socket of a net.Conn with raw system calls. One
// Read and one Write (or TryWrite) may run at a time, concurrently, as on
// the connection. Close the net.Conn to end it.
type Conn struct {
	nc net.Conn
	rc syscall.RawConn
	r  readOp
	w  writeOp
}

// maxIO bounds one system call (a raw call holds its P: a long copy would
// delay preemption and the garbage collector).
const maxIO = 256 << 10

// readOp and writeOp are the state of the one read and the one write under
// way, kept in the Conn so that a call allocates nothing.
type readOp struct {
	p     []byte
	n     int
	errno syscall.Errno
	fn    func(fd uintptr) bool // the RawConn callback: readOp.do
}

func (op *readOp) do(fd uintptr) bool {
	for {
		op.n, op.errno = rawRead(fd, op.p)
		switch op.errno {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false // wait until the socket is readable
		}
		return true
	}
}

type writeOp struct {
	p       []byte
	written int
	errno   syscall.Errno
	wait    bool                  // Write: wait for the socket; TryWrite: never
	fn      func(fd uintptr) bool // the RawConn callback: writeOp.do
}

func (op *writeOp) do(fd uintptr) bool {
	for op.written < len(op.p) {
		chunk := op.p[op.written:]
		if len(chunk) > maxIO {
			chunk = chunk[:maxIO]
		}
		n, errno := rawWrite(fd, chunk)
		switch {
		case errno == 0 && n > 0:
			op.written += n
		case errno == 0:
			op.errno = syscall.EIO // a write of 0 bytes without an error: never loop on it
			return true
		case errno == syscall.EINTR:
		case errno == syscall.EAGAIN:
			return !op.wait // wait until the socket is writable (Write), or return (TryWrite)
		default:
			op.errno = errno
			return true
		}
	}
	return true
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
	c := &Conn{nc: nc, rc: rc}
	c.r.fn, c.w.fn = c.r.do, c.w.do
	return c, true
}

// Read reads into p like net.Conn.Read: it waits for data (until the read
// deadline), returns io.EOF at the end of the stream, and errors that
// errors.Is matches like the connection's (os.ErrDeadlineExceeded,
// net.ErrClosed).
func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if len(p) > maxIO {
		p = p[:maxIO]
	}
	op := &c.r
	op.p, op.n, op.errno = p, 0, 0
	err := c.rc.Read(op.fn)
	n, errno := op.n, op.errno
	op.p = nil // keep no caller's buffer
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
// it (until the write deadline). It returns the bytes written, with the
// error that stopped it.
func (c *Conn) Write(p []byte) (int, error) { return c.write(p, true) }

// TryWrite writes a prefix of p without waiting: as much as the socket
// takes now (0 when it is full).
func (c *Conn) TryWrite(p []byte) (int, error) { return c.write(p, false) }

func (c *Conn) write(p []byte, wait bool) (int, error) {
	op := &c.w
	op.p, op.written, op.errno, op.wait = p, 0, 0, wait
	err := c.rc.Write(op.fn)
	written, errno := op.written, op.errno
	op.p = nil
	if err != nil {
		return written, err
	}
	if errno != 0 {
		return written, c.opError("write", errno)
	}
	return written, nil
}

func (c *Conn) opError(op string, errno syscall.Errno) error {
	return &net.OpError{Op: op, Net: "tcp", Source: c.nc.LocalAddr(), Addr: c.nc.RemoteAddr(), Err: os.NewSyscallError(op, errno)}
}
