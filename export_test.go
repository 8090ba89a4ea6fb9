package mlock

import (
	"sync"
	"time"
)

// SetMaxPending sets the most bytes of commands a session queues for one
// connection, for the sessions started afterwards, and returns a function
// that restores the default.
func SetMaxPending(n int) (restore func()) {
	old := maxPending
	maxPending = n
	return func() { maxPending = old }
}

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

// FakeClock is a clock that moves only when told to, for the tests of the
// safety rule's arithmetic: the session's deadlines, staleness and
// keep-alive period read it instead of the system's clock. It is safe for
// concurrent use.
type FakeClock struct {
	mu     sync.Mutex
	origin time.Time     // the wall time of 0
	t      time.Duration // guarded by mu: now
	timers []*fakeTimer  // guarded by mu: every timer ever made
}

// NewFakeClock returns a FakeClock whose time 0 is the present.
func NewFakeClock() *FakeClock { return &FakeClock{origin: time.Now()} }

// WithClock returns o with the session's clock set to c: the Client made
// with it has a session of its own, on c's time.
func WithClock(o Options, c *FakeClock) Options {
	o.clock = c
	return o
}

// Now returns the fake time.
func (c *FakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.origin.Add(c.t)
}

func (c *FakeClock) now() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *FakeClock) wall(d time.Duration) time.Time { return c.origin.Add(d) }

func (c *FakeClock) afterFunc(d time.Duration, f func()) timer {
	return c.add(&fakeTimer{c: c, f: f}, d)
}

func (c *FakeClock) newTimer(d time.Duration) timer {
	return c.add(&fakeTimer{c: c, ch: make(chan time.Time, 1)}, d)
}

func (c *FakeClock) add(t *fakeTimer, d time.Duration) *fakeTimer {
	c.mu.Lock()
	c.timers = append(c.timers, t)
	c.mu.Unlock()
	t.Reset(d)
	return t
}

// Advance moves the clock forward by d and fires, one at a time and in the
// order of their deadlines (the clock set to each in turn), the timers that
// fall due: a function timer runs in the caller's goroutine, so its effect
// (a lock lost at its Deadline) is seen when Advance returns; a channel
// timer (the pinger's) sends.
func (c *FakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	target := c.t + max(d, 0)
	c.mu.Unlock()
	for {
		c.mu.Lock()
		var next *fakeTimer
		for _, t := range c.timers {
			if t.armed && t.at <= target && (next == nil || t.at < next.at) {
				next = t
			}
		}
		if next == nil {
			c.t = target
			c.mu.Unlock()
			return
		}
		next.armed = false
		c.t = max(c.t, next.at)
		c.mu.Unlock()
		next.fire()
	}
}

// Idle reports whether every channel timer made by the clock is either
// stopped or armed for a time still to come, and its channel empty: the
// pinger waits for the clock, it does not ping or read a firing.
func (c *FakeClock) Idle() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, t := range c.timers {
		if t.ch == nil {
			continue
		}
		if len(t.ch) > 0 {
			return false
		}
		if t.armed && t.at > c.t {
			n++
		}
	}
	return n > 0
}

type fakeTimer struct {
	c     *FakeClock
	f     func()         // a function timer
	ch    chan time.Time // or a channel timer (cap 1)
	at    time.Duration  // guarded by c.mu
	armed bool           // guarded by c.mu
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) fire() {
	if t.f != nil {
		t.f()
		return
	}
	select {
	case t.ch <- t.c.Now():
	default:
	}
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.armed
	t.armed = false
	return was
}

// Reset arms t for d from now. Like time.Timer's since Go 1.23, no value
// sent before is received after it. A function timer already due runs at
// once, in its own goroutine (the caller may hold the session's lock).
func (t *fakeTimer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	was := t.armed
	t.at, t.armed = t.c.t+d, d > 0
	if t.ch != nil {
		select {
		case <-t.ch:
		default:
		}
	}
	t.c.mu.Unlock()
	if d <= 0 {
		if t.f != nil {
			go t.f()
		} else {
			t.fire()
		}
	}
	return was
}
