package core

import (
	"sync"
	"time"
)

// Clock is the core's source of time. Now is in nanoseconds since the Unix
// epoch and never runs backwards. AfterFunc runs f in its own goroutine (or,
// for a fake clock, in the goroutine that advances it) once d has passed.
type Clock interface {
	Now() int64
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a timer made by Clock.AfterFunc. *time.Timer implements it.
type Timer interface {
	// Stop prevents the timer from firing; it reports whether it was armed.
	Stop() bool
	// Reset arms the timer to fire after d; it reports whether it was armed.
	Reset(d time.Duration) bool
}

// SystemClock returns the real clock: the wall time at the call plus the
// monotonic time elapsed since, in Unix nanoseconds. A step of the wall clock
// does not move it.
func SystemClock() Clock {
	start := time.Now()
	return &systemClock{start: start, startNs: start.UnixNano()}
}

type systemClock struct {
	start   time.Time
	startNs int64
}

func (c *systemClock) Now() int64 { return c.startNs + int64(time.Since(c.start)) }

func (c *systemClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// FakeClock is a Clock that moves only when told to, for tests. It is safe
// for concurrent use. Its timers fire synchronously inside Advance, in the
// order of their deadlines, with the clock set to each deadline in turn and
// without FakeClock's own lock held, so a timer function may call the
// clock.
type FakeClock struct {
	mu     sync.Mutex
	now    int64        // guarded by mu
	timers []*fakeTimer // guarded by mu: every timer ever made
}

// NewFakeClock returns a FakeClock reading start.
func NewFakeClock(start time.Time) *FakeClock { return &FakeClock{now: start.UnixNano()} }

// Now returns the fake time in Unix nanoseconds.
func (c *FakeClock) Now() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc arms a timer that runs f when the clock has advanced by d.
func (c *FakeClock) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, f: f, at: c.now + int64(d), armed: true}
	c.timers = append(c.timers, t)
	return t
}

// Advance moves the clock forward by d (a negative d does nothing) and fires,
// one at a time and in deadline order, every timer that falls due, including
// timers armed by the functions it runs.
func (c *FakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	target := c.now + max(int64(d), 0)
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
			c.now = target
			c.mu.Unlock()
			return
		}
		next.armed = false
		c.now = max(c.now, next.at)
		c.mu.Unlock()
		next.f()
	}
}

// Armed returns how many timers are armed.
func (c *FakeClock) Armed() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, t := range c.timers {
		if t.armed {
			n++
		}
	}
	return n
}

type fakeTimer struct {
	c     *FakeClock
	f     func()
	at    int64 // guarded by c.mu
	armed bool  // guarded by c.mu
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.armed
	t.armed = false
	return was
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.armed
	t.armed = true
	t.at = t.c.now + int64(d)
	return was
}
