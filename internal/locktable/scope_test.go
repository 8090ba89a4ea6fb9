package locktable

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// A scoped release touches the owner's resources under the prefix only:
// another namespace's lock and a lock outside every namespace stay held, a
// lock across the edge keeps its part outside, and the waiters of what was
// freed are granted.
func TestReleaseAllIn(t *testing.T) {
	h := newHarness(t, Config{})
	mk := func(sess, res, owner string) Grant {
		t.Helper()
		g, err := h.tab.Lock(h.now, &Request{Session: sess, Resources: strings.Split(res, "|"), TTL: time.Second, Owner: owner})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	a := mk("s1", "A:k|A:l", "u1")
	b := mk("s2", "B:k", "u1")
	run := mk("s3", "job", "u1")
	edge := mk("s1", "A:e|job2", "u1")
	anonA := mk("s1", "A:n", "*")
	anonB := mk("s2", "B:n", "*")
	w := mk("s3", "A:e", "") // waits for edge's part in A:
	names := map[ID]string{a.ID: "a", b.ID: "b", run.ID: "run", edge.ID: "edge", anonA.ID: "anonA", anonB.ID: "anonB", w.ID: "w"}
	h.take(names)

	if n := h.tab.ReleaseAllIn(h.now, "u1", "A:"); n != 2 {
		t.Fatalf("released %d, want 2 (a whole, edge in part)", n)
	}
	if got := h.take(names); !slices.Equal(got, []string{"released:edge", "released:a", "granted:w"}) {
		t.Fatalf("events = %v", got)
	}
	if _, ok := h.tab.Lookup(a.ID); ok {
		t.Fatal("a lock wholly in the scope must be gone")
	}
	for _, id := range []ID{b.ID, run.ID, edge.ID, anonA.ID, anonB.ID} {
		if !h.granted(id) {
			t.Fatalf("%s must stay held", names[id])
		}
	}
	if li, _ := h.tab.Lookup(edge.ID); !slices.Equal(li.Resources, []string{"job2"}) {
		t.Fatalf("edge keeps %v, want [job2]", li.Resources)
	}
	if n := h.tab.ReleaseAllIn(h.now, "*", "A:"); n != 1 || !h.granted(anonB.ID) {
		t.Fatalf("anonymous release in A: released %d, anonB held %v", n, h.granted(anonB.ID))
	}
	if h.tab.ReleaseIn(h.now, "u1", []string{"B:k"}, "A:") || !h.granted(b.ID) {
		t.Fatal("a release of a resource outside the scope must change nothing and report false")
	}
	if !h.tab.ReleaseIn(h.now, "u1", []string{"B:k"}, "B:") || h.granted(b.ID) {
		t.Fatal("a release inside the scope is a release")
	}
	if n := h.tab.ReleaseAllIn(h.now, "u1", ""); n != 2 {
		t.Fatalf("the empty scope is ReleaseAll: released %d, want run and edge", n)
	}
}
