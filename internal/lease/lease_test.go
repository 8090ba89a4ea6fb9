package lease

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeClock moves only when told to. Its timers deliver on their channels
// inside Advance.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	timers  []*fakeTimer
	changed chan struct{} // closed and replaced whenever a timer is armed
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Unix(1_000_000, 0), changed: make(chan struct{})}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) NewTimer(d time.Duration) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, ch: make(chan time.Time, 1)}
	c.timers = append(c.timers, t)
	t.armLocked(d)
	return t
}

// Advance moves the clock by d and fires the timers that fall due.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	for _, t := range c.timers {
		if t.armed && !t.when.After(c.now) {
			t.armed = false
			t.ch <- t.when
		}
	}
}

// waitArmed blocks until a timer is armed to fire at at.
func (c *fakeClock) waitArmed(t *testing.T, at time.Time) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		c.mu.Lock()
		ch := c.changed
		for _, tm := range c.timers {
			if tm.armed && tm.when.Equal(at) {
				c.mu.Unlock()
				return
			}
		}
		c.mu.Unlock()
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("no timer armed at +%v", at.Sub(time.Unix(1_000_000, 0)))
		}
	}
}

type fakeTimer struct {
	c     *fakeClock
	ch    chan time.Time
	when  time.Time // guarded by c.mu
	armed bool      // guarded by c.mu
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.armed
	t.armed = false
	t.drainLocked()
	return was
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.armed
	t.drainLocked()
	t.armLocked(d)
	return was
}

func (t *fakeTimer) drainLocked() {
	select {
	case <-t.ch:
	default:
	}
}

func (t *fakeTimer) armLocked(d time.Duration) {
	t.when, t.armed = t.c.now.Add(d), true
	if d <= 0 {
		t.armed = false
		t.ch <- t.when
	}
	close(t.c.changed)
	t.c.changed = make(chan struct{})
}

// renewCall is one Renew call the test answers.
type renewCall struct {
	at    time.Time
	ctx   context.Context
	reply chan renewal
}

// harness runs Run on a fake clock with a Renew the test answers.
type harness struct {
	clk     *fakeClock
	start   time.Time
	calls   chan renewCall
	jobCtx  chan context.Context
	finish  chan error
	outcome chan [2]error
}

var errGone = errors.New("test: lease lost")

func start(t *testing.T, o Options) *harness {
	t.Helper()
	h := &harness{clk: newFakeClock(), calls: make(chan renewCall), jobCtx: make(chan context.Context, 1),
		finish: make(chan error), outcome: make(chan [2]error, 1)}
	h.start = h.clk.Now()
	if o.Renew == nil {
		o.Renew = func(ctx context.Context) (bool, error) {
			c := renewCall{at: h.clk.Now(), ctx: ctx, reply: make(chan renewal)}
			h.calls <- c
			r := <-c.reply
			return r.held, r.err
		}
	}
	if o.Cause == nil {
		o.Cause = func() error { return errGone }
	}
	go func() {
		fnErr, lostErr := run(context.Background(), o, func(ctx context.Context) error {
			h.jobCtx <- ctx
			return <-h.finish
		}, h.clk)
		h.outcome <- [2]error{fnErr, lostErr}
	}()
	return h
}

func (h *harness) at(d time.Duration) time.Time { return h.start.Add(d) }

// call waits for the next Renew call.
func (h *harness) call(t *testing.T) renewCall {
	t.Helper()
	select {
	case c := <-h.calls:
		return c
	case <-time.After(5 * time.Second):
		t.Fatal("Renew was not called")
	}
	panic("unreachable")
}

func (h *harness) result(t *testing.T) (fnErr, lostErr error) {
	t.Helper()
	select {
	case r := <-h.outcome:
		return r[0], r[1]
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return")
	}
	panic("unreachable")
}

func waitDone(t *testing.T, ctx context.Context) {
	t.Helper()
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the job's context was not cancelled")
	}
}

func notDone(t *testing.T, ctx context.Context) {
	t.Helper()
	if ctx.Err() != nil {
		t.Fatalf("the job's context ended early: %v", context.Cause(ctx))
	}
}

func TestRenewsEveryThirdAndKeepsTheLease(t *testing.T) {
	h := start(t, Options{TTL: 3 * time.Second})
	job := <-h.jobCtx
	for i := 1; i <= 5; i++ {
		h.clk.waitArmed(t, h.at(time.Duration(i)*time.Second))
		h.clk.Advance(time.Second)
		c := h.call(t)
		if want := h.at(time.Duration(i) * time.Second); !c.at.Equal(want) {
			t.Fatalf("renewal %d at +%v, want +%v", i, c.at.Sub(h.start), want.Sub(h.start))
		}
		c.reply <- renewal{held: true}
		h.clk.waitArmed(t, h.at(time.Duration(i+3)*time.Second-margin3s)) // the new end: send time + TTL - margin
		notDone(t, job)
	}
	h.finish <- nil
	if fnErr, lostErr := h.result(t); fnErr != nil || lostErr != nil {
		t.Fatalf("Run = %v, %v; want the lease kept", fnErr, lostErr)
	}
}

// margin3s is Margin(3s): 3s/100 + 5ms.
const margin3s = 35 * time.Millisecond

func TestMargin(t *testing.T) {
	for _, c := range []struct{ d, want time.Duration }{
		{0, 5 * time.Millisecond}, {3 * time.Second, margin3s}, {time.Minute, 605 * time.Millisecond},
	} {
		if got := Margin(c.d); got != c.want {
			t.Errorf("Margin(%v) = %v, want %v", c.d, got, c.want)
		}
	}
}

// The loss is counted from the send time of the last successful renewal, not
// from its answer: a renewal sent at +1s and answered at +2.5s keeps the
// lease until +4s - margin only.
func TestLossCountsFromTheSendTime(t *testing.T) {
	h := start(t, Options{TTL: 3 * time.Second})
	job := <-h.jobCtx
	h.clk.waitArmed(t, h.at(time.Second))
	h.clk.Advance(time.Second)
	c := h.call(t)
	h.clk.Advance(1500 * time.Millisecond) // +2.5s: no second renewal while one is in flight
	c.reply <- renewal{held: true}
	h.clk.waitArmed(t, h.at(4*time.Second-margin3s))
	c = h.call(t) // overdue since +2s: sent at once
	if !c.at.Equal(h.at(2500 * time.Millisecond)) {
		t.Fatalf("the overdue renewal was sent at +%v", c.at.Sub(h.start))
	}
	c.reply <- renewal{err: errors.New("unreachable")}
	h.clk.waitArmed(t, h.at(3500*time.Millisecond))
	h.clk.Advance(time.Second) // +3.5s
	h.call(t).reply <- renewal{err: errors.New("unreachable")}
	h.clk.waitArmed(t, h.at(4500*time.Millisecond))
	h.clk.Advance(500*time.Millisecond - margin3s - time.Millisecond) // +4s - margin - 1ms
	notDone(t, job)
	h.clk.Advance(time.Millisecond) // +4s - margin
	waitDone(t, job)
	if !errors.Is(context.Cause(job), errGone) {
		t.Fatalf("cause %v", context.Cause(job))
	}
	h.finish <- context.Cause(job)
	if fnErr, lostErr := h.result(t); lostErr != errGone || fnErr != errGone {
		t.Fatalf("Run = %v, %v; want the loss", fnErr, lostErr)
	}
}

// Unknown outcomes are retried until a whole TTL (less the margin) passed
// since Run started.
func TestUnreachableForAWholeTTL(t *testing.T) {
	h := start(t, Options{TTL: 3 * time.Second})
	job := <-h.jobCtx
	for i := 1; i <= 2; i++ {
		h.clk.waitArmed(t, h.at(time.Duration(i)*time.Second))
		h.clk.Advance(time.Second)
		c := h.call(t)
		if dl, ok := c.ctx.Deadline(); !ok || dl.IsZero() {
			t.Fatal("a renewal without a deadline")
		}
		c.reply <- renewal{err: errors.New("connection refused")}
	}
	h.clk.waitArmed(t, h.at(3*time.Second-margin3s))
	h.clk.Advance(time.Second - margin3s - time.Millisecond)
	notDone(t, job)
	h.clk.Advance(time.Millisecond)
	waitDone(t, job)
	h.finish <- nil
	if fnErr, lostErr := h.result(t); fnErr != nil || lostErr != errGone {
		t.Fatalf("Run = %v, %v", fnErr, lostErr)
	}
}

func TestRefusedRenewalLosesAtOnce(t *testing.T) {
	h := start(t, Options{TTL: 3 * time.Second})
	job := <-h.jobCtx
	h.clk.waitArmed(t, h.at(time.Second))
	h.clk.Advance(time.Second)
	h.call(t).reply <- renewal{held: false}
	waitDone(t, job)
	h.finish <- errors.New("job error")
	if fnErr, lostErr := h.result(t); fnErr == nil || fnErr.Error() != "job error" || lostErr != errGone {
		t.Fatalf("Run = %v, %v", fnErr, lostErr)
	}
}

func TestLostChannel(t *testing.T) {
	for _, ttl := range []time.Duration{3 * time.Second, 0} {
		lost := make(chan struct{})
		h := start(t, Options{TTL: ttl, Lost: lost})
		job := <-h.jobCtx
		close(lost)
		waitDone(t, job)
		h.finish <- nil
		if _, lostErr := h.result(t); lostErr != errGone {
			t.Fatalf("ttl %v: lostErr %v", ttl, lostErr)
		}
	}
}

// When the job returns with a renewal in flight, that renewal's context is
// cancelled and Run waits for it.
func TestReturnWithARenewalInFlight(t *testing.T) {
	h := start(t, Options{TTL: 3 * time.Second})
	<-h.jobCtx
	h.clk.waitArmed(t, h.at(time.Second))
	h.clk.Advance(time.Second)
	c := h.call(t)
	h.finish <- nil
	select {
	case <-c.ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the renewal's context was not cancelled when the job returned")
	}
	select {
	case <-h.outcome:
		t.Fatal("Run returned before its renewal did")
	default:
	}
	c.reply <- renewal{held: true}
	if fnErr, lostErr := h.result(t); fnErr != nil || lostErr != nil {
		t.Fatalf("Run = %v, %v", fnErr, lostErr)
	}
}

func TestNoTTLNoRenewal(t *testing.T) {
	var calls atomic.Int32
	fnErr, lostErr := Run(context.Background(), Options{Renew: func(context.Context) (bool, error) {
		calls.Add(1)
		return true, nil
	}}, func(context.Context) error { time.Sleep(20 * time.Millisecond); return nil }) // fixed: the job's duration, the test's input
	if fnErr != nil || lostErr != nil || calls.Load() != 0 {
		t.Fatalf("Run = %v, %v after %d renewals", fnErr, lostErr, calls.Load())
	}
}

// Cancelling the parent cancels the job but is not a loss, and renewals go on
// with a live context until the job returns.
func TestParentCancelIsNotALoss(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	clk := newFakeClock()
	calls := make(chan error)
	out := make(chan [2]error, 1)
	jobCtx := make(chan context.Context, 1)
	finish := make(chan struct{})
	go func() {
		fnErr, lostErr := run(parent, Options{TTL: 3 * time.Second, Renew: func(ctx context.Context) (bool, error) {
			calls <- ctx.Err()
			return true, nil
		}}, func(ctx context.Context) error {
			jobCtx <- ctx
			<-finish
			return ctx.Err()
		}, clk)
		out <- [2]error{fnErr, lostErr}
	}()
	job := <-jobCtx
	cancel()
	waitDone(t, job)
	clk.waitArmed(t, clk.Now().Add(time.Second))
	clk.Advance(time.Second)
	if err := <-calls; err != nil {
		t.Fatal("a renewal ran with the cancelled parent's context")
	}
	close(finish)
	r := <-out
	if !errors.Is(r[0], context.Canceled) || r[1] != nil {
		t.Fatalf("Run = %v, %v", r[0], r[1])
	}
}

func TestDefaultCause(t *testing.T) {
	lost := make(chan struct{})
	close(lost)
	_, lostErr := Run(context.Background(), Options{TTL: time.Hour, Lost: lost,
		Renew: func(context.Context) (bool, error) { return true, nil }},
		func(ctx context.Context) error { <-ctx.Done(); return nil })
	if lostErr != ErrLost {
		t.Fatalf("lostErr %v, want ErrLost", lostErr)
	}
}

// On the real clock, with short leases: renewals keep a lease over a job
// several leases long, and a renewal that never succeeds loses it.
func TestSystemClock(t *testing.T) {
	var n atomic.Int32
	fnErr, lostErr := Run(context.Background(), Options{TTL: 200 * time.Millisecond,
		Renew: func(context.Context) (bool, error) { n.Add(1); return true, nil }},
		func(ctx context.Context) error {
			select {
			case <-time.After(500 * time.Millisecond):
				return nil
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		})
	if fnErr != nil || lostErr != nil || n.Load() < 2 {
		t.Fatalf("Run = %v, %v after %d renewals", fnErr, lostErr, n.Load())
	}
	start := time.Now()
	_, lostErr = Run(context.Background(), Options{TTL: 200 * time.Millisecond,
		Renew: func(context.Context) (bool, error) { return false, errors.New("down") }},
		func(ctx context.Context) error { <-ctx.Done(); return nil })
	if lostErr != ErrLost || time.Since(start) < 200*time.Millisecond-Margin(200*time.Millisecond) {
		t.Fatalf("lostErr %v after %v", lostErr, time.Since(start))
	}
}

// With a Lead, the lease ends Lead earlier: base + TTL - margin - Lead. A
// small lead keeps the TTL/3 cadence.
func TestLeadEndsEarlier(t *testing.T) {
	lead := 500 * time.Millisecond
	h := start(t, Options{TTL: 3 * time.Second, Lead: lead})
	job := <-h.jobCtx
	h.clk.waitArmed(t, h.at(time.Second))
	h.clk.Advance(time.Second)
	h.call(t).reply <- renewal{held: true}
	end := h.at(4*time.Second - margin3s - lead) // +3.465s
	h.clk.waitArmed(t, end)
	h.clk.waitArmed(t, h.at(2*time.Second)) // the next renewal: TTL/3 after the last send
	h.clk.Advance(time.Second)
	h.call(t).reply <- renewal{err: errors.New("unreachable")}
	h.clk.waitArmed(t, h.at(3*time.Second))
	h.clk.Advance(time.Second)
	h.call(t).reply <- renewal{err: errors.New("unreachable")}
	h.clk.Advance(end.Sub(h.clk.Now()) - time.Millisecond)
	notDone(t, job)
	h.clk.Advance(time.Millisecond)
	waitDone(t, job)
	h.finish <- nil
	if _, lostErr := h.result(t); lostErr != errGone {
		t.Fatalf("lostErr %v", lostErr)
	}
}

// A large Lead renews more often: every third of TTL - margin - Lead, so
// that two renewals fit before the end.
func TestLargeLeadRenewsOften(t *testing.T) {
	lead := 1200 * time.Millisecond
	o := Options{TTL: 3 * time.Second, Lead: lead}
	period := (3*time.Second - margin3s - lead) / 3 // 588.33ms
	if got := o.period(); got != period {
		t.Fatalf("period %v, want %v", got, period)
	}
	h := start(t, o)
	job := <-h.jobCtx
	for i := 1; i <= 3; i++ {
		h.clk.waitArmed(t, h.at(time.Duration(i)*period))
		h.clk.Advance(period)
		c := h.call(t)
		if !c.at.Equal(h.at(time.Duration(i) * period)) {
			t.Fatalf("renewal %d at +%v", i, c.at.Sub(h.start))
		}
		c.reply <- renewal{held: true}
		h.clk.waitArmed(t, c.at.Add(o.usable()))
		notDone(t, job)
	}
	h.finish <- nil
	if fnErr, lostErr := h.result(t); fnErr != nil || lostErr != nil {
		t.Fatalf("Run = %v, %v", fnErr, lostErr)
	}
}

func TestCheckRefuses(t *testing.T) {
	for _, o := range []Options{
		{TTL: 3 * time.Second, Lead: 1500 * time.Millisecond}, // TTL/2
		{TTL: 3 * time.Second, Lead: 2 * time.Second},
		{TTL: time.Second, Lead: -time.Millisecond},
		{TTL: 5 * time.Millisecond}, // no time left after the margin
		{TTL: 10 * time.Millisecond, Lead: 4900 * time.Microsecond},
	} {
		if err := o.Check(); !errors.Is(err, ErrOptions) {
			t.Errorf("Check(%+v) = %v, want ErrOptions", o, err)
		}
		ran := false
		fnErr, lostErr := Run(context.Background(), o, func(context.Context) error { ran = true; return nil })
		if ran || !errors.Is(fnErr, ErrOptions) || lostErr != nil {
			t.Errorf("Run(%+v) = %v, %v (ran %v); want the refusal without running", o, fnErr, lostErr, ran)
		}
	}
	for _, o := range []Options{{}, {TTL: 3 * time.Second, Lead: 1499 * time.Millisecond}, {TTL: 10 * time.Millisecond}} {
		if err := o.Check(); err != nil {
			t.Errorf("Check(%+v) = %v", o, err)
		}
	}
}

// The holder's own Deadline, if earlier, ends the lease (less the Lead); when
// it moves later the watchdog follows it. While it is the earlier end,
// renewals come every third of the time left to it; renewals that fail to
// move it come ever closer to it but never less than a millisecond apart,
// and none is sent once it has come.
func TestHolderDeadline(t *testing.T) {
	var mu sync.Mutex
	clk0 := time.Unix(1_000_000, 0)
	dl := clk0.Add(2 * time.Second)
	lead := 100 * time.Millisecond
	h := start(t, Options{TTL: 3 * time.Second, Lead: lead, Deadline: func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return dl
	}})
	job := <-h.jobCtx
	end := h.at(2*time.Second - lead)
	h.clk.waitArmed(t, end)
	next := h.at((2*time.Second - lead) / 3) // before the TTL/3 of +1s
	h.clk.waitArmed(t, next)
	mu.Lock()
	dl = clk0.Add(2500 * time.Millisecond) // moved later (for example by a ping's answer)
	mu.Unlock()
	end = h.at(2500*time.Millisecond - lead)
	calls := 0
	for next.Before(end) {
		h.clk.Advance(next.Sub(h.clk.Now()))
		c := h.call(t)
		if !c.at.Equal(next) {
			t.Fatalf("renewal %d at +%v, want +%v", calls, c.at.Sub(h.start), next.Sub(h.start))
		}
		calls++
		c.reply <- renewal{err: errors.New("unreachable")}
		next = next.Add(max(end.Sub(next)/3, time.Millisecond))
		h.clk.waitArmed(t, next)
		notDone(t, job)
	}
	if calls > 30 {
		t.Fatalf("%d renewals before the end", calls)
	}
	h.clk.Advance(end.Sub(h.clk.Now()) - time.Millisecond)
	notDone(t, job)
	h.clk.Advance(time.Millisecond)
	waitDone(t, job)
	h.finish <- nil
	if _, lostErr := h.result(t); lostErr != errGone {
		t.Fatalf("lostErr %v", lostErr)
	}
}

// A holder's Deadline much shorter than the TTL, that each answer moves (the
// client's: the last answer on the session plus the server's grace): the
// renewals come often enough to keep moving it, and the lease is kept for
// many times that span. Here grace 3 s (a Deadline 2.965 s after the last
// answer), TTL 20 s and a Lead of 2.1 s leave 865 ms after each answer;
// renewing every TTL/3 = 6.67 s would lose the lease 865 ms after the start.
func TestRenewsBeforeAShortHolderDeadline(t *testing.T) {
	var mu sync.Mutex
	lastAck := time.Unix(1_000_000, 0)
	const span = 2965 * time.Millisecond
	lead := 2100 * time.Millisecond
	h := start(t, Options{TTL: 20 * time.Second, Lead: lead, Deadline: func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return lastAck.Add(span)
	}})
	job := <-h.jobCtx
	left := span - lead // 865ms
	next := h.at(left / 3)
	for i := 0; h.clk.Now().Before(h.at(6 * time.Second)); i++ {
		h.clk.waitArmed(t, next)
		h.clk.Advance(next.Sub(h.clk.Now()))
		c := h.call(t)
		if !c.at.Equal(next) {
			t.Fatalf("renewal %d at +%v, want +%v", i, c.at.Sub(h.start), next.Sub(h.start))
		}
		mu.Lock()
		lastAck = c.at // the renewal's answer: its send time is the latest answered
		mu.Unlock()
		c.reply <- renewal{held: true}
		h.clk.waitArmed(t, c.at.Add(left)) // the end moved
		next = c.at.Add(left / 3)
		notDone(t, job)
	}
	h.finish <- nil
	if fnErr, lostErr := h.result(t); fnErr != nil || lostErr != nil {
		t.Fatalf("Run = %v, %v; want the lease kept", fnErr, lostErr)
	}
}

// A Deadline without a TTL still ends the lease.
func TestHolderDeadlineWithoutTTL(t *testing.T) {
	start := time.Now()
	_, lostErr := Run(context.Background(), Options{Deadline: func() time.Time { return start.Add(30 * time.Millisecond) }},
		func(ctx context.Context) error { <-ctx.Done(); return nil })
	if lostErr != ErrLost || time.Since(start) < 30*time.Millisecond {
		t.Fatalf("lostErr %v after %v", lostErr, time.Since(start))
	}
}

// Options.Start counts the first lease from the acquisition's send time, not
// from Run's start: the first renewal and the end come that much earlier.
func TestStartIsTheBase(t *testing.T) {
	clk0 := time.Unix(1_000_000, 0)
	h := start(t, Options{TTL: 3 * time.Second, Start: clk0.Add(-400 * time.Millisecond)})
	job := <-h.jobCtx
	h.clk.waitArmed(t, h.at(600*time.Millisecond))           // the first renewal: base + TTL/3
	h.clk.waitArmed(t, h.at(2600*time.Millisecond-margin3s)) // the end: base + TTL - margin
	h.clk.Advance(600 * time.Millisecond)
	h.call(t).reply <- renewal{err: errors.New("unreachable")}
	h.clk.waitArmed(t, h.at(1600*time.Millisecond))
	h.clk.Advance(time.Second)
	h.call(t).reply <- renewal{err: errors.New("unreachable")}
	h.clk.Advance(time.Second - margin3s - time.Millisecond)
	notDone(t, job)
	h.clk.Advance(time.Millisecond)
	waitDone(t, job)
	h.finish <- nil
	if _, lostErr := h.result(t); lostErr != errGone {
		t.Fatalf("lostErr %v", lostErr)
	}
}

// A job that panics ends the watchdog as a job that returns does: the
// panic goes on up (a server recovers it per request, say), and nothing
// keeps renewing the lease for as long as the parent context lives.
func TestPanicStopsTheWatchdog(t *testing.T) {
	others := goleak.IgnoreCurrent()
	clk := newFakeClock()
	renew := func(context.Context) (bool, error) { return true, nil }
	func() {
		defer func() {
			if r := recover(); r != "job panicked" {
				t.Fatalf("recovered %v, want the job's panic", r)
			}
		}()
		run(context.Background(), Options{TTL: 3 * time.Second, Renew: renew}, func(context.Context) error {
			panic("job panicked")
		}, clk)
	}()
	goleak.VerifyNone(t, others)
}
