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
