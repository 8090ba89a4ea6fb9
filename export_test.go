package mlock

import (
	"sync"
	"time"

	"github.com/mlock-dev/mlock/internal/core"
)

// SetMaxPending sets the most bytes of commands a session queues for one
// connection, for the sessions started afterwards, and returns a function
// that restores the default.
func SetMaxPending(n int) (restore func()) {
	old := maxPending
	maxPending = n
	return func() { maxPending = old }
}

// SetAfterGrant sets a function c's Lock runs when the grant reaches its
// goroutine, before it checks what the grant leaves to believe. Set it
// before c's first Lock.
func (c *Client) SetAfterGrant(f func()) { c.afterGrant = f }

// SetWokenWait sets how long a session's reader waits for the callers it
// answered to send again, for the sessions started afterwards, and returns
// a function that restores the default.
func SetWokenWait(d time.Duration) (restore func()) {
	old := wokenWait
	wokenWait = d
	return func() { wokenWait = old }
}

// Backoff returns the state of the reader's back-off (see endBatch): the
// reads left to end without waiting, and the waits in a row that ran out.
func (c *Client) Backoff() (skipWaits, misses int) {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	return c.s.skipWaits, c.s.misses
}

// KnownLocks returns how many locks the client's session knows by id:
// waiting (the server queued them) or held.
func (c *Client) KnownLocks() int {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	return len(c.s.locks)
}

// FakeClock is a session clock on internal/core's FakeClock (the engine's
// fake time), for the tests of the safety rule's arithmetic: the session's
// deadlines, staleness and keep-alive period read it instead of the
// system's clock. It moves only when told to, and is safe for concurrent
// use.
type FakeClock struct {
	c      *core.FakeClock
	origin time.Time // the wall time of 0

	mu    sync.Mutex
	chans []*fakeChanTimer // guarded by mu: every channel timer made
}

// NewFakeClock returns a FakeClock whose time 0 is the present.
func NewFakeClock() *FakeClock {
	o := time.Now()
	return &FakeClock{c: core.NewFakeClock(o), origin: o}
}

// WithClock returns o with the session's clock set to c: the Client made
// with it has a session of its own, on c's time.
func WithClock(o Options, c *FakeClock) Options {
	o.clock = c
	return o
}

// Now returns the fake time.
func (c *FakeClock) Now() time.Time { return c.origin.Add(c.now()) }

// Advance moves the clock forward by d and fires the timers that fall due
// in the order of their deadlines (see core.FakeClock.Advance): a function
// timer runs in the caller's goroutine, so its effect (a lock lost at its
// Deadline) is seen when Advance returns; a channel timer (the pinger's)
// sends.
func (c *FakeClock) Advance(d time.Duration) { c.c.Advance(d) }

// Idle reports whether every channel timer the clock made is stopped or
// armed, none fired and not yet rearmed, and one at least armed: the
// pinger waits for the clock; it does not ping or read a firing.
func (c *FakeClock) Idle() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	armed := false
	for _, t := range c.chans {
		switch t.state {
		case timerFired:
			return false
		case timerArmed:
			armed = true
		}
	}
	return armed
}

func (c *FakeClock) now() time.Duration { return time.Duration(c.c.Now() - c.origin.UnixNano()) }

func (c *FakeClock) wall(d time.Duration) time.Time { return c.origin.Add(d) }

func (c *FakeClock) afterFunc(d time.Duration, f func()) timer {
	t := &fakeFuncTimer{f: f}
	t.t = c.c.AfterFunc(max(d, 0), f)
	if d <= 0 {
		t.Reset(d)
	}
	return t
}

func (c *FakeClock) newTimer(d time.Duration) timer {
	t := &fakeChanTimer{c: c, ch: make(chan time.Time, 1)}
	t.t = c.c.AfterFunc(d, t.fire)
	c.mu.Lock()
	t.state = timerArmed
	c.chans = append(c.chans, t)
	c.mu.Unlock()
	return t
}

// fakeFuncTimer is afterFunc's timer. Like time.AfterFunc's, one armed for
// a time already past runs at once, in its own goroutine (the caller may
// hold the session's lock).
type fakeFuncTimer struct {
	t core.Timer
	f func()
}

func (t *fakeFuncTimer) C() <-chan time.Time { return nil }
func (t *fakeFuncTimer) Stop() bool          { return t.t.Stop() }
func (t *fakeFuncTimer) Reset(d time.Duration) bool {
	if d <= 0 {
		was := t.t.Stop()
		go t.f()
		return was
	}
	return t.t.Reset(d)
}

// The states of a channel timer.
const (
	timerStopped = iota
	timerArmed
	timerFired // sent, not rearmed since
)

// fakeChanTimer is newTimer's timer: a channel of capacity 1 it sends the
// fake time on.
type fakeChanTimer struct {
	c     *FakeClock
	t     core.Timer
	ch    chan time.Time
	state int // guarded by c.mu
}

func (t *fakeChanTimer) C() <-chan time.Time { return t.ch }

func (t *fakeChanTimer) fire() {
	t.c.mu.Lock()
	t.state = timerFired
	t.c.mu.Unlock()
	select {
	case t.ch <- t.c.Now():
	default:
	}
}

func (t *fakeChanTimer) Stop() bool {
	t.c.mu.Lock()
	t.state = timerStopped
	t.c.mu.Unlock()
	return t.t.Stop()
}

// Reset arms t for d from now. Like time.Timer's since Go 1.23, no value
// sent before is received after it.
func (t *fakeChanTimer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	t.state = timerArmed
	select {
	case <-t.ch:
	default:
	}
	t.c.mu.Unlock()
	return t.t.Reset(d)
}
