// Package lease is the one lease watchdog of mlock: it runs a job while
// renewing the lease of the lock that protects it, and cancels the job's
// context when the lease is lost. The root client's Do and Hold and the
// locking module's Execute both run on it.
//
// # The rule
//
// A lease of length TTL is renewed every TTL/3. It is lost when a renewal
// says the lock is gone, when the holder learns of the loss by other means
// (Options.Lost), or once no renewal succeeded for a whole TTL counted from
// the send time of the last successful renewal (or from the start of Run).
// Counting from the send time, not from the answer, is what makes the rule
// safe: the server extended the lease at or after the send, so the lock is
// held at least until that send time plus TTL, and never assumed longer.
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
	"time"
)

// ErrLost is the loss error when Options.Cause is nil.
var ErrLost = errors.New("lease: lost")

// Options describes a lease.
type Options struct {
	// TTL is the length of the lease. It is renewed every TTL/3 (at least
	// every millisecond). TTL <= 0 (or a nil Renew): nothing is renewed
	// and only Lost ends the lease.
	TTL time.Duration
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
	// Cause returns the loss error to report; it is called once, on loss.
	// Nil: ErrLost.
	Cause func() error
}

// Run runs fn with a context that is cancelled, with the loss error as its
// cause (context.Cause), when the lease is lost: Renew said the lock is gone,
// Lost was closed, or no renewal succeeded for a whole TTL counted from the
// send time of the last successful renewal (or from Run's start). The first
// renewal is sent TTL/3 after Run starts: the caller has just acquired or
// renewed the lock.
//
// Run returns fn's error and the loss error (nil if the lease was kept until
// fn returned). fn's context is also cancelled when ctx is; renewals are not:
// they go on until fn returns, since the lock is still held. Run returns only
// after its watchdog goroutine has ended, and does not release anything: the
// caller does.
func Run(ctx context.Context, o Options, fn func(context.Context) error) (fnErr, lostErr error) {
	return run(ctx, o, fn, systemClock{})
}

func run(ctx context.Context, o Options, fn func(context.Context) error, clk clock) (fnErr, lostErr error) {
	jctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	done := make(chan struct{})
	lost := make(chan error, 1)
	w := &watchdog{o: o, clk: clk}
	go func() { lost <- w.watch(ctx, done, cancel) }()
	fnErr = fn(jctx)
	close(done)
	return fnErr, <-lost
}

// watchdog renews one lease; its fields are owned by the watch goroutine.
type watchdog struct {
	o   Options
	clk clock
}

// renewal is the outcome of one Renew call, sent at sent.
type renewal struct {
	sent time.Time
	held bool
	err  error
}

// lose cancels the job with the loss error and returns it.
func (w *watchdog) lose(cancel context.CancelCauseFunc) error {
	err := ErrLost
	if w.o.Cause != nil {
		err = w.o.Cause()
	}
	cancel(err)
	return err
}

// watch runs until done is closed or the lease is lost, and returns the loss
// error or nil. At most one renewal is in flight: the tick is re-armed when
// it answers. watch waits for it before returning.
func (w *watchdog) watch(ctx context.Context, done <-chan struct{}, cancel context.CancelCauseFunc) error {
	o := w.o
	if o.TTL <= 0 || o.Renew == nil {
		select {
		case <-done:
			return nil
		case <-o.Lost:
			return w.lose(cancel)
		}
	}
	period := max(o.TTL/3, time.Millisecond)
	deadline := w.clk.Now().Add(o.TTL) // the lease is assumed held until then
	expiry, tick := w.clk.NewTimer(o.TTL), w.clk.NewTimer(period)
	defer expiry.Stop()
	defer tick.Stop()
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
			return w.lose(cancel)
		case <-expiry.C():
			return w.lose(cancel)
		case <-tick.C():
			now := w.clk.Now()
			if !now.Before(deadline) {
				return w.lose(cancel)
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
			// The next renewal is due a period after this one was sent
			// (at once if this one took longer).
			tick.Reset(r.sent.Add(period).Sub(w.clk.Now()))
			switch {
			case r.err != nil:
				// Unknown: the next tick retries; the expiry stands.
			case !r.held:
				return w.lose(cancel)
			case r.sent.Add(o.TTL).After(deadline):
				deadline = r.sent.Add(o.TTL)
				expiry.Reset(deadline.Sub(w.clk.Now()))
			}
		}
	}
}

// clock is the watchdog's source of time; tests use a fake one.
type clock interface {
	Now() time.Time
	NewTimer(d time.Duration) timer
}

// timer is a one-shot timer whose channel is read by one goroutine. Stop and
// Reset leave no stale value in the channel (as time.Timer since Go 1.23).
type timer interface {
	C() <-chan time.Time
	Stop() bool
	Reset(d time.Duration) bool
}

type systemClock struct{}

func (systemClock) Now() time.Time                 { return time.Now() }
func (systemClock) NewTimer(d time.Duration) timer { return systemTimer{time.NewTimer(d)} }

type systemTimer struct{ *time.Timer }

func (t systemTimer) C() <-chan time.Time { return t.Timer.C }
