package mlock_test

import (
	"bufio"
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"net"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/internal/proctest"
	"github.com/mlock-dev/mlock/internal/protocol"
	"github.com/mlock-dev/mlock/server"
)

// ---- several server addresses: parsing ----

func TestParseURISeveralAddresses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		uri   string
		addrs []string // nil: one address, in Host and Port
		host  string
		port  int
	}{
		{uri: "mlock://h1:1,h2:2,h3", addrs: []string{"h1:1", "h2:2", "h3:12340"}},
		{uri: "mlocks://svc:tok@h1,h2:7?ttl=5", addrs: []string{"h1:12340", "h2:7"}},
		{uri: "mlock://[::1]:1234,[::1],127.0.0.1", addrs: []string{"[::1]:1234", "[::1]:12340", "127.0.0.1:12340"}},
		{uri: "mlock://H1,h2:0", addrs: []string{"H1:12340", "h2:12340"}}, // port 0: the default
		{uri: "mlock://h1:5", host: "h1", port: 5},
		{uri: "mlock://[::1]:5", host: "::1", port: 5},
		{uri: "mlock://", host: ""}, // the default host and port
	} {
		o, err := mlock.ParseURI(tc.uri)
		if err != nil {
			t.Errorf("ParseURI(%q): %v", tc.uri, err)
			continue
		}
		if !slices.Equal(o.Addrs, tc.addrs) || o.Host != tc.host || o.Port != tc.port {
			t.Errorf("ParseURI(%q) = Addrs %q Host %q Port %d, want %q %q %d", tc.uri, o.Addrs, o.Host, o.Port, tc.addrs, tc.host, tc.port)
		}
	}
	o, err := mlock.ParseURI("mlocks://svc:" + topSecret + "@h1:1,h2:2?prefix=p:&socketId=s")
	if err != nil || o.Name != "svc" || string(o.Token) != topSecret || o.TLS == nil || o.Prefix != "p:" || o.SocketID != "s" {
		t.Fatalf("the parameters with several addresses: %+v, %v", o, err)
	}
	for _, bad := range []string{
		"mlock://h1,,h2", "mlock://h1,", "mlock://,h1", "mlock://h1,h1:12340", "mlock://h1,H1",
		"mlock://[::1]:12340,[::1]", "mlock://h1:x,h2", "mlock://h1,h2:99999", "mlock://h1,[::1",
		"mlock://h1,h2:-1", "mlock://h1,h%zz", "mlock://svc:" + topSecret + ",h2", "mlock://h1,h2?color=red",
	} {
		_, err := mlock.ParseURI(bad)
		if !errors.Is(err, mlock.ErrRequest) {
			t.Errorf("ParseURI(%q) = %v, want a request error", bad, err)
			continue
		}
		noSecret(t, "the error of ParseURI", err.Error())
	}
}

func TestOptionsAddrs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		o    mlock.Options
		want []string // Client.Addrs
	}{
		{mlock.Options{Addrs: []string{"127.0.0.1:1", "127.0.0.1"}}, []string{"127.0.0.1:1", "127.0.0.1:12340"}},
		{mlock.Options{Addrs: []string{"LocalHost", "127.0.0.1:3"}, Port: 9}, []string{"localhost:9", "127.0.0.1:3"}},
		{mlock.Options{Addrs: []string{"::1", "[::2]", "[::3]:5"}}, []string{"[::1]:12340", "[::2]:12340", "[::3]:5"}},
		{mlock.Options{Host: "127.0.0.1", Port: 4}, []string{"127.0.0.1:4"}},
		{mlock.Options{}, []string{"localhost:12340"}},
	} {
		tc.o.DialTimeout = 100 * time.Millisecond
		c, err := mlock.NewClient(tc.o)
		if err != nil {
			t.Errorf("NewClient(%q): %v", tc.o.Addrs, err)
			continue
		}
		if got := c.Addrs(); !slices.Equal(got, tc.want) {
			t.Errorf("Addrs(%q, port %d) = %q, want %q", tc.o.Addrs, tc.o.Port, got, tc.want)
		}
		c.Close()
	}
	for _, bad := range []mlock.Options{
		{Addrs: []string{"h1", ""}}, {Addrs: []string{"h1", "H1:12340"}}, {Addrs: []string{"h1", "h1"}, Port: 7},
		{Addrs: []string{"a b"}}, {Addrs: []string{"h1:99999"}}, {Addrs: []string{"[::1"}}, {Addrs: []string{"h1:2:3"}},
		{Addrs: []string{"h1:x"}}, {Addrs: []string{":5"}}, {Addrs: []string{"h1,h2"}}, {Addrs: []string{"h1"}, Host: "h2"},
	} {
		if err := bad.Validate(); !errors.Is(err, mlock.ErrRequest) {
			t.Errorf("Validate(Addrs %q, Host %q) = %v, want a request error", bad.Addrs, bad.Host, err)
		}
		if _, err := mlock.NewClient(bad); !errors.Is(err, mlock.ErrRequest) {
			t.Errorf("NewClient(Addrs %q, Host %q) = %v, want a request error", bad.Addrs, bad.Host, err)
		}
	}
}

// ---- fake nodes of a cluster ----

// fakeNode is a server that serves its connections at the same time with
// fn, and can stop at once (its listener and connections closed), like a
// node that dies.
type fakeNode struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func newFakeNode(t *testing.T, fn func(c net.Conn, r *bufio.Reader)) *fakeNode {
	ln, err := listenFresh(t)
	if err != nil {
		t.Fatal(err)
	}
	n := &fakeNode{ln: ln}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.mu.Lock()
			n.conns = append(n.conns, c)
			n.mu.Unlock()
			n.wg.Add(1)
			go func() {
				defer n.wg.Done()
				defer c.Close()
				fn(c, bufio.NewReader(c))
			}()
		}
	}()
	t.Cleanup(n.stop)
	return n
}

func (n *fakeNode) addr() string { return n.ln.Addr().String() }

func (n *fakeNode) stop() {
	n.ln.Close()
	n.mu.Lock()
	for _, c := range n.conns {
		c.Close()
	}
	n.conns = nil
	n.mu.Unlock()
	n.wg.Wait()
}

// deadAddr returns a loopback address nobody listens on.
func deadAddr(t *testing.T) string {
	ln, err := listenFresh(t)
	if err != nil {
		t.Fatal(err)
	}
	a := ln.Addr().String()
	ln.Close()
	return a
}

// clusterState is what the fake node knows of the session from the node
// that died (replicated state, in a real cluster).
type clusterState struct {
	mu      sync.Mutex
	held    string // the held lock's id
	exp     int64  // its expiry, Unix ms
	token   uint64
	probed  []string // lock ids the client probed with extend
	relock  int      // lock requests asked again
	connect []string // the connect frames' socketIds
}

func ms(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }

// serveResumed is another node of the cluster that resumes the session:
// it answers "connected 1.0 resumed 15000", announces the held lock again,
// and answers the probe of a waiting request with notYet ("not locked
// yet!", then the grant) or else "lock not exist!" (the client asks again,
// and is granted).
func serveResumed(st *clusterState, notYet bool, connected chan<- time.Time) func(c net.Conn, r *bufio.Reader) {
	return func(c net.Conn, r *bufio.Reader) {
		f, err := readCommand(r)
		if err != nil || f[0] != "connect" {
			return
		}
		st.mu.Lock()
		st.connect = append(st.connect, f[1])
		held, exp, token := st.held, st.exp, st.token
		st.mu.Unlock()
		connected <- time.Now()
		var out []byte
		out = protocol.Append(out, "connected", "1.0", "resumed", "15000")
		out = protocol.Append(out, "locked", held, strconv.FormatInt(exp, 10), strconv.FormatUint(token, 10))
		c.Write(out)
		exp1 := func() string { return ms(time.Now().Add(time.Minute)) }
		for {
			f, err := readCommand(r)
			if err != nil {
				return
			}
			switch {
			case f[0] == "ping":
				c.Write(protocol.Append(nil, "result", f[1], "success", "pong"))
			case f[0] == "extend" && f[2] == held:
				c.Write(protocol.Append(nil, "result", f[1], "success", exp1()))
			case f[0] == "extend": // the probe of the waiting request
				st.mu.Lock()
				st.probed = append(st.probed, f[2])
				st.mu.Unlock()
				if notYet {
					c.Write(protocol.AppendFailed(nil, []byte(f[1]), protocol.CodeNotLockedYet, ""))
					time.Sleep(50 * time.Millisecond) // fixed: the grant comes in a later read than the answer
					c.Write(protocol.Append(nil, "locked", f[2], exp1(), strconv.FormatUint(token+10, 10)))
				} else {
					c.Write(protocol.AppendFailed(nil, []byte(f[1]), protocol.CodeLockNotExist, ""))
				}
			case f[0] == "lock":
				st.mu.Lock()
				st.relock++
				st.mu.Unlock()
				id := strings.Repeat("ab", 16)
				c.Write(protocol.Append(nil, "result", f[1], "success", id))
				c.Write(protocol.Append(nil, "locked", id, exp1(), strconv.FormatUint(token+20, 10)))
			case f[0] == "unlock":
				c.Write(protocol.Append(nil, "result", f[1], "success"))
			}
		}
	}
}

// After its node dies, the session resumes on the next node that answers
// (past a dead one, without the backoff between them): the held lock stays
// held when the node says resumed and announces it again, and a lock
// request waiting at the time is probed, then granted there or asked again.
func TestFailoverResumesOnAnotherNode(t *testing.T) {
	t.Parallel()
	for _, notYet := range []bool{true, false} {
		t.Run("probe-granted="+strconv.FormatBool(notYet), func(t *testing.T) {
			addr, _ := startServer(t, server.Config{SessionGrace: 10 * time.Second}, "")
			node1 := newProxy(t, addr) // node 1: the real server, behind a path that can die
			st := &clusterState{}
			connected := make(chan time.Time, 4)
			node3 := newFakeNode(t, serveResumed(st, notYet, connected))
			nodes := []string{node1.addr(), deadAddr(t), node3.addr()}
			c, err := mlock.NewClient(mlock.Options{Addrs: nodes, MaxBackoff: 10 * time.Second, DialTimeout: 2 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			other := client(t, addr, mlock.Options{})
			ctx := ctxT(t)
			l, err := c.Lock(ctx, "held", nil)
			if err != nil {
				t.Fatal(err)
			}
			if n := c.Node(); n != nodes[0] {
				t.Fatalf("Node = %q, want the first, %q", n, nodes[0])
			}
			if _, err := other.Lock(ctx, "wait", nil); err != nil {
				t.Fatal(err)
			}
			g := lockAsync(ctx, c, "wait", nil)
			waitQueue(t, other, "wait", 2)
			// The ping's answer follows the lock request's on the connection:
			// the client has read which request is waiting before node 1 dies.
			if err := c.Ping(ctx); err != nil {
				t.Fatal(err)
			}
			token, d0 := l.Token(), l.Deadline()
			st.mu.Lock()
			st.held, st.exp, st.token = l.ID(), l.ExpiresAt().UnixMilli(), token
			st.mu.Unlock()

			start := time.Now()
			node1.close() // node 1 dies
			var at time.Time
			select {
			case at = <-connected:
			case <-time.After(3 * time.Second):
				t.Fatal("the session did not move to another node")
			}
			t.Logf("on node 3 %v after node 1 died", at.Sub(start))
			if at.Sub(start) > time.Second {
				t.Fatalf("node 3 reached after %v: the backoff applied between the nodes of a round", at.Sub(start))
			}
			var got grant
			select {
			case got = <-g:
			case <-time.After(3 * time.Second):
				t.Fatal("the waiting request was neither probed nor asked again")
			}
			if got.err != nil {
				t.Fatal(got.err)
			}
			st.mu.Lock()
			probed, relock, sids := slices.Clone(st.probed), st.relock, slices.Clone(st.connect)
			st.mu.Unlock()
			if len(sids) != 1 || sids[0] != c.SocketID() {
				t.Fatalf("node 3 got the socketIds %q, want the session's", sids)
			}
			if len(probed) != 1 {
				t.Fatalf("probes %q, want the one waiting request's", probed)
			}
			want, wantRelock := token+10, 0
			if !notYet {
				want, wantRelock = token+20, 1
			}
			if got.l.Token() != want || relock != wantRelock {
				t.Fatalf("the waiting request: token %d, asked again %d times; want %d, %d", got.l.Token(), relock, want, wantRelock)
			}
			select {
			case <-l.Lost():
				t.Fatalf("the held lock was lost on a resumed session: %v", l.Err())
			default:
			}
			if l.Err() != nil || l.Token() != token {
				t.Fatalf("held lock: Err %v, token %d (was %d)", l.Err(), l.Token(), token)
			}
			// The safety rule is that of a reconnect to the same server:
			// the Deadline stays bounded by the grace node 3 announced,
			// counted from no later than now.
			if d := l.Deadline(); d.IsZero() || d.After(time.Now().Add(15*time.Second)) || d.Before(d0.Add(-time.Second)) {
				t.Fatalf("Deadline %v from now (was %v)", time.Until(d), time.Until(d0))
			}
			if n := c.Node(); n != nodes[2] {
				t.Fatalf("Node = %q, want node 3's %q", n, nodes[2])
			}
			if err := c.Ping(ctx); err != nil {
				t.Fatal(err)
			}
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Two real servers that are not one cluster: the second answers "new",
// so the session is gone: the held lock is lost, and the waiting request
// is asked again there (and granted).
func TestFailoverToANodeThatLostTheSession(t *testing.T) {
	t.Parallel()
	addrA, _ := startServer(t, server.Config{SessionGrace: 10 * time.Second}, "")
	addrB, _ := startServer(t, server.Config{}, "")
	nodeA := newProxy(t, addrA)
	c, err := mlock.NewClient(mlock.Options{Addrs: []string{nodeA.addr(), addrB}, MaxBackoff: 10 * time.Second, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	other := client(t, addrA, mlock.Options{})
	ctx := ctxT(t)
	l, err := c.Lock(ctx, "held", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Lock(ctx, "wait", nil); err != nil {
		t.Fatal(err)
	}
	g := lockAsync(ctx, c, "wait", nil)
	waitQueue(t, other, "wait", 2)
	nodeA.close()
	select {
	case <-l.Lost():
	case <-time.After(3 * time.Second):
		t.Fatal("the held lock is still believed after the new node lost the session")
	}
	if !errors.Is(l.Err(), mlock.ErrSessionLost) {
		t.Fatalf("Err = %v", l.Err())
	}
	got := <-g
	if got.err != nil {
		t.Fatalf("the waiting request, asked again on the new node: %v", got.err)
	}
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.AnsweredBy != addrB || c.Node() != addrB || st.HeldLocks != 1 {
		t.Fatalf("status answered by %q (Node %q), %d held; want %q, 1", st.AnsweredBy, c.Node(), st.HeldLocks, addrB)
	}
}

// With every node down a call fails with a
// connection error that names each node and its error, at once when every
// node refuses the connection.
func TestAllNodesDown(t *testing.T) {
	t.Parallel()
	nodes := []string{deadAddr(t), deadAddr(t)}
	const dial = 300 * time.Millisecond
	c, err := mlock.NewClient(mlock.Options{Addrs: nodes, DialTimeout: dial, MaxBackoff: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	_, err = c.Lock(ctxT(t), "x", nil)
	took := time.Since(start)
	var me *mlock.Error
	if !errors.As(err, &me) || me.Type != mlock.TypeConnection || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("Lock = %v, want a connection error (connection refused)", err)
	}
	t.Logf("%v after %v", err, took)
	for _, n := range nodes {
		if !strings.Contains(me.Msg, n) || strings.Count(err.Error(), n) < 2 {
			t.Fatalf("the error does not name %s (in Msg, and with its error): %v", n, err)
		}
	}
	// Every node refused the TCP connection (nothing listens): the call
	// fails at the end of the first round, not after DialTimeout.
	if took > dial {
		t.Fatalf("failed after %v, want at once (before DialTimeout %v)", took, dial)
	}
	if c.Node() != "" {
		t.Fatalf("Node = %q while down", c.Node())
	}
}

// A node that refuses the connection does not fail the calls while another
// node accepts it; when every node refuses, calls fail at once with the
// refusal, which names its node.
func TestRefusalByOneNode(t *testing.T) {
	t.Parallel()
	refusing := func(c net.Conn, r *bufio.Reader) {
		if f, err := readCommand(r); err == nil && f[0] == "connect" {
			c.Write(protocol.AppendError(nil, protocol.CodeAuthFailed))
			drain(c)
		}
	}
	bad1, bad2 := newFakeNode(t, refusing), newFakeNode(t, refusing)
	good := newFakeNode(t, func(c net.Conn, r *bufio.Reader) { serveBasic(c, r, nil) })
	ctx := ctxT(t)
	c, err := mlock.NewClient(mlock.Options{Addrs: []string{bad1.addr(), good.addr()}, DialTimeout: time.Second, MaxBackoff: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Ping(ctx); err != nil {
		t.Fatalf("with one node accepting: %v", err)
	}
	if c.Node() != good.addr() {
		t.Fatalf("Node %q, want %q", c.Node(), good.addr())
	}

	c2, err := mlock.NewClient(mlock.Options{Addrs: []string{bad1.addr(), bad2.addr()}, DialTimeout: 3 * time.Second, MaxBackoff: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	start := time.Now()
	err = c2.Ping(ctx)
	var me *mlock.Error
	if !errors.As(err, &me) || !errors.Is(err, mlock.ErrAuth) || (me.Node != bad1.addr() && me.Node != bad2.addr()) ||
		!strings.Contains(err.Error(), me.Node) {
		t.Fatalf("every node refusing: %v (Node %q)", err, me.Node)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("the refusal came after %v, not at once", took)
	}
}

// Clients naming the same nodes in another order share one session;
// another set of nodes is another session, and one socketId may not serve
// two sessions with a node in common.
func TestSharedSessionOfASetOfNodes(t *testing.T) {
	t.Parallel()
	a, _ := startServer(t, server.Config{}, "")
	b, _ := startServer(t, server.Config{}, "")
	open := func(o mlock.Options) *mlock.Client {
		t.Helper()
		o.DialTimeout = 2 * time.Second
		c, err := mlock.NewClient(o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	c1 := open(mlock.Options{Addrs: []string{a, b}})
	c2, err := mlock.New("mlock://" + b + "," + a)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c2.Close() })
	if c1.SocketID() != c2.SocketID() {
		t.Fatal("two clients of one set of nodes in another order do not share the session")
	}
	if !reflect.DeepEqual(c2.Addrs(), []string{a, b}) {
		t.Fatalf("Addrs = %q: the shared session dials in the first client's order", c2.Addrs())
	}
	c3 := open(mlock.Options{Addrs: []string{a}})
	if c3.SocketID() == c1.SocketID() {
		t.Fatal("another set of nodes shares the session")
	}
	ctx := ctxT(t)
	if err := c3.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := c2.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.AnsweredBy != a || st.SocketCount != 2 { // c1 and c2's session, and c3's
		t.Fatalf("status of %q: %d sockets, want %q, 2", st.AnsweredBy, st.SocketCount, a)
	}
	if _, err := mlock.NewClient(mlock.Options{Addrs: []string{b, a}, SocketID: "other"}); !errors.Is(err, mlock.ErrRequest) {
		t.Fatalf("another socketId for a shared set of nodes: %v", err)
	}
	if _, err := mlock.NewClient(mlock.Options{Addrs: []string{b}, SocketID: c1.SocketID()}); !errors.Is(err, mlock.ErrRequest) {
		t.Fatalf("the socketId of a session of nodes {a, b} for node b alone: %v", err)
	}
}

// With TLS, each node is verified for its own host: the ServerName
// defaults to the host of the address dialled.
func TestTLSServerNamePerNode(t *testing.T) {
	t.Parallel()
	pki := newPKI(t)
	names := make(chan string, 8)
	cfg := &tls.Config{Certificates: []tls.Certificate{pki.server}}
	serve := func(stay bool) func(c *tls.Conn, r *bufio.Reader) {
		return func(c *tls.Conn, r *bufio.Reader) {
			names <- c.ConnectionState().ServerName
			if stay {
				serveBasic(c, r, nil)
			}
			// else: close after the handshake: the client moves on
		}
	}
	n1 := fakeTLSServer(t, cfg, serve(false))
	n2 := fakeTLSServer(t, cfg, serve(true))
	_, p1, _ := net.SplitHostPort(n1)
	c, err := mlock.NewClient(mlock.Options{Addrs: []string{"localhost:" + p1, n2}, TLS: &tls.Config{RootCAs: pki.pool},
		DialTimeout: 2 * time.Second, MaxBackoff: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Ping(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if c.Node() != n2 {
		t.Fatalf("Node %q, want %q", c.Node(), n2)
	}
	// SNI: the name for localhost, none for an IP address (verified
	// against the certificate's IP address).
	if first, second := <-names, <-names; first != "localhost" || second != "" {
		t.Fatalf("server names %q then %q, want localhost then none", first, second)
	}
}

// A connection error of a call in flight names the node it was lost with.
func TestConnectionLostNamesTheNode(t *testing.T) {
	t.Parallel()
	n := newFakeNode(t, func(c net.Conn, r *bufio.Reader) {
		if f, err := readCommand(r); err != nil || f[0] != "connect" {
			return
		}
		c.Write(protocol.Append(nil, "connected", "1.0", "new", "15000"))
		readCommand(r) // the lock: no answer, the connection dies
	})
	c, err := mlock.NewClient(mlock.Options{Addrs: []string{n.addr(), deadAddr(t)}, DialTimeout: time.Second, MaxBackoff: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, err = c.Lock(ctx, "x", nil)
	var me *mlock.Error
	if !errors.As(err, &me) || me.Type != mlock.TypeConnection || me.Node != n.addr() || !strings.Contains(err.Error(), n.addr()) {
		t.Fatalf("Lock = %v, want a connection error naming %s", err, n.addr())
	}
}

// The session dials the nodes in turn, and backs off only between rounds
// (every node failed once), never between the nodes of a round.
func TestRoundRobinWithBackoffBetweenRounds(t *testing.T) {
	t.Parallel()
	type attempt struct {
		node int
		at   time.Time
	}
	var mu sync.Mutex
	var log []attempt
	var nodes []string
	for i := range 3 {
		n := newFakeNode(t, func(c net.Conn, r *bufio.Reader) {
			mu.Lock()
			log = append(log, attempt{i, time.Now()})
			mu.Unlock()
			// closed without an answer: a failed attempt
		})
		nodes = append(nodes, n.addr())
	}
	// The backoff doubles from 50 ms to MaxBackoff, 2 s, each jittered down
	// to half: before round 6 (backoff 1.6 s) the gap between
	// rounds is 800 ms at least, which a gap within a round, a dial on
	// loopback, stays below even on a busy machine; a backoff within a
	// round would not.
	const maxBackoff = 2 * time.Second
	c, err := mlock.NewClient(mlock.Options{Addrs: nodes, DialTimeout: time.Second, MaxBackoff: maxBackoff})
	if err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, 30*time.Second, "21 attempts", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(log) >= 21
	})
	c.Close()
	mu.Lock()
	defer mu.Unlock()
	for i, a := range log {
		if a.node != i%3 {
			t.Fatalf("attempt %d on node %d, want %d (round-robin)", i, a.node, i%3)
		}
		if i == 0 {
			continue
		}
		gap := a.at.Sub(log[i-1].at)
		switch round := i / 3; {
		case round >= 6 && i%3 != 0 && gap >= 750*time.Millisecond:
			t.Fatalf("%v between nodes %d and %d of round %d: a backoff within a round", gap, i%3-1, i%3, round)
		case round >= 6 && i%3 == 0 && gap < 780*time.Millisecond: // backoff 1.6 s, jitter down to half
			t.Fatalf("%v between rounds %d and %d, want the backoff", gap, round-1, round)
		}
	}
	t.Logf("%d attempts, %d rounds", len(log), len(log)/3)
}

// ParseURI never panics, keeps the token out of its errors, and what it
// accepts is valid Options: each address host:port, none twice.
func FuzzParseURI(f *testing.F) {
	for _, s := range []string{"h1:1,h2:2,h3", "[::1]:1234,[::1]", "h1,,h2", "h1,H1", "h:x,h2?ttl=5",
		"h1,h2/p?prefix=a#f", "%zz,h", "[::1", "a@b,c", ":5,h", "h1:0,h2:00012340"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if strings.Contains(s, topSecret) {
			return
		}
		for _, uri := range []string{"mlock://" + s, "mlock://svc:" + topSecret + "@" + s} {
			o, err := mlock.ParseURI(uri)
			if err != nil {
				if !errors.Is(err, mlock.ErrRequest) {
					t.Fatalf("ParseURI(%q) = %v, want a request error", uri, err)
				}
				noSecret(t, "the error of ParseURI", err.Error())
				continue
			}
			if err := o.Validate(); err != nil {
				t.Fatalf("ParseURI(%q) accepted invalid Options: %v", uri, err)
			}
			seen := map[string]bool{}
			for _, a := range o.Addrs {
				h, p, err := net.SplitHostPort(a)
				if err != nil || h == "" || p == "" {
					t.Fatalf("ParseURI(%q): address %q", uri, a)
				}
				k := strings.ToLower(a)
				if seen[k] {
					t.Fatalf("ParseURI(%q): %q twice", uri, a)
				}
				seen[k] = true
			}
			if len(o.Addrs) == 1 {
				t.Fatalf("ParseURI(%q): one address in Addrs", uri)
			}
		}
	})
}

// serveHello is a node that answers connect with "connected 1.0 <mode>
// 15000", naming leader if not "" and the connect asked ("want=leader"),
// counts the connects, and answers pings.
func serveHello(leader *string, mode string, connects *sync.Map) func(c net.Conn, r *bufio.Reader) {
	return func(c net.Conn, r *bufio.Reader) {
		f, err := readCommand(r)
		if err != nil || f[0] != "connect" {
			return
		}
		n, _ := connects.LoadOrStore(c.LocalAddr().String(), new(atomic.Int32))
		n.(*atomic.Int32).Add(1)
		hello := []string{"connected", "1.0", mode, "15000"}
		if slices.Contains(f, "want=leader") {
			n, _ := connects.LoadOrStore(c.LocalAddr().String()+" asked", new(atomic.Int32))
			n.(*atomic.Int32).Add(1)
		}
		if *leader != "" && slices.Contains(f, "want=leader") {
			hello = append(hello, "leader="+*leader)
		}
		c.Write(protocol.Append(nil, hello...))
		for {
			f, err := readCommand(r)
			if err != nil {
				return
			}
			if f[0] == "ping" {
				c.Write(protocol.Append(nil, "result", f[1], "success", "pong"))
			}
		}
	}
}

// A follower that names the cluster's leader in its handshake: a session's
// first connection moves to the leader when it is one of its nodes (once: a
// leader that names another is served), and stays with Options.StayOnNode,
// when the named leader is not one of its nodes, when the follower resumed
// the session (its answer may carry offline pushes), and, back on the
// follower, when the leader does not answer.
func TestSessionMovesToTheLeaderItIsTold(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		aNames      string // "b", "a", "other" or ""
		bNames      string
		aMode       string // default "new"
		bDead       bool
		stay        bool
		want        string // "a" or "b"
		connectsOnA int
		connectsOnB int
	}{
		{name: "moves", aNames: "b", want: "b", connectsOnA: 1, connectsOnB: 1},
		{name: "stays when asked", aNames: "b", stay: true, want: "a", connectsOnA: 1},
		{name: "unknown leader", aNames: "other", want: "a", connectsOnA: 1},
		{name: "on the leader", want: "a", connectsOnA: 1},
		{name: "moves once", aNames: "b", bNames: "a", want: "b", connectsOnA: 1, connectsOnB: 1},
		{name: "resumed stays", aNames: "b", aMode: "resumed", want: "a", connectsOnA: 1},
		{name: "leader down", aNames: "b", bDead: true, want: "a", connectsOnA: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var connects sync.Map
			var aNames, bNames string
			mode := cmp.Or(tc.aMode, "new")
			a := newFakeNode(t, serveHello(&aNames, mode, &connects))
			b := newFakeNode(t, serveHello(&bNames, "new", &connects))
			bAddr := b.addr()
			if tc.bDead {
				b.stop()
			}
			name := func(s string) string {
				switch s {
				case "a":
					return a.addr()
				case "b":
					return bAddr
				case "other":
					return deadAddr(t)
				}
				return ""
			}
			aNames, bNames = name(tc.aNames), name(tc.bNames)
			c, err := mlock.NewClient(mlock.Options{Addrs: []string{a.addr(), bAddr}, StayOnNode: tc.stay})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := c.Ping(ctx); err != nil {
				t.Fatal(err)
			}
			if got := c.Node(); got != name(tc.want) {
				t.Fatalf("session on %s, want %s (%s)", got, tc.want, name(tc.want))
			}
			count := func(addr string) int {
				if n, ok := connects.Load(addr); ok {
					return int(n.(*atomic.Int32).Load())
				}
				return 0
			}
			if ca, cb := count(a.addr()), count(bAddr); ca != tc.connectsOnA || cb != tc.connectsOnB {
				t.Fatalf("connects: %d on a, %d on b; want %d, %d", ca, cb, tc.connectsOnA, tc.connectsOnB)
			}
		})
	}
}

// Only a session's first connection asks for the leader: after a drop the
// session resumes on the next node without "want=leader" and stays there.
func TestSessionMovesOnlyOnItsFirstConnection(t *testing.T) {
	t.Parallel()
	var connects sync.Map
	var aNames, bNames string
	a := newFakeNode(t, serveHello(&aNames, "new", &connects))
	b := newFakeNode(t, serveHello(&bNames, "resumed", &connects))
	bNames = a.addr() // b would name a, if asked
	c, err := mlock.NewClient(mlock.Options{Addrs: []string{a.addr(), b.addr()}, MaxBackoff: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Ping(ctx); err != nil || c.Node() != a.addr() {
		t.Fatalf("first connection: %v on %q, want a (%s)", err, c.Node(), a.addr())
	}
	a.stop()
	deadline := time.Now().Add(5 * time.Second)
	for c.Node() != b.addr() {
		if time.Now().After(deadline) {
			t.Fatalf("the session is on %q 5 s after its node died, want b (%s)", c.Node(), b.addr())
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
	if err := c.Ping(ctx); err != nil || c.Node() != b.addr() {
		t.Fatalf("after the drop: %v on %q, want b (%s)", err, c.Node(), b.addr())
	}
	asked := func(addr string) int32 {
		if n, ok := connects.Load(addr + " asked"); ok {
			return n.(*atomic.Int32).Load()
		}
		return 0
	}
	if asked(a.addr()) != 1 || asked(b.addr()) != 0 {
		t.Fatalf("want=leader sent %d times to a, %d to b; want 1, 0", asked(a.addr()), asked(b.addr()))
	}
}

// A cluster node answers a membership change once the leader committed it,
// without waiting for its own log to catch up: a grant of an earlier entry
// may be pushed after that answer. The lease of such a grant does not count
// from the membership change's send time (nor does the session's end).
func TestClusterChangeAnswerDoesNotMoveTheLease(t *testing.T) {
	t.Parallel()
	const ttl = 10 * time.Second
	id := strings.Repeat("cd", 16)
	queued := make(chan struct{}, 1)
	addr := fakeServer(t, func(c net.Conn, r *bufio.Reader) {
		f, err := readCommand(r)
		if err != nil || f[0] != "connect" {
			return
		}
		c.Write(protocol.Append(nil, "connected", "1.0", "new", "60000"))
		for {
			f, err := readCommand(r)
			if err != nil {
				return
			}
			switch f[0] {
			case "lock": // queued
				c.Write(protocol.Append(nil, "result", f[1], "success", id))
				queued <- struct{}{}
			case "cluster": // answered before this node applies the grant of an earlier entry
				c.Write(protocol.Append(nil, "result", f[1], "success", "done"))
				c.Write(protocol.Append(nil, "locked", id, ms(time.Now().Add(ttl)), "7"))
			case "unlock":
				c.Write(protocol.Append(nil, "result", f[1], "success", "done"))
			}
		}
	})
	c, fc := fakeClient(t, addr, mlock.Options{})
	ctx := ctxT(t)
	g := lockAsync(ctx, c, "change", &mlock.LockOptions{TTL: ttl})
	<-queued
	before := fc.Now()                // after the lock request was sent
	fc.Advance(50 * time.Millisecond) // time passes, which a lease moved by the answer would show
	if err := c.ClusterJoin(ctx, "n4", "10.0.0.4:7000"); err != nil {
		t.Fatal(err)
	}
	got := <-g
	if got.err != nil {
		t.Fatal(got.err)
	}
	if limit := before.Add(ttl - (ttl/100 + 5*time.Millisecond)); got.l.Deadline().After(limit) {
		t.Fatalf("Deadline %v after the lock request's send time plus the ttl less its margin", got.l.Deadline().Sub(limit))
	}
}
