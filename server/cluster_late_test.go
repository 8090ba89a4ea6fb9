package server

import (
	"bytes"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/internal/cluster"
	"github.com/mlock-dev/mlock/internal/core"
	"github.com/mlock-dev/mlock/internal/protocol"
)

// At cluster version 3, a waiter whose wait deadline passed before the
// entry that frees its queue (its holder's lease ended before the
// deadline, but no entry came between: here the leader proposes no ticks)
// is timed out, never granted, on every replica alike; the request behind
// it is granted. Before, every replica granted it at the entry's time
// (the rule of earlier builds, which a cluster keeps below version 3).
func TestClusterLateWaiterTimedOut(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var times []int64 // the times of the entries n0 applies
	tc := newTestClusterWith(t, 3, false, func(tc *testCluster) {
		tc.hooks.apply = func(node string, now int64, _ [][]byte) {
			if node == "n0" {
				mu.Lock()
				times = append(times, now)
				mu.Unlock()
			}
		}
	})
	l := tc.leader()
	waitVersion(t, tc, logFormat) // 3 or later
	tc.hooks.holdTicks.Store(true)
	f1, f2 := (l+1)%3, (l+2)%3
	trigger := tc.dial(f1, "trigger")
	trigger.expect("connected 1.0 new * **")

	// A round is the late case when no entry was applied from the holder's
	// expiry to the waiter's deadline; one that had such an entry (a slow
	// machine) is tried again with new sessions on a new resource.
	for round := range 3 {
		r := strconv.Itoa(round)
		h := tc.dial(f1, "holder"+r)
		h.expect("connected 1.0 new * **")
		w := tc.dial(f2, "waiter"+r)
		w.expect("connected 1.0 new * **")
		b := tc.dial(l, "behind"+r)
		b.expect("connected 1.0 new * **")
		res := "r" + strconv.Itoa(round)
		hid := h.lock("1", res+" 1000 0 0")
		h.locked(hid)
		wid := w.lock("1", res+" 60000 2000 0")
		bid := b.lock("1", res+" 60000 0 0")
		var exp, dl int64
		tc.waitQueue(0, res, 3)
		tc.nodes[0].batch(func(tx *core.Tx) {
			hi, _ := tx.Lookup(mustID(t, hid))
			wi, _ := tx.Lookup(mustID(t, wid))
			exp, dl = hi.Deadline, wi.Deadline
		})
		if exp == 0 || dl <= exp {
			t.Fatalf("holder's expiry %d, waiter's deadline %d: want the expiry first", exp, dl)
		}
		for time.Now().UnixNano() <= dl+int64(100*time.Millisecond) {
			time.Sleep(20 * time.Millisecond)
		}
		tid := trigger.lock(r, "other"+r+" 60000 0 0")
		trigger.locked(tid)
		for i := range 3 {
			tc.waitApplied(i, l)
		}
		mu.Lock()
		between := 0
		for _, at := range times {
			if at >= exp && at < dl {
				between++
			}
		}
		mu.Unlock()
		if between > 0 {
			t.Logf("round %d: %d entries applied between the expiry and the deadline: not the late case, again", round, between)
			continue
		}
		w.expect("timeout " + wid)
		b.expect("locked " + bid + " * *")
		h.expect("expired " + hid)
		for i := range 3 {
			tc.nodes[i].batch(func(tx *core.Tx) {
				if tx.LateGrants() {
					t.Errorf("n%d: the rule of late grants is in force at version %d", i, logFormat3)
				}
				if li, ok := tx.Lookup(mustID(t, wid)); ok {
					t.Errorf("n%d: the late waiter is still there: %+v", i, li)
				}
				if li, ok := tx.Lookup(mustID(t, bid)); !ok || !li.Granted {
					t.Errorf("n%d: the request behind is not granted: %+v", i, li)
				}
			})
		}
		snaps := tc.replicaSnapshots()
		for i := 1; i < len(snaps); i++ {
			if !bytes.Equal(snaps[0], snaps[i]) {
				t.Fatalf("replica states differ (%d and %d bytes)", len(snaps[0]), len(snaps[i]))
			}
		}
		return
	}
	t.Fatal("three rounds had an entry between the expiry and the deadline")
}

// waitVersion waits (bounded) until every node applied cluster
// version v.
func waitVersion(t *testing.T, tc *testCluster, v int) {
	t.Helper()
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		done := true
		for _, s := range tc.nodes {
			done = done && s.cl.versionNow.Load() == int64(v)
		}
		if done {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("cluster version %d not on every node within 30 s", v)
		}
	}
}

func mustID(t *testing.T, s string) core.ID {
	t.Helper()
	id, ok := protocol.ParseID([]byte(s))
	if !ok {
		t.Fatalf("lock id %q does not parse", s)
	}
	return id
}

// The rule of late grants follows the cluster version the log applies,
// whichever way it moves, and the version of a snapshot restored: on below
// version 3, off from 3 on (4 included).
func TestLateGrantsFollowTheClusterVersion(t *testing.T) {
	s := replayServer(t, "late", nil)
	d := s.cl.dedup
	late := func() bool {
		var on bool
		s.batch(func(tx *core.Tx) { on = tx.LateGrants() })
		return on
	}
	if !late() {
		t.Fatal("a node that applied nothing (version 1) does not grant late")
	}
	now := time.Now().UnixNano()
	for i, v := range []int{2, 3, 2, 3, 2, 4, 3, 4, 2, 4} {
		now += int64(time.Millisecond)
		cmd := cluster.DedupCommand("", 0, appendLogCmd(nil, &logCmd{format: v, op: opVersion, version: uint64(v)}))
		d.Apply(now, [][]byte{cmd})
		if got, want := late(), v < 3; got != want {
			t.Fatalf("step %d, version %d: late grants %v, want %v", i, v, got, want)
		}
	}
	for _, v := range []int{3, 2, 4} {
		now += int64(time.Millisecond)
		d.Apply(now, [][]byte{cluster.DedupCommand("", 0, appendLogCmd(nil, &logCmd{format: v, op: opVersion, version: uint64(v)}))})
		snap, err := d.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		for _, from := range []int{1, 3, 4} { // the restoring node's own version before
			r := replayServer(t, fmt.Sprintf("restore%d", from), nil)
			r.batch(func(*core.Tx) { r.cl.version = from })
			if err := r.cl.dedup.Restore(snap); err != nil {
				t.Fatal(err)
			}
			var on bool
			r.batch(func(tx *core.Tx) { on = tx.LateGrants() })
			if want := v < 3; on != want {
				t.Fatalf("restored a snapshot of version %d on a node at %d: late grants %v, want %v", v, from, on, want)
			}
		}
	}
}
