package server

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/mlock-dev/mlock/internal/cluster"
	"github.com/mlock-dev/mlock/internal/core"
	"github.com/mlock-dev/mlock/internal/proctest"
)

// replayEntry is one log entry for a replayed state machine.
type replayEntry struct {
	now  int64
	cmds [][]byte
}

// replaySettings are the settings the log of replayLog puts in force (its
// genesis carries them): replaySM's own.
var replaySettings = func() settings {
	cfg := Config{SessionGrace: 3 * time.Second, Cluster: &ClusterConfig{}}.withDefaults()
	return settingsOf(&cfg)
}()

// replayLog builds a log by hand, as nodes "x" and "y" would propose it:
// genesis, sessions that lock, wait, detach with pushes going to their
// offline buffers, a failover, expiries and a session that comes back.
func replayLog() []replayEntry {
	const ms = int64(time.Millisecond)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	var log []replayEntry
	add := func(at int64, cmds ...[]byte) { log = append(log, replayEntry{t0 + at, cmds}) }
	seqs := map[string]uint64{}
	cmd := func(m *logCmd) []byte {
		seqs[m.conn]++
		m.seq = seqs[m.conn]
		return cluster.DedupCommand(m.conn, m.seq, appendLogCmd(nil, m))
	}
	attach := func(node, conn, sess string) []byte {
		return cmd(&logCmd{op: opAttach, node: node, conn: conn, session: sess})
	}
	frames := func(node, conn, sess string, fr ...string) []byte {
		m := &logCmd{op: opFrames, node: node, conn: conn, session: sess}
		for _, f := range fr {
			m.frames = append(m.frames, []byte(f))
		}
		return cmd(m)
	}
	detach := func(node, conn, sess string) []byte {
		seqs[conn]++
		return cluster.DedupCommand(conn, seqs[conn], appendLogCmd(nil, &logCmd{op: opDetach, node: node, conn: conn, session: sess}))
	}
	add(0, cluster.DedupCommand("", 0, appendGenesis(nil, t0, replaySettings.String())))
	add(1*ms, attach("x", "x/1/1", "s1"), attach("y", "y/1/1", "s2"), attach("y", "y/1/2", "s3"))
	add(2*ms, frames("x", "x/1/1", "s1", "lock 1 a 400 0 0 o1", "lock 2 c 300 0 0 o1"))
	add(3*ms, frames("y", "y/1/1", "s2", "lock 1 a 500 2000 0 o2"), frames("y", "y/1/2", "s3", "lock 1 c 500 100 0 o3"))
	add(4*ms, detach("y", "y/1/1", "s2"), detach("y", "y/1/2", "s3"))
	add(50*ms, frames("x", "x/1/1", "s1", "renew 3 o1 c 900", "release 4 o1 zz"))
	add(103 * ms)                                              // s3's wait times out: offline
	add(200*ms, frames("x", "x/1/1", "s1", "releaseall 5 o1")) // s2 granted a: offline
	add(250*ms, cluster.DedupCommand("", 0, appendLogCmd(nil, &logCmd{op: opFailover, until: t0 + 1500*ms})))
	add(260*ms, frames("x", "x/1/1", "s1", "lock 6 d 100 0 0 o1"))
	add(1500 * ms) // expiries moved to the failover's end
	add(1600*ms, attach("x", "x/1/2", "s2"))
	add(1700*ms, frames("x", "x/1/2", "s2", "lock 1 e 200 0 0 o2", "ping 2"))
	// A repeat of an applied command: answered from the window.
	add(1800*ms, cluster.DedupCommand("x/1/2", seqs["x/1/2"], appendLogCmd(nil, &logCmd{op: opFrames, node: "x", conn: "x/1/2", seq: seqs["x/1/2"], session: "s2", frames: [][]byte{[]byte("lock 1 e 200 0 0 o2"), []byte("ping 2")}})))
	add(2000 * ms)
	add(6000 * ms) // s3's grace ends
	return log
}

// TestClusterReplayRestoreMidway: a state restored from a snapshot taken
// anywhere in the log, then applying the rest of the log, ends byte for byte
// like the state that applied the whole log, and answers alike.
func TestClusterReplayRestoreMidway(t *testing.T) {
	t.Parallel()
	log := replayLog()
	full := replaySM(t, "r")
	var want [][][]byte
	for _, e := range log {
		want = append(want, full.Apply(e.now, e.cmds))
	}
	end, err := full.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	for k := 1; k < len(log); k++ {
		a := replaySM(t, "a"+strconv.Itoa(k))
		for _, e := range log[:k] {
			a.Apply(e.now, e.cmds)
		}
		snap, err := a.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		b := replaySM(t, "b"+strconv.Itoa(k))
		if err := b.Restore(snap); err != nil {
			t.Fatal(err)
		}
		for i, e := range log[k:] {
			got := b.Apply(e.now, e.cmds)
			for j := range got {
				if !bytes.Equal(got[j], want[k+i][j]) {
					t.Errorf("restored at %d: entry %d command %d answered %v, want %v", k, k+i, j, got[j], want[k+i][j])
				}
			}
		}
		got, err := b.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, end) {
			t.Errorf("restored at entry %d: final snapshot differs (%d bytes, want %d)", k, len(got), len(end))
		}
	}
}

// cutRaft cuts node f off the others' Raft messages (its forwarding to the
// leader, over the client port, goes on); heal undoes it.
func (tc *testCluster) cutRaft(f int, heal bool) {
	for j := range tc.n {
		if j == f || tc.trans[j] == nil {
			continue
		}
		if heal {
			tc.trans[j].Connect(tc.trans[f].LocalAddr(), tc.trans[f])
			tc.trans[f].Connect(tc.trans[j].LocalAddr(), tc.trans[j])
		} else {
			tc.trans[j].Disconnect(tc.trans[f].LocalAddr())
			tc.trans[f].Disconnect(tc.trans[j].LocalAddr())
		}
	}
}

// A request answered on the node itself (status, locks, a refusal) comes
// after the answers of the connection's earlier requests, which a follower
// writes when it applies their entry: never before them, even when the
// leader has already answered the forwarded command.
func TestClusterFollowerLocalAnswerKeepsOrder(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, false)
	l := tc.leader()
	f := (l + 1) % 3
	c := tc.dial(f, "waiter")
	c.expect("connected 1.0 new * **")
	c.locked(c.lock("1", "x 10000 0 0"))
	tc.cutRaft(f, false)
	c.send("releaseall 2 nobody") // replicated: the leader answers it at once
	c.send("locks 3")             // answered by the follower itself
	c.send("bogus 4")             // refused by the follower itself
	if p, err := c.next(300 * time.Millisecond); err == nil {
		t.Fatalf("the follower wrote %q before applying the entry of the request before it", p)
	}
	tc.cutRaft(f, true)
	c.expect("result 2 success 0")
	c.expect("result 3 success *")
	c.expect("result 4 failed invalid message!")
}

// A connect on a follower is answered before the requests that follow it,
// even those the follower answers itself.
func TestClusterFollowerConnectAnsweredFirst(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, false)
	l := tc.leader()
	f := (l + 1) % 3
	warm := tc.dial(f, "warm") // the follower knows the leader's address
	warm.expect("connected 1.0 new * **")
	tc.cutRaft(f, false)
	c := tc.dial(f, "late")
	c.send("locks 1")
	if p, err := c.next(300 * time.Millisecond); err == nil {
		t.Fatalf("the follower wrote %q before applying the connect", p)
	}
	tc.cutRaft(f, true)
	c.expect("connected 1.0 new * **")
	c.expect("result 1 success *")
}

// sessionNode returns the node session sid is attached to in node i's
// replicated state ("" detached), and whether the session exists.
func (tc *testCluster) sessionNode(i int, sid string) (node string, ok bool) {
	s := tc.nodes[i]
	s.batch(func(*core.Tx) {
		if sess := s.sessions[sid]; sess != nil {
			node, ok = sess.node, true
		}
	})
	return node, ok
}

// The sessions attached to a node that is removed from the cluster while
// cut off from it are detached (their grace starts), as those of a node
// the leader lost: a removed node is never heard from again.
func TestClusterRemovedNodeSessionsDetached(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, false)
	l := tc.leader()
	g := (l + 1) % 3
	c := tc.dial(g, "orphan")
	c.expect("connected 1.0 new * **")
	c.locked(c.lock("1", "x 600000 0 0"))
	if node, _ := tc.sessionNode(l, "orphan"); node != "n"+strconv.Itoa(g) {
		t.Fatalf("session attached to %q", node)
	}
	tc.cutRaft(g, false)
	tc.change(l, g, false)
	deadline := time.Now().Add(10 * time.Second)
	for {
		node, ok := tc.sessionNode(l, "orphan")
		if !ok || node == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the session is still attached to the removed node %s", node)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A node whose limits differ from the leader's says so in its log as soon
// as the leader's are applied (they are in force on it: see
// TestClusterLeaderSettingsInForce).
func TestClusterLimitsDifferFromTheLeader(t *testing.T) {
	t.Parallel()
	odd := -1
	tc := newTestClusterWith(t, 3, false, func(tc *testCluster) {
		tc.configure = func(i int, c *Config) {
			if i == odd {
				c.MaxTTL = time.Minute
				c.Cluster.DedupWindow = 1000
			}
		}
	})
	l := tc.leader()
	f := (l + 1) % 3
	for i := range 3 {
		if tc.nodes[i].cl.paramsDiffer.Load() != "" {
			t.Fatalf("n%d: limits reported different from the leader's while they are the same", i)
		}
	}
	odd = f
	tc.stop(f)
	tc.start(f)
	deadline := time.Now().Add(10 * time.Second)
	for tc.nodes[f].cl.paramsDiffer.Load() == "" {
		if time.Now().After(deadline) {
			t.Fatal("the follower with another max TTL did not report it")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := tc.nodes[f].cl.paramsDiffer.Load(); !strings.Contains(got, "max-ttl=1m0s (leader: 24h0m0s)") ||
		!strings.Contains(got, "dedup-window=1000") {
		t.Fatalf("reported %q, want the max TTL and the de-duplication window named", got)
	}
	if tc.nodes[l].cl.paramsDiffer.Load() != "" {
		t.Fatal("the leader reported its own limits as different")
	}
}

// sessionLocks counts the locks (granted or waiting) of session sid in node
// i's state.
func (tc *testCluster) sessionLocks(i int, sid string) int {
	n := 0
	tc.nodes[i].batch(func(tx *core.Tx) {
		tx.SessionLocks(sid, func(core.LockInfo) { n++ })
	})
	return n
}

// A client on the leader pipelines locks while the leader is cut off: the
// commands on their way are proposed again through the new leader, each is
// applied once, and the answers come in order once the old leader has
// caught up.
func TestClusterLeaderCutWithCommandsOnTheirWay(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, false)
	l := tc.leader()
	c := tc.dial(l, "busy")
	c.expect("connected 1.0 new * **")
	const n = 40
	var b []byte
	for i := 1; i <= n; i++ {
		b = append(b, frame("lock "+strconv.Itoa(i)+" r"+strconv.Itoa(i)+" 60000 0 0")...)
	}
	c.write(b)
	tc.cutRaft(l, false)
	nl := -1
	deadline := time.Now().Add(10 * time.Second)
	for nl < 0 {
		for i, s := range tc.nodes {
			if i != l && s.cl.node.IsLeader() {
				nl = i
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no new leader")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The old leader steps down: its commands on their way are proposed
	// again, through the new leader once it hears of it.
	proctest.WaitFor(t, 10*time.Second, "the old leader steps down", func() bool {
		return !tc.nodes[l].cl.node.IsLeader()
	})
	tc.cutRaft(l, true)
	next := 1
	for next <= n {
		got := c.readWithin(30 * time.Second)
		if strings.HasPrefix(got, "locked ") {
			continue
		}
		if !match(got, "result "+strconv.Itoa(next)+" success *") {
			t.Fatalf("got %q, want the result of request %d", got, next)
		}
		next++
	}
	if got := tc.sessionLocks(nl, "busy"); got != n {
		t.Fatalf("the session has %d locks, want %d", got, n)
	}
}

// A cluster node refuses to start with a wildcard client address: the
// other nodes would forward to their own machine, and clients would be
// sent there.
func TestClusterWildcardClientAddrRefused(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ listen, advertise string }{
		{"0.0.0.0:12340", ""}, {":12340", ""}, {"[::]:12340", ""}, {"127.0.0.1:12340", "0.0.0.0:12340"},
	} {
		_, tr := raft.NewInmemTransport("raft0")
		_, err := New(Config{Addr: c.listen, Cluster: &ClusterConfig{ID: "n0", Transport: tr, Bootstrap: true,
			Secret: testSecret, ClientAddr: c.advertise}})
		if err == nil || !strings.Contains(err.Error(), "wildcard") {
			t.Errorf("listen %q, advertise %q: %v, want a refusal", c.listen, c.advertise, err)
		}
	}
}

// A node removed from the cluster while it runs is never sent the log
// again: it closes its clients' connections and those that connect later,
// so that the clients move to another node; added again, it serves.
func TestClusterRemovedNodeClosesItsClients(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, false)
	l := tc.leader()
	g := (l + 1) % 3
	c := tc.dial(g, "x")
	c.expect("connected 1.0 new * **")
	tc.change(l, g, false)
	c.closed()
	tc.dial(g, "y").closed()
	tc.change(l, g, true)
	deadline := time.Now().Add(10 * time.Second)
	for tc.nodes[g].cl.removed.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the node added again still counts itself removed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	d := tc.dial(g, "y")
	d.expect("connected 1.0 * * **")
}

// A join naming a member at another address, or another member's address,
// is refused: raft would move the member there (a mistyped address cuts it
// off), or give one address two ids. A join of a member at its own address
// does nothing.
func TestClusterJoinMistakesRefused(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, false)
	l := tc.leader()
	g := (l + 1) % 3
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id := "n" + strconv.Itoa(g)
	for _, ch := range []*clusterChange{
		{join: true, id: id, addr: "raft-elsewhere"},
		{join: true, id: "n9", addr: "raft" + strconv.Itoa(g)},
	} {
		if err := tc.nodes[l].changeHere(ctx, ch); err == nil {
			t.Errorf("join %s at %s accepted", ch.id, ch.addr)
		}
	}
	for _, p := range tc.nodes[l].cl.node.Status().Peers {
		if want := "raft" + strings.TrimPrefix(p.ID, "n"); p.Addr != want {
			t.Errorf("member %s at %s, want %s", p.ID, p.Addr, want)
		}
	}
	if err := tc.nodes[l].changeHere(ctx, &clusterChange{join: true, id: id, addr: "raft" + strconv.Itoa(g)}); err != nil {
		t.Errorf("join of a member at its own address: %v", err)
	}
}

// A follower that missed entries the leader has compacted away installs
// the leader's snapshot: a detached session's offline pushes come with it,
// and its client resuming on that follower gets them.
func TestClusterSnapshotInstallKeepsOfflinePushes(t *testing.T) {
	t.Parallel()
	tc := newTestClusterWith(t, 3, false, func(tc *testCluster) {
		tc.configure = func(i int, c *Config) {
			c.Cluster.TrailingLogs = 1
			c.Cluster.SnapshotThreshold = 1 << 30 // only when asked
			c.SessionGrace = time.Minute          // the waiter resumes after the steps below, however slow
		}
	})
	l := tc.leader()
	f := (l + 1) % 3
	h := tc.dial(l, "holder")
	h.expect("connected 1.0 new * **")
	id := h.lock("1", "x 60000 0 0")
	h.locked(id)
	w := tc.dial(l, "waiter")
	w.expect("connected 1.0 new * **")
	wid := w.lock("1", "x 60000 0 0")
	w.nc.Close()
	deadline := time.Now().Add(30 * time.Second)
	for node, _ := tc.sessionNode(l, "waiter"); node != ""; node, _ = tc.sessionNode(l, "waiter") {
		if time.Now().After(deadline) {
			t.Fatal("the waiter's session is not detached")
		}
		time.Sleep(10 * time.Millisecond)
	}
	tc.cutRaft(f, false)
	h.send("unlock 2 " + id) // grants x to the detached waiter: an offline push
	h.expect("result 2 success done")
	for k := 3; k < 8; k++ {
		h.send("ping " + strconv.Itoa(k))
		h.expect("result " + strconv.Itoa(k) + " success pong")
	}
	if err := tc.nodes[l].cl.node.Snapshot(); err != nil {
		t.Fatal(err)
	}
	before := tc.nodes[f].cl.node.Status().AppliedIndex
	tc.cutRaft(f, true)
	deadline = time.Now().Add(30 * time.Second)
	for {
		st, lst := tc.nodes[f].cl.node.Status(), tc.nodes[l].cl.node.Status()
		if st.AppliedIndex >= lst.CommitIndex && st.AppliedIndex > before {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the follower did not catch up: applied %d, leader's commit %d", st.AppliedIndex, lst.CommitIndex)
		}
		time.Sleep(20 * time.Millisecond)
	}
	r := tc.dial(f, "waiter")
	r.expect("connected 1.0 resumed * **")
	r.expect("locked " + wid + " * *")
}

// A session taken over on a follower while its connection on the leader has
// commands on their way: the old connection is answered for exactly the
// commands applied before the takeover (the others find the session gone),
// then told; the session keeps exactly those locks.
func TestClusterTakeoverWithCommandsOnTheirWay(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, false)
	l := tc.leader()
	f := (l + 1) % 3
	a := tc.dial(l, "moving")
	a.expect("connected 1.0 new * **")
	const n = 200
	for i := 1; i <= n; i++ {
		a.write(frame("lock " + strconv.Itoa(i) + " r" + strconv.Itoa(i) + " 60000 0 0"))
	}
	b := tc.dial(f, "moving")
	b.expect("connected 1.0 resumed * **")
	answered := 0
	for {
		got, err := a.next(5 * time.Second)
		if err != nil {
			break
		}
		switch {
		case strings.HasPrefix(got, "locked "):
		case match(got, "result "+strconv.Itoa(answered+1)+" success *"):
			answered++
		case strings.HasPrefix(got, "error "):
		default:
			t.Fatalf("old connection got %q after %d results", got, answered)
		}
	}
	if got := tc.sessionLocks(l, "moving"); got != answered {
		t.Fatalf("the session holds %d locks, the old connection was answered %d", got, answered)
	}
	t.Logf("%d of %d answered before the takeover", answered, n)
}
