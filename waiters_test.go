package mlock_test

import (
	"testing"
	"time"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/internal/lease"
	"github.com/mlock-dev/mlock/internal/proctest"
	"github.com/mlock-dev/mlock/server"
)

// queued is a waiter queued behind a holder (see queueBehind).
type queued struct {
	holder *mlock.Client // on the server directly
	h      *mlock.Lock   // the holder's lock
	px     *proxy        // the waiter's path to the server
	g      <-chan grant  // the waiter's Lock
	st0    *mlock.Status // the server's, the waiter queued
}

// queueBehind starts a server with the session grace, a holder of res and
// a waiter (made by waiter, given the proxy's address) that asks for res
// with o, and returns once the waiter is queued.
func queueBehind(t *testing.T, grace time.Duration, res string, waiter func(addr string) *mlock.Client, o *mlock.LockOptions) queued {
	t.Helper()
	addr, _ := startServer(t, server.Config{SessionGrace: grace}, "")
	q := queued{holder: client(t, addr, quietOptions), px: newProxy(t, addr)}
	w := waiter(q.px.addr())
	ctx := ctxT(t)
	var err error
	if q.h, err = q.holder.Lock(ctx, res, &mlock.LockOptions{TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	q.g = lockAsync(ctx, w, res, o)
	waitQueue(t, q.holder, res, 2)
	if q.st0, err = q.holder.Status(ctx); err != nil {
		t.Fatal(err)
	}
	return q
}

// A grant whose lease ran out on the server before it arrived (the path
// back held it for longer than the ttl) is not handed over as a lost lock:
// its confirmation finds it gone, and the request is asked again, then
// granted.
func TestGrantGoneBeforeArrivalIsAskedAgain(t *testing.T) {
	t.Parallel()
	const ttl = 300 * time.Millisecond
	ctx := ctxT(t)
	q := queueBehind(t, 10*time.Second, "gone", func(addr string) *mlock.Client { return client(t, addr, mlock.Options{}) },
		&mlock.LockOptions{TTL: ttl, Timeout: 9 * time.Second})
	holder, h, p, g, st0 := q.holder, q.h, q.px, q.g, q.st0
	// Held back until the 300 ms lease has ended on the server (the
	// waiter's unanswered pings give up only after a second).
	resume := p.pause()
	if err := h.Unlock(ctx); err != nil {
		resume()
		t.Fatal(err)
	}
	proctest.WaitFor(t, 5*time.Second, "the grant's lease ends on the server", func() bool {
		st, err := holder.Status(ctx)
		return err == nil && st.ExpiredCount > st0.ExpiredCount
	})
	resume()
	got := <-g
	if got.err != nil {
		t.Fatal(got.err)
	}
	if left := got.l.Deadline().Sub(got.at); left < lease.MinUsable(ttl) {
		t.Fatalf("handed over with %v left to believe, want at least %v", left, lease.MinUsable(ttl))
	}
	st1, err := holder.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st1.ExpiredCount == st0.ExpiredCount || st1.ExtendFailedCount == st0.ExtendFailedCount {
		t.Fatalf("expired %d, failed extends %d: the first grant should have ended unconfirmed",
			st1.ExpiredCount-st0.ExpiredCount, st1.ExtendFailedCount-st0.ExtendFailedCount)
	}
	if st1.LockCount-st0.LockCount != 1 {
		t.Fatalf("%d lock requests, want 1: the request asked again", st1.LockCount-st0.LockCount)
	}
	if err := got.l.Unlock(ctx); err != nil {
		t.Fatalf("unlock: %v", err)
	}
}
