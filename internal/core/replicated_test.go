package core

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// newManual returns a Manual core on a fake clock, and the log of its
// batches.
func newManual(t *testing.T) (*Core, *FakeClock, *batchLog) {
	t.Helper()
	return newCore(t, Config{Manual: true, Engine: EngineConfig{SessionGrace: 5 * time.Second}})
}

func TestManualCoreHasNoTimerAndNoClock(t *testing.T) {
	c, clk, log := newManual(t)
	T := t0.UnixNano() + int64(time.Hour) // the log's time, not the clock's
	var g Grant
	c.BatchAt(T, func(tx *Tx) {
		tx.Apply(&Command{Op: OpAttach, Session: "s1"})
		tx.Apply(&Command{Op: OpAttach, Session: "s2"})
		g = tx.Apply(&Command{Op: OpLock, Request: Request{Session: "s1", Resources: []string{"a"}, TTL: time.Second}}).Grant
		tx.Apply(&Command{Op: OpLock, Request: Request{Session: "s2", Resources: []string{"a"}, TTL: time.Second}})
	})
	if !g.Granted || g.ExpiresAt != T+int64(time.Second) {
		t.Fatalf("grant %+v", g)
	}
	if at, ok := c.NextDeadline(); !ok || at != g.ExpiresAt {
		t.Fatalf("NextDeadline %d %v, want the expiry %d", at, ok, g.ExpiresAt)
	}
	if _, ok := c.Armed(); ok || clk.Armed() != 0 {
		t.Fatal("a manual core armed a timer")
	}
	log.take()
	// The clock passes the expiry: nothing happens.
	clk.Advance(2 * time.Hour)
	if b := log.take(); len(b) != 0 {
		t.Fatalf("batches without a command: %+v", b)
	}
	// Batch and Apply run at the latest batch's time, not the clock's.
	c.Batch(func(tx *Tx) {
		if tx.Now() != T {
			t.Fatalf("Batch at %d, want %d", tx.Now(), T)
		}
	})
	if r := c.Apply(&Command{Op: OpExtend, ID: g.ID, TTL: time.Second, Session: "s1"}); r.Err != nil || r.ExpiresAt != T+int64(time.Second) {
		t.Fatalf("extend at the latest batch's time: %+v", r)
	}
	log.take()
	// The leader's tick at the deadline.
	at, _ := c.NextDeadline()
	c.BatchAt(at, func(tx *Tx) { tx.Apply(&Command{Op: OpTick}) })
	b := log.take()
	if len(b) != 1 || b[0].now != at || !slices.Equal(kinds(b[0].events), []string{"expired:s1", "granted:s2"}) {
		t.Fatalf("tick: %+v", b)
	}
	if c.Now() != at {
		t.Fatalf("Now %d, want %d", c.Now(), at)
	}
}

// A replicated log in miniature: every entry a time and commands.
type entry struct {
	now  int64
	cmds []Command
}

// randomLog makes n entries of random commands, times non-decreasing, with
// ticks at the deadlines a leader would see.
func randomLog(r *rand.Rand, n int) []entry {
	T := t0.UnixNano()
	sessions := []string{"s1", "s2", "s3"}
	res := []string{"a", "b", "c", "d"}
	var log []entry
	log = append(log, entry{T, []Command{{Op: OpAttach, Session: "s1"}, {Op: OpAttach, Session: "s2"}, {Op: OpAttach, Session: "s3"}}})
	for range n {
		T += int64(r.IntN(3)) * int64(100*time.Millisecond)
		var cmds []Command
		for range 1 + r.IntN(4) {
			s := sessions[r.IntN(len(sessions))]
			pick := []string{res[r.IntN(len(res))], res[r.IntN(len(res))]}[:1+r.IntN(2)]
			var cmd Command
			switch r.IntN(9) {
			case 0, 1, 2:
				cmd = Command{Op: OpLock, Request: Request{Session: s, Resources: pick, TTL: time.Duration(1+r.IntN(5)) * 100 * time.Millisecond,
					Timeout: time.Duration(r.IntN(4)) * 100 * time.Millisecond, Owner: []string{"", "o1", "o2"}[r.IntN(3)],
					Modes: [][]Mode{nil, {Shared}, {{Permits: 1, Of: 2}}}[r.IntN(3)]}}
			case 3:
				cmd = Command{Op: OpDetach, Session: s}
			case 4:
				cmd = Command{Op: OpAttach, Session: s}
			case 5:
				cmd = Command{Op: OpRelease, Owner: "o1", Resources: pick}
			case 6:
				cmd = Command{Op: OpReleaseAll, Owner: "o2"}
			case 7:
				cmd = Command{Op: OpFailover, Until: T + int64(r.IntN(5))*int64(100*time.Millisecond)}
			default:
				cmd = Command{Op: OpTick}
			}
			cmds = append(cmds, cmd)
		}
		log = append(log, entry{T, cmds})
	}
	return log
}

// replay applies entries to c and returns what it saw, as text.
func replay(c *Core, entries []entry, seen *[]string) {
	for _, e := range entries {
		c.BatchAt(e.now, func(tx *Tx) {
			for i := range e.cmds {
				r := tx.Apply(&e.cmds[i])
				*seen = append(*seen, fmt.Sprintf("%d %v %+v", tx.Now(), e.cmds[i].Op, r))
			}
		})
	}
}

// TestReplicasAgree: one log applied to three manual cores gives the same
// results, events and snapshots; a core restored from a snapshot taken in
// the middle of the log, then given the rest, ends the same too.
func TestReplicasAgree(t *testing.T) {
	for seed := range uint64(20) {
		log := randomLog(rand.New(rand.NewPCG(seed, 1)), 150)
		cut := 1 + int(seed)*7%len(log)
		var seen [3][]string
		var cores [3]*Core
		for i := range cores {
			i := i
			cores[i], _, _ = newCore(t, Config{Manual: true, Engine: EngineConfig{SessionGrace: time.Second},
				OnBatch: func(_ *Tx, events []Event) {
					for _, e := range events {
						seen[i] = append(seen[i], fmt.Sprintf("event %+v", e))
					}
				}})
		}
		replay(cores[0], log, &seen[0])
		replay(cores[1], log, &seen[1])
		replay(cores[2], log[:cut], &seen[2])
		snap, err := cores[2].Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		cores[2].Close()
		seen[2] = seen[2][:0]
		restored, err := Restore(Config{Manual: true, Engine: EngineConfig{SessionGrace: time.Second},
			OnBatch: func(_ *Tx, events []Event) {
				for _, e := range events {
					seen[2] = append(seen[2], fmt.Sprintf("event %+v", e))
				}
			}}, snap)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(restored.Close)
		if again, _ := restored.Snapshot(); !bytes.Equal(again, snap) {
			t.Fatal("snapshot of the restored core differs")
		}
		replay(restored, log[cut:], &seen[2])
		want := seen[0]
		if !slices.Equal(seen[1], want) {
			t.Fatalf("seed %d: two replicas saw different things", seed)
		}
		// The restored core saw what the others saw after the cut.
		if n := len(seen[2]); n == 0 || !slices.Equal(seen[2], want[len(want)-n:]) {
			t.Fatalf("seed %d: the restored core saw different things (%d lines)", seed, n)
		}
		s0, _ := cores[0].Snapshot()
		s1, _ := cores[1].Snapshot()
		s2, _ := restored.Snapshot()
		if !bytes.Equal(s0, s1) || !bytes.Equal(s0, s2) {
			t.Fatalf("seed %d: snapshots differ", seed)
		}
	}
}

func TestSnapshotKeepsTheLatestTime(t *testing.T) {
	c, _, _ := newManual(t)
	T := t0.UnixNano()
	c.BatchAt(T, func(tx *Tx) { tx.Apply(&Command{Op: OpAttach, Session: "s"}) })
	c.BatchAt(T+100, func(*Tx) {}) // no command: the engine does not see it
	snap, err := c.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	r, err := Restore(Config{Manual: true}, snap)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var at int64
	r.BatchAt(T+50, func(tx *Tx) { at = tx.Now() })
	if at != T+100 || r.Now() != T+100 {
		t.Fatalf("restored core ran a batch at %d, want %d", at, T+100)
	}
}

func TestRestoreArmsTheTimer(t *testing.T) {
	c, _, _ := newCore(t, Config{})
	attach(t, c, "s1", "s2")
	g := lock(t, c, "s1", time.Second, "a")
	lock(t, c, "s2", time.Minute, "a")
	snap, err := c.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	clk := NewFakeClock(t0)
	log := &batchLog{}
	r, err := Restore(Config{Clock: clk, OnBatch: log.onBatch}, snap)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if at, ok := r.Armed(); !ok || at != g.ExpiresAt {
		t.Fatalf("restored core armed at %d %v, want %d", at, ok, g.ExpiresAt)
	}
	clk.Advance(time.Second)
	if b := log.take(); len(b) != 1 || !slices.Equal(kinds(b[0].events), []string{"expired:s1", "granted:s2"}) {
		t.Fatalf("restored core's timer: %+v", b)
	}
}

func TestRestoreRejectsCorruptData(t *testing.T) {
	c, _, _ := newCore(t, Config{})
	attach(t, c, "s")
	lock(t, c, "s", time.Second, "a", "b")
	snap, err := c.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	for n := range len(snap) {
		if _, err := Restore(Config{Manual: true}, snap[:n]); !errors.Is(err, ErrCorruptSnapshot) {
			t.Fatalf("restore of %d of %d bytes: %v", n, len(snap), err)
		}
	}
	if _, err := Restore(Config{Manual: true}, []byte("mlkc\x02")); err == nil || errors.Is(err, ErrCorruptSnapshot) {
		t.Fatalf("version 2: %v", err)
	}
	if _, err := Restore(Config{Manual: true, Engine: EngineConfig{MaxTTL: -1}}, snap); err == nil {
		t.Fatal("restore with a bad engine config succeeded")
	}
}

// TestFailoverCommand: a new leader's OpFailover postpones what would end
// during the election to Until, and nothing else.
func TestFailoverCommand(t *testing.T) {
	c, _, log := newManual(t)
	T := t0.UnixNano()
	sec := int64(time.Second)
	var short, long, waiter Grant
	c.BatchAt(T, func(tx *Tx) {
		for _, s := range []string{"s1", "s2", "s3"} {
			tx.Apply(&Command{Op: OpAttach, Session: s})
		}
		short = tx.Apply(&Command{Op: OpLock, Request: Request{Session: "s1", Resources: []string{"a"}, TTL: time.Second}}).Grant
		long = tx.Apply(&Command{Op: OpLock, Request: Request{Session: "s1", Resources: []string{"b"}, TTL: time.Minute}}).Grant
		waiter = tx.Apply(&Command{Op: OpLock, Request: Request{Session: "s2", Resources: []string{"b"}, TTL: time.Second, Timeout: 2 * time.Second}}).Grant
		tx.Apply(&Command{Op: OpDetach, Session: "s3"}) // grace: 5 s
	})
	// The old leader died at T; the new one takes over at T+1.5s with a
	// window of 10 s.
	until := T + 11*sec
	var r Result
	c.BatchAt(T+sec+sec/2, func(tx *Tx) { r = tx.Apply(&Command{Op: OpFailover, Until: until}) })
	// At T+1.5s the short lock had expired already: the first command of
	// the entry processed it. Then the waiter's timeout and s3's grace end
	// moved; the long lock's expiry is later than until.
	if r.N != 2 || r.Err != nil {
		t.Fatalf("failover: %+v, want 2 deadlines moved", r)
	}
	if b := log.take(); len(b) != 2 || !slices.Equal(kinds(b[1].events), []string{"expired:s1"}) {
		t.Fatalf("failover batch: %+v", b)
	}
	c.Batch(func(tx *Tx) {
		if li, ok := tx.Lookup(long.ID); !ok || li.Deadline != T+int64(time.Minute) {
			t.Fatalf("the long lock moved: %+v", li)
		}
		if li, ok := tx.Lookup(waiter.ID); !ok || li.Deadline != until {
			t.Fatalf("the waiter's timeout: %+v, want %d", li, until)
		}
		if _, ok := tx.Lookup(short.ID); ok {
			t.Fatal("the short lock is still there")
		}
	})
	if at, _ := c.NextDeadline(); at != until {
		t.Fatalf("next deadline %d, want until %d", at, until)
	}
	log.take()
	c.BatchAt(until-1, func(tx *Tx) { tx.Apply(&Command{Op: OpTick}) })
	if b := log.take(); len(b) != 1 || len(b[0].events) != 0 {
		t.Fatalf("before until: %+v", b)
	}
	c.BatchAt(until, func(tx *Tx) { tx.Apply(&Command{Op: OpTick}) })
	if b := log.take(); len(b) != 1 || !slices.Equal(kinds(b[0].events), []string{"timeout:s2", "session-closed:s3"}) {
		t.Fatalf("at until: %+v", b)
	}
}
