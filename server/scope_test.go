package server

import (
	"testing"
)

// scopedReleases runs the scope rules of releasein and releaseallin over a
// and b, the connections of two sessions (of one node, or of two nodes of a
// cluster): two namespaces nsA: and nsB:, one owner u1 in both and outside
// both (an "mlock run" of its own), anonymous locks in both, and a lock
// that straddles a scope's edge.
func scopedReleases(t *testing.T, a, b *raw) {
	t.Helper()
	idA := a.lock("1", "nsA:k 60000 0 0 u1")
	a.locked(idA)
	idB := b.lock("1", "nsB:k 60000 0 0 u1")
	b.locked(idB)
	idRun := b.lock("2", "report:nightly 60000 0 0 u1") // outside both namespaces
	b.locked(idRun)
	anonA := a.lock("2", "nsA:anon 60000 0 0 *")
	a.locked(anonA)
	anonB := b.lock("3", "nsB:anon 60000 0 0 *")
	b.locked(anonB)
	both := a.lock("3", "nsA:s|other:s 60000 0 0 u2")
	a.locked(both)

	// The owner's locks in nsA: only.
	a.send("releaseallin 10 u1 nsA:")
	a.expect("result 10 success 1")
	a.expect("expired " + idA + " released")
	b.quiet()
	// The anonymous owner's in nsA: only.
	a.send("releaseallin 11 * nsA:")
	a.expect("result 11 success 1")
	a.expect("expired " + anonA + " released")
	b.quiet()
	// A release naming a resource outside its scope leaves it alone.
	a.send("releasein 12 u1 nsB:k nsA:")
	a.expect("result 12 success false")
	a.send("releasein 13 * nsB:anon|nsA:none nsA:")
	a.expect("result 13 success false")
	b.quiet()
	b.send("trylock 4 nsB:k 1000 u9")
	b.expect("result 4 failed resource is locked! nsB:k")
	b.send("trylock 5 nsB:anon 1000")
	b.expect("result 5 failed resource is locked! nsB:anon")
	b.send("trylock 6 report:nightly 1000")
	b.expect("result 6 failed resource is locked! report:nightly")
	// Inside its scope, releasein is release.
	b.send("releasein 7 * nsB:anon nsB:")
	b.expect("result 7 success true")
	b.expect("expired " + anonB + " released")

	// A lock across the edge loses only its part inside the scope.
	a.send("releaseallin 14 u2 nsA:")
	a.expect("result 14 success 1")
	a.expect("expired " + both + " released")
	b.send("trylock 8 other:s 1000")
	b.expect("result 8 failed resource is locked! other:s")
	free := b.lock("9", "nsA:s 60000 0 0") // a minute: no expired push among the answers below
	b.locked(free)

	// Malformed.
	a.send("releaseallin 15 u1")
	a.expect("result 15 failed missing arguments!")
	a.send("releasein 16 u1 nsA:k")
	a.expect("result 16 failed missing arguments!")
	a.send("releaseallin 17  nsA:")
	a.expect("result 17 failed missing arguments!")
	a.send("releaseallin 18 u\x001 nsA:")
	a.expect("result 18 failed invalid owner!")

	// An empty scope is the whole server: u1's two remaining locks.
	a.send("releaseallin 19 u1 ")
	a.expect("result 19 success 2")
	b.expectUnordered("expired "+idB+" released", "expired "+idRun+" released")
}

// expectUnordered expects the frames of want, in any order.
func (c *raw) expectUnordered(want ...string) {
	c.t.Helper()
	left := map[string]bool{}
	for _, w := range want {
		left[w] = true
	}
	for range want {
		got := c.read()
		if !left[got] {
			c.t.Fatalf("got %q, want one of %v", got, left)
		}
		delete(left, got)
	}
}

func TestScopedReleases(t *testing.T) {
	t.Parallel()
	srv := start(t, Config{})
	scopedReleases(t, connected(t, srv, "sa"), connected(t, srv, "sb"))
}

func TestClusterScopedReleases(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, false)
	l := tc.leader()
	a := tc.dial((l+1)%3, "sa") // through a follower: the frames go through the log
	a.expect("connected 1.0 new * **")
	b := tc.dial((l+2)%3, "sb")
	b.expect("connected 1.0 new * **")
	scopedReleases(t, a, b)
}
