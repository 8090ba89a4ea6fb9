package mlock_test

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/internal/lease"
	"github.com/mlock-dev/mlock/internal/proctest"
	"github.com/mlock-dev/mlock/internal/protocol"
)

// scriptedServer is a server whose answers the test writes: pings are
// answered at once (or, with holdPongs, after the test's next write),
// every other command is passed to the test.
type scriptedServer struct {
	addr string
	cmds chan []string
	mu   sync.Mutex
	conn net.Conn

	holdPongs bool   // guarded by mu: pongs wait for the test's next write
	pongs     []byte // guarded by mu: the pongs held
}

func newScriptedServer(t *testing.T, graceMs string) *scriptedServer {
	t.Helper()
	ss := &scriptedServer{cmds: make(chan []string, 64)}
	ss.addr = fakeServer(t, func(c net.Conn, r *bufio.Reader) {
		if f, err := readCommand(r); err != nil || f[0] != "connect" {
			return
		}
		ss.mu.Lock()
		ss.conn = c
		c.Write(protocol.Append(nil, "connected", "1.0", "new", graceMs))
		ss.mu.Unlock()
		for {
			f, err := readCommand(r)
			if err != nil {
				return
			}
			if f[0] == "ping" {
				ss.pong(f[1])
				continue
			}
			ss.cmds <- f
		}
	})
	return ss
}

// write writes b, then the pongs held.
func (ss *scriptedServer) write(b []byte) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.conn.Write(append(b, ss.pongs...))
	ss.pongs = nil
}

// pong answers the ping of seq, now or after the test's next write.
func (ss *scriptedServer) pong(seq string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	b := protocol.Append(nil, "result", seq, "success", "pong")
	if ss.holdPongs {
		ss.pongs = append(ss.pongs, b...)
		return
	}
	ss.conn.Write(b)
}

// next returns the next command other than a ping, which must be verb.
func (ss *scriptedServer) next(t *testing.T, verb string) []string {
	t.Helper()
	select {
	case f := <-ss.cmds:
		if f[0] != verb {
			t.Fatalf("the client sent %q, want %s", f, verb)
		}
		return f
	case <-time.After(10 * time.Second):
		t.Fatalf("the client sent no %s", verb)
		return nil
	}
}

// A grant whose confirmations all come back too late to leave
// lease.MinUsable (each answer slower than a third of the ttl) is not handed
// over with what it has: after the bounded confirmations it is given back
// and asked again, and the caller gets the grant of the request asked
// again, with its whole lease to believe. Before, the third slow
// confirmation handed it over with less than lease.MinUsable.
func TestFakeClockSlowConfirmationsAreNotHandedOverShort(t *testing.T) {
	t.Parallel()
	const ttl = time.Minute
	ss := newScriptedServer(t, "600000") // grace 10 min: the ttl is the span
	c, fc := fakeClient(t, ss.addr, mlock.Options{})
	ctx := ctxT(t)
	g := lockAsync(ctx, c, "slow-confirm", &mlock.LockOptions{TTL: ttl, Timeout: time.Hour})
	f := ss.next(t, "lock")
	id1 := strings.Repeat("1", 32)
	ss.write(protocol.Append(nil, "result", f[1], "success", id1))
	// The result must be read before the clock moves, and the pings the
	// move sends answered only after the grant: either answer, read before
	// the grant, would be the grant's base, and the grant would not be
	// stale.
	proctest.WaitFor(t, 10*time.Second, "the lock queued", func() bool { return c.KnownLocks() == 1 })
	ss.mu.Lock()
	ss.holdPongs = true
	ss.mu.Unlock()
	// The grant is pushed half a ttl later: it arrives stale.
	fc.Advance(ttl / 2)
	exp := func() string { return strconv.FormatInt(time.Now().Add(ttl).UnixMilli(), 10) }
	ss.write(protocol.Append(nil, "locked", id1, exp(), "1"))
	// Each confirmation is answered after 25 s, longer than a third of the
	// ttl: the belief it leaves is short of lease.MinUsable.
	for i := 0; i < 3; i++ {
		f = ss.next(t, "extend")
		if f[2] != id1 {
			t.Fatalf("confirmation %d extends %q, want %q", i+1, f[2], id1)
		}
		fc.Advance(25 * time.Second)
		ss.write(protocol.Append(nil, "result", f[1], "success", exp()))
	}
	// Given back, and asked again.
	f = ss.next(t, "unlock")
	if f[2] != id1 {
		t.Fatalf("unlock of %q, want the short grant %q", f[2], id1)
	}
	ss.write(protocol.Append(nil, "result", f[1], "success", "1"))
	f = ss.next(t, "lock")
	sent := fc.Now()
	id2 := strings.Repeat("2", 32)
	ss.write(append(protocol.Append(nil, "result", f[1], "success", id2), protocol.Append(nil, "locked", id2, exp(), "2")...))
	got := <-g
	if got.err != nil {
		t.Fatal(got.err)
	}
	if got.l.ID() != id2 {
		t.Fatalf("handed over %q, want the grant asked again %q", got.l.ID(), id2)
	}
	if left := got.l.Deadline().Sub(fc.Now()); left < lease.MinUsable(ttl) {
		t.Fatalf("handed over with %v left to believe, want at least %v", left, lease.MinUsable(ttl))
	}
	if want := sent.Add(ttl - lease.Margin(ttl)); !got.l.Deadline().Equal(want) {
		t.Fatalf("Deadline %v after the request asked again, want %v", got.l.Deadline().Sub(sent), want.Sub(sent))
	}
}

// A lock request in flight when the connection drops is asked again once
// the server is reached again, although a whole round of dials failed
// meanwhile (the server was down a moment: restarted): the caller was
// waiting, and keeps waiting. Before, the failed round failed it with a
// connection error.
func TestLockInFlightSurvivesAFailedRound(t *testing.T) {
	t.Parallel()
	for _, try := range []bool{false, true} {
		t.Run(fmt.Sprintf("try=%v", try), func(t *testing.T) { lockInFlightAcrossAFailedRound(t, try) })
	}
}

// lockInFlightAcrossAFailedRound: a Lock in flight when the connection
// drops is granted on the connection after a failed one; a TryLock fails
// with the failed round (a try asks not to wait).
func lockInFlightAcrossAFailedRound(t *testing.T, try bool) {
	t.Parallel()
	var mu sync.Mutex
	conns := 0
	lockSeen := make(chan struct{}, 1)
	addr := fakeServer(t, func(c net.Conn, r *bufio.Reader) {
		mu.Lock()
		conns++
		n := conns
		mu.Unlock()
		f, err := readCommand(r)
		if err != nil || f[0] != "connect" {
			return
		}
		if n == 2 {
			return // the handshake fails: the round of dials fails
		}
		c.Write(protocol.Append(nil, "connected", "1.0", "new", "15000"))
		for {
			f, err := readCommand(r)
			if err != nil {
				return
			}
			switch {
			case (f[0] == "lock" || f[0] == "trylock") && n == 1:
				lockSeen <- struct{}{}
				return // dropped before the answer
			case f[0] == "lock" || f[0] == "trylock":
				id := strings.Repeat("a", 32)
				exp := strconv.FormatInt(time.Now().Add(time.Minute).UnixMilli(), 10)
				c.Write(append(protocol.Append(nil, "result", f[1], "success", id), protocol.Append(nil, "locked", id, exp, "7")...))
			case len(f) > 1:
				c.Write(protocol.Append(nil, "result", f[1], "success", "pong"))
			}
		}
	})
	c := client(t, addr, mlock.Options{MaxBackoff: 50 * time.Millisecond})
	ctx := ctxT(t)
	if err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	g := make(chan grant, 1)
	go func() {
		var l *mlock.Lock
		var err error
		if try {
			l, err = c.TryLock(ctx, "in-flight", &mlock.LockOptions{TTL: time.Minute})
		} else {
			l, err = c.Lock(ctx, "in-flight", &mlock.LockOptions{TTL: time.Minute, Timeout: time.Minute})
		}
		g <- grant{l, err, time.Now()}
	}()
	<-lockSeen
	got := <-g
	if try {
		if !errors.Is(got.err, mlock.ErrConnection) {
			t.Fatalf("TryLock = %v, %v; want the failed round's connection error", got.l, got.err)
		}
		return
	}
	if got.err != nil {
		t.Fatalf("Lock = %v, want the request asked again once the server is back", got.err)
	}
	if got.l.Token() != 7 {
		t.Fatalf("token %d, want 7", got.l.Token())
	}
	mu.Lock()
	defer mu.Unlock()
	if conns < 3 {
		t.Fatalf("%d connections, want a failed one between", conns)
	}
}

// A grant the session handed over with enough to believe, but whose caller
// runs only later (a busy machine's scheduling), is checked again in the
// caller's goroutine: short by then, it is confirmed with an extend before
// Lock returns, and its lease counts from that extend's send time. Before,
// Lock returned it with what it had left.
func TestFakeClockGrantShortWhenTheCallerRunsIsConfirmed(t *testing.T) {
	t.Parallel()
	const ttl = time.Minute
	ss := newScriptedServer(t, "600000")
	c, fc := fakeClient(t, ss.addr, mlock.Options{})
	var confirmed time.Time
	c.SetAfterGrant(func() {
		fc.Advance(ttl / 2) // the caller runs half a ttl after the grant was read
		confirmed = fc.Now()
	})
	ctx := ctxT(t)
	g := lockAsync(ctx, c, "late-caller", &mlock.LockOptions{TTL: ttl, Timeout: time.Hour})
	f := ss.next(t, "lock")
	id := strings.Repeat("3", 32)
	exp := func() string { return strconv.FormatInt(time.Now().Add(ttl).UnixMilli(), 10) }
	ss.write(append(protocol.Append(nil, "result", f[1], "success", id), protocol.Append(nil, "locked", id, exp(), "3")...))
	f = ss.next(t, "extend")
	if f[2] != id {
		t.Fatalf("extend of %q, want the grant %q", f[2], id)
	}
	ss.write(protocol.Append(nil, "result", f[1], "success", exp()))
	got := <-g
	if got.err != nil {
		t.Fatal(got.err)
	}
	if want := confirmed.Add(ttl - lease.Margin(ttl)); !got.l.Deadline().Equal(want) {
		t.Fatalf("Deadline %v after the caller ran, want %v (from the confirmation)", got.l.Deadline().Sub(confirmed), want.Sub(confirmed))
	}
	if left := got.l.Deadline().Sub(fc.Now()); left < lease.MinUsable(ttl) {
		t.Fatalf("handed over with %v left to believe, want at least %v", left, lease.MinUsable(ttl))
	}
	select {
	case f := <-ss.cmds:
		t.Fatalf("the client sent %q after the confirmation", f)
	default:
	}
}
