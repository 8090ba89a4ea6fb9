//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package datadir

import (
	"os"
	"syscall"
)

var errWouldBlock error = syscall.EWOULDBLOCK

// lockFileExclusive takes an exclusive flock on f without waiting: it
// returns errWouldBlock if another open file description holds it.
func lockFileExclusive(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err != syscall.EINTR {
			return err
		}
	}
}

// syncDir syncs a directory, so that a rename in it is durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
