package server

import (
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/internal/cluster"
	"github.com/mlock-dev/mlock/internal/core"
	"github.com/mlock-dev/mlock/internal/protocol"
)

// countPings returns an apply hook that counts, on node n0, the pings in
// the log commands it applies.
func countPings(n *atomic.Int64) func(string, int64, [][]byte) {
	return func(node string, _ int64, cmds [][]byte) {
		if node != "n0" {
			return
		}
		for _, c := range cmds {
			_, _, body, err := cluster.ParseDedupCommand(c)
			var m logCmd
			if err != nil || decodeLogCmd(body, &m) != nil {
				continue
			}
			for _, r := range m.reqs {
				if r.kind == reqPing {
					n.Add(1)
				}
			}
			for _, f := range m.frames {
				if strings.HasPrefix(string(f), "ping ") {
					n.Add(1)
				}
			}
		}
	}
}

// settled waits until every node has applied the leader's commit index
// and it stayed so for a moment (the notice that follows the last entry
// is committed too).
func (tc *testCluster) settled(l int) uint64 {
	tc.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var last uint64
	stable := 0
	for stable < 5 {
		if time.Now().After(deadline) {
			tc.t.Fatal("the cluster did not settle")
		}
		commit := tc.nodes[l].cl.node.Status().CommitIndex
		all := true
		for i := range tc.n {
			if tc.nodes[i] != nil && tc.nodes[i].cl.node.Status().AppliedIndex < commit {
				all = false
			}
		}
		if all && commit == last {
			stable++
		} else {
			stable = 0
		}
		last = commit
		time.Sleep(40 * time.Millisecond) // polled: the apply has no event to wait on
	}
	return last
}

// A ping is answered without a log entry, on the leader and on a
// follower: none of 40 pings is in the log (the log path wrote each one).
func TestClusterPingWritesNoEntry(t *testing.T) {
	t.Parallel()
	var pings atomic.Int64
	tc := newTestClusterWith(t, 3, false, func(tc *testCluster) { tc.hooks.apply = countPings(&pings) })
	l := tc.leader()
	f := (l + 1) % 3
	cs := []*raw{tc.dial(l, "on-leader"), tc.dial(f, "on-follower")}
	for _, c := range cs {
		c.expect("connected 1.0 new * **")
	}
	for k := 1; k <= 20; k++ {
		for _, c := range cs {
			c.ping(strconv.Itoa(k))
		}
	}
	tc.settled(tc.leader())
	if n := pings.Load(); n != 0 {
		t.Fatalf("%d of 40 pings in the log", n)
	}
}

// A pong comes after the pushes of every entry committed before the ping
// arrived: a grant made by another connection's unlock is pushed to the
// waiter on a follower before the pong of the waiter's ping sent after the
// unlock was answered.
func TestClusterPongAfterCommittedPushes(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, false)
	l := tc.leader()
	f := (l + 1) % 3
	h := tc.connected(l, "holder")
	w := tc.connected(f, "waiter")
	for k := range 20 {
		res := "r" + strconv.Itoa(k)
		id := h.lock("1", res+" 60000 0 0")
		h.locked(id)
		w.send("lock 2 " + res + " 60000 60000 0")
		wid := w.expect("result 2 success *")[3]
		h.send("unlock 3 " + id)
		h.expect("result 3 success *")
		w.send("ping 4") // after the unlock's answer: its grant is committed
		w.expect("locked " + wid + " * *")
		w.expect("result 4 success pong")
		w.send("unlock 5 " + wid)
		w.expect("result 5 success *")
	}
}

// The leader serves no reads (a build before them): a follower's pings go
// through the log, as before, and are answered.
func TestClusterPingThroughTheLogWithoutReads(t *testing.T) {
	t.Parallel()
	var pings atomic.Int64
	tc := newTestClusterWith(t, 3, false, func(tc *testCluster) {
		tc.hooks.noReads = true
		tc.hooks.apply = countPings(&pings)
	})
	l := tc.leader()
	f := (l + 1) % 3
	c := tc.connected(f, "pinger")
	for k := 1; k <= 5; k++ {
		c.ping(strconv.Itoa(k))
	}
	tc.settled(tc.leader())
	if n := pings.Load(); n < 5 {
		t.Fatalf("%d of 5 pings in the log, want each (a leader change may propose one again)", n)
	}
}

// A follower cut off from the leader's Raft messages (its forwarding to
// the leader goes on) answers no ping the leader did not confirm: its
// session's grace, once the leader detached it, ends no earlier than the
// send time of its last answered ping plus the grace, and no ping sent
// after the leader detached it is answered.
func TestClusterCutOffFollowerPongsBoundTheExpiry(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, false)
	l := tc.leader()
	f := (l + 1) % 3
	h := tc.connected(f, "holder")
	hid := h.lock("1", "x 600000 0 0")
	h.locked(hid)
	w := tc.connected(l, "waiter")
	w.send("lock 1 x 1000 60000 0")
	wid := w.expect("result 1 success *")[3]
	tc.settled(l)
	grace := 3 * time.Second
	tc.cutRaft(f, false)
	// The holder pings every 100 ms on its own; the answers are read
	// alongside.
	sent := map[string]time.Time{}
	var lastPong time.Time
	pongs := 0
	deadline := time.Now().Add(20 * time.Second)
	k := 0
	granted := false
	for !granted && time.Now().Before(deadline) {
		k++
		req := strconv.Itoa(k + 1)
		sent[req] = time.Now()
		_ = h.nc.SetWriteDeadline(time.Now().Add(time.Second))
		if _, err := h.nc.Write(protocol.Append(nil, "ping "+req)); err != nil {
			// Closed by the node (its bound): the client would move.
			time.Sleep(100 * time.Millisecond)
		}
		for {
			p, err := h.next(100 * time.Millisecond)
			if err != nil {
				break
			}
			if fs := strings.Fields(p); len(fs) == 4 && fs[0] == "result" && fs[3] == "pong" {
				pongs++
				if s := sent[fs[1]]; s.After(lastPong) {
					lastPong = s
				}
			}
		}
		if p, err := w.next(time.Millisecond); err == nil {
			if !strings.HasPrefix(p, "locked "+wid) {
				t.Fatalf("the waiter got %q", p)
			}
			granted = true
		}
	}
	if !granted {
		t.Fatal("the waiter was not granted within 20 s of the cut")
	}
	var at int64
	tc.nodes[l].batch(func(tx *core.Tx) {
		id, _ := protocol.ParseID([]byte(wid))
		li, _ := tx.Lookup(id)
		at = li.GrantedAt
	})
	if at == 0 {
		t.Fatal("no grant time in the leader's state")
	}
	t.Logf("%d pongs after the cut; the last ping answered was sent %v before the grant (grace %v)",
		pongs, time.Unix(0, at).Sub(lastPong), grace)
	if !lastPong.IsZero() && time.Unix(0, at).Before(lastPong.Add(grace)) {
		t.Fatalf("the session ended %v after the send time of its last answered ping, before the grace %v",
			time.Unix(0, at).Sub(lastPong), grace)
	}
}

// The leader's rule for detaching a node's sessions: not before the
// failover window has passed since the node's last read (nor since the
// leadership began), and while its detach is on its way the node's reads
// are refused, until the detach is applied.
func TestClusterDetachWaitsForTheNodesReads(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, false)
	l := tc.leader()
	node := tc.nodes[l].cl.node
	var lv liveness
	const window = 300 * time.Millisecond
	since, ok := node.LeadingSince()
	if !ok {
		t.Fatal("the leader does not lead")
	}
	time.Sleep(time.Until(since.Add(window))) // fixed: the leadership's own window has passed
	long := time.Now().Add(-time.Hour)
	if !lv.heard(node, "nX") {
		t.Fatal("a read of a node not being detached was refused")
	}
	if lv.startDetach(node, "nX", long, window) {
		t.Fatal("detach allowed right after the node's read")
	}
	time.Sleep(window) // fixed: the window since the read, the rule's input
	if !lv.startDetach(node, "nX", long, window) {
		t.Fatal("detach refused a window after the node's last read")
	}
	if lv.heard(node, "nX") {
		t.Fatal("a read served while the node's detach is on its way")
	}
	if !lv.heard(node, "nY") {
		t.Fatal("another node's read refused")
	}
	lv.endDetach("nX")
	if !lv.heard(node, "nX") {
		t.Fatal("a read refused after the detach was applied")
	}
	// A follower decides nothing.
	f := (l + 1) % 3
	if lv.startDetach(tc.nodes[f].cl.node, "nZ", long, window) {
		t.Fatal("a follower may detach")
	}
}

// A ping answered on its connection's reader (its pipeline idle: pingHere)
// keeps the order of the answers, on the leader and on a follower: the
// frames read with it are decided once its pong is written, and answered
// without the client sending more; a ping behind a lock on its way is
// answered after the lock's result and its grant.
func TestClusterPingOnTheReaderKeepsOrder(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, false)
	l := tc.leader()
	for _, i := range []int{l, (l + 1) % 3} {
		c := tc.connected(i, "pinger"+strconv.Itoa(i))
		for k := range 5 {
			res := "o" + strconv.Itoa(i) + "-" + strconv.Itoa(k)
			var b []byte
			b = protocol.Append(b, "ping 1")
			b = protocol.Append(b, "lock 2 "+res+" 60000 0 0")
			b = protocol.Append(b, "ping 3")
			c.write(b) // one write: one read on the node, as a rule
			c.expect("result 1 success pong")
			id := c.expect("result 2 success *")[3]
			c.locked(id)
			c.expect("result 3 success pong")
			c.unlock("4", id)
			c.ping("5") // after every answer: on the reader
		}
	}
}

// A node whose shutdown began answers no ping from a read, on the reader or
// on the pipeline: clusterStop proposes the detach of the node's sessions
// once closing is set, and a read index confirmed before that detach
// commits does not cover it, while its entry may be stamped before the
// ping was sent. The connection is closed without a word instead, as
// clusterStop closes it.
func TestClusterNoPongOnceShuttingDown(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, false)
	l := tc.leader()
	for _, i := range []int{l, (l + 1) % 3} {
		n := strconv.Itoa(i)
		idle := tc.connected(i, "idle"+n)
		idle.ping("1")
		busy := tc.connected(i, "busy"+n)
		busy.ping("1")
		srv := tc.nodes[i]
		srv.batch(func(*core.Tx) { srv.closing = true }) // clusterStop's first step; its detach follows
		idle.send("ping 2")                              // on the reader (pingHere)
		idle.closed()
		var b []byte
		b = protocol.Append(b, "lock 2 down"+n+" 60000 0 0")
		b = protocol.Append(b, "ping 3") // behind the lock: on the pipeline (runPing)
		busy.write(b)
		id := busy.expect("result 2 success *")[3]
		busy.locked(id)
		busy.closed()
		srv.batch(func(*core.Tx) { srv.closing = false })
	}
}

// A ping answered on its connection's reader waits for its read under a
// context that ends with the connection: a connection ended meanwhile (here
// by the node, as a takeover or a failed write ends it) while no leader
// confirms the read is let go by its reader at once, not after noLeaderWait.
func TestClusterPingReadEndsWithItsConnection(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, false)
	l := tc.leader()
	f := (l + 1) % 3
	c := tc.connected(f, "stuck")
	c.ping("1") // every answer written: the next ping is answered on the reader
	tc.stop(l)
	tc.stop((l + 2) % 3) // no leader: the read waits (up to noLeaderWait, 15 s)
	srv := tc.nodes[f]
	before := srv.framesIn.Load()
	c.send("ping 2")
	deadline := time.Now().Add(10 * time.Second)
	for srv.framesIn.Load() == before {
		if time.Now().After(deadline) {
			t.Fatal("the ping was not read")
		}
		time.Sleep(time.Millisecond)
	}
	var sc *conn
	srv.batch(func(*core.Tx) { // after the batch that decided the ping
		for _, x := range srv.cl.conns {
			if x.pipe != nil && !x.forward {
				sc = x
			}
		}
		if sc != nil {
			sc.finish()
		}
	})
	if sc == nil {
		t.Fatal("no client connection on the node")
	}
	c.closed()
	deadline = time.Now().Add(3 * time.Second) // seconds: the promise is "at once", not within noLeaderWait
	for {
		sc.pipe.mu.Lock()
		ended := sc.pipe.closed // set when the reader ends (clusterCleanup)
		sc.pipe.mu.Unlock()
		if ended {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the reader still waits for the ping's read after its connection ended")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
