package rawio

import (
	"io"
	"os"
	"syscall"
)

// File writes and syncs a regular file with raw system calls where that is
// supported (Linux, outside the race detector), for the same reason as
// Conn: a pwrite(2) or fsync(2) through the runtime's syscall path wakes
// the runtime's monitor thread when the process was idle, which then polls
// every 20 µs for as long as any goroutine runs. A process that appends
// and syncs a log once per request round pays that on every round.
//
// A raw call holds its P while the kernel works: an fsync that takes long
// delays that P's other goroutines (the other Ps run on) and a garbage
// collection's stop-the-world by as much. Use it where the caller waits for
// the call anyway (a log that must be on disk before anything else
// happens).
//
// Reads go through the os.File (they are rare: recovery).
type File struct {
	*os.File
	rc syscall.RawConn // nil: the os.File's own calls
}

// NewFile wraps f.
func NewFile(f *os.File) *File {
	rf := &File{File: f}
	if fileSupported {
		if rc, err := f.SyscallConn(); err == nil {
			rf.rc = rc
		}
	}
	return rf
}

// WriteAt writes p at off, like os.File.WriteAt.
func (f *File) WriteAt(p []byte, off int64) (int, error) {
	if f.rc == nil {
		return f.File.WriteAt(p, off)
	}
	if off < 0 {
		return 0, &os.PathError{Op: "writeat", Path: f.Name(), Err: syscall.EINVAL}
	}
	written := 0
	var errno syscall.Errno
	err := f.rc.Control(func(fd uintptr) {
		for written < len(p) {
			chunk := p[written:]
			if len(chunk) > maxIO {
				chunk = chunk[:maxIO]
			}
			n, e := rawPwrite(fd, chunk, off+int64(written))
			switch {
			case e == syscall.EINTR:
				continue
			case e != 0:
				errno = e
				return
			case n == 0:
				errno = syscall.EIO // never loop on a write of 0 bytes
				return
			}
			written += n
		}
	})
	if err != nil {
		return written, closedError("write", f.Name())
	}
	if errno != 0 {
		return written, &os.PathError{Op: "write", Path: f.Name(), Err: errno}
	}
	return written, nil
}

// Sync commits the file to stable storage, like os.File.Sync (fsync(2)).
func (f *File) Sync() error {
	if f.rc == nil {
		return f.File.Sync()
	}
	var errno syscall.Errno
	err := f.rc.Control(func(fd uintptr) {
		for {
			errno = rawFsync(fd)
			if errno != syscall.EINTR {
				return
			}
		}
	})
	if err != nil {
		return closedError("sync", f.Name())
	}
	if errno != 0 {
		return &os.PathError{Op: "sync", Path: f.Name(), Err: errno}
	}
	return nil
}

// closedError is the error of a call on a closed file (RawConn.Control fails only then), as
// os.File's own calls report it.
func closedError(op, name string) error {
	return &os.PathError{Op: op, Path: name, Err: os.ErrClosed}
}

var _ io.WriterAt = (*File)(nil)
