package locktable

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// An emptied queue is parked: the next request of its name takes the same
// queue back, and while it is parked nothing shows it (Stats, Head,
// QueueLen, the listings).
func TestParkedQueueTakenBack(t *testing.T) {
	h := newHarness(t, Config{})
	g := h.mustLock("s1", "a", time.Second, 0)
	q := h.tab.queues["a"]
	if err := h.unlock(g.ID); err != nil {
		t.Fatal(err)
	}
	if got := h.tab.queues["a"]; got != q || q.parked == 0 || q.n != 0 {
		t.Fatalf("queue a after its last unlock: %p parked %d, %d entries; want %p parked", got, q.parked, q.n, q)
	}
	if s := h.tab.Stats(); s.Queues != 0 {
		t.Fatalf("Stats.Queues %d with only a parked queue", s.Queues)
	}
	if _, ok := h.tab.Head("a"); ok || h.tab.QueueLen("a") != 0 {
		t.Fatal("Head or QueueLen sees a parked queue")
	}
	listed := 0
	h.tab.QueuesPage("", "", 10, 10, func(QueueInfo) bool { listed++; return true })
	if listed != 0 || h.tab.Busiest("", 10, 10, func(QueueInfo) bool { return true }) != 0 {
		t.Fatal("a listing sees a parked queue")
	}
	if h.tab.Release(h.now, "o", []string{"a"}) {
		t.Fatal("Release acts on a parked queue")
	}
	if n, err := h.tab.Evict(h.now, []string{"a"}); n != 0 || err != nil {
		t.Fatalf("Evict of a parked queue: %d, %v", n, err)
	}

	// Taken back, by a request naming it twice too, and listed again.
	g = h.mustLock("s2", "a|b|a", time.Second, 0)
	if h.tab.queues["a"] != q || q.parked != 0 || q.n != 1 || q.head.l.id != g.ID {
		t.Fatalf("queue a not taken back: %p parked %d, %d entries", h.tab.queues["a"], q.parked, q.n)
	}
	if s := h.tab.Stats(); s.Queues != 2 || s.Entries != 2 {
		t.Fatalf("Stats %+v, want 2 queues and 2 entries", s)
	}
	var names []string
	h.tab.QueuesPage("", "", 10, 10, func(qi QueueInfo) bool { names = append(names, qi.Resource); return true })
	if fmt.Sprint(names) != "[a b]" {
		t.Fatalf("listed %v, want [a b]", names)
	}
	if err := checkIndex(h.tab); err != nil {
		t.Fatal(err)
	}
}

// The ring of parked queues is bounded: once it is full, parking a queue
// forgets the one parked longest ago, and the map of queues holds the live
// queues and at most max parked ones, however many names came and went.
func TestParkedQueuesBounded(t *testing.T) {
	h := newHarness(t, Config{MaxLocksPerSession: -1})
	h.tab.parked.max = 3
	for i := range 50 {
		g := h.mustLock("s1", fmt.Sprintf("r%d", i), time.Second, 0)
		if err := h.unlock(g.ID); err != nil {
			t.Fatal(err)
		}
		if err := checkIndex(h.tab); err != nil {
			t.Fatal(err)
		}
		if want := min(i+1, 3); len(h.tab.queues) != want || h.tab.parked.n != want {
			t.Fatalf("after %d names: %d queues mapped, %d parked; want %d", i+1, len(h.tab.queues), h.tab.parked.n, want)
		}
	}
	for _, name := range []string{"r47", "r48", "r49"} {
		if q := h.tab.queues[name]; q == nil || q.parked == 0 {
			t.Fatalf("%s, among the last parked, is not parked", name)
		}
	}
	// The ring is first in, first out over parks: taking r48 back leaves
	// a hole in its slot; parking "fresh" then forgets r47, the oldest,
	// and parking r48 again reaches the hole, which forgets nobody.
	g := h.mustLock("s1", "r48", time.Second, 0)
	g2 := h.mustLock("s1", "fresh", time.Second, 0)
	if err := h.unlock(g2.ID); err != nil {
		t.Fatal(err)
	}
	if h.tab.queues["r47"] != nil || h.tab.queues["r49"] == nil || h.tab.queues["fresh"] == nil {
		t.Fatal("parking into a full ring did not forget exactly the oldest parked queue")
	}
	if err := h.unlock(g.ID); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"r48", "r49", "fresh"} {
		if q := h.tab.queues[name]; q == nil || q.parked == 0 {
			t.Fatalf("%s is not parked after a park that reached a hole", name)
		}
	}
	if err := checkIndex(h.tab); err != nil {
		t.Fatal(err)
	}
}

// A parked queue's name is checked against the longest name in force: a
// limit lowered since the queue was made refuses it.
func TestParkedQueueNameLimit(t *testing.T) {
	h := newHarness(t, Config{MaxNameLen: 10})
	g := h.mustLock("s1", "abcdefgh", time.Second, 0)
	if err := h.unlock(g.ID); err != nil {
		t.Fatal(err)
	}
	if err := h.tab.SetLimits(Config{MaxNameLen: 4}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.lock("s1", "abcdefgh", time.Second, 0); !errors.Is(err, ErrInvalidResource) {
		t.Fatalf("lock of a parked name over the limit: %v, want ErrInvalidResource", err)
	}
	if _, err := h.lock("s1", "abcd", time.Second, 0); err != nil {
		t.Fatal(err)
	}
}

// Parked queues are not state: a snapshot of a table with parked queues
// equals that of the same table after they are forgotten, and both answer
// the same from then on.
func TestParkedQueuesNotInSnapshot(t *testing.T) {
	a, b := newHarness(t, Config{}), newHarness(t, Config{})
	for _, h := range []*harness{a, b} {
		g := h.mustLock("s1", "x|y", time.Second, 0)
		if err := h.unlock(g.ID); err != nil {
			t.Fatal(err)
		}
		h.mustLock("s2", "z", time.Second, 0)
	}
	forgetParked(b.tab)
	if a.tab.parked.n != 2 || len(b.tab.queues) != 1 {
		t.Fatalf("%d parked in a, %d queues in b", a.tab.parked.n, len(b.tab.queues))
	}
	sa, err := a.tab.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	sb, err := b.tab.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if string(sa) != string(sb) || a.tab.Stats() != b.tab.Stats() {
		t.Fatal("the snapshot or the stats hold the parked queues")
	}
	for _, res := range []string{"x", "y|x", "z", "x|z"} {
		ga, erra := a.lock("s1", res, time.Second, time.Second)
		gb, errb := b.lock("s1", res, time.Second, time.Second)
		if ga != gb || !errors.Is(erra, errb) {
			t.Fatalf("lock %s: %+v, %v with parked queues, %+v, %v without", res, ga, erra, gb, errb)
		}
	}
	if err := checkIndex(a.tab); err != nil {
		t.Fatal(err)
	}
}

// forgetParked forgets every parked queue of t.
func forgetParked(t *Table) {
	r := &t.parked
	for i, q := range r.ring {
		if q != nil {
			r.ring[i] = nil
			t.freeQueue(q)
		}
	}
	r.head, r.len, r.n = 0, 0, 0
}
