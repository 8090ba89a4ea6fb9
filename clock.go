package mlock

import (
	"time"

	"github.com/mlock-dev/mlock/internal/lease"
)

// clock is the time of a session's safety rule: every time it reads (send
// times, answers, deadlines, staleness) and every timer it sets (the
// session's timer of deadlines and backstops, the keep-alive period) goes
// through it. Sessions use systemClock; the package's tests give a session
// a fake clock (Options.clock) to test the rule's arithmetic without
// waiting for it. The transport's own waits (dial timeouts, the reconnect
// backoff, the reader's wait for its callers) stay on the system's clock.
type clock interface {
	// now returns the monotonic time since the clock's origin.
	now() time.Duration
	// wall returns the time.Time of the monotonic time d.
	wall(d time.Duration) time.Time
	// afterFunc runs f, in its own goroutine, once d has passed.
	afterFunc(d time.Duration, f func()) timer
	// newTimer returns a timer whose channel receives once d has passed.
	newTimer(d time.Duration) timer
}

// timer is a time.Timer of a clock.
type timer interface {
	// C returns the channel the timer sends on (nil for afterFunc's).
	C() <-chan time.Time
	// Reset rearms the timer to fire once d has passed; like
	// time.Timer.Reset, no stale value is received after it.
	Reset(d time.Duration) bool
	// Stop disarms the timer.
	Stop() bool
}

// epoch is the origin of systemClock's times (a time.Duration since epoch):
// comparing them is cheaper than comparing time.Time values, and
// epoch.Add(d) turns one back into a time.Time that carries the monotonic
// reading.
var epoch = time.Now()

// monoNow returns the system's monotonic time since epoch: for the
// transport's waits, which are no part of the safety rule.
func monoNow() time.Duration { return time.Since(epoch) }

// systemClock is the clock of every session outside the package's tests.
type systemClock struct{}

func (systemClock) now() time.Duration             { return time.Since(epoch) }
func (systemClock) wall(d time.Duration) time.Time { return epoch.Add(d) }
func (systemClock) afterFunc(d time.Duration, f func()) timer {
	return systemTimer{time.AfterFunc(d, f)}
}
func (systemClock) newTimer(d time.Duration) timer { return systemTimer{time.NewTimer(d)} }

type systemTimer struct{ *time.Timer }

func (t systemTimer) C() <-chan time.Time { return t.Timer.C }

// leaseClock is a session's clock as the lease watchdog's (Hold, Do): the
// lease is counted on the clock the lock's Deadline and send times are.
type leaseClock struct{ c clock }

func (l leaseClock) Now() time.Time                       { return l.c.wall(l.c.now()) }
func (l leaseClock) NewTimer(d time.Duration) lease.Timer { return l.c.newTimer(d) }
