package mlock_test

import (
	"testing"
	"time"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/internal/lease"
	"github.com/mlock-dev/mlock/internal/proctest"
	"github.com/mlock-dev/mlock/server"
)

// A grant whose lease ran out on the server before it arrived (the path
// back held it for longer than the ttl) is not handed over as a lost lock:
// its confirmation finds it gone, and the request is asked again, then
// granted.
func TestGrantGoneBeforeArrivalIsAskedAgain(t *testing.T) {
	t.Parallel()
	const ttl = 300 * time.Millisecond
	addr, _ := startServer(t, server.Config{SessionGrace: 10 * time.Second}, "")
	holder := client(t, addr, mlock.Options{})
	p := newProxy(t, addr)
	waiter := client(t, p.addr(), mlock.Options{})
	ctx := ctxT(t)
	h, err := holder.Lock(ctx, "gone", &mlock.LockOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	g := lockAsync(ctx, waiter, "gone", &mlock.LockOptions{TTL: ttl, Timeout: 9 * time.Second})
	waitQueue(t, holder, "gone", 2)
	st0, err := holder.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
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
