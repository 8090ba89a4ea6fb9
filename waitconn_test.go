package mlock_test

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/internal/protocol"
)

// A lock whose wait timeout is shorter than DialTimeout waits for the
// connection no longer than that timeout: against a server that accepts
// the connection and never answers the handshake (a cluster node without
// a leader), Lock returns ErrTimeout after the lock's timeout, with the
// connection's error as its cause, not ErrConnection after DialTimeout.
func TestLockWaitsForTheConnectionAtMostItsTimeout(t *testing.T) {
	t.Parallel()
	addr := fakeServer(t, func(c net.Conn, r *bufio.Reader) {
		_, _ = readCommand(r) // the connect, never answered
		_, _ = readCommand(r) // until the client hangs up
	})
	c := client(t, addr, mlock.Options{DialTimeout: time.Second})
	const timeout = 400 * time.Millisecond
	start := time.Now()
	_, err := c.Lock(ctxT(t), "no-answer", &mlock.LockOptions{Timeout: timeout})
	took := time.Since(start)
	if !errors.Is(err, mlock.ErrTimeout) {
		t.Fatalf("Lock = %v, want ErrTimeout", err)
	}
	if !errors.Is(err, mlock.ErrConnection) || !strings.Contains(err.Error(), "no connection") {
		t.Errorf("the timeout does not say the connection was the cause: %v", err)
	}
	if took < timeout || took > timeout+time.Second {
		t.Errorf("Lock returned after %v, want its timeout %v", took, timeout)
	}
	// A call without a wait timeout of its own still waits DialTimeout.
	c2 := client(t, addr, mlock.Options{DialTimeout: 600 * time.Millisecond})
	start = time.Now()
	err = c2.Ping(ctxT(t))
	if took := time.Since(start); !errors.Is(err, mlock.ErrConnection) || took < 600*time.Millisecond {
		t.Errorf("Ping = %v after %v, want ErrConnection after DialTimeout", err, took)
	}
}

// The wait for the connection counts in a lock's wait timeout: a server
// that answers the handshake 300 ms late is asked to wait for what is left
// of the timeout, not the whole of it.
func TestLockTimeoutLessTheWaitForTheConnection(t *testing.T) {
	t.Parallel()
	got := make(chan []string, 1)
	addr := fakeServer(t, func(c net.Conn, r *bufio.Reader) {
		f, err := readCommand(r)
		if err != nil || len(f) < 2 || f[0] != "connect" {
			return
		}
		time.Sleep(300 * time.Millisecond) // fixed: the test's input, a handshake answered 300 ms late
		_, _ = c.Write(protocol.Append(nil, "connected", "1.0", "new", "sid", "grace=60000"))
		f, err = readCommand(r)
		if err != nil {
			return
		}
		got <- f
		// lock <req> <res> <ttl> <timeout> <tolerate>: queue it, then time it out.
		_, _ = c.Write(protocol.Append(nil, "result", f[1], "success", strings.Repeat("ab", 16)))
		_, _ = c.Write(protocol.Append(nil, "timeout", strings.Repeat("ab", 16)))
		_, _ = readCommand(r)
	})
	c := client(t, addr, mlock.Options{})
	_, err := c.Lock(ctxT(t), "late-handshake", &mlock.LockOptions{Timeout: 2 * time.Second})
	if !errors.Is(err, mlock.ErrTimeout) {
		t.Fatalf("Lock = %v, want the server's timeout", err)
	}
	f := <-got
	if len(f) < 5 || f[0] != "lock" {
		t.Fatalf("the lock frame: %q", f)
	}
	var ms int
	if _, err := fmt.Sscan(f[4], &ms); err != nil || ms < 1 || ms > 1700 {
		t.Fatalf("the lock asked the server to wait %q ms, want 2000 less the 300 ms wait for the handshake", f[4])
	}
}

// A lock that waited for its connection, then for its queue on a connection
// that dropped, is asked again for what is left of its timeout counted from
// the call, not from its send: the wait for the first connection counts
// once.
func TestLockAskedAgainLessTheWaitForTheConnection(t *testing.T) {
	t.Parallel()
	const timeout = time.Second
	got := make(chan []string, 2)
	conns := 0
	addr := fakeServer(t, func(c net.Conn, r *bufio.Reader) {
		conns++
		f, err := readCommand(r)
		if err != nil || len(f) < 2 || f[0] != "connect" {
			return
		}
		if conns == 1 {
			time.Sleep(300 * time.Millisecond) // fixed: the test's input, a handshake answered 300 ms late
		}
		_, _ = c.Write(protocol.Append(nil, "connected", "1.0", "new", "60000"))
		f, err = readCommand(r)
		if err != nil {
			return
		}
		got <- f
		id := strings.Repeat(fmt.Sprint(conns), 32)
		_, _ = c.Write(protocol.Append(nil, "result", f[1], "success", id)) // queued
		if conns == 1 {
			time.Sleep(100 * time.Millisecond) // fixed: the test's input, the wait in the queue before the drop
			return                             // the connection drops
		}
		_, _ = c.Write(protocol.Append(nil, "timeout", id))
		_, _ = readCommand(r)
	})
	c := client(t, addr, mlock.Options{})
	_, err := c.Lock(ctxT(t), "asked-again", &mlock.LockOptions{Timeout: timeout})
	if !errors.Is(err, mlock.ErrTimeout) {
		t.Fatalf("Lock = %v, want the server's timeout", err)
	}
	first, again := <-got, <-got
	ms := func(f []string) time.Duration {
		if len(f) < 5 || f[0] != "lock" {
			t.Fatalf("the lock frame: %q", f)
		}
		var n int64
		fmt.Sscan(f[4], &n)
		return time.Duration(n) * time.Millisecond
	}
	// Asked for at most 700 ms first, then at most that less the 100 ms it
	// waited in the queue.
	if a, b := ms(first), ms(again); a > timeout-300*time.Millisecond || b > a-100*time.Millisecond {
		t.Fatalf("asked for %v, then %v again; want at most %v, then %v", a, b, timeout-300*time.Millisecond, a-100*time.Millisecond)
	}
}

// An auth timeout answered to a connect (the server did not get it in
// time: the connection was held up on its way), or an eviction from the
// server's full pool of connections before their connect, is no refusal:
// the client connects again at once and the call waiting for the
// connection goes on.
func TestAuthTimeoutIsNoRefusal(t *testing.T) {
	t.Parallel()
	for _, code := range []protocol.Code{protocol.CodeAuthTimeout, protocol.CodeEvicted} {
		t.Run(code.Text(), func(t *testing.T) {
			t.Parallel()
			conns := 0
			addr := fakeServer(t, func(c net.Conn, r *bufio.Reader) {
				conns++
				if f, err := readCommand(r); err != nil || f[0] != "connect" {
					return
				}
				if conns == 1 {
					_, _ = c.Write(protocol.AppendError(nil, code))
					return
				}
				_, _ = c.Write(protocol.Append(nil, "connected", "1.0", "new", "60000"))
				for {
					f, err := readCommand(r)
					if err != nil {
						return
					}
					if f[0] == "ping" {
						_, _ = c.Write(protocol.Append(nil, "result", f[1], "success", "pong"))
					}
				}
			})
			c := client(t, addr, mlock.Options{})
			start := time.Now()
			if err := c.Ping(ctxT(t)); err != nil {
				t.Fatalf("Ping after %q: %v", code.Text(), err)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Fatalf("connected again after %v: %q was taken for a refusal (the longest backoff)", d, code.Text())
			}
		})
	}
}
