package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/internal/cluster"
	"github.com/mlock-dev/mlock/internal/core"
	"github.com/mlock-dev/mlock/internal/proctest"
	"github.com/mlock-dev/mlock/internal/testcert"
)

// testCluster is an in-process cluster: raft over the in-memory transport,
// clients over real TCP.
type testCluster struct {
	t     *testing.T
	n     int
	dirs  []string // "" : in memory
	addrs []string // client addresses, fixed across restarts
	trans []*raft.InmemTransport
	nodes []*Server
	done  []chan error
	// TLS on the client ports: every node's certificate and the CA file the
	// nodes verify each other with ("": plain TCP).
	tlsCert, tlsKey, caFile string
	// raftAddrs, when set, are the nodes' Raft addresses: Raft over TCP
	// (with TLS when tlsCert is set) instead of the in-memory transport.
	raftAddrs []string
	// configure, when set, changes node i's configuration before it starts.
	configure func(i int, c *Config)
	// hooks are every node's test hooks (set apply and ownFormat in the
	// setup of newTestClusterWith).
	hooks *clusterTestHooks
}

var testSecret = []byte("0123456789abcdef-cluster-test")

// change runs a membership change on the leader l: node g removed, or
// (join) added again at its in-memory Raft address.
func (tc *testCluster) change(l, g int, join bool) {
	tc.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ch := &clusterChange{id: "n" + strconv.Itoa(g)}
	if join {
		ch.join, ch.addr = true, "raft"+strconv.Itoa(g)
	}
	if err := tc.nodes[l].changeHere(ctx, ch); err != nil {
		tc.t.Fatal(err)
	}
}

// raftTimeout is the nodes' heartbeat and election timeout: a second. The
// package's cluster tests run 32 at a time under the race detector: with
// 150 ms, and then with 400 ms beside a second test run on 2 cores, a
// starved node's missed heartbeats moved the leadership in the middle of
// tests (and each follower's heartbeats, a tenth of it apart, cost the
// CPU of the others).
func (tc *testCluster) raftTimeout() time.Duration {
	return time.Second
}

// testNoLeaderWait is a test cluster's bound on a request's wait for the
// log (noLeaderWait, 5 s in production) unless its setup sets one: an
// election on a busy machine took longer than 5 s, and the tests that
// let a request wait through one do not test the bound.
const testNoLeaderWait = 15 * time.Second

func newTestCluster(t *testing.T, n int, onDisk bool) *testCluster {
	t.Helper()
	return newTestClusterWith(t, n, onDisk, nil)
}

// newTestClusterWith is newTestCluster, with setup run before the nodes start.
func newTestClusterWith(t *testing.T, n int, onDisk bool, setup func(*testCluster)) *testCluster {
	t.Helper()
	tc := &testCluster{t: t, n: n, dirs: make([]string, n), addrs: make([]string, n),
		trans: make([]*raft.InmemTransport, n), nodes: make([]*Server, n), done: make([]chan error, n),
		hooks: &clusterTestHooks{}}
	if setup != nil {
		setup(tc)
	}
	if tc.hooks.noLeaderWait == 0 {
		tc.hooks.noLeaderWait = testNoLeaderWait
	}
	for i := range n {
		if onDisk {
			tc.dirs[i] = filepath.Join(t.TempDir(), "n"+strconv.Itoa(i))
		}
	}
	for i := range n {
		tc.start(i)
	}
	t.Cleanup(func() {
		for i := range n {
			tc.stop(i)
		}
	})
	return tc
}

func (tc *testCluster) peers() []ClusterPeer {
	var p []ClusterPeer
	for i := range tc.n {
		addr := "raft" + strconv.Itoa(i)
		if tc.raftAddrs != nil {
			addr = tc.raftAddrs[i]
		}
		p = append(p, ClusterPeer{ID: "n" + strconv.Itoa(i), Addr: addr})
	}
	return p
}

// start starts node i (again), on its client address of before if any.
func (tc *testCluster) start(i int) {
	t := tc.t
	t.Helper()
	var transport raft.Transport // nil: TCP on raftAddrs[i]
	raftAddr := ""
	if tc.raftAddrs != nil {
		raftAddr = tc.raftAddrs[i]
	} else {
		_, tr := raft.NewInmemTransport(raft.ServerAddress("raft" + strconv.Itoa(i)))
		tc.trans[i], transport = tr, tr
		for j := range tc.n {
			if j != i && tc.trans[j] != nil {
				tr.Connect(tc.trans[j].LocalAddr(), tc.trans[j])
				tc.trans[j].Connect(tr.LocalAddr(), tr)
			}
		}
	}
	addr := tc.addrs[i]
	if addr == "" {
		// Not port 0: a restart binds the same port again, and a port of
		// the ephemeral range may meanwhile be the local port of another
		// process's connection (see proctest.FreeAddr).
		addr = proctest.FreeAddr(t)
	}
	var ln net.Listener
	var err error
	for range 50 { // a restart may find its port in TIME_WAIT for a moment
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	tc.addrs[i] = ln.Addr().String()
	logger := slog.New(slog.DiscardHandler)
	if testing.Verbose() {
		logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	cfg := Config{
		Addr:         tc.addrs[i],
		SessionGrace: 3 * time.Second,
		Logger:       logger.With("node", i),
		TLSCertFile:  tc.tlsCert, TLSKeyFile: tc.tlsKey,
		Cluster: &ClusterConfig{
			CAFile: tc.caFile,
			ID:     "n" + strconv.Itoa(i), ClientAddr: tc.addrs[i], Dir: tc.dirs[i], Transport: transport, RaftAddr: raftAddr,
			Bootstrap: true, Peers: tc.peers(), Secret: testSecret,
			HeartbeatTimeout: tc.raftTimeout(), ElectionTimeout: tc.raftTimeout(),
			LeaderLeaseTimeout: tc.raftTimeout() / 2,
			testHooks:          tc.hooks,
		},
	}
	if tc.configure != nil {
		tc.configure(i, &cfg)
	}
	srv, err := New(cfg)
	if err != nil {
		ln.Close()
		t.Fatal(err)
	}
	tc.nodes[i] = srv
	done := make(chan error, 1)
	tc.done[i] = done
	go func() { done <- srv.Serve(ln) }()
}

// stop shuts node i down (once).
func (tc *testCluster) stop(i int) {
	srv := tc.nodes[i]
	if srv == nil {
		return
	}
	tc.nodes[i] = nil
	for j := range tc.n {
		if j != i && tc.trans[j] != nil && tc.trans[i] != nil {
			tc.trans[j].Disconnect(tc.trans[i].LocalAddr())
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // seconds: a busy machine
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		tc.t.Errorf("shutdown n%d: %v", i, err)
	}
	if err := <-tc.done[i]; err != ErrServerClosed {
		tc.t.Errorf("Serve n%d returned %v", i, err)
	}
	tc.trans[i] = nil
}

// leader waits for a ready leader among the running nodes and returns its
// index. The bound is 30 s: a busy machine, under the race detector, with
// the package's other clusters beside, has taken over 10 s to elect one.
func (tc *testCluster) leader() int {
	tc.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		for i, s := range tc.nodes {
			if s != nil && s.cl.node.IsLeader() {
				return i
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	tc.t.Fatal("no leader")
	return -1
}

// dial connects a raw client to node i as sid.
// waitQueue waits until node i's replicated state has n entries (holder
// included) in resource's queue.
func (tc *testCluster) waitQueue(i int, resource string, n int) {
	tc.t.Helper()
	proctest.WaitFor(tc.t, 30*time.Second, fmt.Sprintf("%d entries of %s on node %d", n, resource, i), func() bool {
		got := 0
		tc.nodes[i].batch(func(tx *core.Tx) { got = tx.QueueLen(resource) })
		return got == n
	})
}

func (tc *testCluster) dial(i int, sid string) *raw {
	tc.t.Helper()
	return tc.dialConnect(i, "connect "+sid+" 1.0")
}

// connected dials node i as sid and expects a new session.
func (tc *testCluster) connected(i int, sid string) *raw {
	tc.t.Helper()
	c := tc.dial(i, sid)
	c.expect("connected 1.0 new * **")
	return c
}

// dialConnect connects to node i and sends the connect frame given.
func (tc *testCluster) dialConnect(i int, connect string) *raw {
	tc.t.Helper()
	c := tc.conn(i)
	c.send(connect)
	return c
}

// dialForward opens a forwarding connection to node i, as a follower
// does: its first frame is forward and the cluster's secret.
func (tc *testCluster) dialForward(i int) *raw {
	tc.t.Helper()
	c := tc.conn(i)
	c.write(frame("forward " + hex.EncodeToString(tc.nodes[i].cl.secret[:])))
	return c
}

// conn opens a connection to node i's client address, closed when the
// test ends, and sends nothing.
func (tc *testCluster) conn(i int) *raw {
	tc.t.Helper()
	nc, err := net.Dial("tcp", tc.addrs[i])
	if err != nil {
		tc.t.Fatal(err)
	}
	tc.t.Cleanup(func() { nc.Close() })
	return &raw{t: tc.t, nc: nc}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// readTimeout reads one frame within d.
func (c *raw) readWithin(d time.Duration) string {
	c.t.Helper()
	p, err := c.next(d)
	if err != nil {
		c.t.Fatalf("reading a frame: %v", err)
	}
	return p
}

func TestClusterLocksThroughEveryNode(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, false)
	tc.leader()
	var cs []*raw
	for i := range 3 {
		c := tc.dial(i, "s"+strconv.Itoa(i))
		c.expect("connected 1.0 new * **")
		cs = append(cs, c)
	}
	// FIFO across nodes: 0 holds, 1 then 2 wait.
	id0 := cs[0].lock("1", "hot 10000 0 0")
	tok0, _ := strconv.ParseUint(cs[0].locked(id0), 10, 64)
	id1 := cs[1].lock("1", "hot 10000 0 0")
	// 1's lock is in the log (node 2 applied it) before 2 asks: the order
	// under test.
	tc.waitQueue(2, "hot", 2)
	id2 := cs[2].lock("1", "hot 10000 0 0")
	cs[1].quiet()
	cs[2].quiet()
	cs[0].send("unlock 2 " + id0)
	cs[0].expect("result 2 success done")
	f := cs[1].expect("locked " + id1 + " * *") // pushed by node 1
	tok1, _ := strconv.ParseUint(f[3], 10, 64)
	cs[2].quiet()
	cs[1].send("unlock 2 " + id1)
	cs[1].expect("result 2 success done")
	f = cs[2].expect("locked " + id2 + " * *")
	tok2, _ := strconv.ParseUint(f[3], 10, 64)
	if !(tok0 < tok1 && tok1 < tok2) {
		t.Fatalf("tokens %d %d %d not increasing", tok0, tok1, tok2)
	}
	// Every command kind through a follower.
	fol := (tc.leader() + 1) % 3
	c := cs[fol]
	c.send("trylock 3 hot 1000")
	if got := c.read(); !strings.HasPrefix(got, "result 3 failed ") { // held by 2
		t.Fatalf("trylock: %q", got)
	}
	c.send("ping 4")
	c.expect("result 4 success pong")
	id := c.lock("5", "a|b 60000 0 0 own")
	c.locked(id)
	c.send("extend 6 " + id + " 20000")
	c.expect("result 6 success *")
	c.send("renew 7 own a|b 30000")
	c.expect("result 7 success * *")
	c.send("release 8 own a")
	c.expect("result 8 success true")
	c.expect("expired " + id + " *") // partial release
	c.send("releaseall 9 own")
	c.expect("result 9 success *")
	c.expect("expired " + id + " released") // the rest of it, in log order as on one node
	c.send("status 10")
	st := c.expect("result 10 success *")
	if !strings.Contains(strings.Join(st[3:], " "), `"cluster":{"id":"n`) {
		t.Fatalf("status without the cluster object: %v", st)
	}
	// Pipelined frames keep their order.
	var b []byte
	for i := range 20 {
		b = append(b, frame(fmt.Sprintf("lock p%d p%d 5000 0 0", i, i))...)
	}
	c.write(b)
	for i := 0; i < 20; {
		got := c.read()
		if strings.HasPrefix(got, "locked ") || strings.HasPrefix(got, "expired ") {
			continue
		}
		if !match(got, fmt.Sprintf("result p%d success *", i)) {
			t.Fatalf("pipelined answer %d: %q", i, got)
		}
		i++
	}
}

func frame(p string) []byte {
	var r raw
	_ = r
	b := []byte{0, 0, 0, 0}
	b = append(b, p...)
	b = append(b, '\n')
	l := len(b)
	b[0], b[1], b[2], b[3] = byte(l>>24), byte(l>>16), byte(l>>8), byte(l)
	return b
}

func TestClusterSessionMovesToAnotherNode(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, false)
	tc.leader()
	a := tc.dial(0, "mover")
	a.expect("connected 1.0 new * **")
	id := a.lock("1", "m 60000 0 0")
	tok := a.locked(id)
	w := tc.dial(2, "waiter")
	w.expect("connected 1.0 new * **")
	wid := w.lock("1", "m 60000 0 0")
	// The client moves to node 1: its session resumes there with its lock.
	a.nc.Close()
	b := tc.dial(1, "mover")
	b.expect("connected 1.0 resumed * **")
	b.expect("locked " + id + " * " + tok)
	w.quiet()
	// A push for it is now delivered by node 1.
	b.send("unlock 2 " + id)
	b.expect("result 2 success done")
	w.expect("locked " + wid + " * *")
	// Takeover across nodes: the old connection is told.
	c := tc.dial(0, "waiter")
	c.expect("connected 1.0 resumed * **")
	for {
		got := w.read()
		if strings.HasPrefix(got, "error ") {
			break
		}
		if !strings.HasPrefix(got, "locked ") {
			t.Fatalf("old connection got %q", got)
		}
	}
	c.expect("locked " + wid + " * *")
}

func TestClusterLeaderLoss(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, false)
	l := tc.leader()
	f1, f2 := (l+1)%3, (l+2)%3
	h := tc.dial(f1, "holder")
	h.expect("connected 1.0 new * **")
	id := h.lock("1", "x 60000 0 0")
	tok, _ := strconv.ParseUint(h.locked(id), 10, 64)
	w := tc.dial(f2, "waiter")
	w.expect("connected 1.0 new * **")
	wid := w.lock("1", "x 60000 0 0") // no timeout: waits
	tc.stop(l)
	// During the election the unlock waits, and is then applied.
	h.send("unlock 2 " + id)
	if got := h.readWithin(30 * time.Second); got != "result 2 success done" {
		t.Fatalf("unlock: %q", got)
	}
	got := w.readWithin(30 * time.Second)
	f := strings.Split(got, " ")
	if len(f) != 4 || f[0] != "locked" || f[1] != wid {
		t.Fatalf("waiter got %q", got)
	}
	if tok2, _ := strconv.ParseUint(f[3], 10, 64); tok2 <= tok {
		t.Fatalf("token %d after %d", tok2, tok)
	}
	if nl := tc.leader(); nl == l {
		t.Fatal("the stopped node leads")
	}
}

// TestClusterGoClient: the Go client with every node's address, workers
// contending for one resource while the leader is stopped; fencing tokens
// show no two holders at once.
func TestClusterGoClient(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, false)
	l := tc.leader()
	var mu sync.Mutex
	holding := 0
	var tokens []uint64
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	// The workers lock until 10 grants came after the leader stopped (a
	// count, not a time: a busy machine grants slowly), or ctx ends.
	stopped := false
	after := 0
	more := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return after < 10
	}
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each worker starts on a different node.
			addrs := append(append([]string(nil), tc.addrs[w%3:]...), tc.addrs[:w%3]...)
			c, err := mlock.New("mlock://" + strings.Join(addrs, ","))
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			for more() {
				lk, err := c.Lock(ctx, "shared", &mlock.LockOptions{TTL: 10 * time.Second})
				if err != nil {
					errs <- fmt.Errorf("lock: %w", err)
					return
				}
				mu.Lock()
				holding++
				if holding > 1 {
					errs <- fmt.Errorf("two holders")
				}
				tokens = append(tokens, lk.Token())
				if stopped {
					after++
				}
				mu.Unlock()
				time.Sleep(time.Millisecond)
				mu.Lock()
				holding--
				mu.Unlock()
				if err := lk.Unlock(ctx); err != nil {
					// Two connections lost in a failover: the session
					// releases it when it is connected again (Unlock's doc).
					// Never lost: Unlock is called a millisecond after the
					// grant, long before the Deadline, so a retried unlock
					// that finds the lock gone (freed by its first try or by
					// the lock's loss at its Deadline during the failover)
					// succeeds.
					var me *mlock.Error
					if !errors.As(err, &me) || me.Type != mlock.TypeConnection {
						errs <- fmt.Errorf("unlock: %w", err)
						return
					}
				}
			}
		}()
	}
	// The load runs (10 grants) before the leader stops.
	proctest.WaitFor(t, 30*time.Second, "grants before the leader stops", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(tokens) >= 10
	})
	tc.stop(l)
	mu.Lock()
	stopped = true
	mu.Unlock()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("token %d after %d", tokens[i], tokens[i-1])
		}
	}
	if after < 10 {
		t.Fatalf("%d grants after the leader stopped (of %d), want 10", after, len(tokens))
	}
	t.Logf("%d grants, %d after the leader stopped", len(tokens), after)
}

func TestClusterRestartFromDisk(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, true)
	tc.leader()
	a := tc.dial(1, "keeper")
	a.expect("connected 1.0 new * **")
	id := a.lock("1", "kept 600000 0 0")
	tok := a.locked(id)
	tc.nodes[0].cl.node.Snapshot() // compact once: the restart restores a snapshot, then the log
	id2 := a.lock("2", "kept2 600000 0 0")
	tok2 := a.locked(id2)
	a.nc.Close()
	for i := range 3 {
		tc.stop(i)
	}
	b := restartKeeper(t, tc, id+" "+tok, id2+" "+tok2)
	// Tokens keep increasing.
	id3 := b.lock("3", "new 1000 0 0")
	if tok3, _ := strconv.ParseUint(b.locked(id3), 10, 64); tok3 <= mustUint(tok2) {
		t.Fatalf("token %d after %s", tok3, tok2)
	}
}

// restartKeeper starts tc's three stopped nodes, waits for a leader and
// resumes the session "keeper" on node 2, which must be told again of its
// two held locks, each "<id> <token>" of want.
func restartKeeper(t *testing.T, tc *testCluster, want ...string) *raw {
	t.Helper()
	for i := range 3 {
		tc.start(i)
	}
	tc.leader()
	b := tc.dial(2, "keeper")
	if got := b.readWithin(30 * time.Second); !match(got, "connected 1.0 resumed * **") {
		t.Fatalf("after the restart: %q", got)
	}
	seen := map[string]bool{}
	for range 2 {
		f := strings.Split(b.read(), " ")
		seen[f[1]+" "+f[3]] = true
	}
	for _, w := range want {
		if !seen[w] {
			t.Fatalf("locks after the restart: %v, want %v", seen, want)
		}
	}
	return b
}

func mustUint(s string) uint64 { n, _ := strconv.ParseUint(s, 10, 64); return n }

// TestClusterDeterminism records the log one node applies and replays it
// into three fresh state machines: identical snapshots, byte for byte.
func TestClusterDeterminism(t *testing.T) {
	t.Parallel()
	type rec struct {
		now  int64
		cmds [][]byte
	}
	var mu sync.Mutex
	var log []rec
	apply := func(node string, now int64, cmds [][]byte) {
		if node != "n0" {
			return
		}
		cp := make([][]byte, len(cmds))
		for i, c := range cmds {
			cp[i] = append([]byte(nil), c...)
		}
		if cmds == nil {
			cp = nil
		}
		mu.Lock()
		log = append(log, rec{now, cp})
		mu.Unlock()
	}
	tc := newTestClusterWith(t, 3, false, func(tc *testCluster) { tc.hooks.apply = apply })
	tc.leader()
	var cs []*raw
	for i := range 3 {
		c := tc.dial(i, "d"+strconv.Itoa(i))
		c.expect("connected 1.0 new * **")
		cs = append(cs, c)
	}
	for k := range 5 {
		for i, c := range cs {
			c.send("lock " + strconv.Itoa(k) + " r" + strconv.Itoa(k%2) + " 300 0 0 o" + strconv.Itoa(i))
			// Grants and expiries of the earlier 300 ms locks may come first.
			for got := c.read(); !match(got, "result "+strconv.Itoa(k)+" success *"); got = c.read() {
				if !strings.HasPrefix(got, "locked ") && !strings.HasPrefix(got, "expired ") {
					t.Fatalf("got %q, want the result of lock %d", got, k)
				}
			}
		}
	}
	// The 300 ms leases expire and are granted on: two of each resource
	// (r0 has 9 entries, r1 6) in n0's state.
	proctest.WaitFor(t, 10*time.Second, "two expiries on each resource", func() bool {
		var q0, q1 int
		tc.nodes[0].batch(func(tx *core.Tx) { q0, q1 = tx.QueueLen("r0"), tx.QueueLen("r1") })
		return q0 <= 7 && q1 <= 4
	})
	cs[0].nc.Close()
	// The close's detach goes through the log to every node.
	proctest.WaitFor(t, 10*time.Second, "d0 detached on every node", func() bool {
		for i := range 3 {
			if node, ok := tc.sessionNode(i, "d0"); !ok || node != "" {
				return false
			}
		}
		return true
	})
	for i := range 3 {
		tc.stop(i)
	}
	mu.Lock()
	entries := log
	mu.Unlock()
	if len(entries) < 10 {
		t.Fatalf("only %d entries", len(entries))
	}
	var snaps [][]byte
	for k := range 3 {
		d := replaySM(t, "replay"+strconv.Itoa(k))
		for _, e := range entries {
			d.Apply(e.now, e.cmds)
		}
		b, err := d.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		snaps = append(snaps, b)
		// A restored state snapshots the same.
		d2 := replaySM(t, "restored")
		if err := d2.Restore(b); err != nil {
			t.Fatal(err)
		}
		if b2, _ := d2.Snapshot(); !bytes.Equal(b, b2) {
			t.Fatal("restored state differs")
		}
	}
	if !bytes.Equal(snaps[0], snaps[1]) || !bytes.Equal(snaps[1], snaps[2]) {
		t.Fatal("replays differ")
	}
	if len(snaps[0]) < 100 {
		t.Fatalf("snapshot of %d bytes: no state?", len(snaps[0]))
	}
}

// replaySM returns a state machine of a server that is no node: for
// replaying a log.
func replaySM(t *testing.T, id string) *cluster.Dedup {
	return replaySMWith(t, id, nil)
}

// replaySMWith is replaySM with its own flags: configure changes them.
func replaySMWith(t *testing.T, id string, configure func(*Config)) *cluster.Dedup {
	return replayServer(t, id, configure).cl.dedup
}

// replayServer is the server of replaySMWith.
func replayServer(t *testing.T, id string, configure func(*Config)) *Server {
	cfg := Config{SessionGrace: 3 * time.Second, Cluster: &ClusterConfig{}}
	if configure != nil {
		configure(&cfg)
	}
	cfg = cfg.withDefaults()
	s := &Server{cfg: cfg, log: cfg.Logger, sessions: map[string]*session{}, conns: map[*conn]struct{}{},
		perIP: nil, buckets: map[string]*bucket{}, set: settingsOf(&cfg)}
	s.cl = &clusterState{id: id, conns: map[string]*conn{}, version: logFormat1}
	s.cl.versionNow.Store(logFormat1)
	c, err := s.newCore(s.set, nil, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	s.corep.Store(c)
	s.cl.dedup = cluster.NewDedup(&replica{s}, cfg.Cluster.DedupWindow)
	return s
}

// Membership changes asked through any node reach the leader: a follower is
// removed and joins again; removing a stranger fails saying why; a single
// server answers that it is not a cluster node.
func TestClusterMembershipThroughAnyNode(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, false)
	l := tc.leader()
	via, gone := (l+1)%3, (l+2)%3 // ask a follower to remove the other follower
	c, err := mlock.New("mlock://" + tc.addrs[via])
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	members := func() []string {
		var ids []string
		for _, p := range tc.nodes[l].ClusterStatus().Peers {
			ids = append(ids, p.ID)
		}
		slices.Sort(ids)
		return ids
	}
	id := "n" + strconv.Itoa(gone)
	if err := c.ClusterRemove(ctx, id); err != nil {
		t.Fatalf("ClusterRemove(%s): %v", id, err)
	}
	if got := members(); len(got) != 2 || slices.Contains(got, id) {
		t.Fatalf("members after removing %s: %v", id, got)
	}
	if err := c.ClusterJoin(ctx, id, "raft"+strconv.Itoa(gone)); err != nil {
		t.Fatalf("ClusterJoin(%s): %v", id, err)
	}
	if got := members(); len(got) != 3 || !slices.Contains(got, id) {
		t.Fatalf("members after %s joined again: %v", id, got)
	}
	err = c.ClusterRemove(ctx, "stranger")
	var me *mlock.Error
	if !errors.As(err, &me) || me.Type != mlock.TypeRequest || !strings.Contains(err.Error(), `no member "stranger"`) {
		t.Fatalf("removing a stranger: %v, want a request error naming it", err)
	}
	if err := c.ClusterJoin(ctx, "bad id", "x"); err == nil {
		t.Fatal("a node id with a space was sent")
	}

	single := start(t, Config{})
	sc, err := mlock.New("mlock://" + single.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	if err := sc.ClusterRemove(ctx, "n1"); !errors.Is(err, mlock.ErrNotCluster) {
		t.Fatalf("ClusterRemove on a single server: %v, want ErrNotCluster", err)
	}
}

// tlsClientOnFollower returns a TLS client (trusting ca) of a follower, and
// the follower's index; the client is closed when the test ends.
func (tc *testCluster) tlsClientOnFollower(ca *testcert.CA) (*mlock.Client, int) {
	tc.t.Helper()
	f := (tc.leader() + 1) % tc.n
	c, err := mlock.NewClient(mlock.Options{Addrs: []string{tc.addrs[f]}, TLS: &tls.Config{RootCAs: ca.Pool()}})
	if err != nil {
		tc.t.Fatal(err)
	}
	tc.t.Cleanup(func() { c.Close() })
	return c, f
}

// With TLS on the client ports, a follower forwards to the leader over TLS,
// verifying the leader's certificate: a TLS client on a follower locks.
func TestClusterForwardsOverTLS(t *testing.T) {
	t.Parallel()
	ca := testcert.New(t)
	cert, key := ca.Server(t, "127.0.0.1")
	tc := newTestClusterWith(t, 3, false, func(tc *testCluster) {
		tc.tlsCert, tc.tlsKey, tc.caFile = cert, key, ca.CertFile()
	})
	c, f := tc.tlsClientOnFollower(ca)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lk, err := c.Lock(ctx, "over-tls", &mlock.LockOptions{TTL: time.Minute}) // outlives a busy machine's forwarding
	if err != nil {
		t.Fatalf("Lock through a follower over TLS: %v", err)
	}
	if c.Node() != tc.addrs[f] {
		t.Fatalf("answered by %s, want the follower %s", c.Node(), tc.addrs[f])
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// With TLS on the client ports, the Raft ports over TCP speak TLS too, with
// the node's certificate (reloaded with it): a 3-node cluster elects a
// leader and a TLS client on a follower locks.
func TestClusterRaftOverTLS(t *testing.T) {
	t.Parallel()
	ca := testcert.New(t)
	cert, key := ca.Server(t, "127.0.0.1")
	raftAddrs := []string{proctest.FreeAddr(t), proctest.FreeAddr(t), proctest.FreeAddr(t)}
	tc := newTestClusterWith(t, 3, false, func(tc *testCluster) {
		tc.tlsCert, tc.tlsKey, tc.caFile, tc.raftAddrs = cert, key, ca.CertFile(), raftAddrs
	})
	c, _ := tc.tlsClientOnFollower(ca)
	// Seconds of margin: a starved machine takes seconds to handshake TLS
	// between the nodes and may elect again before the lock is committed.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	lk, err := c.Lock(ctx, "raft-over-tls", &mlock.LockOptions{TTL: time.Minute}) // outlives a busy machine's forwarding
	if err != nil {
		t.Fatalf("Lock through a follower: %v", err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	// raftLeaf is the certificate node i serves on its Raft port, verified
	// against the CA for 127.0.0.1.
	raftLeaf := func(i int) *x509.Certificate {
		t.Helper()
		d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 2 * time.Second}, Config: &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"}}
		nc, err := d.Dial("tcp", tc.raftAddrs[i])
		if err != nil {
			t.Fatalf("TLS to node %d's Raft port: %v", i, err)
		}
		defer nc.Close()
		return nc.(*tls.Conn).ConnectionState().PeerCertificates[0]
	}
	before := raftLeaf(0)
	// A new certificate in the same files, reloaded (as on SIGHUP), serves
	// the next Raft connections.
	newCert, newKey := ca.Server(t, "127.0.0.1")
	for _, cp := range [][2]string{{newCert, cert}, {newKey, key}} {
		b, err := os.ReadFile(cp[0])
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(cp[1], b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := tc.nodes[0].Reload(); err != nil {
		t.Fatal(err)
	}
	if after := raftLeaf(0); after.SerialNumber.Cmp(before.SerialNumber) == 0 {
		t.Fatal("the Raft port serves the certificate of before the reload")
	}
}

// A follower writes its clients' answers in log order, with the pushes of
// the entries before them: an answer the leader has already given never
// overtakes a grant pushed by an earlier entry the follower has not applied,
// and neither does a pong (answered once the follower applied up to a read
// index the leader confirmed after the ping arrived).
// (A client counts a grant's lease from the send time of the last request
// answered before it: an answer read first would stretch the lease past the
// server's expiry.)
func TestClusterFollowerAnswersInLogOrder(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, false)
	l := tc.leader()
	f := (l + 1) % 3
	holder := tc.connected(l, "holder")
	waiter := tc.connected(f, "waiter")
	idH := holder.lock("1", "x 10000 0 0")
	holder.locked(idH)
	idW := waiter.lock("1", "x 10000 0 0") // queued; the answer came from the follower's apply
	waiter.quiet()
	// The follower stops receiving the log (its forwarding to the leader,
	// over the client port, goes on).
	for j := range 3 {
		if j != f {
			tc.trans[j].Disconnect(tc.trans[f].LocalAddr())
			tc.trans[f].Disconnect(tc.trans[j].LocalAddr())
		}
	}
	holder.send("unlock 2 " + idH) // grants x to the waiter in an entry the follower does not apply
	holder.expect("result 2 success done")
	waiter.send("releaseall 2 nobody") // replicated; the leader answers it at once
	waiter.send("ping 3")              // after a read index past them: a pong is a bound of when later grants were made
	if p, err := waiter.next(300 * time.Millisecond); err == nil {
		t.Fatalf("the follower wrote %q before applying the entries before it", p)
	}
	for j := range 3 {
		if j != f {
			tc.trans[j].Connect(tc.trans[f].LocalAddr(), tc.trans[f])
			tc.trans[f].Connect(tc.trans[j].LocalAddr(), tc.trans[j])
		}
	}
	waiter.expect("locked " + idW + " * *")
	waiter.expect("result 2 success 0")
	waiter.expect("result 3 success pong")
}

// A follower names the leader in its handshake; the Go client moves there
// unless told to stay.
func TestClusterClientMovesToTheLeader(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, false)
	// Each try names new sessions: a session of an earlier try lives on
	// (resumed, rightly, by a connect with its socketId).
	try := 0
	tc.steadyLeader("the handshakes", func(l, f int) error {
		try++
		c := tc.dialConnect(f, fmt.Sprintf("connect hint-probe-%d 1.0 want=leader", try))
		if got, want := c.readWithin(30*time.Second), "connected 1.0 new * leader="+tc.addrs[l]; !match(got, want) {
			return fmt.Errorf("a follower's handshake: %q, want %q", got, want)
		}
		if got := tc.dial(f, fmt.Sprintf("hint-probe-%d-0", try)).readWithin(30 * time.Second); !match(got, "connected 1.0 new *") {
			return fmt.Errorf("a follower's handshake without want=leader: %q", got)
		}
		lc := tc.dialConnect(l, fmt.Sprintf("connect hint-probe-%d-2 1.0 want=leader", try))
		if got := lc.readWithin(30 * time.Second); !match(got, "connected 1.0 new *") {
			return fmt.Errorf("the leader's handshake names a leader: %q", got)
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, stay := range []bool{false, true} {
		tc.steadyLeader(fmt.Sprintf("StayOnNode %v", stay), func(l, f int) error {
			try++ // a resumed session would not move
			cl, err := mlock.NewClient(mlock.Options{Addrs: []string{tc.addrs[f], tc.addrs[l]}, StayOnNode: stay,
				SocketID: fmt.Sprintf("mover-%v-%d", stay, try)})
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			lk, err := cl.Lock(ctx, fmt.Sprintf("moved-%v", stay), &mlock.LockOptions{TTL: time.Minute}) // outlives a busy machine's steps
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := lk.Unlock(ctx); err != nil {
					t.Error(err)
				}
			}()
			want := tc.addrs[l]
			if stay {
				want = tc.addrs[f]
			}
			if got := cl.Node(); got != want {
				return fmt.Errorf("the session is on %s, want %s", got, want)
			}
			return nil
		})
	}
}

// steadyLeader runs step with the leader's index and a follower's, again
// (up to 5 times) while step fails and the leadership moved meanwhile (a
// busy machine elects now and then): what step checks is a steady
// cluster's. A failure with the leader and its term unchanged fails the
// test.
func (tc *testCluster) steadyLeader(what string, step func(l, f int) error) {
	tc.t.Helper()
	for try := 1; ; try++ {
		l := tc.leader()
		term := tc.nodes[l].cl.node.Term()
		err := step(l, (l+1)%tc.n)
		if err == nil {
			return
		}
		if moved := tc.leader() != l || tc.nodes[l].cl.node.Term() != term; !moved || try == 5 {
			tc.t.Fatalf("%s: %v (try %d, the leadership moved: %v)", what, err, try, moved)
		}
		tc.t.Logf("%s: %v: the leadership moved meanwhile; again", what, err)
	}
}

// A forwarding connection leaves the pool of pre-handshake connections when
// its hello is accepted: many of them from one address (followers
// reconnecting to the leader after failovers) never crowd that address
// out. (They used to stay counted under their address for good.)
func TestClusterForwardingConnectionsLeaveThePreHandshakePool(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, false)
	l := tc.leader()
	hello := "forward " + hex.EncodeToString(tc.nodes[l].cl.secret[:])
	srv := tc.nodes[l]
	preFromLoopback := func() (n int) {
		srv.core().Batch(func(*core.Tx) {
			if a := srv.preByIP[preKey(netip.MustParseAddr("127.0.0.1"))]; a != nil {
				n = a.n
			}
		})
		return n
	}
	for i := range 32 {
		fc := tc.dialConnect(l, hello)
		// Its hello handled: it counts no more.
		deadline := time.Now().Add(5 * time.Second)
		for preFromLoopback() != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("forwarding connection %d still counts as pre-handshake (%d from its address)", i, preFromLoopback())
			}
			time.Sleep(5 * time.Millisecond)
		}
		if i%2 == 0 {
			fc.nc.Close() // some reconnect, some stay
		}
	}
	c := tc.dial(l, "after-forwards")
	if got := c.readWithin(30 * time.Second); !strings.HasPrefix(got, "connected ") {
		t.Fatalf("a client from the forwarders' address: %q", got)
	}
}
