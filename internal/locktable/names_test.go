package locktable

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// checkIndex checks the index of names: none, or one that holds every
// queue exactly once, young or in the tree, and nothing else.
func checkIndex(t *Table) error {
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
		if int(q.young) != i+1 || t.queues[q.name] != q {
			return fmt.Errorf("young queue %d: %s (position %d), live %v", i, q.name, q.young, t.queues[q.name] == q)
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
		q := t.queues[name]
		if q == nil || q.young != 0 {
			return fmt.Errorf("tree holds %s, which is not a queue of the tree (%v)", name, q)
		}
	}
	if len(inTree)+len(x.young) != len(t.queues) {
		return fmt.Errorf("tree %d and young %d, for %d queues", len(inTree), len(x.young), len(t.queues))
	}
	return nil
}

// The index of names through its states: listings see every queue in
// order whether the index was just built, holds young queues, was flushed
// by them, or was dropped after more churn than a rebuild costs.
func TestIndexOfNamesStates(t *testing.T) {
	states := map[string]bool{}
	rapid.Check(t, func(rt *rapid.T) {
		h := newHarness(t, Config{MaxLocksPerSession: -1})
		h.tab.idx.max = rapid.IntRange(1, 8).Draw(rt, "youngMax")
		h.tab.idx.slack = rapid.IntRange(0, 16).Draw(rt, "dropSlack")
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
