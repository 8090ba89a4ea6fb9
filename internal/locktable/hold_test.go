package locktable

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestHoldGrantsQueuesThenGrantsInArrivalOrder(t *testing.T) {
	h := newHarness(t, Config{})
	until := h.now + 100*ms
	h.tab.HoldGrants(h.now, until)
	if got := h.tab.HoldUntil(); got != until {
		t.Fatalf("HoldUntil = %d, want %d", got, until)
	}
	a := h.mustLock("s1", "A", time.Second, 0)
	b := h.mustLock("s2", "A", time.Second, 0) // behind a
	c := h.mustLock("s3", "B|C", time.Second, 0)
	d := h.mustLock("s1", "D", time.Second, 0)
	names := map[ID]string{a.ID: "a", b.ID: "b", c.ID: "c", d.ID: "d"}
	for _, g := range []Grant{a, b, c, d} {
		if g.Granted || g.Token != 0 || h.granted(g.ID) {
			t.Fatalf("granted during the hold: %+v", g)
		}
	}
	if at, ok := h.tab.NextDeadline(); !ok || at != until {
		t.Fatalf("next deadline = %d, %v; want the end of the hold %d", at, ok, until)
	}
	if st := h.tab.Stats(); st.Held != 0 || st.Live != 4 || st.HoldUntil != until || st.Granted != 0 {
		t.Fatalf("stats during the hold: %+v", st)
	}
	h.advance(99 * time.Millisecond)
	if got := h.take(names); len(got) != 0 {
		t.Fatalf("events before the end of the hold: %v", got)
	}
	h.advance(time.Millisecond)
	// Reported in arrival order, with tokens in that order, expiring ttl
	// after the end of the hold.
	if got := h.take(names); !slices.Equal(got, []string{"granted:a", "granted:c", "granted:d"}) {
		t.Fatalf("events at the end of the hold: %v", got)
	}
	var tokens []uint64
	for _, g := range []Grant{a, c, d} {
		li, ok := h.tab.Lookup(g.ID)
		if !ok || !li.Granted || li.Deadline != until+int64(time.Second) {
			t.Fatalf("%s after the hold: %+v", names[g.ID], li)
		}
		tokens = append(tokens, li.Token)
	}
	if !slices.IsSorted(tokens) || tokens[0] != 1 || tokens[2] != 3 {
		t.Fatalf("tokens %v, want 1 2 3 in arrival order", tokens)
	}
	if h.granted(b.ID) {
		t.Fatal("b waits behind a after the hold too")
	}
	if h.tab.HoldUntil() != 0 || h.tab.Stats().HoldUntil != 0 {
		t.Fatal("the hold is over")
	}
	// Normal service again: a free resource is granted at once.
	if g := h.mustLock("s2", "E", time.Second, 0); !g.Granted {
		t.Fatal("not granted at once after the hold")
	}
}

func TestHoldGrantsEventsInArrivalOrder(t *testing.T) {
	h := newHarness(t, Config{})
	h.tab.HoldGrants(h.now, h.now+50*ms)
	w := h.mustLock("s1", "A", time.Second, 0)
	x := h.mustLock("s2", "A|B", time.Second, 0) // behind w on A
	y := h.mustLock("s3", "C", time.Second, 0)   // grantable at once
	names := map[ID]string{w.ID: "w", x.ID: "x", y.ID: "y"}
	// w leaves: x becomes grantable after y did, but arrived before it.
	if err := h.unlock(w.ID); err != nil {
		t.Fatal(err)
	}
	h.advance(50 * time.Millisecond)
	if got := h.take(names); !slices.Equal(got, []string{"granted:x", "granted:y"}) {
		t.Fatalf("events = %v, want x then y (arrival order)", got)
	}
}

func TestHoldGrantsTryTolerateTimeout(t *testing.T) {
	h := newHarness(t, Config{})
	h.tab.HoldGrants(h.now, h.now+time.Second.Nanoseconds())
	// A try-lock on free resources is refused as busy, naming the first.
	_, err := h.tab.Lock(h.now, &Request{Session: "s1", Resources: []string{"A", "B"}, TTL: time.Second, Try: true})
	var re *ResourceError
	if !errors.Is(err, ErrBusy) || !errors.As(err, &re) || re.Resource != "A" {
		t.Fatalf("try during a hold: %v", err)
	}
	if h.tab.Stats().Refused != 1 || h.tab.QueueLen("A") != 0 {
		t.Fatal("a refused try must count as refused and change nothing")
	}
	// On a queued resource it names the busy one.
	h.mustLock("s1", "B", time.Second, 0)
	_, err = h.tab.Lock(h.now, &Request{Session: "s2", Resources: []string{"A", "B"}, TTL: time.Second, Try: true})
	if !errors.As(err, &re) || re.Resource != "B" || !errors.Is(err, ErrBusy) {
		t.Fatalf("try on a queued resource during a hold: %v", err)
	}
	// Tolerate counts the queue as usual.
	h.mustLock("s2", "B", time.Second, 0)
	if _, err := h.tab.Lock(h.now, &Request{Session: "s3", Resources: []string{"B"}, TTL: time.Second, Tolerate: 1}); !errors.Is(err, ErrTolerate) {
		t.Fatalf("tolerate during a hold: %v", err)
	}
	// Wait timeouts run during the hold, of a waiter at the head too.
	g := h.mustLock("s3", "T", time.Second, 100*time.Millisecond)
	h.advance(100 * time.Millisecond)
	if got := h.take(map[ID]string{g.ID: "g"}); !slices.Equal(got, []string{"timeout:g"}) {
		t.Fatalf("events = %v", got)
	}
	if h.tab.QueueLen("T") != 0 {
		t.Fatal("a timed-out request leaves its queues")
	}
}

func TestHoldGrantsOnlyGrows(t *testing.T) {
	h := newHarness(t, Config{})
	h.tab.HoldGrants(h.now, h.now) // not after now: nothing
	if h.tab.HoldUntil() != 0 {
		t.Fatal("a hold ending now must not start")
	}
	h.tab.HoldGrants(h.now, h.now+100*ms)
	h.tab.HoldGrants(h.now, h.now+50*ms) // earlier: ignored
	if got := h.tab.HoldUntil(); got != h.now+100*ms {
		t.Fatalf("HoldUntil = %d, want the later end", got)
	}
	h.tab.HoldGrants(h.now, h.now+200*ms)
	if at, _ := h.tab.NextDeadline(); at != h.now+200*ms || h.tab.HoldUntil() != at {
		t.Fatalf("the hold was not extended: next deadline %d", at)
	}
	g := h.mustLock("s1", "A", time.Second, 0)
	h.advance(150 * time.Millisecond)
	if h.granted(g.ID) {
		t.Fatal("granted before the extended end")
	}
	h.advance(50 * time.Millisecond)
	if !h.granted(g.ID) {
		t.Fatal("not granted at the extended end")
	}
}

func TestGrantAfterConfig(t *testing.T) {
	start := int64(1_000_000) * ms // the harness's clock
	h := newHarness(t, Config{GrantAfter: start + 30*ms})
	g := h.mustLock("s1", "A", time.Second, 0)
	if g.Granted {
		t.Fatal("granted before Config.GrantAfter")
	}
	h.advance(30 * time.Millisecond)
	if got := h.take(map[ID]string{g.ID: "g"}); !slices.Equal(got, []string{"granted:g"}) {
		t.Fatalf("events = %v", got)
	}
	// A GrantAfter already past holds nothing.
	h2 := newHarness(t, Config{GrantAfter: 1})
	if g := h2.mustLock("s1", "A", time.Second, 0); !g.Granted {
		t.Fatal("a past GrantAfter held a grant")
	}
}

// A hold that starts while locks are held (as a server stops granting at
// shutdown): held locks keep working, releases free resources, but their
// waiters are granted only when the hold ends.
func TestHoldGrantsWithHeldLocks(t *testing.T) {
	h := newHarness(t, Config{})
	a := h.ownerLock("s1", "A|B", "o1", time.Second)
	w := h.mustLock("s2", "A", time.Second, 0)
	x := h.mustLock("s3", "B", time.Second, 0)
	names := map[ID]string{a.ID: "a", w.ID: "w", x.ID: "x"}
	h.tab.HoldGrants(h.now, h.now+100*ms)
	if _, err := h.extend(a.ID, 2*time.Second); err != nil {
		t.Fatalf("extend during a hold: %v", err)
	}
	if g, err := h.renew("o1", []string{"B", "A"}, 2*time.Second); err != nil || g.ID != a.ID {
		t.Fatalf("renew during a hold: %+v %v", g, err)
	}
	if g := h.ownerLock("s1", "A|B", "o1", 2*time.Second); !g.Renewed || g.ID != a.ID {
		t.Fatalf("re-entry during a hold: %+v", g)
	}
	// A partial release frees A: w is grantable but held.
	if h.tab.Release(h.now, "o1", []string{"A"}) != true {
		t.Fatal("release of a held resource")
	}
	if got := h.take(names); !slices.Equal(got, []string{"released:a"}) {
		t.Fatalf("events = %v", got)
	}
	if h.granted(w.ID) {
		t.Fatal("granted during the hold")
	}
	if err := h.unlock(a.ID); err != nil {
		t.Fatal(err)
	}
	h.advance(100 * time.Millisecond)
	if got := h.take(names); !slices.Equal(got, []string{"granted:w", "granted:x"}) {
		t.Fatalf("events = %v", got)
	}
}

func TestHoldGrantsSessionDrop(t *testing.T) {
	h := newHarness(t, Config{SessionGrace: 20 * time.Millisecond})
	h.tab.HoldGrants(h.now, h.now+100*ms)
	a := h.mustLock("s1", "A", time.Second, 0)
	b := h.mustLock("s2", "A", time.Second, 0)
	h.tab.Detach(h.now, "s1")
	h.advance(20 * time.Millisecond)
	if got := h.take(map[ID]string{a.ID: "a", b.ID: "b"}); !slices.Equal(got, []string{"dropped:a", "closed:s1"}) {
		t.Fatalf("events = %v", got)
	}
	if h.granted(b.ID) {
		t.Fatal("granted during the hold")
	}
	h.advance(80 * time.Millisecond)
	if got := h.take(map[ID]string{b.ID: "b"}); !slices.Equal(got, []string{"granted:b"}) {
		t.Fatalf("events = %v", got)
	}
}

// Many requests that come and go during a hold do not make it grow without
// bound.
func TestHoldGrantsReadyListBounded(t *testing.T) {
	h := newHarness(t, Config{})
	h.tab.HoldGrants(h.now, h.now+time.Hour.Nanoseconds())
	keep := h.mustLock("s1", "keep", time.Second, 0)
	for range 10_000 {
		g := h.mustLock("s2", "A", time.Second, 0)
		if err := h.unlock(g.ID); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(h.tab.ready); n > 2*h.tab.live+64 {
		t.Fatalf("ready holds %d entries for %d live requests", n, h.tab.live)
	}
	h.advance(time.Hour)
	if got := h.take(map[ID]string{keep.ID: "keep"}); !slices.Equal(got, []string{"granted:keep"}) {
		t.Fatalf("events = %v", got)
	}
}

func TestLockUnlockAllocsWithAndWithoutHold(t *testing.T) {
	h := newHarness(t, Config{})
	req := Request{Session: "s1", Resources: strings.Split("A|B", "|"), TTL: time.Second}
	cycle := func() {
		g, err := h.tab.Lock(h.now, &req)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.unlock(g.ID); err != nil {
			t.Fatal(err)
		}
	}
	cycle() // warm the free lists
	if n := testing.AllocsPerRun(1000, cycle); n != 0 {
		t.Fatalf("lock+unlock allocates %v times", n)
	}
	h.tab.HoldGrants(h.now, h.now+time.Hour.Nanoseconds())
	for range 200 {
		cycle() // let ready reach its compacted size
	}
	if n := testing.AllocsPerRun(1000, cycle); n != 0 {
		t.Fatalf("lock+unlock during a hold allocates %v times", n)
	}
}
