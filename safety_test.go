package mlock_test

import (
	"bufio"
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/internal/proctest"
	"github.com/mlock-dev/mlock/internal/protocol"
	"github.com/mlock-dev/mlock/server"
)

// closedAt returns a channel that receives when ch closes.
func closedAt(ch <-chan struct{}) <-chan time.Time {
	at := make(chan time.Time, 1)
	go func() { <-ch; at <- time.Now() }()
	return at
}

// grantedAt runs Lock in the background and reports when it returned.
type grant struct {
	l   *mlock.Lock
	err error
	at  time.Time
}

func lockAsync(ctx context.Context, c *mlock.Client, res string, o *mlock.LockOptions) <-chan grant {
	ch := make(chan grant, 1)
	go func() {
		l, err := c.Lock(ctx, res, o)
		ch <- grant{l, err, time.Now()}
	}()
	return ch
}

// (a) A blackholed path: the holder's requests no longer reach the server.
// The holder must learn that its lock is lost before the server's lease ends
// and the waiter is granted.
func TestBlackholedHolderLosesBeforeTheServerGrants(t *testing.T) {
	t.Parallel()
	addr, _ := startServer(t, server.Config{}, "")
	px := newProxy(t, addr)
	holder := client(t, px.addr(), mlock.Options{MaxBackoff: 100 * time.Millisecond})
	waiter := client(t, addr, mlock.Options{})
	ctx := ctxT(t)
	l, err := holder.Lock(ctx, "bh", &mlock.LockOptions{TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	lostAt := closedAt(l.Lost())
	cancelled := make(chan time.Time, 1)
	jobCtx := make(chan context.Context, 1)
	done := make(chan error, 1)
	go func() {
		done <- holder.Hold(ctx, l, func(ctx context.Context) error {
			jobCtx <- ctx
			<-ctx.Done()
			cancelled <- time.Now()
			return context.Cause(ctx)
		})
	}()
	job := <-jobCtx
	g := lockAsync(ctx, waiter, "bh", nil)
	waitQueue(t, waiter, "bh", 2)
	d0 := l.Deadline()
	proctest.WaitFor(t, 5*time.Second, "the holder extends", func() bool { return l.Deadline().After(d0) })
	px.drop.Store(true)
	blackholed := time.Now()

	got := <-g
	if got.err != nil {
		t.Fatal(got.err)
	}
	defer got.l.Unlock(ctx)
	// Checked when the waiter is granted: the holder's belief, not when a
	// goroutine got to record it. A holder believes its lock until its
	// Deadline; the loss is then noted by a timer that a loaded machine
	// may run some milliseconds late, so the Deadline is the bound checked.
	if l.Err() == nil && l.Deadline().After(got.at) {
		t.Fatalf("the waiter was granted %v after the blackhole; the holder believes it holds the lock for %v more",
			got.at.Sub(blackholed), l.Deadline().Sub(got.at))
	}
	if job.Err() == nil && l.Deadline().After(got.at) {
		t.Fatal("the holder's job was still running, within its Deadline, when the waiter was granted")
	}
	lost, stopped := <-lostAt, <-cancelled
	t.Logf("after the blackhole: holder lost at %v, job stopped at %v, waiter granted at %v",
		lost.Sub(blackholed), stopped.Sub(blackholed), got.at.Sub(blackholed))
	if err := <-done; !errors.Is(err, mlock.ErrLost) || !errors.Is(err, mlock.ErrExpired) {
		t.Fatalf("Hold = %v, want the lease's loss", err)
	}
	// The server frees the lock when the lease ends: the waiter is granted
	// then, not a ttl or a grace later (a bound of seconds: the machine may
	// be busy).
	if got.at.Sub(blackholed) > 5*time.Second {
		t.Fatalf("the server granted the waiter %v after the blackhole: the lease was 1 s", got.at.Sub(blackholed))
	}
}

// (b) The connection is down longer than the server's session grace: the
// holder must give its lock up before the server drops the session and
// grants the waiter, although its lease is much longer.
func TestOutageLongerThanTheGrace(t *testing.T) {
	t.Parallel()
	addr, _ := startServer(t, server.Config{SessionGrace: time.Second}, "")
	px := newProxy(t, addr)
	holder := client(t, px.addr(), mlock.Options{MaxBackoff: 100 * time.Millisecond})
	waiter := client(t, addr, mlock.Options{})
	ctx := ctxT(t)
	l, err := holder.Lock(ctx, "og", &mlock.LockOptions{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	lostAt := closedAt(l.Lost())
	g := lockAsync(ctx, waiter, "og", nil)
	waitQueue(t, waiter, "og", 2)
	px.drop.Store(true) // the holder's reconnections do not get through
	px.cut()
	cut := time.Now()

	got := <-g
	if got.err != nil {
		t.Fatal(got.err)
	}
	defer got.l.Unlock(ctx)
	// The holder's belief at the grant: its Deadline (the loss's timer
	// may run some milliseconds late on a loaded machine).
	if l.Err() == nil && l.Deadline().After(got.at) {
		t.Fatalf("the server dropped the session and granted the waiter %v after the cut; the holder believes for %v more",
			got.at.Sub(cut), l.Deadline().Sub(got.at))
	}
	lost := <-lostAt
	t.Logf("after the cut: holder lost at %v, waiter granted at %v", lost.Sub(cut), got.at.Sub(cut))
	if err := l.Err(); !errors.Is(err, mlock.ErrLost) || !errors.Is(err, mlock.ErrSessionLost) {
		t.Fatalf("Err = %v, want the session's loss", err)
	}
	if got.at.Sub(cut) > 3*time.Second {
		t.Fatalf("the waiter was granted %v after the cut: the grace was 1 s", got.at.Sub(cut))
	}
}

// (c) The server crashes and restarts with empty state while the client
// holds one lock and waits for another: the held lock is reported lost, the
// waiting request is asked again and granted by the new server.
func TestServerRestartUnderHeldAndWaitingLocks(t *testing.T) {
	cfg := server.Config{}
	addr, stop := startServer(t, cfg, "")
	px := newProxy(t, addr)
	c := client(t, px.addr(), mlock.Options{MaxBackoff: 100 * time.Millisecond, DialTimeout: 500 * time.Millisecond})
	other := client(t, addr, mlock.Options{})
	ctx := ctxT(t)
	held, err := c.Lock(ctx, "r1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Lock(ctx, "r2", nil); err != nil {
		t.Fatal(err)
	}
	g := lockAsync(ctx, c, "r2", &mlock.LockOptions{Timeout: time.Minute})
	waitQueue(t, other, "r2", 2)

	// A crash as the client sees it: it hears nothing of the shutdown.
	px.drop.Store(true)
	px.cut()
	stop()
	startServer(t, cfg, addr) // same address, empty state
	px.drop.Store(false)

	select {
	case <-held.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("held lock not reported lost after the restart")
	}
	var me *mlock.Error
	if err := held.Err(); !errors.As(err, &me) || me.Type != mlock.TypeLost || !errors.Is(err, mlock.ErrSessionLost) ||
		me.Msg != "session lost" {
		t.Fatalf("held: %v", err)
	}
	got := <-g
	if got.err != nil {
		t.Fatalf("the waiting request was not asked again: %v", got.err)
	}
	if got.l.Token() == 0 || got.l.Err() != nil {
		t.Fatalf("re-asked lock: token %d, err %v", got.l.Token(), got.l.Err())
	}
	if err := got.l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// The client works again.
	l, err := c.Lock(ctx, "r1", nil)
	if err != nil {
		t.Fatal(err)
	}
	l.Unlock(ctx)
}

// (e) A server shutting down cleanly tells its holders: they are lost at
// once, and a waiting request is asked again of the next server.
func TestShutdownLosesHeldLocksAndReasksWaiters(t *testing.T) {
	cfg := server.Config{}
	addr, stop := startServer(t, cfg, "")
	c := client(t, addr, mlock.Options{MaxBackoff: 100 * time.Millisecond})
	other := client(t, "localhost:"+strings.Split(addr, ":")[1], mlock.Options{MaxBackoff: 100 * time.Millisecond})
	ctx := ctxT(t)
	held, err := c.Lock(ctx, "s1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Lock(ctx, "s2", nil); err != nil {
		t.Fatal(err)
	}
	g := lockAsync(ctx, c, "s2", nil)
	waitQueue(t, other, "s2", 2)
	lostAt := closedAt(held.Lost())
	stop()
	stopped := time.Now()
	select {
	case at := <-lostAt:
		t.Logf("held lock lost %v after Shutdown returned", at.Sub(stopped))
	case <-time.After(time.Second):
		t.Fatal("a clean shutdown did not tell the holder")
	}
	// The server pushed the expiry (for 1.0 clients) before its shutdown
	// error; either is the loss.
	if err := held.Err(); !errors.Is(err, mlock.ErrLost) ||
		!(errors.Is(err, mlock.ErrExpired) || errors.Is(err, mlock.ErrSessionLost)) {
		t.Fatalf("held: %v", err)
	}
	t.Logf("held: %v", held.Err())
	startServer(t, cfg, addr)
	got := <-g
	if got.err != nil {
		t.Fatalf("the waiting request was not asked again: %v", got.err)
	}
	got.l.Unlock(ctx)
}

// fakeServer accepts one connection at a time and hands it to fn.
func fakeServer(t *testing.T, fn func(c net.Conn, r *bufio.Reader)) string {
	ln, err := listenFresh(t)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fn(c, bufio.NewReader(c))
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}

// listenFresh listens on a loopback port this test binary has not used
// before (proctest.FreeAddr), not on port 0: the client keeps one session
// per address and reconnects to it for as long as it is open, so a port
// the kernel handed out again (a dead address of one test, a closed fake
// server of another) would join one test's client to another's server;
// on a busy machine, where the tests overlap longer, it did.
func listenFresh(t testing.TB) (net.Listener, error) {
	t.Helper()
	var err error
	for range 10 {
		var ln net.Listener
		if ln, err = net.Listen("tcp", proctest.FreeAddr(t)); err == nil {
			return ln, nil
		}
	}
	return nil, err
}

// readCommand reads one command frame and splits it into fields.
func readCommand(r *bufio.Reader) ([]string, error) {
	p, err := protocol.ReadFrame(r, nil, protocol.MaxFrameLimit)
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(p)), nil
}

// An Extend whose answer arrives after the lock was lost (its Deadline
// passed while the answer was on its way, and the client gave the lock up)
// reports the loss: the lock is not held, whatever the server answered.
func TestExtendAnsweredAfterTheLossReportsIt(t *testing.T) {
	t.Parallel()
	addr, _ := startServer(t, server.Config{SessionGrace: 5 * time.Second}, "")
	px := newProxy(t, addr)
	c := client(t, px.addr(), mlock.Options{})
	ctx := ctxT(t)
	l, err := c.Lock(ctx, "late-extend", &mlock.LockOptions{TTL: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	resume := px.pause() // the server's answers wait
	errc := make(chan error, 1)
	go func() { _, err := l.Extend(ctx, time.Minute); errc <- err }()
	select {
	case <-l.Lost(): // the Deadline passed: given up
	case <-time.After(5 * time.Second):
		resume()
		t.Fatal("the lock was not lost at its Deadline")
	}
	resume()
	if err := <-errc; !errors.Is(err, mlock.ErrLost) {
		t.Fatalf("Extend answered after the loss = %v, want the loss", err)
	}
	if !l.Deadline().IsZero() {
		t.Fatalf("Deadline %v after the loss", l.Deadline())
	}
}

// A renewal of a held lock to a shorter lease (Extend, an owner's re-entry,
// Renew by owner) whose answer never arrives (lost with the connection, or
// given up through its context) may have been applied: the Deadline is
// bounded by it at once, so the holder never believes the lock held after
// the server may have freed it.
func TestUnansweredShorteningRenewalBoundsTheDeadline(t *testing.T) {
	t.Parallel()
	const short = 500 * time.Millisecond
	for _, how := range []string{"extend", "reentry", "renew"} {
		t.Run(how, func(t *testing.T) {
			addr, _ := startServer(t, server.Config{}, "")
			px := newProxy(t, addr)
			c := client(t, px.addr(), mlock.Options{})
			other := client(t, addr, mlock.Options{})
			ctx := ctxT(t)
			res := "shorten-" + how
			l, err := c.Lock(ctx, res, &mlock.LockOptions{TTL: time.Minute, Owner: "o"})
			if err != nil {
				t.Fatal(err)
			}
			px.dropBack.Store(true) // the answer is lost
			start := time.Now()
			rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			switch how {
			case "extend":
				_, err = l.Extend(rctx, short)
			case "reentry":
				_, err = c.Lock(rctx, res, &mlock.LockOptions{TTL: short, Owner: "o"})
			case "renew":
				_, _, err = c.Renew(rctx, "o", []string{res}, short)
			}
			cancel()
			if err == nil {
				t.Fatal("the renewal was answered")
			}
			px.dropBack.Store(false)
			if d := l.Deadline(); d.After(start.Add(short)) {
				t.Errorf("Deadline %v after the renewal was sent, beyond its ttl", d.Sub(start))
			}
			tl, err := other.Lock(ctx, res, nil) // the server freed it after the shortened lease
			if err != nil {
				t.Fatal(err)
			}
			defer tl.Unlock(ctx)
			if d := l.Deadline(); d.After(time.Now()) {
				t.Fatalf("another client holds the lock; its first holder believes it for %v more", time.Until(d))
			}
		})
	}
}

// A Release or ReleaseAll whose answer never arrives (lost with the
// connection, or given up through its context) may have freed the session's
// own held locks, and the server's word of it is lost too: the handles it
// may have freed are lost at once (and given back), their holders do not
// go on believing them held. (An eviction keeps the lock for the session
// grace, which bounds the holder's belief.)
func TestUnansweredReleaseLosesTheHandles(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"release", "releaseall"} {
		t.Run(how, func(t *testing.T) {
			addr, _ := startServer(t, server.Config{}, "")
			px := newProxy(t, addr)
			c := client(t, px.addr(), mlock.Options{})
			other := client(t, addr, mlock.Options{})
			ctx := ctxT(t)
			res := "release-" + how
			l, err := c.Lock(ctx, res+"|"+res+"-b", &mlock.LockOptions{TTL: time.Minute, Owner: "o"})
			if err != nil {
				t.Fatal(err)
			}
			kept, err := c.Lock(ctx, "kept-"+how, &mlock.LockOptions{TTL: time.Minute, Owner: "p"})
			if err != nil {
				t.Fatal(err)
			}
			px.dropBack.Store(true) // the answer and the expiry push are lost
			rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			switch how {
			case "release":
				_, err = c.Release(rctx, "o", res)
			case "releaseall":
				_, err = c.ReleaseAll(rctx, "o")
			}
			cancel()
			if err == nil {
				t.Fatal("answered")
			}
			if !errors.Is(l.Err(), mlock.ErrLost) {
				t.Errorf("the handle it may have freed: Err %v, Deadline in %v", l.Err(), time.Until(l.Deadline()))
			}
			if kept.Err() != nil {
				t.Errorf("a handle it could not free was lost: %v", kept.Err())
			}
			px.dropBack.Store(false)
			tl, err := other.Lock(ctx, res, nil)
			if err != nil {
				t.Fatal(err)
			}
			tl.Unlock(ctx)
		})
	}
}

// A shorter renewal the server refuses (its answer says so: it was not
// applied) leaves the lease as it was.
func TestRefusedShorteningRenewalLeavesTheDeadline(t *testing.T) {
	addr, _ := startServer(t, server.Config{}, "")
	c := client(t, addr, mlock.Options{})
	ctx := ctxT(t)
	l, err := c.Lock(ctx, "refused-short", &mlock.LockOptions{TTL: time.Minute, Owner: "o"})
	if err != nil {
		t.Fatal(err)
	}
	// A re-entry in another mode.
	if _, err := c.Lock(ctx, "refused-short", &mlock.LockOptions{TTL: time.Second, Owner: "o", Mode: mlock.Shared}); !errors.Is(err, mlock.ErrModeChange) {
		t.Fatalf("re-entry in another mode: %v", err)
	}
	if d := time.Until(l.Deadline()); d < 10*time.Second {
		t.Fatalf("Deadline in %v after a refused renewal", d)
	}
}
