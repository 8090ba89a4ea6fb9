package mlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/internal/lease"
	"github.com/mlock-dev/mlock/internal/proctest"
	"github.com/mlock-dev/mlock/server"
)

// The safety rule's arithmetic on a fake clock: the server is real (its
// leases and grace long enough never to end during a test), the client's
// time moves only when the test moves it, so every bound is asserted to
// the nanosecond and nothing waits for time to pass.

// fakeClient is client with a fake clock: its session is its own.
func fakeClient(t *testing.T, addr string, o mlock.Options) (*mlock.Client, *mlock.FakeClock) {
	t.Helper()
	fc := mlock.NewFakeClock()
	return client(t, addr, mlock.WithClock(o, fc)), fc
}

// settle waits until fc's pinger waits for the clock: a ping the last
// Advance made due has been sent and answered.
func settle(t *testing.T, fc *mlock.FakeClock) {
	t.Helper()
	proctest.WaitFor(t, 10*time.Second, "the pinger settles", fc.Idle)
}

// step advances fc by d, in steps of every, settling after each.
func step(t *testing.T, fc *mlock.FakeClock, d, every time.Duration) {
	t.Helper()
	for left := d; left > 0; left -= every {
		fc.Advance(min(every, left))
		settle(t, fc)
	}
}

// quietOptions ping only when the test's fake clock says so: the real-time
// sessions of a test (a holder, an admin) send nothing of their own.
var quietOptions = mlock.Options{PingInterval: time.Hour}

// pingsOf returns the frames the server read between two statuses, less
// the second status.
func pingsOf(st0, st1 *mlock.Status) int64 { return int64(st1.FramesIn-st0.FramesIn) - 1 }

// A held lock is believed to its Deadline, base + ttl - Margin(ttl) with
// base the send time of the request that granted or renewed it, and lost at
// that instant: not a nanosecond before, not a nanosecond after.
func TestFakeClockDeadlineOfTheLease(t *testing.T) {
	t.Parallel()
	addr, _ := startServer(t, server.Config{SessionGrace: 10 * time.Minute}, "")
	c, fc := fakeClient(t, addr, mlock.Options{})
	ctx := ctxT(t)
	const ttl = time.Minute
	sent := fc.Now()
	l, err := c.Lock(ctx, "fdl", &mlock.LockOptions{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	want := sent.Add(ttl - lease.Margin(ttl))
	if d := l.Deadline(); !d.Equal(want) {
		t.Fatalf("Deadline %v after the send, want %v", d.Sub(sent), want.Sub(sent))
	}

	// An Extend moves the lease to its own send time + ttl.
	fc.Advance(10 * time.Second)
	settle(t, fc)
	const ttl2 = 2 * time.Minute
	sent = fc.Now()
	if _, err := l.Extend(ctx, ttl2); err != nil {
		t.Fatal(err)
	}
	want = sent.Add(ttl2 - lease.Margin(ttl2))
	if d := l.Deadline(); !d.Equal(want) {
		t.Fatalf("Deadline %v after the Extend was sent, want %v", d.Sub(sent), want.Sub(sent))
	}

	step(t, fc, want.Sub(fc.Now())-time.Nanosecond, 10*time.Second)
	select {
	case <-l.Lost():
		t.Fatalf("lost %v before its Deadline: %v", want.Sub(fc.Now()), l.Err())
	default:
	}
	fc.Advance(time.Nanosecond) // the Deadline: given up
	select {
	case <-l.Lost():
	default:
		t.Fatalf("still held %v before its Deadline", want.Sub(fc.Now()))
	}
	if err := l.Err(); !errors.Is(err, mlock.ErrLost) || !errors.Is(err, mlock.ErrExpired) {
		t.Fatalf("Err = %v, want the lease's end", err)
	}
	if !l.Deadline().IsZero() {
		t.Fatal("a lost lock has a Deadline")
	}
}

// Two held locks whose Deadlines are less than a millisecond apart are lost
// each at its own Deadline: when the first one's passes, the second is still
// held. A lost lock is given back to the server at once, and the server
// grants it to the next waiter: not before the Deadline its holder was
// told. (The session's timer once lost every lock due within a
// millisecond of the one it fired for, and a waiter was granted the second
// lock before its holder's Deadline.)
func TestFakeClockLocksDueTogetherAreLostEachAtItsDeadline(t *testing.T) {
	t.Parallel()
	addr, _ := startServer(t, server.Config{SessionGrace: 10 * time.Minute}, "")
	c, fc := fakeClient(t, addr, mlock.Options{})
	ctx := ctxT(t)
	const ttl1, ttl2 = time.Minute, time.Minute + time.Millisecond
	sent := fc.Now() // both requests: the fake clock does not move between them
	l1, err := c.Lock(ctx, "due-1", &mlock.LockOptions{TTL: ttl1})
	if err != nil {
		t.Fatal(err)
	}
	l2, err := c.Lock(ctx, "due-2", &mlock.LockOptions{TTL: ttl2})
	if err != nil {
		t.Fatal(err)
	}
	d1, d2 := sent.Add(ttl1-lease.Margin(ttl1)), sent.Add(ttl2-lease.Margin(ttl2))
	if !l1.Deadline().Equal(d1) || !l2.Deadline().Equal(d2) {
		t.Fatalf("Deadlines %v and %v after the send, want %v and %v", l1.Deadline().Sub(sent), l2.Deadline().Sub(sent),
			d1.Sub(sent), d2.Sub(sent))
	}
	if gap := d2.Sub(d1); gap <= 0 || gap >= time.Millisecond {
		t.Fatalf("the Deadlines are %v apart, want less than a millisecond", gap)
	}
	step(t, fc, d1.Sub(fc.Now()), 10*time.Second) // to the first Deadline
	select {
	case <-l1.Lost():
	default:
		t.Fatal("the first lock is still held at its Deadline")
	}
	select {
	case <-l2.Lost():
		t.Fatalf("the second lock was lost %v before its Deadline: %v", d2.Sub(fc.Now()), l2.Err())
	default:
	}
	if d := l2.Deadline(); !d.Equal(d2) {
		t.Fatalf("the second lock's Deadline is %v after the send, want %v", d.Sub(sent), d2.Sub(sent))
	}
	fc.Advance(d2.Sub(fc.Now())) // the second Deadline
	select {
	case <-l2.Lost():
	default:
		t.Fatal("the second lock is still held at its Deadline")
	}
	if err := l2.Err(); !errors.Is(err, mlock.ErrExpired) {
		t.Fatalf("Err = %v, want the lease's end", err)
	}
}

// A session left unanswered for its grace (less the grace's margin) loses
// its locks, however long their leases: the server may have dropped the
// session.
func TestFakeClockSessionGraceBoundsTheDeadline(t *testing.T) {
	t.Parallel()
	const grace = 2 * time.Minute
	addr, _ := startServer(t, server.Config{SessionGrace: grace}, "")
	px := newProxy(t, addr)
	c, fc := fakeClient(t, px.addr(), mlock.Options{})
	ctx := ctxT(t)
	sent := fc.Now()
	l, err := c.Lock(ctx, "fgr", &mlock.LockOptions{TTL: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if g, ok := c.SessionGrace(); !ok || g != grace {
		t.Fatalf("SessionGrace = %v, %v", g, ok)
	}
	want := sent.Add(grace - lease.Margin(grace)) // the lock's answer was the last
	if d := l.Deadline(); !d.Equal(want) {
		t.Fatalf("Deadline %v after the send, want the grace's end %v", d.Sub(sent), want.Sub(sent))
	}
	resume := px.pause() // nothing is answered from now on
	defer resume()
	fc.Advance(want.Sub(fc.Now()) - time.Nanosecond)
	if err := l.Err(); err != nil {
		t.Fatalf("lost before the grace's end: %v", err)
	}
	fc.Advance(time.Nanosecond)
	if err := l.Err(); !errors.Is(err, mlock.ErrLost) || !errors.Is(err, mlock.ErrSessionLost) {
		t.Fatalf("Err = %v at the grace's end, want the session's loss", err)
	}
}

// An idle client holding one lock keeps its session answered: it pings
// every third of the shorter of the grace and the ttl, no more often, and
// once it holds nothing it goes back to Options.PingInterval.
func TestFakeClockKeepAliveOfAnIdleHolder(t *testing.T) {
	t.Parallel()
	const grace = 600 * time.Millisecond // a ping every 200 ms
	addr, _ := startServer(t, server.Config{SessionGrace: grace}, "")
	c, fc := fakeClient(t, addr, mlock.Options{})
	admin := client(t, "localhost:"+strings.Split(addr, ":")[1], quietOptions)
	ctx := ctxT(t)
	l, err := c.Lock(ctx, "idle", &mlock.LockOptions{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	settle(t, fc)
	st0, err := admin.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const span = 2 * time.Second
	step(t, fc, span, 50*time.Millisecond)
	st1, err := admin.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if pings, want := pingsOf(st0, st1), int64(span/(grace/3)); pings != want {
		t.Fatalf("%d pings in %v, want %d (one every %v)", pings, span, want, grace/3)
	}
	if l.Err() != nil {
		t.Fatalf("the idle holder lost its lock: %v", l.Err())
	}
	// Without locks the client goes back to Options.PingInterval (20 s):
	// the period in force (200 ms) passes, then nothing for 19 s.
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	step(t, fc, grace/3, 50*time.Millisecond)
	st0, _ = admin.Status(ctx)
	step(t, fc, 19*time.Second, 500*time.Millisecond)
	st1, _ = admin.Status(ctx)
	if n := pingsOf(st0, st1); n > 0 {
		t.Fatalf("%d pings in 19 s without locks", n)
	}
}

// A session that only waits is answered every quarter of the ttl it waits
// for, so that a grant after a wait far longer than the ttl arrives usable
// (its lease counts from the last answer read before it) without a
// confirming round trip; and it pings no more often than that.
func TestFakeClockGrantAfterALongWaitIsUsable(t *testing.T) {
	t.Parallel()
	const ttl = time.Minute
	addr, _ := startServer(t, server.Config{SessionGrace: time.Hour}, "")
	port := strings.Split(addr, ":")[1]
	holder := client(t, addr, quietOptions)
	waiter, fc := fakeClient(t, "localhost:"+port, mlock.Options{})
	admin := client(t, newProxy(t, addr).addr(), quietOptions)
	ctx := ctxT(t)
	h, err := holder.Lock(ctx, "hot", &mlock.LockOptions{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	g := lockAsync(ctx, waiter, "hot", &mlock.LockOptions{TTL: ttl, Timeout: time.Hour})
	waitQueue(t, admin, "hot", 2)
	settle(t, fc)
	st0, err := admin.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const wait = 3 * ttl
	step(t, fc, wait, ttl/8)
	// The pinger rearms its timer once its ping is written: the server may
	// read the last one after a status asked on another connection. Asked
	// again until it has (each status is a frame too).
	want := int64(wait / (ttl / 4))
	var st1 *mlock.Status
	var pings int64
	for polls := int64(1); ; polls++ {
		if st1, err = admin.Status(ctx); err != nil {
			t.Fatal(err)
		}
		if pings = pingsOf(st0, st1) - (polls - 1); pings >= want || polls == 100 {
			break
		}
		time.Sleep(10 * time.Millisecond) // poll interval: the server's frame count has no event
	}
	if pings != want {
		t.Fatalf("%d pings from the waiting session in %v, want %d (one every ttl/4)", pings, wait, want)
	}
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	got := <-g
	if got.err != nil {
		t.Fatal(got.err)
	}
	// The last ping was answered now: the whole lease is left to believe.
	left := got.l.Deadline().Sub(fc.Now())
	if want := ttl - lease.Margin(ttl); left != want {
		t.Fatalf("granted after %v with %v left to believe, want %v", wait, left, want)
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

// A grant that arrives stale (the path from the server held it back for
// longer than the keep-alive period) is confirmed with one extend before it
// is handed over: its lease then counts from the confirmation's send time.
func TestFakeClockStaleGrantIsConfirmed(t *testing.T) {
	t.Parallel()
	const ttl = time.Minute
	ctx := ctxT(t)
	var fc *mlock.FakeClock
	q := queueBehind(t, time.Hour, "stale", func(addr string) (c *mlock.Client) { c, fc = fakeClient(t, addr, mlock.Options{}); return c },
		&mlock.LockOptions{TTL: ttl, Timeout: time.Hour})
	holder, h, px, g, st0 := q.holder, q.h, q.px, q.g, q.st0
	settle(t, fc)
	// The grant is pushed while the path back to the waiter is held, then
	// half its ttl passes: it arrives with less than lease.MinUsable to believe.
	resume := px.pause()
	if err := h.Unlock(ctx); err != nil {
		resume()
		t.Fatal(err)
	}
	waitQueue(t, holder, "stale", 1) // granted on the server
	fc.Advance(ttl / 2)
	confirmed := fc.Now() // the confirmation is sent at this time
	resume()
	got := <-g
	if got.err != nil {
		t.Fatal(got.err)
	}
	want := confirmed.Add(ttl - lease.Margin(ttl))
	if d := got.l.Deadline(); !d.Equal(want) {
		t.Fatalf("handed over with %v left to believe, want %v (from the confirmation)", d.Sub(fc.Now()), want.Sub(fc.Now()))
	}
	if left := got.l.Deadline().Sub(fc.Now()); left < lease.MinUsable(ttl) {
		t.Fatalf("handed over with %v left to believe, want at least %v", left, lease.MinUsable(ttl))
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

// Renew by owner moves the lease of the handle that holds exactly that set
// (in any order) to the renewal's send time + its ttl.
func TestFakeClockRenewMovesTheHandle(t *testing.T) {
	t.Parallel()
	addr, _ := startServer(t, server.Config{SessionGrace: time.Hour}, "")
	c, fc := fakeClient(t, addr, mlock.Options{})
	ctx := ctxT(t)
	const ttl = time.Minute
	l, err := c.Lock(ctx, "ma|mb", &mlock.LockOptions{Owner: "w", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	step(t, fc, 10*time.Second, 5*time.Second)
	const ttl2 = 3 * time.Minute
	sent := fc.Now()
	if _, _, err := c.Renew(ctx, "w", []string{"mb", "ma"}, ttl2); err != nil {
		t.Fatal(err)
	}
	want := sent.Add(ttl2 - lease.Margin(ttl2))
	if d := l.Deadline(); !d.Equal(want) {
		t.Fatalf("Deadline %v after the Renew was sent, want %v", d.Sub(sent), want.Sub(sent))
	}
	step(t, fc, 2*ttl, 10*time.Second) // past the first lease
	if err := l.Err(); err != nil {
		t.Fatalf("lost after a renewal: %v", err)
	}
	if _, err := l.Extend(ctx, 0); err != nil {
		t.Fatalf("the handle still holds the lock: %v", err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// Do (and Hold) count the lease on the session's clock, as the lock's
// Deadline is: as the fake clock runs past several ttls, the renewals, due
// on that clock, keep the lock and the job is not cancelled.
func TestFakeClockDoCountsTheLeaseOnTheSessionClock(t *testing.T) {
	t.Parallel()
	addr, _ := startServer(t, server.Config{SessionGrace: 10 * time.Minute}, "")
	c, fc := fakeClient(t, addr, mlock.Options{})
	ctx := ctxT(t)
	const ttl = time.Minute
	running, stop := make(chan context.Context, 1), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- c.Do(ctx, "fdo", &mlock.LockOptions{TTL: ttl}, func(jctx context.Context) error {
			running <- jctx
			select {
			case <-jctx.Done():
				return context.Cause(jctx)
			case <-stop:
				return nil
			}
		})
	}()
	var jctx context.Context
	select {
	case jctx = <-running:
	case err := <-done:
		t.Fatalf("Do: %v", err)
	}
	step(t, fc, 3*ttl, 5*time.Second) // renewals every ttl/3, on the fake clock
	if err := context.Cause(jctx); err != nil {
		t.Fatalf("the job was cancelled while the fake clock ran: %v", err)
	}
	close(stop)
	if err := <-done; err != nil {
		t.Fatalf("Do: %v", err)
	}
}
