package locktable

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// Busiest returns the same queues as sorting every queue by length (then
// name) and taking the first n with the prefix.
func TestBusiestMatchesSorting(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		h := newHarness(t, Config{})
		names := []string{"a", "a1", "a2", "ab", "b", "b1", "c", "ca"}
		ops := rapid.IntRange(0, 60).Draw(rt, "ops")
		for i := range ops {
			sess := fmt.Sprintf("s%d", 1+i%3)
			res := rapid.SampledFrom(names).Draw(rt, "res")
			_, _ = h.lock(sess, res, time.Minute, time.Minute)
		}
		prefix := rapid.SampledFrom([]string{"", "a", "b", "c", "zz"}).Draw(rt, "prefix")
		n := rapid.IntRange(0, 10).Draw(rt, "n")
		maxEntries := rapid.IntRange(0, 5).Draw(rt, "maxEntries")
		type row struct {
			name string
			n    int
		}
		var want []row
		h.tab.QueuesPage(prefix, "", 1000, 1_000_000, func(q QueueInfo) bool {
			want = append(want, row{q.Resource, q.Len})
			return true
		})
		matched := len(want)
		slices.SortStableFunc(want, func(a, b row) int { return b.n - a.n })
		want = want[:min(len(want), max(n, 1))]
		var got []row
		m := h.tab.Busiest(prefix, n, maxEntries, func(q QueueInfo) bool {
			if len(q.Entries) != min(q.Len, max(maxEntries, 1)) {
				rt.Fatalf("%s: %d entries of %d, max %d", q.Resource, len(q.Entries), q.Len, maxEntries)
			}
			if !strings.HasPrefix(q.Resource, prefix) {
				rt.Fatalf("%s does not start with %q", q.Resource, prefix)
			}
			got = append(got, row{q.Resource, q.Len})
			return true
		})
		if m != matched || !slices.Equal(got, want) {
			rt.Fatalf("Busiest(%q, %d) = %v (matched %d), want %v (matched %d)", prefix, n, got, m, want, matched)
		}
	})
}

// The list of contended queues holds exactly the queues of two entries or
// more, through grants, releases, timeouts and snapshots.
func TestBusyListMatchesQueues(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		h := newHarness(t, Config{})
		var ids []ID
		for range rapid.IntRange(0, 80).Draw(rt, "ops") {
			switch rapid.IntRange(0, 3).Draw(rt, "op") {
			case 0, 1:
				res := rapid.SampledFrom([]string{"a", "b", "c", "a|b", "b|c", "d"}).Draw(rt, "res")
				if g, err := h.lock(fmt.Sprintf("s%d", rapid.IntRange(1, 3).Draw(rt, "s")), res, time.Minute, time.Duration(rapid.IntRange(0, 3).Draw(rt, "to"))*time.Second); err == nil {
					ids = append(ids, g.ID)
				}
			case 2:
				if len(ids) > 0 {
					_ = h.tab.Unlock(h.now, ids[rapid.IntRange(0, len(ids)-1).Draw(rt, "i")], "")
				}
			case 3:
				h.now += int64(time.Second)
				h.tab.Advance(h.now)
			}
		}
		check := func(tab *Table) {
			want := map[string]bool{}
			for name, q := range tab.queues {
				if q.parked == 0 && q.n >= 2 {
					want[name] = true
				}
			}
			got := map[string]bool{}
			for i, q := range tab.busy {
				if got[q.name] || int(q.busy) != i+1 {
					rt.Fatalf("busy list broken at %s (position %d, recorded %d)", q.name, i+1, q.busy)
				}
				got[q.name] = true
			}
			for _, q := range tab.queues {
				if (q.busy > 0) != (q.n >= 2) {
					rt.Fatalf("queue %s of %d entries has busy %d", q.name, q.n, q.busy)
				}
			}
			if len(got) != len(want) {
				rt.Fatalf("busy list %v, want %v", got, want)
			}
			for k := range want {
				if !got[k] {
					rt.Fatalf("busy list lacks %s", k)
				}
			}
		}
		check(h.tab)
		snap, _ := h.tab.MarshalBinary()
		r, err := Restore(Config{}, snap)
		if err != nil {
			rt.Fatal(err)
		}
		check(r)
	})
}
