package server

import (
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestClusterStoreFailureStopsTheNode: the Raft log store of the leader,
// or of a follower, cannot be written (an I/O error at each write): it
// acknowledges nothing of the write, stops (fail-stop: Failed is closed,
// /readyz says why) and the other two (elect a leader and) serve; the lock acknowledged before is still
// held, tokens keep growing, and the node restarted on its directory once
// the disk works catches up.
func TestClusterStoreFailureStopsTheNode(t *testing.T) {
	for _, who := range []string{"leader", "follower"} {
		t.Run(who, func(t *testing.T) {
			t.Parallel()
			storeFailure(t, who == "leader")
		})
	}
}

func storeFailure(t *testing.T, leader bool) {
	tc := newTestCluster(t, 3, true)
	l := tc.leader()
	f1, f2 := (l+1)%3, (l+2)%3
	if !leader {
		// The failing node is a follower (l below); the clients use the
		// leader and the other follower.
		l, f1 = f1, l
	}
	h := tc.dial(f1, "holder")
	h.expect("connected 1.0 new * **")
	id := h.lock("1", "x 60000 0 0")
	tok, _ := strconv.ParseUint(h.locked(id), 10, 64)

	failing := "n" + strconv.Itoa(l)
	fault := func(node, store string) error {
		if node == failing {
			return syscall.EIO
		}
		return nil
	}
	tc.hooks.storeFault.Store(&fault)
	w := tc.dial(f2, "writer")
	w.expect("connected 1.0 new * **")
	w.send("lock 1 y 60000 0 0") // its entry cannot be written on the leader
	select {
	case <-tc.nodes[l].Failed():
	case <-time.After(20 * time.Second):
		t.Fatal("the node whose log store fails did not stop")
	}
	if err := tc.nodes[l].FailedErr(); err == nil || !strings.Contains(err.Error(), syscall.EIO.Error()) {
		t.Fatalf("FailedErr: %v", err)
	}
	if ok, why := (obsSource{tc.nodes[l]}).Ready(); ok || !strings.Contains(why, "Raft directory cannot be written") {
		t.Fatalf("/readyz of the stopped node: %v %q", ok, why)
	}
	nl := tc.leader()
	if nl == l {
		t.Fatal("the stopped node leads")
	}
	// The acknowledged lock is still held; new locks get higher tokens.
	o := tc.dial(f2, "other")
	o.expect("connected 1.0 new * **")
	o.send("trylock 1 x 60000")
	if got := o.readWithin(15 * time.Second); !strings.HasPrefix(got, "result 1 failed resource is locked!") {
		t.Fatalf("trylock of the held lock after the failover: %q", got)
	}
	zid := h.lock("2", "z 60000 0 0")
	if tok2, _ := strconv.ParseUint(h.locked(zid), 10, 64); tok2 <= tok {
		t.Fatalf("token %d after %d", tok2, tok)
	}
	h.send("unlock 3 " + id)
	if got := h.readWithin(15 * time.Second); got != "result 3 success done" {
		t.Fatalf("unlock of the held lock: %q", got)
	}
	// The disk works again: the node restarted on its directory catches up.
	tc.stop(l)
	tc.hooks.storeFault.Store(nil)
	tc.start(l)
	tc.waitQueue(l, "z", 1)
}
