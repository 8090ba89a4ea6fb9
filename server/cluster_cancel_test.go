package server

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/internal/core"
	"github.com/mlock-dev/mlock/internal/proctest"
)

// TestClusterGivenUpLockCancelled: the leader loses both followers; a lock
// asked on it with a 1 s wait timeout is answered as timed out, its entry
// (stamped before the deadline) in the leader's log only. One follower
// comes back: the old leader is the only node that can lead (its log is the
// longer), so it commits that entry and the lock is made for a session
// whose client was told "timeout". The node cancels it (opCancel): another
// session takes the resource within seconds, not after the 60 s lease.
func TestClusterGivenUpLockCancelled(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, true)
	l := tc.leader()
	waitClusterVersion(t, tc, logFormat3)
	c := tc.dial(l, "given-up")
	c.expect("connected 1.0 new * **")
	f1, f2 := (l+1)%3, (l+2)%3
	// Every node cut off from the others at once, while l still leads: the
	// lock's entry goes into l's log and nowhere else, and no other node
	// can lead meanwhile (its own entry would replace it). Then the two
	// followers stop.
	for i := range 3 {
		for j := range 3 {
			if i != j {
				tc.trans[i].Disconnect(tc.trans[j].LocalAddr())
			}
		}
	}
	before := tc.nodes[l].cl.node.Status().LastIndex
	c.send("lock 1 gu 60000 1000 0")
	proctest.WaitFor(t, 5*time.Second, "the lock's entry in the leader's log", func() bool {
		return tc.nodes[l].cl.node.Status().LastIndex != before
	})
	tc.stop(f1)
	tc.stop(f2)
	c.expectTimedOut("1")

	tc.start(f1)
	if got := tc.leader(); got != l {
		t.Fatalf("n%d leads, want n%d (the only log with the entry)", got, l)
	}
	o := tc.dial(l, "other")
	o.expect("connected 1.0 new * **")
	start := time.Now()
	for i := uint64(1); ; i++ {
		o.send("trylock " + itoa(i) + " gu 60000")
		p := o.readWithin(30 * time.Second)
		if strings.HasPrefix(p, "result "+itoa(i)+" success") {
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("gu still held %v after the recovery: %q", time.Since(start), p)
		}
		time.Sleep(100 * time.Millisecond) // poll interval
	}
	var cancelled uint64
	tc.nodes[l].batch(func(*core.Tx) { cancelled = tc.nodes[l].counters.cancelled })
	t.Logf("free %v after the recovery; locks cancelled: %d", time.Since(start).Round(time.Millisecond), cancelled)
	if cancelled != 1 {
		t.Errorf("locks cancelled: %d, want 1 (the entry was committed, or the resource would have been free at once)", cancelled)
	}
}

// waitClusterVersion waits until every running node writes format v.
func waitClusterVersion(t *testing.T, tc *testCluster, v int) {
	t.Helper()
	proctest.WaitFor(t, 30*time.Second, fmt.Sprintf("cluster version %d in force on every node", v), func() bool {
		for _, s := range tc.nodes {
			if s != nil && s.cl.writeFormat() < v {
				return false
			}
		}
		return true
	})
}

// expectTimedOut reads the answer of lock request req that timed out: a
// result with a lock id, then "timeout" with that id.
func (c *raw) expectTimedOut(req string) {
	c.t.Helper()
	res := c.readWithin(30 * time.Second)
	f := strings.Fields(res)
	if len(f) != 4 || f[0] != "result" || f[1] != req || f[2] != "success" {
		c.t.Fatalf("lock %s: %q", req, res)
	}
	if got := c.readWithin(30 * time.Second); got != "timeout "+f[3] {
		c.t.Fatalf("after %q: %q, want the timeout push", res, got)
	}
}
