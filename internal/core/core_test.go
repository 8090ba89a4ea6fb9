package core

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Unix(1_700_000_000, 0)

// batchLog records what OnBatch saw.
type batchLog struct {
	mu      sync.Mutex
	batches []loggedBatch
}

type loggedBatch struct {
	now    int64
	events []Event
}

func (l *batchLog) onBatch(tx *Tx, events []Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.batches = append(l.batches, loggedBatch{tx.Now(), slices.Clone(events)})
}

// take returns the batches seen since the last call.
func (l *batchLog) take() []loggedBatch {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.batches
	l.batches = nil
	return b
}

func newCore(t testing.TB, cfg Config) (*Core, *FakeClock, *batchLog) {
	t.Helper()
	clk := NewFakeClock(t0)
	log := &batchLog{}
	cfg.Clock = clk
	if cfg.OnBatch == nil {
		cfg.OnBatch = log.onBatch
	}
	seed := [32]byte{1}
	cfg.Engine.Seed = &seed
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c, clk, log
}

func attach(t testing.TB, c *Core, sessions ...string) {
	t.Helper()
	for _, s := range sessions {
		c.Apply(&Command{Op: OpAttach, Session: s})
	}
}

func lock(t testing.TB, c *Core, sess string, ttl time.Duration, res ...string) Grant {
	t.Helper()
	r := c.Apply(&Command{Op: OpLock, Request: Request{Session: sess, Resources: res, TTL: ttl}})
	if r.Err != nil {
		t.Fatalf("lock %v: %v", res, r.Err)
	}
	return r.Grant
}

func kinds(events []Event) []string {
	var out []string
	for _, e := range events {
		out = append(out, e.Kind.String()+":"+e.Session)
	}
	return out
}

func TestExpiryFiresThroughTimer(t *testing.T) {
	c, clk, log := newCore(t, Config{})
	attach(t, c, "s1", "s2")
	g1 := lock(t, c, "s1", time.Second, "a")
	g2 := lock(t, c, "s2", time.Minute, "a")
	if !g1.Granted || g2.Granted {
		t.Fatalf("grants %+v %+v", g1, g2)
	}
	log.take()
	clk.Advance(999 * time.Millisecond)
	if b := log.take(); len(b) != 0 {
		t.Fatalf("batches before the expiry: %+v", b)
	}
	clk.Advance(time.Millisecond)
	b := log.take()
	if len(b) != 1 {
		t.Fatalf("want one timer batch, got %+v", b)
	}
	if b[0].now != t0.UnixNano()+int64(time.Second) {
		t.Fatalf("timer batch at %d, want the expiry", b[0].now)
	}
	if got := kinds(b[0].events); !slices.Equal(got, []string{"expired:s1", "granted:s2"}) {
		t.Fatalf("events %v", got)
	}
	if e := b[0].events[1]; e.ID != g2.ID || e.Token != g1.Token+1 || e.ExpiresAt != b[0].now+int64(time.Minute) {
		t.Fatalf("grant event %+v", e)
	}
	// The timer is re-armed at the new holder's expiry.
	if at, ok := c.Armed(); !ok || at != b[0].now+int64(time.Minute) {
		t.Fatalf("armed at %d %v", at, ok)
	}
}

func TestEventsArriveAfterTheBatchInOrder(t *testing.T) {
	c, _, log := newCore(t, Config{})
	attach(t, c, "s1", "s2", "s3")
	h := lock(t, c, "s1", time.Minute, "a", "b")
	lock(t, c, "s2", time.Minute, "a")
	lock(t, c, "s3", time.Minute, "b")
	log.take()
	var seen []loggedBatch
	c.Batch(func(tx *Tx) {
		if r := tx.Apply(&Command{Op: OpUnlock, ID: h.ID, Session: "s1"}); r.Err != nil {
			t.Fatal(r.Err)
		}
		seen = log.take() // nothing yet: events wait for the end of the batch
		r := tx.Apply(&Command{Op: OpLock, Request: Request{Session: "s1", Resources: []string{"c"}, TTL: time.Minute}})
		if r.Err != nil || !r.Grant.Granted {
			t.Fatalf("lock c: %+v", r)
		}
	})
	if len(seen) != 0 {
		t.Fatalf("OnBatch ran inside the batch: %+v", seen)
	}
	b := log.take()
	if len(b) != 1 {
		t.Fatalf("batches %+v", b)
	}
	// Both waiters granted, in queue order; the immediate grant is not an
	// event.
	if got := kinds(b[0].events); !slices.Equal(got, []string{"granted:s2", "granted:s3"}) {
		t.Fatalf("events %v", got)
	}
	// OnBatch runs for a batch without events too.
	c.Batch(func(*Tx) {})
	if b := log.take(); len(b) != 1 || len(b[0].events) != 0 {
		t.Fatalf("empty batch: %+v", b)
	}
}

func TestBatchAtClampsTime(t *testing.T) {
	c, clk, _ := newCore(t, Config{})
	base := t0.UnixNano()
	var got []int64
	rec := func(tx *Tx) { got = append(got, tx.Now()) }
	c.BatchAt(base+100, rec)
	c.BatchAt(base+50, rec) // earlier: raised
	c.Batch(rec)            // the clock is behind: raised too
	clk.Advance(time.Second)
	c.Batch(rec)
	c.BatchAt(base, rec)
	want := []int64{base + 100, base + 100, base + 100, base + int64(time.Second), base + int64(time.Second)}
	if !slices.Equal(got, want) {
		t.Fatalf("batch times %v, want %v", got, want)
	}
	// Deterministic commands: a lock applied at T expires at T + ttl.
	var g Grant
	c.BatchAt(base+int64(time.Hour), func(tx *Tx) {
		tx.Apply(&Command{Op: OpAttach, Session: "s"})
		g = tx.Apply(&Command{Op: OpLock, Request: Request{Session: "s", Resources: []string{"x"}, TTL: time.Second}}).Grant
	})
	if g.ExpiresAt != base+int64(time.Hour+time.Second) {
		t.Fatalf("expires at %d", g.ExpiresAt)
	}
}

func TestTimerArmedOnlyEarlier(t *testing.T) {
	c, clk, _ := newCore(t, Config{})
	base := t0.UnixNano()
	if _, ok := c.Armed(); ok || clk.Armed() != 0 {
		t.Fatal("a core without deadlines must not arm its timer")
	}
	attach(t, c, "s")
	lock(t, c, "s", time.Hour, "a")
	lock(t, c, "s", time.Minute, "b")
	lock(t, c, "s", 2*time.Hour, "c")
	if at, ok := c.Armed(); !ok || at != base+int64(time.Minute) || clk.Armed() != 1 {
		t.Fatalf("armed at %d (%v), %d timers: want one at the earliest expiry", at-base, ok, clk.Armed())
	}
	clk.Advance(time.Minute)
	if at, _ := c.Armed(); at != base+int64(time.Hour) || clk.Armed() != 1 {
		t.Fatalf("re-armed at %d with %d timers", at-base, clk.Armed())
	}
}

func TestCloseStopsTimer(t *testing.T) {
	c, clk, log := newCore(t, Config{})
	attach(t, c, "s")
	lock(t, c, "s", time.Second, "a")
	log.take()
	c.Close()
	c.Close() // idempotent
	if _, ok := c.Armed(); ok || clk.Armed() != 0 {
		t.Fatal("Close left the timer armed")
	}
	clk.Advance(time.Hour)
	if b := log.take(); len(b) != 0 {
		t.Fatalf("timer fired after Close: %+v", b)
	}
	// Batches still work, process what is due, and arm nothing.
	lock(t, c, "s", time.Second, "b")
	b := log.take()
	if len(b) != 1 || !slices.Equal(kinds(b[0].events), []string{"expired:s"}) {
		t.Fatalf("batch after Close: %+v", b)
	}
	if clk.Armed() != 0 {
		t.Fatal("a batch after Close armed the timer")
	}
}

func TestSessionGraceThroughTimer(t *testing.T) {
	c, clk, log := newCore(t, Config{Engine: EngineConfig{SessionGrace: time.Second}})
	attach(t, c, "s", "t")
	lock(t, c, "s", time.Hour, "a")
	w := lock(t, c, "t", time.Hour, "a")
	c.Apply(&Command{Op: OpDetach, Session: "s"})
	log.take()
	clk.Advance(time.Second)
	b := log.take()
	if len(b) != 1 || !slices.Equal(kinds(b[0].events), []string{"dropped:s", "granted:t", "session-closed:s"}) {
		t.Fatalf("grace end: %+v", b)
	}
	if b[0].events[1].ID != w.ID {
		t.Fatal("the waiter was granted")
	}
	c.Batch(func(tx *Tx) {
		if tx.HasSession("s") || !tx.HasSession("t") {
			t.Fatal("sessions after grace")
		}
	})
}

func TestCommands(t *testing.T) {
	c, _, log := newCore(t, Config{})
	if r := c.Apply(&Command{Op: OpAttach, Session: "s"}); r.OK || r.Err != nil {
		t.Fatalf("first attach: %+v", r)
	}
	if r := c.Apply(&Command{Op: OpAttach, Session: "s"}); !r.OK {
		t.Fatalf("second attach: %+v", r)
	}
	r := c.Apply(&Command{Op: OpLock, Request: Request{Session: "s", Owner: "o", Resources: []string{"a", "b"}, TTL: time.Second}})
	if r.Err != nil || !r.Grant.Granted {
		t.Fatalf("lock: %+v", r)
	}
	id := r.Grant.ID
	if r := c.Apply(&Command{Op: OpExtend, ID: id, TTL: time.Minute, Session: "s"}); r.Err != nil || r.ExpiresAt != t0.UnixNano()+int64(time.Minute) {
		t.Fatalf("extend: %+v", r)
	}
	if r := c.Apply(&Command{Op: OpExtend, ID: ID{1}, TTL: time.Minute}); !errors.Is(r.Err, ErrNotFound) {
		t.Fatalf("extend unknown: %+v", r)
	}
	if r := c.Apply(&Command{Op: OpLock, Request: Request{Session: "s", Resources: []string{"a"}, TTL: time.Second, Try: true}}); !errors.Is(r.Err, ErrBusy) {
		t.Fatalf("try-lock on a held resource: %+v", r)
	}
	if r := c.Apply(&Command{Op: OpLock, Request: Request{Session: "s", Resources: []string{"a b"}, TTL: time.Second}}); !errors.Is(r.Err, ErrInvalidResource) {
		t.Fatalf("invalid name: %+v", r)
	}
	c.Batch(func(tx *Tx) {
		if li, ok := tx.Lookup(id); !ok || !li.Granted || tx.QueueLen("a") != 1 || tx.Stats().Held != 1 {
			t.Fatalf("read methods: %+v %v", li, ok)
		}
	})
	log.take()
	if r := c.Apply(&Command{Op: OpRelease, Owner: "o", Resources: []string{"a", "b"}}); !r.OK {
		t.Fatalf("release: %+v", r)
	}
	if b := log.take(); len(b) != 1 || !slices.Equal(kinds(b[0].events), []string{"released:s"}) {
		t.Fatalf("release events %+v", b)
	}
	lock(t, c, "s", time.Second, "x")
	r = c.Apply(&Command{Op: OpLock, Request: Request{Session: "s", Owner: "p", Resources: []string{"y"}, TTL: time.Second}})
	c.Apply(&Command{Op: OpLock, Request: Request{Session: "s", Owner: "p", Resources: []string{"z"}, TTL: time.Second}})
	if r := c.Apply(&Command{Op: OpReleaseAll, Owner: "p"}); r.N != 2 {
		t.Fatalf("releaseall: %+v", r)
	}
	if r := c.Apply(&Command{Op: OpUnlock, ID: r.Grant.ID}); !errors.Is(r.Err, ErrNotFound) {
		t.Fatalf("unlock of a released lock: %+v", r)
	}
	if r := c.Apply(&Command{}); !errors.Is(r.Err, ErrUnknownOp) {
		t.Fatalf("zero command: %+v", r)
	}
}

func TestApplyInOnBatchPanics(t *testing.T) {
	var c *Core
	var recovered any
	c, _, _ = newCore(t, Config{OnBatch: func(tx *Tx, _ []Event) {
		defer func() { recovered = recover() }()
		tx.Apply(&Command{Op: OpTick})
	}})
	c.Batch(func(*Tx) {})
	if recovered == nil {
		t.Fatal("Apply from OnBatch did not panic")
	}
}

// TestSystemClock runs an expiry on the real clock: the timer goroutine
// reaches OnBatch, and Close leaves nothing running (goleak).
func TestSystemClock(t *testing.T) {
	got := make(chan Event, 4)
	c, err := New(Config{OnBatch: func(_ *Tx, events []Event) {
		for _, e := range events {
			got <- e
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Apply(&Command{Op: OpAttach, Session: "s"})
	start := time.Now()
	r := c.Apply(&Command{Op: OpLock, Request: Request{Session: "s", Resources: []string{"a"}, TTL: 20 * time.Millisecond}})
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	if ns := r.Grant.ExpiresAt - time.Now().UnixNano(); ns > int64(time.Second) || ns < -int64(time.Second) {
		t.Fatalf("SystemClock is not Unix time: expiry %d ns away", ns)
	}
	select {
	case e := <-got:
		if e.Kind != Expired || time.Since(start) < 20*time.Millisecond {
			t.Fatalf("event %v after %v", e.Kind, time.Since(start))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no expiry")
	}
}

func TestNewRejectsBadEngineConfig(t *testing.T) {
	if _, err := New(Config{Engine: EngineConfig{MaxTTL: -1}}); err == nil {
		t.Fatal("negative MaxTTL accepted")
	}
}

func TestOpString(t *testing.T) {
	if OpLock.String() != "lock" || OpTick.String() != "tick" || OpHoldGrants.String() != "holdgrants" || Op(42).String() != "Op(42)" {
		t.Fatal(OpLock.String(), OpTick.String(), Op(42).String())
	}
}

func benchCore(b *testing.B) *Core {
	seed := [32]byte{3}
	c, err := New(Config{Engine: EngineConfig{Seed: &seed, MaxLocksPerSession: -1, MaxQueueLen: -1},
		OnBatch: func(*Tx, []Event) {}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	c.Apply(&Command{Op: OpAttach, Session: "s"})
	return c
}

// BenchmarkCoreApply: one lock+unlock cycle as two Apply calls (two batches).
// Compare BenchmarkEngineUncontended in internal/locktable.
func BenchmarkCoreApply(b *testing.B) {
	for _, k := range []int{1, 5} {
		b.Run(fmt.Sprintf("resources=%d", k), func(b *testing.B) {
			c := benchCore(b)
			res := make([]string, k)
			for i := range res {
				res[i] = fmt.Sprint("bench:", i)
			}
			lk := Command{Op: OpLock, Request: Request{Session: "s", TTL: time.Minute, Resources: res}}
			un := Command{Op: OpUnlock, Session: "s"}
			b.ReportAllocs()
			for b.Loop() {
				r := c.Apply(&lk)
				if r.Err != nil || !r.Grant.Granted {
					b.Fatal(r.Err)
				}
				un.ID = r.Grant.ID
				if r := c.Apply(&un); r.Err != nil {
					b.Fatal(r.Err)
				}
			}
		})
	}
}

// BenchmarkCoreBatch: the same cycle in one batch, as a server's read batch.
func BenchmarkCoreBatch(b *testing.B) {
	c := benchCore(b)
	lk := Command{Op: OpLock, Request: Request{Session: "s", TTL: time.Minute, Resources: []string{"bench"}}}
	un := Command{Op: OpUnlock, Session: "s"}
	b.ReportAllocs()
	for b.Loop() {
		c.Batch(func(tx *Tx) {
			r := tx.Apply(&lk)
			un.ID = r.Grant.ID
			tx.Apply(&un)
		})
	}
}

func TestRenewByOwner(t *testing.T) {
	c, clk, log := newCore(t, Config{})
	attach(t, c, "s", "t")
	r := c.Apply(&Command{Op: OpLock, Request: Request{Session: "s", Owner: "o", Resources: []string{"a", "b"}, TTL: time.Second}})
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	g := r.Grant
	clk.Advance(500 * time.Millisecond)
	rn := c.Apply(&Command{Op: OpRenew, Owner: "o", Resources: []string{"b", "a", "a"}, TTL: time.Second, Session: "s"})
	if rn.Err != nil || !rn.Grant.Renewed || rn.Grant.ID != g.ID || rn.Grant.Token != g.Token ||
		rn.Grant.ExpiresAt != t0.UnixNano()+int64(1500*time.Millisecond) {
		t.Fatalf("renew: %+v (lock %+v)", rn, g)
	}
	var last uint64
	c.Batch(func(tx *Tx) { last = tx.LastToken() })
	if last != g.Token {
		t.Fatalf("renew burned a token: last %d, lock %d", last, g.Token)
	}
	if r := c.Apply(&Command{Op: OpRenew, Owner: "o", Resources: []string{"a"}, TTL: time.Second}); !errors.Is(r.Err, ErrNotFound) {
		t.Fatalf("renew of a subset: %+v", r)
	}
	if r := c.Apply(&Command{Op: OpRenew, Owner: "p", Resources: []string{"a", "b"}, TTL: time.Second}); !errors.Is(r.Err, ErrNotFound) {
		t.Fatalf("renew by another owner: %+v", r)
	}
	// A partial release is reported, and the rest is no longer renewable
	// as the whole set.
	log.take()
	if r := c.Apply(&Command{Op: OpRelease, Owner: "o", Resources: []string{"a"}}); !r.OK {
		t.Fatalf("release a: %+v", r)
	}
	b := log.take()
	if len(b) != 1 || len(b[0].events) != 1 || b[0].events[0].Kind != Released || !b[0].events[0].Partial || b[0].events[0].ID != g.ID {
		t.Fatalf("partial release events: %+v", b)
	}
	if r := c.Apply(&Command{Op: OpRenew, Owner: "o", Resources: []string{"a", "b"}, TTL: time.Second}); !errors.Is(r.Err, ErrNotFound) {
		t.Fatalf("renew after a partial release: %+v", r)
	}
	// The resource a conflict names.
	r = c.Apply(&Command{Op: OpLock, Request: Request{Session: "t", Resources: []string{"x", "b"}, TTL: time.Second, Try: true}})
	var re *ResourceError
	if !errors.Is(r.Err, ErrBusy) || !errors.As(r.Err, &re) || re.Resource != "b" {
		t.Fatalf("try-lock on b: %+v", r)
	}
	if CheckName("a|b", 0) == nil || CheckName("ok", 2) != nil || !errors.Is(CheckName("long", 2), ErrInvalidResource) {
		t.Fatal("CheckName")
	}
}

// BenchmarkCoreAccess compares the two ways of serialising access to the
// engine that the core could use, with 16 goroutines each doing lock+unlock
// cycles on its own resource: the core's mutex (one Batch per cycle) against
// one owning goroutine fed through a channel.
func BenchmarkCoreAccess(b *testing.B) {
	const workers = 16
	newCore := func(b *testing.B) *Core {
		c := benchCore(b)
		for i := range workers {
			c.Apply(&Command{Op: OpAttach, Session: fmt.Sprint("s", i)})
		}
		return c
	}
	cycle := func(tx *Tx, lk *Command) {
		r := tx.Apply(lk)
		if r.Err != nil {
			panic(r.Err)
		}
		if r := tx.Apply(&Command{Op: OpUnlock, ID: r.Grant.ID, Session: lk.Request.Session}); r.Err != nil {
			panic(r.Err)
		}
	}
	run := func(b *testing.B, do func(i int, lk *Command)) {
		var next atomic.Int64
		var wg sync.WaitGroup
		for i := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				lk := &Command{Op: OpLock, Request: Request{Session: fmt.Sprint("s", i),
					Resources: []string{fmt.Sprint("r", i)}, TTL: time.Minute}}
				for next.Add(1) <= int64(b.N) {
					do(i, lk)
				}
			}()
		}
		wg.Wait()
	}
	b.Run("mutex", func(b *testing.B) {
		c := newCore(b)
		b.ResetTimer()
		run(b, func(_ int, lk *Command) {
			c.Batch(func(tx *Tx) { cycle(tx, lk) })
		})
	})
	b.Run("goroutine", func(b *testing.B) {
		c := newCore(b)
		type call struct {
			lk   *Command
			done chan struct{}
		}
		calls := make(chan call, workers)
		go func() {
			for cl := range calls {
				c.Batch(func(tx *Tx) { cycle(tx, cl.lk) })
				cl.done <- struct{}{}
			}
		}()
		dones := make([]chan struct{}, workers)
		for i := range dones {
			dones[i] = make(chan struct{}, 1)
		}
		b.ResetTimer()
		run(b, func(i int, lk *Command) {
			calls <- call{lk, dones[i]}
			<-dones[i]
		})
		b.StopTimer()
		close(calls)
	})
}
