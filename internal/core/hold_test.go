package core

import (
	"errors"
	"slices"
	"testing"
	"time"
)

// A lock asked for during a hold on grants is granted exactly when the hold
// ends, by the core's own timer, and reported through OnBatch.
func TestHoldGrantsEndsThroughTimer(t *testing.T) {
	c, clk, log := newCore(t, Config{})
	attach(t, c, "s1", "s2")
	until := t0.Add(10 * time.Second).UnixNano()
	if r := c.Apply(&Command{Op: OpHoldGrants, Until: until}); r.Err != nil || r.ExpiresAt != until {
		t.Fatalf("hold: %+v", r)
	}
	g1 := lock(t, c, "s1", time.Second, "a")
	g2 := lock(t, c, "s2", time.Second, "a")
	if g1.Granted || g2.Granted {
		t.Fatalf("granted during the hold: %+v %+v", g1, g2)
	}
	r := c.Apply(&Command{Op: OpLock, Request: Request{Session: "s2", Resources: []string{"b"}, TTL: time.Second, Try: true}})
	if !errors.Is(r.Err, ErrBusy) {
		t.Fatalf("try-lock during the hold: %+v", r)
	}
	if at, ok := c.Armed(); !ok || at != until {
		t.Fatalf("timer armed at %d, %v; want the end of the hold %d", at, ok, until)
	}
	c.Batch(func(tx *Tx) {
		if tx.HoldUntil() != until || tx.Stats().HoldUntil != until {
			t.Fatalf("HoldUntil = %d", tx.HoldUntil())
		}
	})
	log.take()
	clk.Advance(10*time.Second - 1)
	if b := log.take(); len(b) != 0 {
		t.Fatalf("batches before the end of the hold: %+v", b)
	}
	clk.Advance(1)
	b := log.take()
	if len(b) != 1 || b[0].now != until || !slices.Equal(kinds(b[0].events), []string{"granted:s1"}) {
		t.Fatalf("batches at the end of the hold: %+v", b)
	}
	e := b[0].events[0]
	if e.ID != g1.ID || e.Token != 1 || e.ExpiresAt != until+int64(time.Second) {
		t.Fatalf("grant event %+v", e)
	}
	c.Batch(func(tx *Tx) {
		if tx.HoldUntil() != 0 {
			t.Fatal("the hold is over")
		}
	})
	log.take()
	// The grant's expiry is the next deadline: the timer moves on to it
	// and the waiter follows.
	clk.Advance(time.Second)
	b = log.take()
	if len(b) != 1 || !slices.Equal(kinds(b[0].events), []string{"expired:s1", "granted:s2"}) {
		t.Fatalf("batches after the expiry: %+v", b)
	}
}

// Extending a hold after the timer was armed for its first end: the timer
// fires early, finds nothing due and re-arms for the new end.
func TestHoldGrantsExtended(t *testing.T) {
	c, clk, log := newCore(t, Config{})
	attach(t, c, "s")
	c.Apply(&Command{Op: OpHoldGrants, Until: t0.Add(time.Second).UnixNano()})
	g := lock(t, c, "s", time.Minute, "a")
	until := t0.Add(3 * time.Second).UnixNano()
	if r := c.Apply(&Command{Op: OpHoldGrants, Until: until}); r.ExpiresAt != until {
		t.Fatalf("extended hold: %+v", r)
	}
	if r := c.Apply(&Command{Op: OpHoldGrants, Until: t0.Add(2 * time.Second).UnixNano()}); r.ExpiresAt != until {
		t.Fatalf("a shorter hold must not shorten it: %+v", r)
	}
	log.take()
	clk.Advance(2 * time.Second)
	for _, b := range log.take() {
		if len(b.events) != 0 {
			t.Fatalf("events before the extended end: %+v", b)
		}
	}
	clk.Advance(time.Second)
	b := log.take()
	if len(b) != 1 || b[0].now != until || len(b[0].events) != 1 || b[0].events[0].ID != g.ID {
		t.Fatalf("batches at the extended end: %+v", b)
	}
}

// EngineConfig.GrantAfter starts the core with grants held.
func TestGrantAfterThroughCore(t *testing.T) {
	until := t0.Add(5 * time.Second).UnixNano()
	c, clk, log := newCore(t, Config{Engine: EngineConfig{GrantAfter: until}})
	attach(t, c, "s")
	if g := lock(t, c, "s", time.Second, "a"); g.Granted {
		t.Fatal("granted before GrantAfter")
	}
	log.take()
	clk.Advance(5 * time.Second)
	b := log.take()
	if len(b) != 1 || b[0].now != until || !slices.Equal(kinds(b[0].events), []string{"granted:s"}) {
		t.Fatalf("batches at GrantAfter: %+v", b)
	}
}

// The same commands at the same times give the same table: a hold applied
// through BatchAt, as a replicated log would, ends at the same grant.
func TestHoldGrantsDeterministicWithBatchAt(t *testing.T) {
	run := func() []Event {
		var got []Event
		c, _, _ := newCore(t, Config{OnBatch: func(_ *Tx, events []Event) { got = append(got, events...) }})
		T := t0.UnixNano()
		c.BatchAt(T, func(tx *Tx) {
			tx.Apply(&Command{Op: OpAttach, Session: "s"})
			tx.Apply(&Command{Op: OpHoldGrants, Until: T + int64(time.Second)})
			tx.Apply(&Command{Op: OpLock, Request: Request{Session: "s", Resources: []string{"a"}, TTL: time.Second}})
			tx.Apply(&Command{Op: OpLock, Request: Request{Session: "s", Resources: []string{"b"}, TTL: time.Second}})
		})
		c.BatchAt(T+int64(time.Second), func(tx *Tx) { tx.Apply(&Command{Op: OpTick}) })
		return got
	}
	a, b := run(), run()
	if len(a) != 2 || !slices.Equal(a, b) || a[0].Token != 1 || a[1].Token != 2 {
		t.Fatalf("runs differ or grant wrongly: %+v vs %+v", a, b)
	}
}
