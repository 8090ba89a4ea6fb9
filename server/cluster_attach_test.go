package server

import (
	"bytes"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/internal/core"
)

// An attach applied at a time past its session's grace, before any tick
// processed the end of that grace (the entry came first: here the leader
// proposes no ticks), starts a new session that the nodes keep: its
// grants are pushed and a later connection of the same socketId takes it
// over. Before, every node took the old session's end, in the same batch,
// for the new one's: it forgot the new session, and the client's first
// request after its connect closed the connection.
func TestClusterAttachAtTheEndOfTheGrace(t *testing.T) {
	t.Parallel()
	const grace = 300 * time.Millisecond
	tc := newTestClusterWith(t, 3, false, func(tc *testCluster) {
		tc.configure = func(_ int, c *Config) { c.SessionGrace = grace }
	})
	l := tc.leader()
	f := (l + 1) % 3
	tc.hooks.holdTicks.Store(true)
	a := tc.dial(f, "s")
	a.expect("connected 1.0 new * **")
	old := a.lock("1", "old 60000 0 0")
	a.locked(old)
	a.nc.Close()
	var end int64
	for range 1000 {
		if node, ok := tc.sessionNode(l, "s"); ok && node == "" {
			tc.nodes[l].batch(func(tx *core.Tx) { end, _ = tx.NextDeadline() })
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if end == 0 {
		t.Fatal("the session was not detached")
	}
	for time.Now().UnixNano() <= end+int64(10*time.Millisecond) {
		time.Sleep(10 * time.Millisecond)
	}

	b := tc.dial(f, "s")
	b.expect("connected 1.0 new * **") // the old session's grace is over
	other := tc.dial(l, "other")
	other.expect("connected 1.0 new * **")
	wid := grantPushedTo(b, other) // the grant is pushed to the new session

	// A new connection of the same socketId takes the session over.
	c := tc.dial(l, "s")
	c.expect("connected 1.0 resumed * **")
	b.expect("error session taken over by a new connection!")
	c.locked(wid)
	c.send("unlock 3 " + old)
	c.expect("result 3 failed lock not exist!")
	for i := range 3 {
		if n := tc.sessionLocks(i, "s"); n != 1 {
			t.Errorf("n%d: the session holds %d locks, want 1", i, n)
		}
	}
	snaps := tc.replicaSnapshots()
	for i := 1; i < len(snaps); i++ {
		if !bytes.Equal(snaps[0], snaps[i]) {
			t.Fatalf("node states differ (%d and %d bytes)\n%q\n%q", len(snaps[0]), len(snaps[i]), snaps[0], snaps[i])
		}
	}
}

// A resumed session is told again of its evicted locks (expired <id>
// released), never told they are held: the notice of the eviction written
// to a connection that then dies is lost, and the evicted lock ends at the
// eviction plus the grace, which the answers of the new connection would
// let its holder outlive.
func TestClusterResumeRetellsAnEviction(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, false)
	l := tc.leader()
	f := (l + 1) % 3
	a := tc.dial(f, "holder")
	a.expect("connected 1.0 new * **")
	id := a.lock("1", "x 60000 0 0")
	a.locked(id)
	ops := tc.dial(l, "ops")
	ops.expect("connected 1.0 new * **")
	if got := ops.ask("1", "evict 1 x"); got != "1" {
		t.Fatalf("evict answered %q", got)
	}
	// a's client never reads its old connection: it connects again, on
	// another node.
	nw := tc.dial(l, "holder")
	nw.expect("connected 1.0 resumed 3000 **")
	nw.expect("expired " + id + " evicted")
	nw.send("ping 2")
	nw.expect("result 2 success pong") // and nothing else: no locked push for it
	nw.send("extend 3 " + id + " 60000")
	nw.expect("result 3 failed lock not exist!")
}
