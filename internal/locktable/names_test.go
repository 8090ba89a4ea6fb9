package locktable

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// checkIndex checks the index of names: none, or one that holds every
// live queue exactly once, young or in the tree, and nothing else (no
// parked queue); and the ring of parked queues (checkParked).
func checkIndex(t *Table) error {
	if err := checkParked(t); err != nil {
		return err
	}
	x := &t.idx
	if x.tree == nil {
		if len(x.young) != 0 || x.ops != 0 {
			return fmt.Errorf("no index, but %d young queues and %d operations", len(x.young), x.ops)
		}
		for _, q := range t.queues {
			if q.young != 0 {
				return fmt.Errorf("no index, but queue %s is young (%d)", q.name, q.young)
			}
		}
		return nil
	}
	if len(x.young) > x.max {
		return fmt.Errorf("%d young queues, more than %d", len(x.young), x.max)
	}
	for i, q := range x.young {
		if int(q.young) != i+1 || t.queue(q.name) != q {
			return fmt.Errorf("young queue %d: %s (position %d), live %v", i, q.name, q.young, t.queue(q.name) == q)
		}
	}
	var inTree []string
	x.tree.Ascend(func(k nameKey) bool {
		inTree = append(inTree, k.name)
		return true
	})
	if !slices.IsSorted(inTree) {
		return fmt.Errorf("tree out of order: %q", inTree)
	}
	for _, name := range inTree {
		q := t.queue(name)
		if q == nil || q.young != 0 {
			return fmt.Errorf("tree holds %s, which is not a live queue of the tree (%v)", name, q)
		}
	}
	if len(inTree)+len(x.young) != t.queueCount() {
		return fmt.Errorf("tree %d and young %d, for %d queues", len(inTree), len(x.young), t.queueCount())
	}
	return nil
}

// checkParked checks that the queues of the map are the live ones (not
// empty) and the parked ones (empty, out of the index), and that the ring
// of parked queues holds exactly the parked ones, each at its position.
func checkParked(t *Table) error {
	r := &t.parked
	if r.max < 1 || r.max > maxParked || r.len > r.max || r.n > r.len || r.head < 0 || r.head >= r.max {
		return fmt.Errorf("parked ring: head %d, %d slots in use, %d queues", r.head, r.len, r.n)
	}
	inRing := 0
	for i, q := range r.ring {
		if q == nil {
			continue
		}
		if i >= r.max {
			return fmt.Errorf("parked queue %s in slot %d of %d", q.name, i, r.max)
		}
		if used := (i - r.head + r.max) % r.max; used >= r.len {
			return fmt.Errorf("parked queue %s in slot %d, outside the %d in use from %d", q.name, i, r.len, r.head)
		}
		if int(q.parked) != i+1 || t.queues[q.name] != q {
			return fmt.Errorf("slot %d: queue %s (position %d), mapped %v", i, q.name, q.parked, t.queues[q.name] == q)
		}
		inRing++
	}
	if inRing != r.n {
		return fmt.Errorf("%d parked queues in the ring, %d counted", inRing, r.n)
	}
	for name, q := range t.queues {
		switch {
		case q.name != name:
			return fmt.Errorf("queue %s mapped under %s", q.name, name)
		case q.parked > 0 && (q.n != 0 || q.head != nil || q.tail != nil || q.gate != nil || q.nadm != 0 || q.nshared != 0 ||
			q.used != 0 || q.busy != 0 || q.young != 0 || r.ring[q.parked-1] != q):
			return fmt.Errorf("parked queue %s: %d entries, busy %d, young %d, in its slot %v",
				name, q.n, q.busy, q.young, r.ring[q.parked-1] == q)
		case q.parked == 0 && q.n == 0:
			return fmt.Errorf("queue %s is empty but not parked", name)
		}
	}
	return nil
}

// The index of names through its states: listings see every queue in
// order whether the index was just built, holds young queues, was flushed
// by them, or was dropped after more churn than a rebuild costs.
func TestIndexOfNamesStates(t *testing.T) {
	t.Parallel() // CPU-bound: beside the other, on the second core
	states := map[string]bool{}
	rapid.Check(t, func(rt *rapid.T) {
		h := newHarness(t, Config{MaxLocksPerSession: -1})
		h.tab.idx.max = rapid.IntRange(1, 8).Draw(rt, "youngMax")
		h.tab.idx.slack = rapid.IntRange(0, 16).Draw(rt, "dropSlack")
		h.tab.parked.max = rapid.IntRange(1, 8).Draw(rt, "maxParked")
		live := map[string]ID{}
		for range rapid.IntRange(1, 300).Draw(rt, "ops") {
			name := fmt.Sprintf("r%02d", rapid.IntRange(0, 40).Draw(rt, "r"))
			switch op := rapid.IntRange(0, 4).Draw(rt, "op"); {
			case op == 4:
				var want []string
				for n := range live {
					want = append(want, n)
				}
				slices.Sort(want)
				var got []string
				h.tab.QueuesPage("", "", 1000, 1000, func(qi QueueInfo) bool {
					got = append(got, qi.Resource)
					return true
				})
				if !slices.Equal(got, want) {
					rt.Fatalf("listing %q, want %q", got, want)
				}
			case live[name] == NoID:
				g, err := h.lock("s1", name, time.Hour, 0)
				if err != nil {
					rt.Fatal(err)
				}
				live[name] = g.ID
			default:
				if err := h.tab.Unlock(h.now, live[name], "s1"); err != nil {
					rt.Fatal(err)
				}
				delete(live, name)
			}
			if err := checkIndex(h.tab); err != nil {
				rt.Fatal(err)
			}
			switch x := &h.tab.idx; {
			case x.tree == nil:
				states["none"] = true
			case len(x.young) > 0:
				states["young"] = true
			default:
				states["tree"] = true
			}
		}
	})
	for _, s := range []string{"none", "young", "tree"} {
		if !states[s] {
			t.Fatalf("no history reached the state %q of the index (%v)", s, states)
		}
	}
}
