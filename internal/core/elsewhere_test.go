package core

import (
	"errors"
	"slices"
	"testing"
	"time"
)

// Command.Session is the caller of OpExtend, OpRenew and OpUnlock: from
// elsewhere an expiry never moves earlier and an unlock is reported to the
// holder.
func TestCommandsFromElsewhere(t *testing.T) {
	c, clk, log := newCore(t, Config{})
	attach(t, c, "s1", "s2")
	r := c.Apply(&Command{Op: OpLock, Request: Request{Session: "s1", Owner: "o", Resources: []string{"a"}, TTL: time.Minute}})
	g := r.Grant
	clk.Advance(time.Second)
	end := g.ExpiresAt
	for _, cmd := range []Command{
		{Op: OpExtend, ID: g.ID, TTL: time.Second, Session: "s2"},
		{Op: OpExtend, ID: g.ID, TTL: time.Second},
		{Op: OpRenew, Owner: "o", Resources: []string{"a"}, TTL: time.Second, Session: "s2"},
	} {
		r := c.Apply(&cmd)
		got := r.ExpiresAt
		if cmd.Op == OpRenew {
			got = r.Grant.ExpiresAt
		}
		if r.Err != nil || got != end {
			t.Fatalf("%v from %q shortened the lock: %+v, want expiry %d", cmd.Op, cmd.Session, r, end)
		}
	}
	if r := c.Apply(&Command{Op: OpExtend, ID: g.ID, TTL: time.Second, Session: "s1"}); r.Err != nil || r.ExpiresAt != clk.Now()+int64(time.Second) {
		t.Fatalf("extend from its own session: %+v", r)
	}
	w := lock(t, c, "s2", time.Minute, "a")
	log.take()
	if r := c.Apply(&Command{Op: OpUnlock, ID: g.ID, Session: "s2"}); r.Err != nil {
		t.Fatal(r.Err)
	}
	b := log.take()
	if len(b) != 1 || !slices.Equal(kinds(b[0].events), []string{"released:s1", "granted:s2"}) || b[0].events[1].ID != w.ID {
		t.Fatalf("unlock from elsewhere: %+v", b)
	}
}

// OpEvict revokes: the holder is told at once, the waiter is granted by the
// core's timer when the grace has passed (the lock's expiry is later).
func TestEvictCommand(t *testing.T) {
	c, clk, log := newCore(t, Config{Engine: EngineConfig{SessionGrace: 5 * time.Second}})
	attach(t, c, "s1", "s2")
	g := lock(t, c, "s1", time.Minute, "a", "b")
	w := lock(t, c, "s2", time.Minute, "b")
	log.take()
	r := c.Apply(&Command{Op: OpEvict, Resources: []string{"b", "free", "a"}})
	if r.Err != nil || r.N != 1 {
		t.Fatalf("evict: %+v", r)
	}
	b := log.take()
	if len(b) != 1 || !slices.Equal(kinds(b[0].events), []string{"released:s1"}) || b[0].events[0].ID != g.ID {
		t.Fatalf("evict events: %+v", b)
	}
	end := clk.Now() + int64(5*time.Second)
	if at, ok := c.Armed(); !ok || at != end {
		t.Fatalf("timer armed at %d %v, want %d", at, ok, end)
	}
	if r := c.Apply(&Command{Op: OpEvict, Resources: []string{"a"}}); r.Err != nil || r.N != 0 {
		t.Fatalf("evict again: %+v", r)
	}
	if r := c.Apply(&Command{Op: OpExtend, ID: g.ID, TTL: time.Hour, Session: "s1"}); !errors.Is(r.Err, ErrNotFound) {
		t.Fatalf("extend of a revoked lock: %+v", r)
	}
	log.take()
	clk.Advance(5 * time.Second)
	b = log.take()
	if len(b) != 1 || !slices.Equal(kinds(b[0].events), []string{"expired:s1", "granted:s2"}) || b[0].events[1].ID != w.ID {
		t.Fatalf("at the end of the grace: %+v", b)
	}
	if r := c.Apply(&Command{Op: OpEvict, Resources: []string{"a b"}}); !errors.Is(r.Err, ErrInvalidResource) || r.N != 0 {
		t.Fatalf("evict of an invalid name: %+v", r)
	}
	if OpEvict.String() != "evict" {
		t.Fatalf("OpEvict is %q", OpEvict)
	}
}

func TestServerFullAndLookups(t *testing.T) {
	c, _, _ := newCore(t, Config{Engine: EngineConfig{MaxLocks: 3, MaxSessionBytes: 4}})
	attach(t, c, "s1", "s2", "s3")
	lock(t, c, "s1", time.Minute, "q1")
	lock(t, c, "s2", time.Minute, "q2")
	lock(t, c, "s3", time.Minute, "q1")
	if r := c.Apply(&Command{Op: OpLock, Request: Request{Session: "s3", Resources: []string{"q3"}, TTL: time.Minute}}); !errors.Is(r.Err, ErrServerFull) {
		t.Fatalf("fourth lock: %+v", r)
	}
	if r := c.Apply(&Command{Op: OpLock, Request: Request{Session: "s1", Resources: []string{"abcd"}, TTL: time.Minute}}); !errors.Is(r.Err, ErrSessionLimit) {
		t.Fatalf("session bytes: %+v", r)
	}
	c.Batch(func(tx *Tx) {
		if st := tx.Stats(); st.Entries != 3 || st.NameBytes != 6 || st.ServerFull != 1 {
			t.Fatalf("stats %+v", st)
		}
		if li, ok := tx.Head("q1"); !ok || li.Session != "s1" || !li.Granted {
			t.Fatalf("head %+v %v", li, ok)
		}
		var got []QueueInfo
		next := tx.QueuesPage("q", "", 1, 10, func(qi QueueInfo) bool { got = append(got, qi); return true })
		if next != "q1" || len(got) != 1 || got[0].Resource != "q1" || got[0].Len != 2 || len(got[0].Entries) != 2 {
			t.Fatalf("page %+v next %q", got, next)
		}
	})
	if DefaultMaxLocks != 1_000_000 || DefaultMaxEntries != 4_000_000 || DefaultMaxNameBytes != 256<<20 || DefaultMaxSessionBytes != 8<<20 {
		t.Fatal("defaults")
	}
}
