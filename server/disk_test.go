package server

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/internal/datadir"
	"github.com/mlock-dev/mlock/internal/proctest"
	"github.com/mlock-dev/mlock/internal/protocol"
)

// cycle asks for a lock on r and unlocks it. It returns the grant's token,
// or the failure's text.
func (c *raw) cycle(n *int, r string) (uint64, string) {
	c.t.Helper()
	*n++
	req := strconv.Itoa(*n)
	c.send("lock " + req + " " + r + " 60000 0 0")
	f := strings.Split(c.read(), " ")
	if len(f) < 4 || f[0] != "result" || f[1] != req {
		c.t.Fatalf("lock answered %q", strings.Join(f, " "))
	}
	if f[2] != "success" {
		return 0, strings.Join(f[3:], " ")
	}
	tok, err := strconv.ParseUint(c.locked(f[3]), 10, 64)
	if err != nil {
		c.t.Fatal(err)
	}
	*n++
	c.send("unlock " + strconv.Itoa(*n) + " " + f[3])
	c.expect("result " + strconv.Itoa(*n) + " success *")
	return tok, ""
}

// TestTokenMarkWriteFails injects a failure at each step of the writes of
// the token mark (the errors of a full, failing and read-only disk): the
// server gives the tokens the mark on disk covers and no other, then
// refuses lock requests with a clear error, says so in /readyz, status,
// the metrics and the log, and grants again on its own once writes
// succeed; a restart on the same directory gives only higher tokens.
func TestTokenMarkWriteFails(t *testing.T) {
	cases := []struct {
		op  datadir.Op
		err error
	}{
		{datadir.OpCreate, syscall.EROFS},
		{datadir.OpWrite, syscall.ENOSPC},
		{datadir.OpSync, syscall.EIO},
		{datadir.OpRename, syscall.EIO},
		{datadir.OpSyncDir, syscall.EIO},
	}
	for _, tc := range cases {
		t.Run(string(tc.op), func(t *testing.T) {
			var fail atomic.Bool
			datadir.SetFaultHook(func(op datadir.Op, file string) error {
				if fail.Load() && op == tc.op && file == "token-mark" {
					return tc.err
				}
				return nil
			})
			t.Cleanup(func() { datadir.SetFaultHook(nil) })
			dir := t.TempDir()
			var logs logBuffer
			const block = 16
			cfg := Config{DataDir: dir, TokenBlock: block, Logger: logs.logger()}
			srv, stop := serve(t, cfg)
			web := startHTTP(t, srv)
			if fams := scrape(t, web); value(t, fams, "mlock_disk_healthy") != 1 || value(t, fams, "mlock_disk_errors_total") != 0 ||
				value(t, fams, "mlock_tokens_left") < block/2 {
				t.Fatal("the disk metrics of a healthy data directory are wrong")
			}
			c := connected(t, srv, "client")
			n := 0
			var last uint64
			fail.Store(true)
			last, refused := proctest.GrantUntilRefused(t, 4*block, last, func() (uint64, string) { return c.cycle(&n, "r") }, func(tok uint64) {
				if srv.dir.MarkDue(tok) {
					// The write is due: wait for it to fail, so that the
					// requests past the mark are refused, not queued for it.
					waitFor(t, "the failed write", func() bool { return srv.diskState().failing })
				}
			})
			if refused != protocol.CodeNoTokens.Text() {
				t.Fatalf("with the mark not written, the lock requests were answered %q (last token %d)", refused, last)
			}
			if m := proctest.TokenMark(t, dir); last >= m {
				t.Fatalf("token %d given at or above the mark on disk %d", last, m)
			}
			if code, body := get(t, web+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, tc.err.Error()) {
				t.Fatalf("/readyz while the mark cannot be written: %d %q", code, body)
			}
			if fams := scrape(t, web); value(t, fams, "mlock_disk_healthy") != 0 || value(t, fams, "mlock_disk_errors_total") < 1 ||
				value(t, fams, "mlock_tokens_left") != 0 {
				t.Fatal("the disk metrics do not say the mark cannot be written")
			}
			c.send("status 999")
			st := strings.TrimPrefix(c.read(), "result 999 success ")
			var doc protocol.Status
			if err := json.Unmarshal([]byte(st), &doc); err != nil {
				t.Fatalf("status: %v: %s", err, st)
			}
			if doc.Disk == nil || doc.Disk.Healthy || doc.Disk.Errors == 0 || doc.Disk.TokensLeft != 0 || doc.Disk.Error != tc.err.Error() {
				t.Fatalf("status disk while failing: %+v", doc.Disk)
			}
			waitFor(t, "log of the failed write", func() bool { return strings.Contains(logs.String(), "writing the token high-water mark failed") })
			if log := logs.String(); strings.Count(log, "writing the token high-water mark failed") != 1 {
				t.Fatalf("the log does not say once that the mark cannot be written:\n%s", log)
			}
			// The disk recovers: the server retries on its own.
			fail.Store(false)
			last = proctest.GrantAgain(t, 20*time.Second, 20*time.Millisecond, "the disk recovered", last, func() (uint64, string) { return c.cycle(&n, "r") })
			if code, body := get(t, web+"/readyz"); code != http.StatusOK {
				t.Fatalf("/readyz after the disk recovered: %d %q", code, body)
			}
			if fams := scrape(t, web); value(t, fams, "mlock_disk_healthy") != 1 {
				t.Fatal("mlock_disk_healthy is not 1 after the disk recovered")
			}
			waitFor(t, "log of the recovery", func() bool { return strings.Contains(logs.String(), "written again") })
			for range 2 * block {
				tok, why := c.cycle(&n, "r")
				if why != "" || tok <= last {
					t.Fatalf("after recovery: token %d after %d, %q", tok, last, why)
				}
				last = tok
			}
			if m := proctest.TokenMark(t, dir); last >= m {
				t.Fatalf("token %d at or above the mark on disk %d", last, m)
			}
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			srv2, stop2 := serve(t, Config{DataDir: dir, TokenBlock: block, QuietPeriod: -1})
			defer stop2()
			c2 := connected(t, srv2, "again")
			tok, why := c2.cycle(new(int), "r")
			if why != "" || tok <= last {
				t.Fatalf("after a restart: token %d (last before %d), %q", tok, last, why)
			}
		})
	}
}

// TestTokenMarkFailsAtStart: a start whose first write of the mark fails
// does not serve (it could not cover any token).
func TestTokenMarkFailsAtStart(t *testing.T) {
	datadir.SetFaultHook(func(op datadir.Op, file string) error {
		if file == "token-mark" && op == datadir.OpSync {
			return syscall.ENOSPC
		}
		return nil
	})
	t.Cleanup(func() { datadir.SetFaultHook(nil) })
	_, err := New(Config{DataDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), syscall.ENOSPC.Error()) {
		t.Fatalf("New with a disk that fails: %v", err)
	}
}

// waitFor polls cond for up to 20 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(20 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("no %s within 20 s", what)
		}
	}
}
