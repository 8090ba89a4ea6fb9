package mlock_test

import (
	"bufio"
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/internal/proctest"
	"github.com/mlock-dev/mlock/internal/protocol"
	"github.com/mlock-dev/mlock/server"
)

// A grant the server made while the session was away is read after the
// handshake of the resumed session: its lease counts from an answer read
// before the outage, never from the handshake, so the Deadline is never
// later than the server's end of the lease.
func TestGrantKeptForAnAwaySessionCountsFromBeforeTheOutage(t *testing.T) {
	t.Parallel()
	addr, _ := startServer(t, server.Config{SessionGrace: 5 * time.Second}, "")
	px := newProxy(t, addr)
	holder := client(t, addr, mlock.Options{})
	waiter := client(t, px.addr(), mlock.Options{MaxBackoff: 50 * time.Millisecond, DialTimeout: 500 * time.Millisecond})
	ctx := ctxT(t)
	h, err := holder.Lock(ctx, "rp", nil)
	if err != nil {
		t.Fatal(err)
	}
	g := lockAsync(ctx, waiter, "rp", &mlock.LockOptions{TTL: 3 * time.Second})
	waitQueue(t, holder, "rp", 2)
	px.drop.Store(true)
	px.cut()
	proctest.WaitFor(t, 5*time.Second, "the waiter's session sees the cut", func() bool { return waiter.Node() == "" })
	if err := h.Unlock(ctx); err != nil { // granted while the waiter's session is away
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // fixed: the grant ages on the server (real time: the server's lease is the bound checked)
	px.drop.Store(false)
	got := <-g
	if got.err != nil {
		t.Fatal(got.err)
	}
	defer got.l.Unlock(ctx)
	d, exp := got.l.Deadline(), got.l.ExpiresAt()
	t.Logf("Deadline %v before the server's end of the lease", exp.Sub(d))
	if d.After(exp) {
		t.Fatalf("Deadline %v after the server's end of the lease", d.Sub(exp))
	}
}

// A lock that was granted and expired while the path to the server was a
// black hole (the pushes were lost with the connection): after the session
// resumes, the waiting request learns that it is gone and asks again,
// instead of waiting forever.
func TestWaitingLockGrantedAndExpiredDuringABlackhole(t *testing.T) {
	t.Parallel()
	addr, _ := startServer(t, server.Config{SessionGrace: 5 * time.Second}, "")
	px := newProxy(t, addr)
	holder := client(t, addr, mlock.Options{})
	waiter := client(t, px.addr(), mlock.Options{MaxBackoff: 50 * time.Millisecond, DialTimeout: 500 * time.Millisecond})
	ctx := ctxT(t)
	h, err := holder.Lock(ctx, "bw", nil)
	if err != nil {
		t.Fatal(err)
	}
	g := lockAsync(ctx, waiter, "bw", &mlock.LockOptions{TTL: 300 * time.Millisecond, Timeout: 8 * time.Second})
	waitQueue(t, holder, "bw", 2)
	px.drop.Store(true)
	px.dropBack.Store(true)
	if err := h.Unlock(ctx); err != nil { // granted to the waiter; the grant is lost on the way
		t.Fatal(err)
	}
	waitQueue(t, holder, "bw", 0) // the grant expired
	px.cut()
	px.drop.Store(false)
	px.dropBack.Store(false)
	select {
	case got := <-g:
		if got.err != nil {
			t.Fatal(got.err)
		}
		if got.l.Deadline().IsZero() || got.l.Token() <= h.Token()+1 {
			t.Fatalf("asked again: deadline %v, token %d (holder %d)", got.l.Deadline(), got.l.Token(), h.Token())
		}
		got.l.Unlock(ctx)
	case <-time.After(3 * time.Second):
		t.Fatal("the waiting request still waits for a lock that is gone")
	}
}

// Closing the Client during Hold frees the lock on the server and stops the
// job: its context is cancelled with the loss (Type lost, ErrClosed).
func TestCloseDuringHoldStopsTheJob(t *testing.T) {
	t.Parallel()
	addr, _ := startServer(t, server.Config{}, "")
	c := client(t, addr, mlock.Options{})
	other := client(t, addr, mlock.Options{}) // keeps the session
	ctx := ctxT(t)
	l, err := c.Lock(ctx, "cd", &mlock.LockOptions{TTL: 6 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- c.Hold(ctx, l, func(ctx context.Context) error {
			close(started)
			<-ctx.Done()
			return context.Cause(ctx)
		})
	}()
	<-started
	c.Close()
	select {
	case err := <-done:
		if !errors.Is(err, mlock.ErrLost) || !errors.Is(err, mlock.ErrClosed) {
			t.Fatalf("Hold = %v, want a loss by ErrClosed", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatalf("the job still runs after Close (Err %v, Deadline %v)", l.Err(), l.Deadline())
	}
	select {
	case <-l.Lost():
	default:
		t.Fatal("Lost not closed")
	}
	if _, err := l.Extend(ctx, 0); !errors.Is(err, mlock.ErrLost) {
		t.Fatalf("Extend after Close = %v", err)
	}
	waitQueue(t, other, "cd", 0)
}

// The server's "error server shutting down!" alone (no expiry pushes before
// it) marks held locks lost with ErrSessionLost, and the client confirms
// it: it sends bye, then closes the connection.
func TestShutdownErrorFrame(t *testing.T) {
	t.Parallel()
	type seen struct {
		frames []string
		closed bool
	}
	got := make(chan seen, 4)
	locked := make(chan struct{}) // the client returned the grant
	addr := fakeServer(t, func(c net.Conn, r *bufio.Reader) {
		if f, err := readCommand(r); err != nil || f[0] != "connect" {
			return
		}
		c.Write(protocol.Append(nil, "connected", "1.0", "new", "15000"))
		f, err := readCommand(r)
		if err != nil || f[0] != "lock" {
			return
		}
		id := strings.Repeat("cd", 16)
		c.Write(protocol.Append(nil, "result", f[1], "success", id))
		c.Write(protocol.Append(nil, "locked", id, strconv.FormatInt(time.Now().Add(time.Minute).UnixMilli(), 10), "7"))
		<-locked // the shutdown comes in a later read than the grant
		c.Write(protocol.AppendError(nil, protocol.CodeShuttingDown))
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		var s seen
		for {
			f, err := readCommand(r)
			if err != nil {
				var ne net.Error
				s.closed = !errors.As(err, &ne) || !ne.Timeout()
				got <- s
				return
			}
			s.frames = append(s.frames, strings.Join(f, " "))
		}
	})
	c := client(t, addr, mlock.Options{MaxBackoff: time.Second})
	ctx := ctxT(t)
	l, err := c.Lock(ctx, "sd", nil)
	close(locked)
	if err != nil {
		t.Fatal(err)
	}
	s := <-got
	var me *mlock.Error
	if err := l.Err(); !errors.As(err, &me) || me.Type != mlock.TypeLost || !errors.Is(err, mlock.ErrSessionLost) ||
		me.Msg != "server shutting down" {
		t.Fatalf("Err = %#v", err)
	}
	if len(s.frames) != 1 || !strings.HasPrefix(s.frames[0], "bye ") || len(strings.Fields(s.frames[0])) != 2 || !s.closed {
		t.Fatalf("after the shutdown error the server read %q (closed %v), want one bye, then the close", s.frames, s.closed)
	}
}

// The real server records a shutdown as clean (the next start grants at
// once) only when every holder confirmed that it heard its locks are gone.
func TestShutdownConfirmedToTheServer(t *testing.T) {
	t.Parallel()
	cfg := server.Config{DataDir: t.TempDir(), ShutdownWait: 5 * time.Second}
	addr, stop := startServer(t, cfg, "")
	c := client(t, addr, mlock.Options{MaxBackoff: time.Minute})
	ctx := ctxT(t)
	l, err := c.Lock(ctx, "sc", nil)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	stop()
	t.Logf("shutdown took %v", time.Since(start))
	if l.Err() == nil {
		t.Fatal("the held lock is not lost")
	}
	addr2, _ := startServer(t, cfg, "")
	st, err := client(t, addr2, mlock.Options{}).Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.QuietUntil != 0 {
		t.Fatalf("the next start is quiet until %v: the holder's confirmation was not counted",
			time.UnixMilli(st.QuietUntil))
	}
}

// An expired (or released) push for a request the client still sees as
// waiting (its grant was lost): the request is asked again.
func TestExpiredPushForAWaitingLockAsksAgain(t *testing.T) {
	t.Parallel()
	for _, released := range []bool{false, true} {
		t.Run("released="+strconv.FormatBool(released), func(t *testing.T) {
			addr := fakeServer(t, func(c net.Conn, r *bufio.Reader) {
				if f, err := readCommand(r); err != nil || f[0] != "connect" {
					return
				}
				c.Write(protocol.Append(nil, "connected", "1.0", "new", "15000"))
				n := 0
				for {
					f, err := readCommand(r)
					if err != nil {
						return
					}
					switch f[0] {
					case "lock":
						n++
						id := strings.Repeat(strconv.Itoa(n), 32)
						c.Write(protocol.Append(nil, "result", f[1], "success", id))
						if n == 1 {
							push := []string{"expired", id}
							if released {
								push = append(push, "released")
							}
							c.Write(protocol.Append(nil, push...))
							continue
						}
						c.Write(protocol.Append(nil, "locked", id, strconv.FormatInt(time.Now().Add(time.Minute).UnixMilli(), 10), "9"))
					case "ping":
						c.Write(protocol.Append(nil, "result", f[1], "success", "pong"))
					}
				}
			})
			// On a fake clock that stands still while real time passes: the
			// request asked again is sent at the session clock's time, and
			// the grant's lease counts from there.
			c, fc := fakeClient(t, addr, mlock.Options{})
			time.Sleep(300 * time.Millisecond) // fixed: real time passes, the fake clock stands still (the test's input)
			ctx, cancel := context.WithTimeout(ctxT(t), 2*time.Second)
			defer cancel()
			const ttl = 10 * time.Second
			l, err := c.Lock(ctx, "ex", &mlock.LockOptions{TTL: ttl})
			if err != nil {
				t.Fatalf("a waiting request hit by an expiry: %v", err)
			}
			if l.Token() != 9 {
				t.Fatalf("token %d, want the second grant's", l.Token())
			}
			if late := l.Deadline().Sub(fc.Now().Add(ttl)); late > 0 {
				t.Fatalf("Deadline %v past the session clock's now + ttl: the request asked again was stamped with another clock", late)
			}
		})
	}
}

// Renew by owner moves a handle's lease only if the server renewed that
// very lock: same fencing token.
func TestRenewOfAnotherGrantDoesNotMoveTheHandle(t *testing.T) {
	t.Parallel()
	addr := fakeServer(t, func(c net.Conn, r *bufio.Reader) {
		if f, err := readCommand(r); err != nil || f[0] != "connect" {
			return
		}
		c.Write(protocol.Append(nil, "connected", "1.0", "new", "15000"))
		exp := func(d time.Duration) string { return strconv.FormatInt(time.Now().Add(d).UnixMilli(), 10) }
		for {
			f, err := readCommand(r)
			if err != nil {
				return
			}
			switch f[0] {
			case "lock":
				id := strings.Repeat("ef", 16)
				c.Write(protocol.Append(nil, "result", f[1], "success", id))
				c.Write(protocol.Append(nil, "locked", id, exp(time.Second), "7"))
			case "renew": // another grant of the owner on the same resources
				c.Write(protocol.Append(nil, "result", f[1], "success", exp(30*time.Second), "9"))
			case "ping":
				c.Write(protocol.Append(nil, "result", f[1], "success", "pong"))
			}
		}
	})
	c := client(t, addr, mlock.Options{})
	ctx := ctxT(t)
	l, err := c.Lock(ctx, "rn", &mlock.LockOptions{Owner: "w", TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	d0 := l.Deadline()
	if _, tok, err := c.Renew(ctx, "w", []string{"rn"}, 30*time.Second); err != nil || tok != 9 {
		t.Fatalf("Renew = %d, %v", tok, err)
	}
	if d1 := l.Deadline(); !d1.Equal(d0) {
		t.Fatalf("a renewal of token 9 moved the Deadline of the handle of token 7 by %v", d1.Sub(d0))
	}
}

// Close returns promptly although the server stopped reading and the
// connection's buffers are full.
func TestCloseWithAServerThatDoesNotRead(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	addr := fakeServer(t, func(c net.Conn, r *bufio.Reader) {
		if f, err := readCommand(r); err != nil || f[0] != "connect" {
			return
		}
		c.Write(protocol.Append(nil, "connected", "1.0", "new", "15000"))
		<-release // reads nothing more
	})
	defer close(release)
	c, err := mlock.NewClient(clientOptions(addr, mlock.Options{PingInterval: time.Minute}))
	if err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("x", 1<<20)
	var wg sync.WaitGroup
	for range 12 { // more than the sockets' buffers hold
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			c.TryLock(ctx, big, nil)
		}()
	}
	wg.Wait()
	closed := make(chan struct{})
	start := time.Now()
	go func() { c.Close(); close(closed) }()
	select {
	case <-closed:
		t.Logf("Close took %v", time.Since(start))
	case <-time.After(3 * time.Second):
		t.Fatal("Close hangs on a server that does not read")
	}
}

// A queue of commands past its limit closes the connection and the session
// reconnects. A lock request too long for the queue is asked again on each
// new connection, and fails with a connection error at the last one.
func TestOutboxOverflowDropsTheConnection(t *testing.T) {
	// Not parallel: it sets the package's maxPending for the sessions it starts.
	addr, _ := startServer(t, server.Config{}, "")
	t.Cleanup(mlock.SetMaxPending(4 << 10)) // after the client's Close
	c := client(t, addr, mlock.Options{MaxBackoff: 50 * time.Millisecond})
	ctx := ctxT(t)
	if err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err := c.Lock(lctx, strings.Repeat("y", 8<<10), nil)
	if !errors.Is(err, mlock.ErrConnection) {
		t.Fatalf("Lock past the queue's limit = %v, want a connection error", err)
	}
	if err := c.Ping(ctx); err != nil {
		t.Fatalf("after the overflow: %v", err)
	}
}

// LockOptions.Lead: Hold stops the job that long before the lock's Deadline.
func TestHoldStopsTheJobLeadBeforeTheDeadline(t *testing.T) {
	t.Parallel()
	addr, _ := startServer(t, server.Config{}, "")
	px := newProxy(t, addr)
	c := client(t, px.addr(), mlock.Options{})
	ctx := ctxT(t)
	// Seconds: half the lead is the slack for a timer run late on a busy
	// machine (150 ms of a 300 ms lead was missed once).
	const ttl, lead = 10 * time.Second, 3 * time.Second
	if _, err := c.Lock(ctx, "ld", &mlock.LockOptions{TTL: ttl, Lead: ttl / 2}); !errors.Is(err, mlock.ErrRequest) {
		t.Fatalf("a lead of half the ttl: %v", err)
	}
	l, err := c.Lock(ctx, "ld", &mlock.LockOptions{TTL: ttl, Lead: lead})
	if err != nil {
		t.Fatal(err)
	}
	left := make(chan time.Duration, 1)
	err = c.Hold(ctx, l, func(ctx context.Context) error {
		px.drop.Store(true) // no extension gets through
		<-ctx.Done()
		left <- time.Until(l.Deadline())
		return nil
	})
	if !errors.Is(err, mlock.ErrLost) {
		t.Fatalf("Hold = %v", err)
	}
	// Without the lead the job would stop at the Deadline (0 left); half the
	// lead of slack absorbs a timer or a wake-up run late on a loaded machine.
	if d := <-left; d < lead/2 {
		t.Fatalf("the job was stopped %v before the Deadline, want about %v", d, lead)
	}
}

func clientOptions(addr string, o mlock.Options) mlock.Options {
	host, port, _ := net.SplitHostPort(addr)
	o.Host = host
	o.Port, _ = strconv.Atoi(port)
	return o
}

// A lock request whose connection drops before its answer is asked again on
// the next connection. The server had granted the first request already: that
// grant is announced on the resumed session for no waiting handle and given
// back, so the caller ends up holding exactly one lock, the one it was
// answered, and the resource is free once it unlocks. With an owner the
// request asked again renews the first grant by re-entry, which is being given
// back: the request is asked once more.
func TestLockInFlightWhenTheConnectionDropsIsAskedAgain(t *testing.T) {
	t.Parallel()
	for _, owner := range []string{"", "worker-1"} {
		t.Run("owner="+owner, func(t *testing.T) {
			addr, _ := startServer(t, server.Config{SessionGrace: 5 * time.Second}, "")
			px := newProxy(t, addr)
			other := client(t, addr, mlock.Options{})
			c := client(t, px.addr(), mlock.Options{MaxBackoff: 50 * time.Millisecond, DialTimeout: 500 * time.Millisecond})
			ctx := ctxT(t)
			if err := c.Ping(ctx); err != nil {
				t.Fatal(err)
			}
			px.dropBack.Store(true) // the answers are lost
			g := lockAsync(ctx, c, "inflight", &mlock.LockOptions{TTL: 10 * time.Second, Timeout: 5 * time.Second, Owner: owner})
			waitQueue(t, other, "inflight", 1) // granted on the server
			px.cut()
			px.dropBack.Store(false)
			var l *mlock.Lock
			select {
			case got := <-g:
				if got.err != nil {
					t.Fatalf("Lock = %v, want the lock asked again", got.err)
				}
				l = got.l
			case <-time.After(5 * time.Second):
				t.Fatal("the lock request in flight is neither asked again nor failed")
			}
			if l.Deadline().IsZero() {
				t.Fatal("no deadline")
			}
			heldThenFree(t, other, l, "inflight") // the first grant given back, this one held
		})
	}
}

// A lock request given up by its caller is given back when its grant
// arrives. If the same owner asked again meanwhile, the server renewed that
// grant by re-entry for the new request: the new request, answered with the
// id being given back, is asked again instead of believed held while the
// unlock frees the resource.
func TestOwnerRequestRenewingAnAbandonedGrantIsAskedAgain(t *testing.T) {
	t.Parallel()
	addr, _ := startServer(t, server.Config{}, "")
	px := newProxy(t, addr)
	other := client(t, addr, mlock.Options{})
	c := client(t, px.addr(), mlock.Options{})
	ctx := ctxT(t)
	if err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	o := &mlock.LockOptions{TTL: 10 * time.Second, Owner: "job"}
	resume := px.pause()
	ctx1, cancel1 := context.WithCancel(ctx)
	first := lockAsync(ctx1, c, "reentry", o)
	waitQueue(t, other, "reentry", 1) // granted on the server, the answer held back
	cancel1()
	if got := <-first; got.err == nil {
		t.Fatal("Lock succeeded after its context was cancelled")
	}
	st0 := status(t, other)
	second := lockAsync(ctx, c, "reentry", o) // renews the first grant by re-entry
	waitCount(t, other, "the re-entry reaches the server", func(st *mlock.Status) bool { return st.LockCount > st0.LockCount })
	resume()
	var l *mlock.Lock
	select {
	case got := <-second:
		if got.err != nil {
			t.Fatal(got.err)
		}
		l = got.l
	case <-time.After(5 * time.Second):
		t.Fatal("the second request is never answered")
	}
	heldThenFree(t, other, l, "reentry")
}

// status returns the server's status as c reads it.
func status(t *testing.T, c *mlock.Client) *mlock.Status {
	t.Helper()
	st, err := c.Status(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// waitCount waits until the server's counters, read through c, satisfy
// cond: a request sent on a connection whose answers are held back has
// reached the server.
func waitCount(t *testing.T, c *mlock.Client, what string, cond func(*mlock.Status) bool) {
	t.Helper()
	proctest.WaitFor(t, 5*time.Second, what, func() bool {
		st, err := c.Status(ctxT(t))
		return err == nil && cond(st)
	})
}

// heldThenFree checks that l, which its client believes held, is held on
// the server (other cannot take res), and that res is free once l is
// unlocked (nothing else of l's session, such as a first grant not given
// back, holds it).
func heldThenFree(t *testing.T, other *mlock.Client, l *mlock.Lock, res string) {
	t.Helper()
	ctx := ctxT(t)
	waitQueue(t, other, res, 1)
	if tl, err := other.TryLock(ctx, res, nil); err == nil {
		tl.Unlock(ctx)
		t.Fatal("another client got the lock its holder believes it holds")
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	waitQueue(t, other, res, 0)
	tl, err := other.TryLock(ctx, res, nil)
	if err != nil {
		t.Fatalf("after Unlock the resource is still held: %v", err)
	}
	tl.Unlock(ctx)
}

// An owner's Lock answered while the same owner's Unlock of that lock is in
// flight (the server renewed the lock by re-entry, then unlocked it) is asked
// again: it must not return the handle being unlocked as held.
func TestOwnerLockDuringUnlockOfTheSameLockIsAskedAgain(t *testing.T) {
	t.Parallel()
	addr, _ := startServer(t, server.Config{}, "")
	px := newProxy(t, addr)
	other := client(t, addr, mlock.Options{})
	c := client(t, px.addr(), mlock.Options{})
	ctx := ctxT(t)
	o := &mlock.LockOptions{TTL: 10 * time.Second, Owner: "job"}
	first, err := c.Lock(ctx, "during-unlock", o)
	if err != nil {
		t.Fatal(err)
	}
	resume := px.pause()
	st0 := status(t, other)
	second := lockAsync(ctx, c, "during-unlock", o) // sent first: renews the first lock
	waitCount(t, other, "the re-entry reaches the server", func(st *mlock.Status) bool { return st.LockCount > st0.LockCount })
	unlocked := make(chan error, 1)
	go func() { unlocked <- first.Unlock(ctx) }() // then unlocks it
	waitCount(t, other, "the unlock reaches the server", func(st *mlock.Status) bool { return st.FinishedCount > st0.FinishedCount })
	resume()
	if err := <-unlocked; err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	var l *mlock.Lock
	select {
	case got := <-second:
		if got.err != nil {
			t.Fatal(got.err)
		}
		l = got.l
	case <-time.After(5 * time.Second):
		t.Fatal("the second Lock is never answered")
	}
	if l.Err() != nil {
		t.Fatalf("the second Lock returned a lost handle: %v", l.Err())
	}
	waitQueue(t, other, "during-unlock", 1)
	if tl, err := other.TryLock(ctx, "during-unlock", nil); err == nil {
		tl.Unlock(ctx)
		t.Fatal("another client got the lock its holder believes it holds")
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// framesSeen waits until the server has received n frames since st0 besides
// the status requests of this wait itself.
func framesSeen(t *testing.T, admin *mlock.Client, st0 *mlock.Status, n uint64) {
	t.Helper()
	ctx := ctxT(t)
	for polls := uint64(1); ; polls++ {
		st, err := admin.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.FramesIn-st0.FramesIn >= n+polls {
			return
		}
		if polls == 1000 {
			t.Fatalf("the server received %d frames, want %d", st.FramesIn-st0.FramesIn-polls, n)
		}
		time.Sleep(2 * time.Millisecond) // poll interval
	}
}

// An owner's second request for a lock its session holds (or waits for),
// given up (its context cancelled, or its Client closed) before its answer
// arrived, is answered with the first handle's lock: that lock stays held
// (or waiting) for the first handle, it is not given back.
func TestAbandonedReentryLeavesTheFirstHandleItsLock(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		waiting  bool // the first handle waits in the queue
		closeCli bool // the second request's Client is closed (else its context is cancelled)
	}{{"held/canceled", false, false}, {"held/closed", false, true}, {"waiting/canceled", true, false}} {
		t.Run(tc.name, func(t *testing.T) {
			addr, _ := startServer(t, server.Config{}, "")
			px := newProxy(t, addr)
			c := client(t, px.addr(), mlock.Options{})
			other := client(t, addr, mlock.Options{})
			ctx := ctxT(t)
			lo := &mlock.LockOptions{Owner: "w", TTL: 30 * time.Second}
			var blocker *mlock.Lock
			var first <-chan grant
			if tc.waiting {
				var err error
				if blocker, err = other.Lock(ctx, "re", nil); err != nil {
					t.Fatal(err)
				}
				first = lockAsync(ctx, c, "re", lo)
				waitQueue(t, other, "re", 2)
			} else {
				first = lockAsync(ctx, c, "re", lo)
				waitQueue(t, other, "re", 1)
			}
			c2 := c
			if tc.closeCli {
				var err error
				if c2, err = mlock.NewClient(c.Options()); err != nil { // the same session
					t.Fatal(err)
				}
				t.Cleanup(func() { c2.Close() })
			}
			st0, err := other.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			resume := px.pause() // the answer waits
			cctx, cancel := context.WithCancel(ctx)
			defer cancel()
			second := make(chan error, 1)
			go func() { _, err := c2.Lock(cctx, "re", lo); second <- err }()
			framesSeen(t, other, st0, 1) // the server has the second request
			if tc.closeCli {
				c2.Close()
			} else {
				cancel()
			}
			err = <-second
			resume()
			t.Logf("second: %v", err)
			if err == nil {
				t.Fatal("the second request succeeded")
			}
			if err := c.Ping(ctx); err != nil { // the answer was read
				t.Fatal(err)
			}
			if tc.waiting {
				if err := blocker.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
			}
			var l *mlock.Lock
			select {
			case g := <-first:
				if g.err != nil {
					t.Fatal(g.err)
				}
				l = g.l
			case <-time.After(5 * time.Second):
				t.Fatal("the first request is never granted")
			}
			if l.Err() != nil {
				t.Fatalf("the first handle lost its lock: %v", l.Err())
			}
			heldThenFree(t, other, l, "re")
		})
	}
}

// Close answers the Client's calls in flight at once with ErrClosed, even
// while the server's answers are slow: a lock request's grant that arrives
// later is given back, and the other Clients of the session go on.
func TestCloseEndsCallsInFlight(t *testing.T) {
	t.Parallel()
	addr, _ := startServer(t, server.Config{}, "")
	px := newProxy(t, addr)
	a := client(t, px.addr(), mlock.Options{})
	b, err := mlock.NewClient(a.Options()) // the same session
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	other := client(t, addr, mlock.Options{})
	ctx := ctxT(t)
	if err := a.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	st0, err := other.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	resume := px.pause() // the answers wait
	t.Cleanup(func() { once.Do(resume) })
	errs := make(chan error, 2)
	go func() { _, err := b.Lock(ctx, "inflight", nil); errs <- err }()
	go func() { _, err := b.Status(ctx); errs <- err }()
	framesSeen(t, other, st0, 2) // the server has both
	b.Close()
	for range 2 {
		select {
		case err := <-errs:
			if !errors.Is(err, mlock.ErrClosed) {
				t.Fatalf("a call of the closed client: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a call of the closed client waits for its answer")
		}
	}
	once.Do(resume)
	if err := a.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	waitQueue(t, other, "inflight", 0) // the grant was given back
}

// A server that closes every connection right after its handshake is not
// reconnected to in a tight loop: the backoff grows as after failed
// attempts (a connection that lasts resets it).
func TestConnectionsDroppedAtOnceBackOff(t *testing.T) {
	t.Parallel()
	var at []time.Time // the connects' times
	var mu sync.Mutex
	addr := fakeServer(t, func(c net.Conn, r *bufio.Reader) {
		f, err := readCommand(r)
		if err != nil || f[0] != "connect" {
			return
		}
		mu.Lock()
		at = append(at, time.Now())
		mu.Unlock()
		c.Write(protocol.Append(nil, "connected", "1.0", "new", "15000"))
	})
	c, err := mlock.NewClient(clientOptions(addr, mlock.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, 10*time.Second, "5 connections", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(at) >= 5
	})
	c.Close()
	mu.Lock()
	defer mu.Unlock()
	// 50 ms doubling, with jitter down to half: the gaps are at least 25,
	// 50, 100, 200 ms; at once, they would be a fraction of a millisecond.
	for i := 1; i < 5; i++ {
		if gap, want := at[i].Sub(at[i-1]), 25*time.Millisecond<<(i-1)-5*time.Millisecond; gap < want {
			t.Fatalf("connection %d came %v after the one before, want at least %v", i+1, gap, want)
		}
	}
}

// An Unlock whose answer was lost with the connection is asked again; the
// server no longer has the lock, because the first unlock freed it: that is
// no loss of the lock (which its Deadline still covered), Unlock succeeds.
func TestUnlockAnsweredOnlyAfterAReconnectSucceeds(t *testing.T) {
	t.Parallel()
	addr, _ := startServer(t, server.Config{SessionGrace: 5 * time.Second}, "")
	px := newProxy(t, addr)
	c := client(t, px.addr(), mlock.Options{MaxBackoff: 50 * time.Millisecond})
	other := client(t, addr, mlock.Options{})
	ctx := ctxT(t)
	l, err := c.Lock(ctx, "unlock-retried", nil)
	if err != nil {
		t.Fatal(err)
	}
	st0, err := other.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	px.dropBack.Store(true) // the unlock's answer is lost
	errc := make(chan error, 1)
	go func() { errc <- l.Unlock(ctx) }()
	framesSeen(t, other, st0, 1) // the server has the unlock
	waitQueue(t, other, "unlock-retried", 0)
	px.cut()
	px.dropBack.Store(false)
	if err := <-errc; err != nil {
		t.Fatalf("Unlock = %v", err)
	}
}

// An Unlock sent while the lock was believed held, whose answer was lost with
// a connection that stayed silent past the lock's Deadline (a failover: the
// node stopped, the next one elected late), is asked again; the server no
// longer has the lock. Either the first unlock freed it, or the lease ended
// no earlier than the Deadline, after Unlock was called: the holder held
// the lock for all its use, so Unlock succeeds. (It once returned "lock
// expired", telling a holder whose writes were alone that they may not have
// been.) The Deadline passing still loses the lock for its Lost channel.
func TestUnlockRetriedAfterTheDeadlinePassedInFlight(t *testing.T) {
	t.Parallel()
	addr, _ := startServer(t, server.Config{SessionGrace: 5 * time.Second}, "")
	px := newProxy(t, addr)
	c := client(t, px.addr(), mlock.Options{MaxBackoff: 50 * time.Millisecond})
	other := client(t, addr, mlock.Options{})
	ctx := ctxT(t)
	l, err := c.Lock(ctx, "unlock-late", &mlock.LockOptions{TTL: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	st0, err := other.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	px.dropBack.Store(true) // the unlock's answer is lost, and every answer after it
	errc := make(chan error, 1)
	go func() { errc <- l.Unlock(ctx) }()
	framesSeen(t, other, st0, 1) // the server has the unlock
	waitQueue(t, other, "unlock-late", 0)
	select {
	case <-l.Lost(): // the Deadline passed while the unlock waited
	case err := <-errc:
		t.Fatalf("Unlock returned %v before the Deadline passed", err)
	case <-ctx.Done():
		t.Fatal("the lock was not lost at its Deadline")
	}
	if !errors.Is(l.Err(), mlock.ErrExpired) {
		t.Fatalf("Err = %v, want the lease's end", l.Err())
	}
	px.cut()
	px.dropBack.Store(false)
	if err := <-errc; err != nil {
		t.Fatalf("Unlock = %v, want nil: it was called well before the Deadline", err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatalf("a second Unlock = %v, want nil (unlocking twice is no error)", err)
	}
}

// A grant whose every confirmation comes back after the lease it gives has
// ended is not handed over (it would be lost on arrival): it is given back
// and asked again, and the wait ends with its timeout.
func TestGrantNeverConfirmedInTimeIsNotHandedOver(t *testing.T) {
	t.Parallel()
	const late, ttl = 120 * time.Millisecond, 100 * time.Millisecond // every answer after the lease
	addr := fakeServer(t, func(c net.Conn, r *bufio.Reader) {
		if f, err := readCommand(r); err != nil || f[0] != "connect" {
			return
		}
		c.Write(protocol.Append(nil, "connected", "1.0", "new", "15000"))
		var mu sync.Mutex
		later := func(b []byte) {
			time.AfterFunc(late, func() {
				mu.Lock()
				defer mu.Unlock()
				c.Write(b)
			})
		}
		exp := func() string { return strconv.FormatInt(time.Now().Add(ttl).UnixMilli(), 10) }
		n := 0
		for {
			f, err := readCommand(r)
			if err != nil {
				return
			}
			switch f[0] {
			case "lock":
				n++
				id := strings.Repeat(strconv.Itoa(n%10), 32)
				later(append(protocol.Append(nil, "result", f[1], "success", id), protocol.Append(nil, "locked", id, exp(), strconv.Itoa(n))...))
			case "extend":
				later(protocol.Append(nil, "result", f[1], "success", exp()))
			case "ping":
				later(protocol.Append(nil, "result", f[1], "success", "pong"))
			default:
				if len(f) > 1 {
					later(protocol.Append(nil, "result", f[1], "success", "done"))
				}
			}
		}
	})
	c := client(t, addr, mlock.Options{})
	l, err := c.Lock(ctxT(t), "late", &mlock.LockOptions{TTL: ttl, Timeout: 1500 * time.Millisecond})
	if err == nil {
		t.Fatalf("handed over a grant with %v left (held: %v)", time.Until(l.Deadline()), l.Err() == nil)
	}
	if !errors.Is(err, mlock.ErrTimeout) {
		t.Fatalf("Lock: %v, want the wait's timeout", err)
	}
}

// An Unlock asked once and answered "lock not exist!" while the lock was
// still believed held is no expiry (a server expires a lease only after the
// Deadline its holder counts): something else ended it, a release by its
// owner elsewhere or an eviction whose word did not reach this connection.
// Unlock says so (ErrReleased), so that a caller such as mlock run never
// takes it for a lease that ended after the work was done.
func TestUnlockNotFoundBeforeTheDeadlineIsNoExpiry(t *testing.T) {
	t.Parallel()
	addr := fakeServer(t, func(c net.Conn, r *bufio.Reader) {
		if f, err := readCommand(r); err != nil || f[0] != "connect" {
			return
		}
		c.Write(protocol.Append(nil, "connected", "1.0", "new", "15000"))
		id := strings.Repeat("7", 32)
		for {
			f, err := readCommand(r)
			if err != nil {
				return
			}
			switch f[0] {
			case "lock":
				exp := strconv.FormatInt(time.Now().Add(time.Minute).UnixMilli(), 10)
				c.Write(append(protocol.Append(nil, "result", f[1], "success", id), protocol.Append(nil, "locked", id, exp, "1")...))
			case "unlock":
				c.Write(protocol.Append(nil, "result", f[1], "failed", "lock not exist!"))
			default:
				if len(f) > 1 {
					c.Write(protocol.Append(nil, "result", f[1], "success", "done"))
				}
			}
		}
	})
	c := client(t, addr, mlock.Options{})
	l, err := c.Lock(ctxT(t), "ended-elsewhere", &mlock.LockOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	err = l.Unlock(ctxT(t))
	if !errors.Is(err, mlock.ErrReleased) || errors.Is(err, mlock.ErrExpired) || !errors.Is(err, mlock.ErrLost) {
		t.Fatalf("Unlock = %v, want a loss that is no expiry (ErrReleased)", err)
	}
}
