// Package lease is the one lease watchdog of mlock: it runs a job while
// renewing the lease of the lock that protects it, and cancels the job's
// context when the lease is lost. The root client's Do and Hold and the
// locking module's Execute both run on it.
//
// # The rule
//
// What a holder believes, it can justify with its own clock. A lease of
// length TTL is renewed every TTL/3. It is lost when a renewal says the lock
// is gone, when the holder learns of the loss by other means (Options.Lost),
// or at
//
//	base + TTL - Margin(TTL) - Lead
//
// where base is the send time of the last successful renewal (or of the
// acquisition, Options.Start, else the start of Run). Counting from the send time, not from the answer, is what makes the
// rule safe: the server extended the lease at or after the send, so the lock
// is held at least until that send time plus TTL on the server's clock, and
// never assumed longer. Margin covers the drift between the two clocks: they
// are assumed to run at rates that differ by less than 1 %. Lead
// (Options.Lead) ends the lease earlier still, for a holder that needs time
// to stop its work (a command that must be killed before anyone else may get
// the lock). A holder that knows a tighter end of its own (Options.Deadline,
// for example the end of the session that holds the lock) moves the loss
// earlier: it is then at the earlier of the two, less Lead.
//
// # Cadence
//
// The next renewal is sent a period after the last one (TTL/3, see
// Options.TTL) or, when the holder's Deadline less Lead is the earlier end,
// a third of the way from now to that end if that comes first: a renewal
// is also an answer from the server, so it is what moves such a Deadline
// (the client's, whose session end counts from the last answer) before the
// lease is lost. The Deadline is read again after every renewal. Two
// renewals are never less than a millisecond apart, and none is sent once
// the end has come, so a lease about to be lost does not cause a burst of
// renewals: as the end nears, each renewal that fails to move it comes a
// third of the remaining time later, a few dozen at most.
//
// # Caveats
//
// Run does not release anything when the job ends or the lease is lost; the
// caller does. A lease is not mutual exclusion under every failure (a paused
// process does not notice the time passing); pass fencing tokens to what
// the lock protects.
package lease

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrLost is the loss error when Options.Cause is nil.
var ErrLost = errors.New("lease: lost")

// ErrOptions is the kind of error of Check (and of Run, for options it
// refuses): a Lead that is negative or not below half the TTL, or a TTL too
// short to outlast its own clock-drift margin.
var ErrOptions = errors.New("lease: invalid options")

// Margin is the clock-drift margin for a span d: d/100 + 5 ms. The
// holder's clock and the server's are assumed to run at rates that differ by
// less than 1 %; the 5 ms cover the granularity of timers and of the
// server's millisecond leases.
func Margin(d time.Duration) time.Duration { return d/100 + 5*time.Millisecond }

// MinUsable is the least a grant leaves its holder to believe when it
// reaches the caller: two thirds of span (the shorter of the lock's ttl and
// the session grace) less its Margin. The Go client confirms a grant that
// arrives with less before it hands it over; the checkers of the test
// suites hold every grant that saw no fault to it.
func MinUsable(span time.Duration) time.Duration { return (span - Margin(span)) / 3 * 2 }

// Options describes a lease.
type Options struct {
	// TTL is the length of the lease. It is renewed every TTL/3 (never more
	// often than every millisecond; more often if a third of what is left after the
	// margin and Lead is shorter, or if Deadline ends the lease earlier:
	// see the package documentation). TTL <= 0 (or a nil Renew): nothing
	// is renewed and only Lost (or Deadline) ends the lease.
	TTL time.Duration
	// Lead ends the lease this long before the holder's believed end
	// (base + TTL - Margin(TTL), or Deadline), so that the job can be
	// stopped before anyone else may get the lock (for example, the time a
	// command needs to die). Default 0. It must be below TTL/2.
	Lead time.Duration
	// Renew renews the lease. It returns held=false with a nil error when
	// the lock is gone for sure (the lease is lost at once), and an error
	// when the outcome is unknown (for example, the server could not be
	// reached): the next tick tries again. Its context ends at the latest
	// when the lease would run out, or when the job returns; Renew must
	// return when it ends. It is called from one goroutine at a time,
	// never concurrently with itself.
	Renew func(ctx context.Context) (held bool, err error)
	// Lost, if not nil, is closed when the holder learns of the loss by
	// other means (for example, the server pushed an expiry).
	Lost <-chan struct{}
	// Deadline, if not nil, returns the holder's own estimate of the end of
	// the lock, its drift margin already applied (for example the client's,
	// which also counts the end of the session that holds the lock); the
	// zero time means none. It must never move earlier except to report a
	// loss (Lost is then the better signal). The lease is lost at the
	// earlier of that end and base + TTL - Margin(TTL), less Lead; while
	// it is the earlier, renewals come at least every third of the time
	// left to it, so that their answers can move it. It is read at the
	// start, after every renewal and when the earlier end comes, from the
	// watchdog's goroutine; it must be cheap and must not block.
	Deadline func() time.Time
	// Start, if not zero, is the base of the first lease: the send time of
	// the request that acquired (or last renewed) the lock, when it was
	// before Run started. Zero (or a time after Run's start): Run's start.
	// The first renewal is due a period after it.
	Start time.Time
	// Clock, if not nil, is the clock the lease is counted on: the one
	// Deadline and Start are read on. Nil: the system's.
	Clock Clock
	// Cause returns the loss error to report; it is called once, on loss.
	// Nil: ErrLost.
	Cause func() error
	// CauseOf, if set, is used instead of Cause: it is told how the lease
	// was lost and, for LossTimedOut, the error of the last renewal that
	// failed (nil if none did: none was answered in time).
	CauseOf func(how Loss, lastErr error) error
}

// Loss tells how a lease was lost.
type Loss uint8

const (
	// LossReported: Lost was closed (the provider learned it).
	LossReported Loss = iota + 1
	// LossRefused: a renewal answered that the lock is gone.
	LossRefused
	// LossTimedOut: no renewal succeeded before the lease's own end.
	LossTimedOut
	// LossHolder: the holder's Deadline passed (the client's session may
	// have ended without word from the server).
	LossHolder
)

// Check reports whether o is usable: an error of kind ErrOptions when Lead
// is negative, when TTL > 0 and Lead >= TTL/2, or when TTL is so short that
// TTL - Margin(TTL) - Lead leaves no time at all.
func (o *Options) Check() error {
	switch {
	case o.Lead < 0:
		return fmt.Errorf("%w: negative lead %v", ErrOptions, o.Lead)
	case o.TTL <= 0:
		return nil
	case o.Lead >= o.TTL/2:
		return fmt.Errorf("%w: lead %v is not below half the ttl %v", ErrOptions, o.Lead, o.TTL)
	case o.usable() <= 0:
		return fmt.Errorf("%w: ttl %v does not outlast its clock-drift margin %v plus the lead %v",
			ErrOptions, o.TTL, Margin(o.TTL), o.Lead)
	}
	return nil
}

// usable is how long after a renewal's send time the lease is believed held.
func (o *Options) usable() time.Duration { return o.TTL - Margin(o.TTL) - o.Lead }

// period is the renewal cadence: TTL/3, or a third of usable if TTL/3
// would leave fewer than two renewals before the loss; at least 1 ms.
func (o *Options) period() time.Duration {
	p := o.TTL / 3
	if u := o.usable(); 2*p >= u {
		p = u / 3
	}
	return max(p, time.Millisecond)
}

// Run runs fn with a context that is cancelled, with the loss error as its
// cause (context.Cause), when the lease is lost: Renew said the lock is gone,
// Lost was closed, or no renewal succeeded in time: at base + TTL -
// Margin(TTL) - Lead, base being the send time of the last successful
// renewal (or Options.Start, else Run's start), or earlier at Deadline() -
// Lead (see the package documentation). The first renewal is sent a period
// after that base: the caller has just acquired or renewed the lock.
//
// Run returns fn's error and the loss error (nil if the lease was kept until
// fn returned). fn's context is also cancelled when ctx is; renewals are not:
// they go on until fn returns, since the lock is still held. Run returns only
// after its watchdog goroutine has ended, and does not release anything: the
// caller does. Options that Check refuses are returned as fnErr, without
// running fn.
func Run(ctx context.Context, o Options, fn func(context.Context) error) (fnErr, lostErr error) {
	if o.Clock != nil {
		return run(ctx, o, fn, o.Clock)
	}
	return run(ctx, o, fn, systemClock{})
}

func run(ctx context.Context, o Options, fn func(context.Context) error, clk Clock) (fnErr, lostErr error) {
	if err := o.Check(); err != nil {
		return err, nil
	}
	jctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	done := make(chan struct{})
	lost := make(chan error, 1)
	w := &watchdog{o: o, clk: clk}
	base := clk.Now() // before fn starts: the lease is counted from here at the latest
	if !o.Start.IsZero() && o.Start.Before(base) {
		base = o.Start
	}
	go func() { lost <- w.watch(ctx, base, done, cancel) }()
	returned := false
	defer func() {
		if !returned {
			// fn panicked: the watchdog stops all the same, and the panic
			// goes on up.
			close(done)
			<-lost
		}
	}()
	fnErr = fn(jctx)
	returned = true
	close(done)
	return fnErr, <-lost
}

// watchdog renews one lease; its fields are owned by the watch goroutine.
type watchdog struct {
	o       Options
	clk     Clock
	lastErr error // of the last renewal, if it failed
}

// renewal is the outcome of one Renew call, sent at sent.
type renewal struct {
	sent time.Time
	held bool
	err  error
}

// lose cancels the job with the loss error and returns it.
func (w *watchdog) lose(cancel context.CancelCauseFunc, how Loss) error {
	err := ErrLost
	switch {
	case w.o.CauseOf != nil:
		err = w.o.CauseOf(how, w.lastErr)
	case w.o.Cause != nil:
		err = w.o.Cause()
	}
	cancel(err)
	return err
}

// end returns when the lease is lost if nothing changes: own (base + usable)
// or, if earlier, the holder's Deadline less Lead (held is then true). ok is
// false when there is no end at all.
func (w *watchdog) end(own time.Time, renewing bool) (end time.Time, ok, held bool) {
	end, ok = own, renewing
	if w.o.Deadline != nil {
		if d := w.o.Deadline(); !d.IsZero() {
			if d = d.Add(-w.o.Lead); !ok || d.Before(end) {
				end, ok, held = d, true, true
			}
		}
	}
	return end, ok, held
}

// minGap is the shortest time between two renewals.
const minGap = time.Millisecond

// nextRenewal returns how long after now the next renewal is due, the last
// one having been sent at last: a period after it (at once if that has
// passed: the last renewal took longer than a period) or, when the holder's
// Deadline is the end (byHolder), a third of the way from now to that end if
// that comes first, but not sooner than minGap.
func nextRenewal(now, last time.Time, period time.Duration, end time.Time, byHolder bool) time.Duration {
	d := last.Add(period).Sub(now)
	if byHolder {
		d = min(d, max(end.Sub(now)/3, minGap))
	}
	return d
}

// watch runs until done is closed or the lease is lost, and returns the loss
// error or nil. At most one renewal is in flight: the tick is re-armed when
// it answers. watch waits for it before returning.
func (w *watchdog) watch(ctx context.Context, base time.Time, done <-chan struct{}, cancel context.CancelCauseFunc) error {
	o := w.o
	renewing := o.TTL > 0 && o.Renew != nil
	own := base.Add(o.usable()) // base + TTL - margin - lead
	deadline, bounded, byHolder := w.end(own, renewing)
	timedOut := func() Loss {
		if byHolder {
			return LossHolder
		}
		return LossTimedOut
	}
	if bounded && !w.clk.Now().Before(deadline) {
		return w.lose(cancel, timedOut())
	}
	var expiryC, tickC <-chan time.Time
	rearm := func() {} // re-reads the end and re-arms the expiry
	if bounded {
		expiry := w.clk.NewTimer(deadline.Sub(w.clk.Now()))
		defer expiry.Stop()
		expiryC = expiry.C()
		rearm = func() {
			if d, ok, h := w.end(own, renewing); ok {
				deadline, byHolder = d, h
				expiry.Reset(deadline.Sub(w.clk.Now()))
			}
		}
	}
	period := o.period()
	var tick Timer
	if renewing {
		now := w.clk.Now()
		tick = w.clk.NewTimer(nextRenewal(now, base, period, deadline, byHolder))
		defer tick.Stop()
		tickC = tick.C()
	}
	rctx, rcancel := context.WithCancel(context.WithoutCancel(ctx))
	results := make(chan renewal, 1)
	inFlight := false
	defer func() {
		rcancel()
		if inFlight {
			<-results
		}
	}()
	for {
		select {
		case <-done:
			return nil
		case <-o.Lost:
			return w.lose(cancel, LossReported)
		case <-expiryC:
			// The end may have moved later (Deadline); re-read it.
			rearm()
			if !w.clk.Now().Before(deadline) {
				return w.lose(cancel, timedOut())
			}
		case <-tickC:
			now := w.clk.Now()
			if !now.Before(deadline) {
				return w.lose(cancel, timedOut())
			}
			inFlight = true
			go func(sent time.Time, left time.Duration) {
				c, cc := context.WithTimeout(rctx, left)
				held, err := o.Renew(c)
				cc()
				results <- renewal{sent: sent, held: held, err: err}
			}(now, deadline.Sub(now))
		case r := <-results:
			inFlight = false
			switch {
			case r.err != nil:
				// Unknown: the next tick retries; the own end stands.
				w.lastErr = r.err
			case !r.held:
				return w.lose(cancel, LossRefused)
			default:
				w.lastErr = nil
				if e := r.sent.Add(o.usable()); e.After(own) {
					own = e
				}
			}
			// Any answer may have moved the holder's Deadline: re-read it
			// before choosing when the next renewal is due (at once if it
			// is overdue: this one took longer than the period).
			rearm()
			tick.Reset(nextRenewal(w.clk.Now(), r.sent, period, deadline, byHolder))
		}
	}
}

// Clock is the watchdog's source of time (Options.Clock): the holder's own,
// so that the lease and the holder's Deadline and Start are read on one
// clock.
type Clock interface {
	Now() time.Time
	NewTimer(d time.Duration) Timer
}

// Timer is a one-shot timer of a Clock, whose channel is read by one
// goroutine. Stop and Reset leave no stale value in the channel (as
// time.Timer since Go 1.23).
type Timer interface {
	C() <-chan time.Time
	Stop() bool
	Reset(d time.Duration) bool
}

type systemClock struct{}

func (systemClock) Now() time.Time                 { return time.Now() }
func (systemClock) NewTimer(d time.Duration) Timer { return systemTimer{time.NewTimer(d)} }

type systemTimer struct{ *time.Timer }

func (t systemTimer) C() <-chan time.Time { return t.Timer.C }
