package server

import (
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/internal/core"
	"github.com/mlock-dev/mlock/internal/proctest"
)

// TestClusterLeaderlessBounds: with two of three nodes stopped, the survivor
// has no leader. A lock with a wait timeout of 1 s is answered as timed out
// (a result with a lock id, then "timeout" with it) 1 s + giveUpMargin after
// it was sent, and the connection closes; a connect is not answered and
// closes after the node's noLeaderWait (2 s here, 5 s by default). Once the
// two are back, neither the lock nor the connect took anything: another
// session trylocks the resource.
func TestClusterLeaderlessBounds(t *testing.T) {
	t.Parallel()
	const noLeaderWait = 2 * time.Second
	tc := newTestClusterWith(t, 3, true, func(tc *testCluster) { tc.hooks.noLeaderWait = noLeaderWait })
	l := tc.leader()
	waitClusterVersion(t, tc, logFormat3)
	sv := (l + 1) % 3
	c := tc.dial(sv, "leaderless")
	c.expect("connected 1.0 new * **")
	for i := range 3 {
		if i != sv {
			tc.stop(i)
		}
	}

	start := time.Now()
	c.send("lock 1 lw 60000 1000 0")
	c.expectTimedOut("1")
	took := time.Since(start)
	if took < time.Second || took > time.Second+giveUpMargin+500*time.Millisecond {
		t.Errorf("timed out after %v, want 1 s + %v", took, giveUpMargin)
	}
	if p, err := c.next(2 * time.Second); !errors.Is(err, io.EOF) {
		t.Errorf("after the timeout: %q, %v; want the connection closed", p, err)
	}

	start = time.Now()
	h := tc.dial(sv, "leaderless-connect")
	if p, err := h.next(noLeaderWait + 2*time.Second); !errors.Is(err, io.EOF) {
		t.Errorf("connect without a leader: %q, %v; want the connection closed", p, err)
	}
	if took := time.Since(start); took < noLeaderWait-100*time.Millisecond || took > noLeaderWait+time.Second {
		t.Errorf("connect closed after %v, want %v", took, noLeaderWait)
	}

	for i := range 3 {
		if i != sv {
			tc.start(i)
		}
	}
	tc.leader()
	o := tc.dial(l, "other")
	o.expect("connected 1.0 new * **")
	o.send("trylock 1 lw 60000")
	o.expect("result 1 success *")
	o.expect("locked * * *")
}

// A connection that a node without a leader closed (its connect could not
// be committed) frees its place in the node's counts at once, though the
// detach of its session waits for a leader: the closed connections of a
// long outage do not fill the node's --max-conns.
func TestClusterLeaderlessClosedConnectionsFreeTheirSlots(t *testing.T) {
	t.Parallel()
	tc := newTestClusterWith(t, 3, false, func(tc *testCluster) { tc.hooks.noLeaderWait = 300 * time.Millisecond })
	l := tc.leader()
	sv := (l + 1) % 3
	for i := range 3 {
		if i != sv {
			tc.stop(i)
		}
	}
	srv := tc.nodes[sv]
	for i := range 5 {
		c := tc.dial(sv, fmt.Sprintf("outage%d", i))
		if p, err := c.next(3 * time.Second); !errors.Is(err, io.EOF) {
			t.Fatalf("connect %d without a leader: %q, %v; want the connection closed", i, p, err)
		}
	}
	proctest.WaitFor(t, 2*time.Second, "the closed connections out of the node's counts", func() bool {
		n := -1
		srv.batch(func(*core.Tx) { n = len(srv.conns) })
		return n == 0
	})
}
