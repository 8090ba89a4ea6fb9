package mlock_test

import (
	"strings"
	"testing"
	"time"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/internal/lease"
	"github.com/mlock-dev/mlock/server"
)

// minUsable is the client's promise for every grant it hands over: at
// least two thirds of the ttl less its drift margin left to believe.
func minUsable(ttl time.Duration) time.Duration { return (ttl - lease.Margin(ttl)) / 3 * 2 }

// A session that only waits is answered at least every quarter of the ttl
// it waits for, so that a grant after a wait far longer than the ttl
// arrives usable (its lease counts from the last answer read before it),
// without a confirming round trip; and it pings no more often than that.
func TestGrantAfterALongWaitIsUsable(t *testing.T) {
	const ttl = time.Second
	addr, _ := startServer(t, server.Config{SessionGrace: 10 * time.Second}, "")
	port := strings.Split(addr, ":")[1]
	holder := client(t, addr, mlock.Options{})
	waiter := client(t, "localhost:"+port, mlock.Options{})       // another session
	admin := client(t, newProxy(t, addr).addr(), mlock.Options{}) // a third, for status
	ctx := ctxT(t)
	h, err := holder.Lock(ctx, "hot", &mlock.LockOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	g := lockAsync(ctx, waiter, "hot", &mlock.LockOptions{TTL: ttl, Timeout: 9 * time.Second})
	waitQueue(t, admin, "hot", 2)
	st0, err := admin.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const wait = 3 * ttl
	time.Sleep(wait) // the waiter's wait, three times its ttl
	st1, err := admin.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Frames in: the waiter's pings, at most one ping of the holder (its
	// keep-alive period is a third of the 10 s grace) and the second status.
	pings := int64(st1.FramesIn-st0.FramesIn) - 1
	t.Logf("a waiting session with ttl %v: %d frames in %v (%.1f/s)", ttl, pings, wait, float64(pings)/wait.Seconds())
	if want := int64(wait / (ttl / 4)); pings < want/2 || pings > want+2 {
		t.Fatalf("%d frames from the waiting sessions in %v, want about %d (a ping every ttl/4)", pings, wait, want)
	}
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	got := <-g
	if got.err != nil {
		t.Fatal(got.err)
	}
	left := got.l.Deadline().Sub(got.at)
	t.Logf("granted after %v with %v left to believe", wait, left)
	if left < minUsable(ttl) {
		t.Fatalf("granted with %v left to believe, want at least %v", left, minUsable(ttl))
	}
	if err := got.l.Unlock(ctx); err != nil {
		t.Fatalf("unlock of the grant: %v", err)
	}
	st2, err := admin.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st2.ExtendCount != st1.ExtendCount {
		t.Fatalf("%d extends: a fresh grant was confirmed", st2.ExtendCount-st1.ExtendCount)
	}
}

// A grant that arrives stale (the path from the server held it back longer
// than the keep-alive period) is confirmed with one extend before it is
// handed over: the caller gets a lock it can use, not one that is lost on
// arrival or about to be.
func TestStaleGrantIsConfirmedBeforeItIsHandedOver(t *testing.T) {
	const ttl = time.Second
	addr, _ := startServer(t, server.Config{SessionGrace: 10 * time.Second}, "")
	holder := client(t, addr, mlock.Options{})
	p := newProxy(t, addr)
	waiter := client(t, p.addr(), mlock.Options{})
	ctx := ctxT(t)
	h, err := holder.Lock(ctx, "stale", &mlock.LockOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	g := lockAsync(ctx, waiter, "stale", &mlock.LockOptions{TTL: ttl, Timeout: 9 * time.Second})
	waitQueue(t, holder, "stale", 2)
	st0, err := holder.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The grant is pushed while the path back to the waiter is held for
	// 700 ms (less than the second after which the waiter gives up on an
	// unanswered ping): it arrives with about 285 ms of its lease left.
	resume := p.pause()
	unlocked := time.Now()
	if err := h.Unlock(ctx); err != nil {
		resume()
		t.Fatal(err)
	}
	time.Sleep(700*time.Millisecond - time.Since(unlocked))
	resume()
	got := <-g
	if got.err != nil {
		t.Fatal(got.err)
	}
	left := got.l.Deadline().Sub(got.at)
	t.Logf("a grant held back %v arrived; handed over with %v left to believe", got.at.Sub(unlocked).Round(time.Millisecond), left)
	if left < minUsable(ttl) {
		t.Fatalf("handed over with %v left to believe, want at least %v", left, minUsable(ttl))
	}
	if err := got.l.Err(); err != nil {
		t.Fatalf("the grant is lost: %v", err)
	}
	st1, err := holder.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := st1.ExtendCount - st0.ExtendCount; n != 1 {
		t.Fatalf("%d extends, want 1: the confirmation", n)
	}
	if err := got.l.Unlock(ctx); err != nil {
		t.Fatalf("unlock of the confirmed grant: %v", err)
	}
}

// A grant whose lease ran out on the server before it arrived (the path
// back held it for longer than the ttl) is not handed over as a lost lock:
// its confirmation finds it gone, and the request is asked again, then
// granted.
func TestGrantGoneBeforeArrivalIsAskedAgain(t *testing.T) {
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
	// Held back 600 ms: the 300 ms lease ends on the server first (the
	// waiter's unanswered pings give up only after a second).
	resume := p.pause()
	if err := h.Unlock(ctx); err != nil {
		resume()
		t.Fatal(err)
	}
	time.Sleep(600 * time.Millisecond)
	resume()
	got := <-g
	if got.err != nil {
		t.Fatal(got.err)
	}
	if left := got.l.Deadline().Sub(got.at); left < minUsable(ttl) {
		t.Fatalf("handed over with %v left to believe, want at least %v", left, minUsable(ttl))
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
