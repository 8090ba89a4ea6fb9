package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/internal/proctest"
	"github.com/mlock-dev/mlock/internal/protocol"
	"github.com/mlock-dev/mlock/internal/testenv"
)

// mountTmpfs mounts a tmpfs of size (mount's words: "256k") on a new
// directory and unmounts it when the test ends. Where mounting is not
// allowed (not root, not Linux) the test is skipped with the reason, and
// fails under CI=true.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	why := "the tests of a real disk that fills up or turns read-only"
	if runtime.GOOS != "linux" {
		testenv.Missing(t, "tmpfs mounts need Linux", why)
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size+",mode=0700", "tmpfs", dir).CombinedOutput(); err != nil {
		testenv.Missing(t, "cannot mount a tmpfs ("+strings.TrimSpace(string(out))+"; "+err.Error()+"): run as root", why)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// fill writes a file in dir until the file system has no space left, and
// returns its path.
func fill(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	for range 1 << 20 {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling %s: %v", dir, err)
			}
			return path
		}
	}
	t.Fatalf("%s never filled up", dir)
	return ""
}

// diskStatus reads status's disk part.
func (c *client) diskStatus() *protocol.StatusDisk {
	c.t.Helper()
	var doc protocol.Status
	js := c.status("d", &doc)
	if doc.Disk == nil {
		c.t.Fatalf("status without disk: %s", js)
	}
	return doc.Disk
}

// cycle locks res and unlocks it: the grant's token, or the failure's
// text.
func (c *client) cycle(n *int, res string) (uint64, string) {
	c.t.Helper()
	*n++
	req := strconv.Itoa(*n)
	c.send("lock", req, res, "60000", "0", "0")
	got := c.read()
	id, ok := strings.CutPrefix(got, "result "+req+" success ")
	if !ok {
		if why, ok := strings.CutPrefix(got, "result "+req+" failed "); ok {
			return 0, why
		}
		c.t.Fatalf("lock: %q", got)
	}
	got = c.read()
	f := strings.Fields(got)
	if len(f) < 4 || f[0] != "locked" || f[1] != id {
		c.t.Fatalf("want locked %s, got %q", id, got)
	}
	tok, err := strconv.ParseUint(f[3], 10, 64)
	if err != nil {
		c.t.Fatal(err)
	}
	*n++
	c.send("unlock", strconv.Itoa(*n), id)
	if got := c.read(); !strings.HasPrefix(got, "result "+strconv.Itoa(*n)+" success") {
		c.t.Fatalf("unlock: %q", got)
	}
	return tok, ""
}

// TestRealDiskFailures runs mlockd with its data directory on a small
// tmpfs that fills up while a client locks, and on one remounted
// read-only: mlockd gives no token the mark on disk does not cover, then
// refuses lock requests with the disk's error in status, grants again once
// the disk has room (or is writable) again, and after a crash and a restart
// on the same directory gives only higher tokens and keeps a lock that was
// held through its quiet start.
func TestRealDiskFailures(t *testing.T) {
	cases := []struct {
		name           string
		errText        string
		break_, repair func(t *testing.T, mnt string) func()
	}{
		{"full", syscall.ENOSPC.Error(), func(t *testing.T, mnt string) func() {
			path := fill(t, mnt)
			return func() {
				if err := os.Remove(path); err != nil {
					t.Fatal(err)
				}
			}
		}, nil},
		{"read-only", syscall.EROFS.Error(), func(t *testing.T, mnt string) func() {
			if out, err := exec.Command("mount", "-o", "remount,ro", mnt).CombinedOutput(); err != nil {
				t.Fatalf("remount read-only: %v: %s", err, out)
			}
			return func() {
				if out, err := exec.Command("mount", "-o", "remount,rw", mnt).CombinedOutput(); err != nil {
					t.Fatalf("remount read-write: %v: %s", err, out)
				}
			}
		}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mnt := mountTmpfs(t, "256k")
			dir := filepath.Join(mnt, "data")
			args := []string{"--data-dir", dir, "--token-block", "64", "--session-grace", "1s"}
			cmd, addr := mlockd(t, args...)
			holder := dial(t, addr, "holder")
			holder.lockHeld("h", "held") // acknowledged before the disk breaks
			c := dial(t, addr, "client")
			n := 0
			var last uint64
			repair := tc.break_(t, mnt)
			last, refused := proctest.GrantUntilRefused(t, 1000, last, func() (uint64, string) { return c.cycle(&n, "r") }, nil)
			if refused != protocol.CodeNoTokens.Text() {
				t.Fatalf("with the disk %s, lock requests were answered %q", tc.name, refused)
			}
			if m := proctest.TokenMark(t, dir); last >= m {
				t.Fatalf("token %d given at or above the mark on disk %d", last, m)
			}
			if d := c.diskStatus(); d.Healthy || d.Error != tc.errText || d.Errors == 0 || d.TokensLeft != 0 {
				t.Fatalf("status with the disk %s: %+v", tc.name, d)
			}
			repair()
			last = proctest.GrantAgain(t, 30*time.Second, 50*time.Millisecond, "the disk was repaired", last, func() (uint64, string) { return c.cycle(&n, "r") })
			if d := c.diskStatus(); !d.Healthy || d.Error != "" {
				t.Fatalf("status after the repair: %+v", d)
			}
			// Break it again, then crash: the restart on the repaired
			// directory gives higher tokens, and the lock held through it
			// is not given away during the quiet start.
			repair = tc.break_(t, mnt)
			for range 1000 {
				tok, why := c.cycle(&n, "r")
				if why != "" {
					break
				}
				last = max(last, tok)
			}
			if err := cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			cmd.Wait()
			repair()
			_, addr = mlockd(t, args...)
			c2 := dial(t, addr, "after")
			c2.send("trylock", "1", "held", "5000")
			if got := c2.read(); !strings.HasPrefix(got, "result 1 failed resource is locked!") {
				t.Fatalf("trylock of the held lock right after the restart: %q, want busy (quiet start)", got)
			}
			n2 := 1
			tok, why := c2.cycle(&n2, "r") // waits for the quiet start
			if why != "" || tok <= last {
				t.Fatalf("after the restart: token %d (last before %d), %q", tok, last, why)
			}
		})
	}
}
