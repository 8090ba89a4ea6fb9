package proctest

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// portClaims is the directory where the test processes of a machine claim
// the ports they draw (FreeAddr here, freePort in the Node.js tests): a
// file per port, holding the claiming process's id. Two test binaries of
// one run, or a binary and a Node.js file, would otherwise draw the same
// port now and then, and one reach the other's server (or find a stopped
// server's port, which it needs silent, answered).
func portClaims() string { return filepath.Join(os.TempDir(), "mlock-test-ports") }

// claimMaxAge: a claim older than this is stale whatever its process id
// says (ids are reused; no test process runs this long).
const claimMaxAge = 6 * time.Hour

// claimPort claims port for this process, for as long as it runs; false
// if another live process holds it. A claim whose process has exited (or
// that is older than claimMaxAge) is taken over. Where the directory
// cannot be written, every port is granted (as before claims).
func claimPort(port string) bool {
	dir := portClaims()
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return true
	}
	name := filepath.Join(dir, port)
	me := strconv.Itoa(os.Getpid())
	for range 2 {
		f, err := os.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o666)
		if err == nil {
			_, err = f.WriteString(me)
			f.Close()
			return err == nil
		}
		if !os.IsExist(err) {
			return true
		}
		if !claimStale(name) {
			return false
		}
		// Taken over: two processes that find one stale claim at the same
		// moment could both take it (remove, create); they would also have
		// to draw the same port within that moment.
		os.Remove(name)
	}
	return false
}

// claimStale reports whether the claim file name was left by a process
// that is gone.
func claimStale(name string) bool {
	fi, err := os.Stat(name)
	if err != nil {
		return os.IsNotExist(err)
	}
	if time.Since(fi.ModTime()) > claimMaxAge {
		return true
	}
	b, err := os.ReadFile(name)
	if err != nil {
		return false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		// Being written (created, not yet filled) or garbage: stale only
		// if it has been so for a while.
		return time.Since(fi.ModTime()) > time.Minute
	}
	return pid != os.Getpid() && !processAlive(pid)
}
