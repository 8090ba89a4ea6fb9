package server

import (
	"testing"
	"time"

	"github.com/mlock-dev/mlock/internal/core"
)

// detachedSession waits (bounded: 30 s) until the session sid of the
// anonymous principal is detached, and returns the end of its grace period
// (Unix ns). Its grace must be seconds: the session is seen detached only
// until its grace ends.
func detachedSession(t *testing.T, srv *Server, sid string) int64 {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		var end int64
		srv.batch(func(tx *core.Tx) {
			if sess := srv.sessions[sid]; sess != nil && sess.c == nil {
				end, _ = tx.NextDeadline()
			}
		})
		if end != 0 {
			return end
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("session %s was not detached", sid)
	return 0
}

// grantPushedTo: other holds x, b asks for it, other unlocks it, and b is
// pushed the grant. It returns b's lock id.
func grantPushedTo(b, other *raw) string {
	b.t.Helper()
	held := other.lock("1", "x 60000 0 0")
	other.locked(held)
	wid := b.lock("2", "x 60000 0 0")
	other.send("unlock 2 " + held)
	other.expect("result 2 success done")
	b.locked(wid)
	return wid
}

// TestConnectAtTheEndOfTheGrace: a connect whose batch runs after the end
// of its session's grace period but before the deadline timer has processed
// it (a late timer: here the timer is stopped, and the batches process the
// deadlines themselves) starts a new session that behaves as any other: its
// grants are pushed, and a later connection with its socketId takes it
// over. Before, the server forgot the new session at the end of that batch
// (it took the old session's end for the new one's): its grants were never
// pushed, and a second connection attached to it without a takeover, whose
// end then started the grace of a session still in use.
func TestConnectAtTheEndOfTheGrace(t *testing.T) {
	t.Parallel()
	// Seconds: the session is seen detached, and the timer stopped, before
	// its grace ends, on a starved machine too.
	const grace = 3 * time.Second
	srv := start(t, Config{SessionGrace: grace})
	a := connected(t, srv, "s")
	old := a.lock("1", "old 60000 0 0")
	a.locked(old)
	a.nc.Close()
	end := detachedSession(t, srv, "s")
	srv.core().Close() // the timer is late: the next batch finds the grace over
	srv.batch(func(*core.Tx) {
		if srv.sessions["s"] == nil {
			t.Error("the session was dropped before the timer was stopped: the test proves nothing")
		}
	})
	for time.Now().UnixNano() <= end {
		time.Sleep(5 * time.Millisecond)
	}

	b := connected(t, srv, "s") // a new session: the old one's grace is over
	other := connected(t, srv, "other")
	wid := grantPushedTo(b, other) // the grant is pushed to the new session

	// A new connection of the same socketId takes the session over.
	c := dialRaw(t, srv)
	c.send("connect s 1.0")
	c.expect("connected 1.0 resumed *")
	b.expect("error session taken over by a new connection!")
	b.closed()
	c.locked(wid)
	c.send("unlock 3 " + old)
	c.expect("result 3 failed lock not exist!")
}

// TestResumeRetellsAnEviction: the notice of an eviction written to a
// connection that then dies (half-open: its client never reads it) is
// told again when the session resumes, never announced as a held lock.
// The evicted lock ends at the eviction plus the grace, which covers what
// the holder could believe from its answers up to the eviction; once it
// resumes, new answers would let it believe in the lock up to its lease,
// past the time the waiter gets it.
func TestResumeRetellsAnEviction(t *testing.T) {
	t.Parallel()
	srv := start(t, Config{SessionGrace: 10 * time.Second})
	a := connected(t, srv, "holder")
	id := a.lock("1", "x 60000 0 0")
	a.locked(id)
	ops := connected(t, srv, "ops")
	if got := ops.ask("1", "evict 1 x"); got != "1" {
		t.Fatalf("evict answered %q", got)
	}
	// a's client never reads its old connection: it connects again.
	nw := dialRaw(t, srv)
	nw.send("connect holder 1.0")
	nw.expect("connected 1.0 resumed 10000")
	nw.expect("expired " + id + " evicted")
	nw.send("ping 2")
	nw.expect("result 2 success pong") // and nothing else: no locked push for it
	nw.send("extend 3 " + id + " 60000")
	nw.expect("result 3 failed lock not exist!")
}
