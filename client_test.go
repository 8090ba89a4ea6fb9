package mlock_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/internal/proctest"
	"github.com/mlock-dev/mlock/internal/testenv"
	"github.com/mlock-dev/mlock/server"
	"github.com/mlock-dev/mlock/server/servertest"
)

// TestMain checks for leaked goroutines. Ignored: the waiters of a raft future that raft never answers
// (an entry it found already applied; see internal/cluster futureError and complete): they end only with
// the process.
func TestMain(m *testing.M) {
	testenv.WaitBound(8) // the parallel tests wait for servers, proxies and leases
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/mlock-dev/mlock/internal/cluster.(*leadership).futureError.func1"),
		goleak.IgnoreAnyFunction("github.com/mlock-dev/mlock/internal/cluster.(*leadership).complete"))
}

// startServer runs mlockd in-process on addr ("" for a free port).
func startServer(t testing.TB, cfg server.Config, addr string) (string, func()) {
	t.Helper()
	return servertest.Start(t, cfg, addr)
}

func client(t testing.TB, addr string, o mlock.Options) *mlock.Client {
	t.Helper()
	host, port, _ := net.SplitHostPort(addr)
	o.Host = host
	fmt.Sscan(port, &o.Port)
	if o.DialTimeout == 0 {
		o.DialTimeout = 10 * time.Second // seconds: a busy machine's dial and handshake
	}
	c, err := mlock.NewClient(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // seconds: a busy machine
	t.Cleanup(cancel)
	return ctx
}

func TestParseURI(t *testing.T) {
	t.Parallel()
	o, err := mlock.ParseURI("mlock://localhost:12340?timeout=5000&ttl=3000&prefix=order:&tolerate=3")
	if err != nil {
		t.Fatal(err)
	}
	want := mlock.Options{Host: "localhost", Port: 12340, Timeout: 5 * time.Second, TTL: 3 * time.Second, Prefix: "order:", Tolerate: 3}
	if !reflect.DeepEqual(o, want) {
		t.Fatalf("ParseURI = %+v, want %+v", o, want)
	}
	if o, _ := mlock.ParseURI("mlock://example.org"); o.Port != 0 || o.Host != "example.org" {
		t.Fatalf("no port: %+v (0 means the default 12340)", o)
	}
	// A bare number is milliseconds; a duration is accepted too.
	if o, err := mlock.ParseURI("mlock://h?ttl=5s&timeout=1m30s"); err != nil || o.TTL != 5*time.Second || o.Timeout != 90*time.Second {
		t.Fatalf("durations: %+v, %v", o, err)
	}
	for _, bad := range []string{
		"redis://localhost", "mlock://h:x", "mlock://h?ttl=abc", "mlock://h?timeout=-1", "mlock://h?tolerate=-2",
		"mlock://h?ttl=-5s", "mlock://h/db", "mlock://h?ttl=5parsecs",
		"mlock://h?prefix=a|b", "mlock://h?prefix=a%20b", "mlock://h?color=red", "mlock://h:99999",
	} {
		_, err := mlock.ParseURI(bad)
		if !errors.Is(err, mlock.ErrRequest) {
			t.Errorf("ParseURI(%q) = %v, want a request error", bad, err)
		}
	}
}

func TestLockUnlockWithPrefix(t *testing.T) {
	t.Parallel()
	addr, _ := startServer(t, server.Config{}, "")
	c := client(t, addr, mlock.Options{Prefix: "order:"})
	ctx := ctxT(t)
	l, err := c.Lock(ctx, "product:1001|product:1002", &mlock.LockOptions{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.ID()) != 32 || l.Token() == 0 || time.Until(l.ExpiresAt()) < 4*time.Second {
		t.Fatalf("lock id %q token %d expires %v", l.ID(), l.Token(), l.ExpiresAt())
	}
	ls, err := c.Locks(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(ls.Queues) != 2 || ls.Queues[0].Resource != "order:product:1001" || ls.Queues[1].Resource != "order:product:1002" {
		t.Fatalf("locks = %+v", ls)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatalf("second unlock: %v", err)
	}
	l2, err := c.LockAll(ctx, []string{"product:1001"}, nil)
	if err != nil || l2.Token() <= l.Token() {
		t.Fatalf("relock: %v, token %d after %d", err, l2.Token(), l.Token())
	}
	if _, err := c.Lock(ctx, "a b", nil); !errors.Is(err, mlock.ErrRequest) {
		t.Fatalf("resource with a space: %v", err)
	}
	if _, err := c.Lock(ctx, "a||b", nil); !errors.Is(err, mlock.ErrRequest) {
		t.Fatalf("empty resource: %v", err)
	}
}

func TestSharedConnection(t *testing.T) {
	t.Parallel()
	addr, _ := startServer(t, server.Config{}, "")
	a := client(t, addr, mlock.Options{})
	b := client(t, addr, mlock.Options{})
	if a.SocketID() != b.SocketID() {
		t.Fatal("two clients of one address must share the session")
	}
	ctx := ctxT(t)
	st, err := b.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.SocketCount != 1 || st.Connections != 1 {
		t.Fatalf("status = %+v, want one shared connection", st)
	}
	host, port, _ := net.SplitHostPort(addr)
	var p int
	fmt.Sscan(port, &p)
	if _, err := mlock.NewClient(mlock.Options{Host: host, Port: p, SocketID: "other"}); !errors.Is(err, mlock.ErrRequest) {
		t.Fatalf("a second socketId for one address: %v", err)
	}
}

func TestErrorTypes(t *testing.T) {
	t.Parallel()
	addr, _ := startServer(t, server.Config{}, "")
	c := client(t, addr, mlock.Options{})
	ctx := ctxT(t)
	h, err := c.Lock(ctx, "e", nil)
	if err != nil {
		t.Fatal(err)
	}
	w := make(chan error, 1)
	go func() { _, err := c.Lock(ctx, "e", nil); w <- err }()
	waitQueue(t, c, "e", 2)
	if _, err := c.Lock(ctx, "e", &mlock.LockOptions{Tolerate: 1}); !errors.Is(err, mlock.ErrTolerate) {
		t.Fatalf("tolerate: %v", err)
	}
	var me *mlock.Error
	if _, err := c.TryLock(ctx, "e", nil); !errors.As(err, &me) || me.Type != mlock.TypeTolerate || !errors.Is(err, mlock.ErrBusy) {
		t.Fatalf("trylock: %v", err)
	}
	start := time.Now()
	if _, err := c.Lock(ctx, "e", &mlock.LockOptions{Timeout: 100 * time.Millisecond}); !errors.Is(err, mlock.ErrTimeout) {
		t.Fatalf("server timeout: %v", err)
	} else if time.Since(start) < 90*time.Millisecond {
		t.Fatal("timed out too early")
	}
	dctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := c.Lock(dctx, "e", nil); !errors.Is(err, mlock.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ctx deadline: %v", err)
	}
	h.Unlock(ctx)
	if err := <-w; err != nil {
		t.Fatalf("the waiter queued before the failures: %v", err)
	}
}

// waitQueue waits until resource's queue has n entries.
func waitQueue(t *testing.T, c *mlock.Client, resource string, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ls, err := c.Locks(context.Background(), resource)
		if errors.Is(err, mlock.ErrRateLimited) {
			time.Sleep(50 * time.Millisecond) // poll: the server's listing rate
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for _, q := range ls.Queues {
			if q.Resource == resource {
				got = len(q.Entries)
			}
		}
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue %s has %d entries, want %d", resource, got, n)
		}
		time.Sleep(5 * time.Millisecond) // poll interval
	}
}

func TestCancelLeavesTheQueue(t *testing.T) {
	t.Parallel()
	addr, _ := startServer(t, server.Config{}, "")
	c := client(t, addr, mlock.Options{})
	ctx := ctxT(t)
	h, _ := c.Lock(ctx, "cq", nil)
	cctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { _, err := c.Lock(cctx, "cq", nil); errc <- err }()
	waitQueue(t, c, "cq", 2)
	cancel()
	err := <-errc
	if !errors.Is(err, context.Canceled) || !errors.Is(err, mlock.ErrCanceled) || errors.Is(err, mlock.ErrRequest) {
		t.Fatalf("cancelled wait: %v", err)
	}
	waitQueue(t, c, "cq", 1)
	h.Unlock(ctx)
	waitQueue(t, c, "cq", 0)
}

func TestLostLockAndExtend(t *testing.T) {
	t.Parallel()
	addr, _ := startServer(t, server.Config{}, "")
	c := client(t, addr, mlock.Options{})
	ctx := ctxT(t)
	l, err := c.Lock(ctx, "short", &mlock.LockOptions{TTL: 150 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	exp, err := l.Extend(ctx, 300*time.Millisecond)
	if err != nil || time.Until(exp) < 200*time.Millisecond {
		t.Fatalf("extend = %v, %v", exp, err)
	}
	select {
	case <-l.Lost():
	case <-time.After(3 * time.Second):
		t.Fatal("the lock never reported its loss")
	}
	if !errors.Is(l.Err(), mlock.ErrLost) {
		t.Fatalf("Err = %v", l.Err())
	}
	if _, err := l.Extend(ctx, time.Second); !errors.Is(err, mlock.ErrLost) {
		t.Fatalf("extend after loss: %v", err)
	}
	if err := l.Unlock(ctx); !errors.Is(err, mlock.ErrLost) {
		t.Fatalf("unlock after loss: %v", err)
	}
}

func TestDoExtendsWhileRunning(t *testing.T) {
	t.Parallel()
	addr, _ := startServer(t, server.Config{}, "")
	c := client(t, addr, mlock.Options{})
	ctx := ctxT(t)
	// A lease of 3 s, renewed every third of it: leases of 150 ms and of
	// 1 s were lost on a busy machine (load 20), whose stalls outlast 600 ms.
	err := c.Do(ctx, "job", &mlock.LockOptions{TTL: 3 * time.Second}, func(ctx context.Context) error {
		select {
		case <-time.After(7 * time.Second): // more than two leases
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	})
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	if _, err := c.TryLock(ctx, "job", nil); err != nil {
		t.Fatalf("Do did not unlock: %v", err)
	}
	boom := errors.New("boom")
	if err := c.Do(ctx, "job2", nil, func(context.Context) error { return boom }); err != boom {
		t.Fatalf("Do returns fn's error: %v", err)
	}
}

func TestDoCancelsOnLoss(t *testing.T) {
	t.Parallel()
	addr, _ := startServer(t, server.Config{}, "")
	c := client(t, addr, mlock.Options{})
	admin := client(t, addr, mlock.Options{})
	ctx := ctxT(t)
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- c.Do(ctx, "cron", &mlock.LockOptions{Owner: "worker-7"}, func(ctx context.Context) error {
			close(started)
			<-ctx.Done()
			if !errors.Is(context.Cause(ctx), mlock.ErrLost) {
				return fmt.Errorf("cause = %v", context.Cause(ctx))
			}
			return ctx.Err()
		})
	}()
	<-started
	if n, err := admin.ReleaseAll(ctx, "worker-7"); err != nil || n != 1 {
		t.Fatalf("ReleaseAll = %d, %v", n, err)
	}
	if err := <-done; !errors.Is(err, mlock.ErrLost) {
		t.Fatalf("Do = %v, want the loss", err)
	}
}

func TestOwnerReleaseAndReentry(t *testing.T) {
	t.Parallel()
	addr, _ := startServer(t, server.Config{}, "")
	c := client(t, addr, mlock.Options{})
	ctx := ctxT(t)
	o := &mlock.LockOptions{Owner: "u1", TTL: time.Second}
	a, err := c.Lock(ctx, "k1|k2", o)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Lock(ctx, "k2|k1", o)
	if err != nil || b != a {
		t.Fatalf("re-entry must return the held lock: %v", err)
	}
	if ok, err := c.Release(ctx, "u2", "k1|k2"); ok || err != nil {
		t.Fatalf("another owner's release = %v, %v", ok, err)
	}
	if ok, err := c.Release(ctx, "u1", "k1|k2"); !ok || err != nil {
		t.Fatalf("owner release = %v, %v", ok, err)
	}
	select {
	case <-a.Lost():
	case <-time.After(2 * time.Second):
		t.Fatal("the handle of a released lock is not told")
	}
}

func TestInFlightCallsFailFastAndLocksSurviveReconnect(t *testing.T) {
	t.Parallel()
	addr, _ := startServer(t, server.Config{SessionGrace: 10 * time.Second}, "")
	px := newProxy(t, addr)
	holder := client(t, addr, mlock.Options{})
	w := client(t, px.addr(), mlock.Options{MaxBackoff: 100 * time.Millisecond})
	ctx := ctxT(t)
	h, err := holder.Lock(ctx, "rc", nil)
	if err != nil {
		t.Fatal(err)
	}
	kept, err := w.Lock(ctx, "kept", nil) // held across the outage
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *mlock.Lock, 1)
	go func() {
		l, err := w.Lock(ctx, "rc", nil)
		if err != nil {
			t.Errorf("waiting lock across a reconnect: %v", err)
		}
		got <- l
	}()
	waitQueue(t, holder, "rc", 2)
	px.cut() // the network drops; the waiter's session survives
	start := time.Now()
	if err := w.Ping(ctx); err != nil {
		t.Fatalf("ping across a reconnect: %v", err)
	}
	if time.Since(start) > 3*time.Second {
		t.Fatal("ping took too long")
	}
	h.Unlock(ctx)
	l := <-got
	if l == nil {
		t.FailNow()
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if kept.Err() != nil {
		t.Fatalf("the held lock was reported lost: %v", kept.Err())
	}
	if _, err := kept.Extend(ctx, time.Minute); err != nil {
		t.Fatalf("the held lock did not survive the outage: %v", err)
	}
	if err := kept.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestInFlightCallFailsFast(t *testing.T) {
	t.Parallel()
	addr, _ := startServer(t, server.Config{}, "")
	px := newProxy(t, addr)
	c := client(t, px.addr(), mlock.Options{MaxBackoff: 100 * time.Millisecond})
	ctx := ctxT(t)
	if err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	px.drop.Store(true) // the request never reaches the server
	errc := make(chan error, 1)
	go func() { _, err := c.Release(ctx, "o", "x"); errc <- err }()
	// The request is in flight: the proxy swallowed it.
	proctest.WaitFor(t, 10*time.Second, "the request at the proxy", func() bool { return px.dropped.Load() > 0 })
	start := time.Now()
	px.cut()
	err := <-errc
	if !errors.Is(err, mlock.ErrConnection) {
		t.Fatalf("in-flight call: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second { // seconds: not at its context's end (30 s)
		t.Fatalf("in-flight call failed after %v", d)
	}
	px.drop.Store(false)
	if err := c.Ping(ctx); err != nil {
		t.Fatalf("after reconnect: %v", err)
	}
}

func TestClosingOneClientDoesNotDisturbAnother(t *testing.T) {
	t.Parallel()
	addr, _ := startServer(t, server.Config{}, "")
	holder := client(t, "localhost:"+strings.Split(addr, ":")[1], mlock.Options{}) // another address string: another connection
	a := client(t, addr, mlock.Options{})
	b, _ := mlock.NewClient(a.Options())
	ctx := ctxT(t)
	h, err := holder.Lock(ctx, "shared", nil)
	if err != nil {
		t.Fatal(err)
	}
	aErr := make(chan error, 1)
	bErr := make(chan error, 1)
	go func() {
		l, err := a.Lock(ctx, "shared", nil)
		if err == nil {
			err = l.Unlock(ctx)
		}
		aErr <- err
	}()
	go func() { _, err := b.Lock(ctx, "shared", nil); bErr <- err }()
	waitQueue(t, holder, "shared", 3)
	b.Close() // mid-call
	if err := <-bErr; !errors.Is(err, mlock.ErrClosed) {
		t.Fatalf("the closed client's wait: %v", err)
	}
	waitQueue(t, holder, "shared", 2) // its request left the queue
	h.Unlock(ctx)
	if err := <-aErr; err != nil {
		t.Fatalf("the other client's wait: %v", err)
	}
	if err := a.Ping(ctx); err != nil {
		t.Fatal(err)
	}
}

// A call waiting for the connection when its Client is closed fails at once
// with ErrClosed: it is not sent once the connection is back (another Client
// keeps the session up), and it does not wait out the DialTimeout when the
// session ends with it.
func TestCloseEndsACallWaitingForTheConnection(t *testing.T) {
	t.Parallel()
	for _, shared := range []bool{false, true} {
		t.Run("shared="+strconv.FormatBool(shared), func(t *testing.T) {
			addr, stop := startServer(t, server.Config{SessionGrace: 5 * time.Second}, "")
			a := client(t, addr, mlock.Options{MaxBackoff: 20 * time.Millisecond, DialTimeout: 2 * time.Second})
			if shared {
				b, err := mlock.NewClient(a.Options())
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { b.Close() })
			}
			ctx := ctxT(t)
			if err := a.Ping(ctx); err != nil {
				t.Fatal(err)
			}
			stop()
			for i := 0; a.Node() != ""; i++ { // the session saw the server go
				if i == 500 {
					t.Fatal("still connected")
				}
				time.Sleep(10 * time.Millisecond) // poll interval
			}
			errc := make(chan error, 1)
			go func() {
				l, err := a.Lock(ctx, "cw", nil)
				if err == nil {
					err = fmt.Errorf("granted %s to a closed client", l.ID())
				}
				errc <- err
			}()
			waitParked(t, "mlock.(*session).waitUp") // the call waits for the connection
			a.Close()
			if shared {
				startServer(t, server.Config{SessionGrace: 5 * time.Second}, addr)
			}
			if err := <-errc; !errors.Is(err, mlock.ErrClosed) {
				t.Fatalf("the closed client's call: %v", err)
			}
			if err := a.Ping(ctx); !errors.Is(err, mlock.ErrClosed) {
				t.Fatalf("a call of the closed client: %v", err)
			}
		})
	}
}

// Unlock sends one unlock: the server's answer ends the lock, nothing is
// given back after it.
func TestUnlockSendsOneCommand(t *testing.T) {
	t.Parallel()
	addr, _ := startServer(t, server.Config{}, "")
	c := client(t, addr, mlock.Options{})
	admin := client(t, "localhost:"+strings.Split(addr, ":")[1], mlock.Options{}) // another session
	ctx := ctxT(t)
	if err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	st0, err := admin.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.Lock(ctx, "once", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx); err != nil { // after anything queued by the unlock
		t.Fatal(err)
	}
	st1, err := admin.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// lock, unlock, ping, and the second status.
	if n := st1.FramesIn - st0.FramesIn; n != 4 {
		t.Fatalf("%d frames for lock, unlock, ping and status, want 4", n)
	}
}

// A handle must never claim resources it no longer holds: releasing part of
// a multi-resource lock by owner loses the whole handle.
func TestPartialReleaseLosesTheHandle(t *testing.T) {
	t.Parallel()
	addr, _ := startServer(t, server.Config{}, "")
	c := client(t, addr, mlock.Options{})
	admin := client(t, "localhost:"+strings.Split(addr, ":")[1], mlock.Options{}) // another session
	ctx := ctxT(t)
	l, err := c.Lock(ctx, "pa|pb", &mlock.LockOptions{Owner: "o1"})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := admin.Release(ctx, "o1", "pa"); !ok || err != nil {
		t.Fatalf("partial release = %v, %v", ok, err)
	}
	select {
	case <-l.Lost():
	case <-time.After(3 * time.Second):
		t.Fatal("the handle of a partly released lock still claims pa|pb")
	}
	if err := l.Err(); !errors.Is(err, mlock.ErrLost) || !(errors.Is(err, mlock.ErrReleased) || errors.Is(err, mlock.ErrExpired)) {
		t.Fatalf("Err = %v", err)
	}
	if _, err := l.Extend(ctx, time.Second); !errors.Is(err, mlock.ErrLost) {
		t.Fatalf("Extend of a lost handle: %v", err)
	}
	// Another owner can take the released resource at once.
	if o, err := admin.TryLock(ctx, "pa", nil); err != nil {
		t.Fatalf("pa after its release: %v", err)
	} else {
		o.Unlock(ctx)
	}
}

func TestTryLockAllNamesTheBusyResource(t *testing.T) {
	t.Parallel()
	addr, _ := startServer(t, server.Config{}, "")
	c := client(t, addr, mlock.Options{Prefix: "p:"})
	ctx := ctxT(t)
	h, err := c.Lock(ctx, "y", nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.TryLockAll(ctx, []string{"x", "y"}, nil)
	var me *mlock.Error
	if !errors.As(err, &me) || me.Type != mlock.TypeTolerate || !errors.Is(err, mlock.ErrBusy) || me.Resource != "p:y" {
		t.Fatalf("TryLockAll on a busy set: %#v", err)
	}
	if strings.Count(err.Error(), "locked") != 1 || !strings.Contains(err.Error(), "p:y") {
		t.Fatalf("Error() = %q: one line naming the resource, no stutter", err)
	}
	h.Unlock(ctx)
	l, err := c.TryLockAll(ctx, []string{"x", "y"}, nil)
	if err != nil || l.Resources() != "p:x|p:y" {
		t.Fatalf("TryLockAll on a free set: %v", err)
	}
	l.Unlock(ctx)

	// An owner asking for a set that overlaps what it holds.
	o := &mlock.LockOptions{Owner: "w1"}
	if _, err := c.LockAll(ctx, []string{"k1", "k2"}, o); err != nil {
		t.Fatal(err)
	}
	_, err = c.Lock(ctx, "k2|k3", o)
	if !errors.As(err, &me) || me.Type != mlock.TypeRequest || !errors.Is(err, mlock.ErrOwnerConflict) || me.Resource != "p:k2" {
		t.Fatalf("owner conflict: %#v", err)
	}
}

func TestRenewByOwner(t *testing.T) {
	t.Parallel()
	addr, _ := startServer(t, server.Config{}, "")
	c := client(t, addr, mlock.Options{})
	other := client(t, "localhost:"+strings.Split(addr, ":")[1], mlock.Options{}) // another session
	ctx := ctxT(t)
	l, err := c.Lock(ctx, "ra|rb", &mlock.LockOptions{Owner: "w", TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	exp, token, err := other.Renew(ctx, "w", []string{"rb", "ra", "rb"}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if token != l.Token() || time.Until(exp) < 50*time.Second {
		t.Fatalf("Renew = %v, token %d (lock's %d)", exp, token, l.Token())
	}
	for _, tc := range []struct {
		owner string
		res   []string
	}{{"w", []string{"ra"}}, {"w", []string{"ra", "rb", "rc"}}, {"x", []string{"ra", "rb"}}} {
		_, _, err := other.Renew(ctx, tc.owner, tc.res, time.Second)
		if !errors.Is(err, mlock.ErrRequest) || !errors.Is(err, mlock.ErrNotHeld) {
			t.Errorf("Renew(%s, %v) = %v, want ErrNotHeld", tc.owner, tc.res, err)
		}
	}
	if _, _, err := c.Renew(ctx, "", []string{"ra"}, 0); !errors.Is(err, mlock.ErrRequest) {
		t.Fatalf("Renew without owner: %v", err)
	}
	if _, _, err := c.Renew(ctx, "w", []string{"a b"}, 0); !errors.Is(err, mlock.ErrRequest) {
		t.Fatalf("Renew of a bad name: %v", err)
	}
}

func TestErrorText(t *testing.T) {
	t.Parallel()
	tests := []struct {
		err  *mlock.Error
		want string
	}{
		{&mlock.Error{Type: mlock.TypeTolerate, Msg: "resource is locked!", Resource: "a", Err: mlock.ErrBusy},
			"mlock: tolerate error: resource is locked! (a)"},
		{&mlock.Error{Type: mlock.TypeTolerate, Msg: "can not tolerate!"}, "mlock: tolerate error: can not tolerate!"},
		{&mlock.Error{Type: mlock.TypeConnection, Err: mlock.ErrClosed}, "mlock: connection error: client closed"},
		{&mlock.Error{Type: mlock.TypeLost, Msg: "lock expired", Err: mlock.ErrExpired}, "mlock: lost error: lock expired"},
		{&mlock.Error{Type: mlock.TypeCanceled, Err: context.Canceled}, "mlock: canceled error: context canceled"},
		{&mlock.Error{Type: mlock.TypeTimeout, Err: context.DeadlineExceeded}, "mlock: timeout error: context deadline exceeded"},
		// A cause of this package's own: "mlock:" once, at the front.
		{&mlock.Error{Type: mlock.TypeTimeout, Msg: "no answer within 50ms",
			Err: &mlock.Error{Type: mlock.TypeTimeout, Err: context.DeadlineExceeded}},
			"mlock: timeout error: no answer within 50ms: timeout error: context deadline exceeded"},
	}
	for _, tc := range tests {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("Error() = %q, want %q", got, tc.want)
		}
		if tc.err.Err != nil && !errors.Is(tc.err, tc.err.Err) {
			t.Errorf("%q: the cause is not in the chain", tc.err)
		}
	}
}

// TestTTLOverTheMaximumSaysTheRange: the server's 1.0 text "ttl should be
// integer!" says nothing of the range; the client's error does.
func TestTTLOverTheMaximumSaysTheRange(t *testing.T) {
	t.Parallel()
	addr, _ := startServer(t, server.Config{MaxTTL: time.Minute}, "")
	c := client(t, addr, mlock.Options{})
	_, err := c.Lock(context.Background(), "r", &mlock.LockOptions{TTL: 2 * time.Minute})
	if !errors.Is(err, mlock.ErrRequest) || !strings.Contains(err.Error(), "ttl should be integer!") || !strings.Contains(err.Error(), "--max-ttl") {
		t.Fatalf("got %v, want a request error naming the range", err)
	}
}

// TestNothingListeningFailsFast: a client whose every node refuses the TCP
// connection (nothing listens) fails at once, not after DialTimeout, with
// one clear line that keeps the cause.
func TestNothingListeningFailsFast(t *testing.T) {
	t.Parallel()
	ln, err := listenFresh(t)
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	host, port, _ := net.SplitHostPort(addr)
	// A DialTimeout of a minute: failing within seconds is failing at once
	// on a busy machine too, and far from it.
	o := mlock.Options{Host: host, DialTimeout: time.Minute}
	fmt.Sscan(port, &o.Port)
	c, err := mlock.NewClient(o)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	err = c.Ping(context.Background())
	if d := time.Since(start); d > 15*time.Second {
		t.Fatalf("failed after %v, want at once", d)
	}
	if !errors.Is(err, mlock.ErrConnection) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("got %v, want a connection error with ECONNREFUSED in its chain", err)
	}
	want := "mlock: connection error at " + addr + ": server unreachable: connect: connection refused"
	if err.Error() != want {
		t.Fatalf("got %q, want %q", err.Error(), want)
	}
}

// Hold of a lock that is not held (unlocked, or lost) does not run the job:
// nothing protects it.
func TestHoldOfALockNotHeld(t *testing.T) {
	t.Parallel()
	addr, _ := startServer(t, server.Config{}, "")
	c := client(t, addr, mlock.Options{})
	ctx := ctxT(t)
	unlocked, err := c.Lock(ctx, "hold-not-held", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := unlocked.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	lost, err := c.Lock(ctx, "hold-lost", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Evict(ctx, "hold-lost"); err != nil {
		t.Fatal(err)
	}
	<-lost.Lost()
	for name, l := range map[string]*mlock.Lock{"unlocked": unlocked, "lost": lost} {
		ran := false
		err := c.Hold(ctx, l, func(context.Context) error { ran = true; return nil })
		if ran || err == nil {
			t.Errorf("Hold of a lock %s: the job ran %v, error %v", name, ran, err)
		}
		if name == "lost" && !errors.Is(err, mlock.ErrLost) {
			t.Errorf("Hold of a lost lock: %v", err)
		}
	}
}

// A job that panics gives its lock back as one that returns: another
// client gets it at once, and the panic reaches Do's caller.
func TestDoPanicUnlocks(t *testing.T) {
	t.Parallel()
	addr, _ := startServer(t, server.Config{}, "")
	c := client(t, addr, mlock.Options{})
	other := client(t, addr, mlock.Options{})
	ctx := ctxT(t)
	got := func() (p any) {
		defer func() { p = recover() }()
		_ = c.Do(ctx, "do-panic", &mlock.LockOptions{TTL: time.Minute}, func(context.Context) error {
			panic("job failed")
		})
		return nil
	}()
	if got != "job failed" {
		t.Fatalf("recovered %v, want the job's panic", got)
	}
	l, err := other.TryLock(ctx, "do-panic", nil)
	if err != nil {
		t.Fatalf("the lock of a job that panicked is still held: %v", err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// waitParked waits until a goroutine of the test (one its function
// started) in fn (a function name as stack traces print it) is parked in a
// select: a call blocked in a wait that announces itself by no event.
func waitParked(t *testing.T, fn string) {
	t.Helper()
	test := "mlock_test." + strings.Split(t.Name(), "/")[0] + "."
	buf := make([]byte, 1<<20)
	proctest.WaitFor(t, 10*time.Second, fn+" parked", func() bool {
		n := runtime.Stack(buf, true)
		for _, g := range strings.Split(string(buf[:n]), "\n\n") {
			if strings.Contains(g, "[select") && strings.Contains(g, fn) && strings.Contains(g, test) {
				return true
			}
		}
		return false
	})
}

func TestHeldLockInDo(t *testing.T) {
	t.Parallel()
	addr, _ := startServer(t, server.Config{}, "")
	c := client(t, addr, mlock.Options{})
	ctx := ctxT(t)
	if mlock.HeldLock(ctx) != nil {
		t.Fatal("HeldLock of a context outside Do is not nil")
	}
	var tokens []uint64
	for range 2 {
		err := c.Do(ctx, "sku:1|sku:2", nil, func(ctx context.Context) error {
			l := mlock.HeldLock(ctx)
			if l == nil {
				return errors.New("no lock in Do's context")
			}
			if l.Resources() != "sku:1|sku:2" {
				return fmt.Errorf("HeldLock's resources %q", l.Resources())
			}
			tokens = append(tokens, l.Token())
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if tokens[0] == 0 || tokens[1] <= tokens[0] {
		t.Fatalf("tokens %v: want two growing tokens", tokens)
	}
}
