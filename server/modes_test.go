package server

import (
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/mlock-dev/mlock"
)

// TestModesOverTCP: shared locks, a writer that blocks later readers, the
// readers behind it granted together when it leaves, semaphores, the
// refusals of the modes, and the locks listing with modes.
func TestModesOverTCP(t *testing.T) {
	t.Parallel()
	srv := start(t, Config{})
	c1, c2, c3 := connected(t, srv, "m1"), connected(t, srv, "m2"), connected(t, srv, "m3")

	r1 := c1.lock("1", "cat 60000 0 0  s")
	c1.locked(r1)
	r2 := c2.lock("2", "cat 60000 0 0  s")
	c2.locked(r2) // readers together
	w := c3.lock("3", "cat 60000 0 0")
	r3 := c1.lock("4", "cat 60000 0 0  s")
	c3.quiet() // the writer waits for the readers
	c1.quiet() // the reader behind it waits too: no barging
	c2.send("trylock 5 cat 60000  s")
	c2.expect("result 5 failed resource is locked! cat")

	// The listing shows the modes, two holders and two waiters.
	c3.send("locks 6 cat")
	f := c3.expect("result 6 success *")
	var doc mlock.Locks
	if err := json.Unmarshal([]byte(f[3]), &doc); err != nil || len(doc.Queues) != 1 {
		t.Fatalf("locks: %v %s", err, f[3])
	}
	got := ""
	for _, e := range doc.Queues[0].Entries {
		got += e.Mode + ":" + e.State + " "
	}
	if got != "s:held s:held x:waiting s:waiting " {
		t.Fatalf("locks entries %q", got)
	}

	c1.send("unlock 7 " + r1)
	c1.expect("result 7 success done")
	c3.quiet()
	c2.send("unlock 8 " + r2)
	c2.expect("result 8 success done")
	tw, _ := strconv.ParseUint(c3.locked(w), 10, 64)
	c3.send("unlock 9 " + w)
	c3.expect("result 9 success done")
	if tr, _ := strconv.ParseUint(c1.locked(r3), 10, 64); tr <= tw {
		t.Fatalf("reader's token %d not above the writer's %d", tr, tw)
	}

	// A semaphore of 2: two holders, a third waits; another count is refused.
	p1 := c1.lock("10", "pay|log 60000 0 0  1/2|s")
	c1.locked(p1)
	p2 := c2.lock("11", "pay 60000 0 0  1/2")
	c2.locked(p2)
	p3 := c3.lock("12", "pay 60000 0 0  1/2")
	c3.quiet()
	c3.send("lock 13 pay 60000 0 0  1/3")
	c3.expect("result 13 failed permits do not match! pay")
	c2.send("unlock 14 " + p2)
	c2.expect("result 14 success done")
	c3.locked(p3)

	// Malformed modes, and an owner's upgrade.
	for i, args := range []string{"a|b 60000 0 0  s|s|s", "a 60000 0 0  r", "a|a 60000 0 0  s|x", "a 60000 0 0  0/2"} {
		req := strconv.Itoa(20 + i)
		c1.send("lock " + req + " " + args)
		c1.expect("result " + req + " failed invalid mode!")
	}
	o := c1.lock("30", "doc 60000 0 0 w1 s")
	c1.locked(o)
	c1.send("lock 31 doc 60000 0 0 w1 x")
	c1.expect("result 31 failed lock mode can not change! doc")
	c1.send("lock 32 doc 60000 0 0 w1 s")
	c1.expect("result 32 success " + o) // re-entry in its mode
}

// TestClusterModes: shared locks through every node of a cluster: readers
// on two nodes hold together, a writer on the third waits for them and
// blocks a later reader, which is granted after the writer.
func TestClusterModes(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, false)
	tc.leader()
	var cs []*raw
	for i := range 3 {
		c := tc.dial(i, "m"+strconv.Itoa(i))
		c.expect("connected 1.0 new * **")
		cs = append(cs, c)
	}
	r0 := cs[0].lock("1", "doc 10000 0 0  s")
	cs[0].locked(r0)
	r1 := cs[1].lock("1", "doc 10000 0 0  s")
	cs[1].locked(r1)
	w := cs[2].lock("1", "doc 10000 0 0")
	r2 := cs[0].lock("2", "doc 10000 0 0  s")
	cs[2].quiet()
	cs[0].quiet()
	cs[1].send("lock 2 doc 10000 0 0  1/2")
	cs[1].expect("result 2 failed permits do not match! doc")
	for i, id := range []string{r0, r1} {
		cs[i].send("unlock 3 " + id)
		cs[i].expect("result 3 success done")
	}
	cs[2].locked(w)
	cs[0].quiet()
	cs[2].send("unlock 4 " + w)
	cs[2].expect("result 4 success done")
	cs[0].locked(r2)
}

// TestModesWaitsAndRefusals: a waiting writer that times out lets the
// readers behind it in at once; a waiting request for 3 of 5 permits
// blocks a later request for 1 (lock and trylock); a shared request on a
// semaphore and another count are refused; an owner's re-entry with
// another count of one semaphore is refused; tolerate counts the readers
// holding together as one; an eviction revokes every reader, and the
// writer waits for the grace.
func TestModesWaitsAndRefusals(t *testing.T) {
	t.Parallel()
	// Seconds, the grace and the writer's wait: this test sees that nothing
	// comes before they end (a busy machine took over a second to look).
	srv := start(t, Config{SessionGrace: 5 * time.Second})
	c1, c2, c3 := connected(t, srv, "k1"), connected(t, srv, "k2"), connected(t, srv, "k3")

	// Readers, a writer that times out, a reader behind it.
	r1 := c1.lock("1", "doc 60000 0 0  s")
	c1.locked(r1)
	w := c2.lock("2", "doc 60000 5000 0")
	r2 := c3.lock("3", "doc 60000 0 0  s")
	c3.quiet()
	c2.expect("timeout " + w)
	c3.locked(r2)

	// tolerate: the two readers holding together count as one entry.
	r3 := c2.lock("4", "doc 60000 0 1  s")
	c2.locked(r3)
	w2 := c1.lock("5", "doc 60000 0 1")
	c1.quiet()
	c3.send("lock 6 doc 60000 0 1")
	c3.expect("result 6 failed can not tolerate!")

	// An eviction revokes the three readers (told at once); they end at
	// the grace, and only then does the writer get the resource.
	ops := connected(t, srv, "ops")
	if got := ops.ask("7", "evict 7 doc"); got != "3" {
		t.Fatalf("evict answered %q", got)
	}
	c1.expect("expired " + r1 + " evicted")
	c3.expect("expired " + r2 + " evicted")
	c2.expect("expired " + r3 + " evicted")
	c1.quiet()
	c1.expect("expired " + r1)
	c1.locked(w2)
	c2.expect("expired " + r3)
	c3.expect("expired " + r2)
	c1.send("unlock 8 " + w2)
	c1.expect("result 8 success done")

	// A semaphore of 5: 3 in use, a request for 3 waits and blocks 1.
	p1 := c1.lock("10", "pay 60000 0 0 o1 3/5")
	c1.locked(p1)
	p2 := c2.lock("11", "pay 60000 0 0  3/5")
	c2.quiet()
	p3 := c3.lock("12", "pay 60000 0 0  1/5")
	c3.quiet()
	c3.send("trylock 13 pay 60000  1/5")
	c3.expect("result 13 failed resource is locked! pay")
	c3.send("lock 14 pay 60000 0 0  s")
	c3.expect("result 14 failed permits do not match! pay")
	c1.send("lock 15 pay 60000 0 0 o1 2/5")
	c1.expect("result 15 failed lock mode can not change! pay")
	c1.send("lock 16 pay 60000 0 0 o1 3/6")
	c1.expect("result 16 failed permits do not match! pay")
	c1.send("lock 17 pay 60000 0 0 o1 3/5")
	c1.expect("result 17 success " + p1)
	c1.locked(p1) // renewed
	c1.send("unlock 18 " + p1)
	c1.expect("result 18 success done")
	c2.locked(p2)
	c3.locked(p3)
}
