//go:build !unix

package proctest

import (
	"os"
	"time"
)

// lockFile takes an exclusive lock on the file name: it creates the file,
// waiting while another process holds it (a file older than a build can
// take was left by a process that died: taken over); unlock removes it.
func lockFile(name string) (unlock func(), err error) {
	for {
		f, err := os.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err == nil {
			f.Close()
			return func() { os.Remove(name) }, nil
		}
		if !os.IsExist(err) {
			return nil, err
		}
		if fi, err := os.Stat(name); err == nil && time.Since(fi.ModTime()) > 5*time.Minute {
			os.Remove(name)
			continue
		}
		time.Sleep(50 * time.Millisecond) // poll interval: no file locks here
	}
}

// processAlive reports whether a process with id pid may exist: without a
// cheap check here, every claim is held until it is claimMaxAge old.
func processAlive(pid int) bool { return pid > 0 }
