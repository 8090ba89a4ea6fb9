package core

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

// A replicated log changes the engine's limits and session grace at one
// point: the commands before it run with the old ones, every command after
// it (in the same batch or a later one) with the new ones.
func TestSetLimitsAppliesFromTheNextCommand(t *testing.T) {
	c, _, _ := newCore(t, Config{Manual: true, Engine: EngineConfig{MaxTTL: time.Hour, SessionGrace: 5 * time.Second, MaxResources: 4}})
	T := t0.UnixNano()
	lockTTL := func(tx *Tx, sess, res string, ttl time.Duration) error {
		return tx.Apply(&Command{Op: OpLock, Request: Request{Session: sess, Resources: []string{res}, TTL: ttl}}).Err
	}
	c.BatchAt(T, func(tx *Tx) {
		tx.Apply(&Command{Op: OpAttach, Session: "s1"})
		tx.Apply(&Command{Op: OpAttach, Session: "s2"})
		if err := lockTTL(tx, "s1", "a", 2*time.Hour); !errors.Is(err, ErrInvalidTTL) {
			t.Fatalf("ttl above the max: %v", err)
		}
		if err := tx.SetLimits(EngineConfig{MaxTTL: 3 * time.Hour, SessionGrace: 20 * time.Second, MaxResources: 1}); err != nil {
			t.Fatal(err)
		}
		if err := lockTTL(tx, "s1", "a", 2*time.Hour); err != nil {
			t.Fatalf("ttl below the new max, same batch: %v", err)
		}
		if tx.SessionGrace() != 20*time.Second {
			t.Fatalf("grace in force %v", tx.SessionGrace())
		}
	})
	c.BatchAt(T+1, func(tx *Tx) {
		r := tx.Apply(&Command{Op: OpLock, Request: Request{Session: "s2", Resources: []string{"b", "c"}, TTL: time.Second}})
		if !errors.Is(r.Err, ErrTooManyResources) {
			t.Fatalf("two resources above the new max of one: %v", r.Err)
		}
		tx.Apply(&Command{Op: OpDetach, Session: "s2"})
	})
	if at, ok := c.NextDeadline(); !ok || at != T+1+int64(20*time.Second) {
		t.Fatalf("the detached session's grace ends at %d %v, want the new grace's %d", at, ok, T+1+int64(20*time.Second))
	}
	// A bad configuration changes nothing.
	c.BatchAt(T+2, func(tx *Tx) {
		if err := tx.SetLimits(EngineConfig{SessionGrace: time.Microsecond}); err == nil {
			t.Fatal("a grace below 1ms was accepted")
		}
		if tx.SessionGrace() != 20*time.Second {
			t.Fatalf("grace in force after a refused change %v", tx.SessionGrace())
		}
		if err := lockTTL(tx, "s1", "d", 2*time.Hour); err != nil {
			t.Fatalf("limits after a refused change: %v", err)
		}
	})
}

// A snapshot taken after a change restores, with the limits in force given
// back (a replicated state machine keeps them in its own snapshot), to a
// core that goes on exactly as the original: same results, same snapshots.
func TestSetLimitsSnapshotRoundTrip(t *testing.T) {
	base := EngineConfig{MaxTTL: time.Hour, SessionGrace: 5 * time.Second}
	changed := EngineConfig{MaxTTL: 3 * time.Hour, SessionGrace: 20 * time.Second}
	c, _, _ := newCore(t, Config{Manual: true, Engine: base})
	T := t0.UnixNano()
	c.BatchAt(T, func(tx *Tx) {
		tx.Apply(&Command{Op: OpAttach, Session: "s1"})
		if err := tx.SetLimits(changed); err != nil {
			t.Fatal(err)
		}
	})
	snap, err := c.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	r, err := Restore(Config{Manual: true, Engine: changed}, snap)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, x := range []*Core{c, r} {
		x.BatchAt(T+10, func(tx *Tx) {
			if res := tx.Apply(&Command{Op: OpLock, Request: Request{Session: "s1", Resources: []string{"a"}, TTL: 2 * time.Hour}}); res.Err != nil {
				t.Fatalf("lock with the changed max ttl: %v", res.Err)
			}
			tx.Apply(&Command{Op: OpDetach, Session: "s1"})
		})
	}
	a, _ := c.Snapshot()
	b, _ := r.Snapshot()
	if !bytes.Equal(a, b) {
		t.Fatal("the restored core went on differently")
	}
	at, _ := r.NextDeadline()
	if at != T+10+int64(20*time.Second) {
		t.Fatalf("restored grace ends at %d, want %d", at, T+10+int64(20*time.Second))
	}
}
