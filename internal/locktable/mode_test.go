package locktable

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// lockM locks res ("a|b") in modes ("s|x", or one for all) for sess.
func (h *harness) lockM(sess, res, modes string, try bool, owner string) (Grant, error) {
	h.t.Helper()
	req := &Request{Session: sess, Resources: strings.Split(res, "|"), TTL: time.Second, Try: try, Owner: owner}
	for _, m := range strings.Split(modes, "|") {
		md, ok := ParseMode([]byte(m))
		if !ok {
			h.t.Fatalf("bad mode %q", m)
		}
		req.Modes = append(req.Modes, md)
	}
	return h.tab.Lock(h.now, req)
}

func (h *harness) mustLockM(sess, res, modes string) Grant {
	h.t.Helper()
	g, err := h.lockM(sess, res, modes, false, "")
	if err != nil {
		h.t.Fatalf("lock %s %s: %v", res, modes, err)
	}
	return g
}

// grantedNow returns the ids granted by the events since the last call, in
// order, and checks that their tokens increase.
func (h *harness) grantedNow() []ID {
	h.t.Helper()
	var ids []ID
	last := uint64(0)
	for _, e := range h.events {
		if e.Kind == Granted {
			if e.Token <= last {
				h.t.Fatalf("token %d after %d", e.Token, last)
			}
			last = e.Token
			ids = append(ids, e.ID)
		}
	}
	h.events = nil
	return ids
}

func TestParseMode(t *testing.T) {
	good := map[string]Mode{"x": Exclusive, "s": Shared, "1/1": {Permits: 1, Of: 1}, "2/5": {Permits: 2, Of: 5},
		"1000000000/1000000000": {Permits: MaxPermits, Of: MaxPermits}}
	for in, want := range good {
		m, ok := ParseMode([]byte(in))
		if !ok || m != want || m.String() != in {
			t.Errorf("ParseMode(%q) = %v %v, String %q; want %v", in, m, ok, m.String(), want)
		}
	}
	for _, in := range []string{"", "X", "S", "w", "r", "0/5", "6/5", "1/0", "01/5", "1/05", "-1/5", "1/", "/5",
		"1/1000000001", "1/2/3", "1 /2", "18446744073709551617/1", "xs"} {
		if m, ok := ParseMode([]byte(in)); ok {
			t.Errorf("ParseMode(%q) = %v, want refused", in, m)
		}
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = ParseMode([]byte("3/7")) }); n != 0 {
		t.Fatalf("ParseMode allocates %v times", n)
	}
}

func TestSharedReadersGrantedTogetherWriterBlocksLaterReaders(t *testing.T) {
	h := newHarness(t, Config{})
	r1 := h.mustLockM("s1", "cat", "s")
	r2 := h.mustLockM("s2", "cat", "s")
	if !r1.Granted || !r2.Granted || r2.Token <= r1.Token {
		t.Fatalf("readers not granted together: %+v %+v", r1, r2)
	}
	w := h.mustLockM("s3", "cat", "x")
	r3 := h.mustLockM("s1", "cat", "s")
	if w.Granted || r3.Granted {
		t.Fatalf("writer %+v or the reader behind it %+v granted among readers", w, r3)
	}
	// No barging: a try-lock reader behind the waiting writer is busy.
	if _, err := h.lockM("s2", "cat", "s", true, ""); !errors.Is(err, ErrBusy) {
		t.Fatalf("try reader past a waiting writer: %v", err)
	}
	h.unlock(r1.ID)
	if g := h.grantedNow(); len(g) != 0 {
		t.Fatalf("granted %v while a reader still holds", g)
	}
	h.unlock(r2.ID)
	if g := h.grantedNow(); len(g) != 1 || g[0] != w.ID {
		t.Fatalf("after the readers: granted %v, want the writer", g)
	}
	r4 := h.mustLockM("s2", "cat", "s")
	w2 := h.mustLockM("s3", "cat", "x")
	r5 := h.mustLockM("s2", "cat", "s")
	h.unlock(w.ID)
	// The readers up to the next writer, in queue order, in one step.
	if g := h.grantedNow(); len(g) != 2 || g[0] != r3.ID || g[1] != r4.ID {
		t.Fatalf("after the writer: granted %v, want r3 r4", g)
	}
	if h.granted(w2.ID) || h.granted(r5.ID) {
		t.Fatal("the second writer or the reader behind it granted")
	}
	// Tolerate counts the admitted group as one: r3+r4 (1), w2, r5 = 3.
	if _, err := h.tab.Lock(h.now, &Request{Session: "s1", Resources: []string{"cat"}, TTL: time.Second,
		Tolerate: 2, Modes: []Mode{Shared}}); !errors.Is(err, ErrTolerate) {
		t.Fatalf("tolerate 2 on a queue of 3: %v", err)
	}
	if _, err := h.tab.Lock(h.now, &Request{Session: "s1", Resources: []string{"cat"}, TTL: time.Second,
		Tolerate: 3, Modes: []Mode{Shared}}); err != nil {
		t.Fatalf("tolerate 3 on a queue of 3: %v", err)
	}
	// A waiting writer that leaves lets the readers behind it in.
	h.unlock(w2.ID)
	if g := h.grantedNow(); len(g) != 2 || g[0] != r5.ID {
		t.Fatalf("after the waiting writer left: granted %v, want r5 and the last reader", g)
	}
}

func TestSemaphorePermits(t *testing.T) {
	h := newHarness(t, Config{})
	a := h.mustLockM("s1", "pay", "3/5")
	b := h.mustLockM("s2", "pay", "2/5")
	c := h.mustLockM("s3", "pay", "1/5")
	if !a.Granted || !b.Granted || c.Granted {
		t.Fatalf("3+2 of 5 granted, 1 more waits: %+v %+v %+v", a, b, c)
	}
	h.unlock(b.ID)
	d := h.mustLockM("s2", "pay", "4/5")
	e := h.mustLockM("s1", "pay", "1/5")
	if g := h.grantedNow(); len(g) != 1 || g[0] != c.ID {
		t.Fatalf("after 2 returned: %v, want c", g)
	}
	// 3+1 in use: d (4) waits, and e (1), which would fit, waits behind it.
	if d.Granted || e.Granted {
		t.Fatalf("d %+v e %+v granted", d, e)
	}
	if _, err := h.lockM("s3", "pay", "1/5", true, ""); !errors.Is(err, ErrBusy) {
		t.Fatalf("try past a waiting request: %v", err)
	}
	// Another count, or shared (unbounded), is refused while entries are queued.
	for _, m := range []string{"1/4", "s"} {
		if _, err := h.lockM("s3", "pay", m, false, ""); !errors.Is(err, ErrPermitsConflict) || !strings.Contains(err.Error(), "pay") {
			t.Fatalf("mode %s on a semaphore of 5: %v", m, err)
		}
	}
	// Exclusive fits any resource: it waits for every permit.
	x := h.mustLockM("s3", "pay", "x")
	h.unlock(a.ID)
	h.unlock(c.ID)
	if g := h.grantedNow(); len(g) != 2 || g[0] != d.ID || g[1] != e.ID {
		t.Fatalf("after a and c: %v, want d e", g)
	}
	h.unlock(d.ID)
	h.unlock(e.ID)
	if g := h.grantedNow(); len(g) != 1 || g[0] != x.ID {
		t.Fatalf("want the exclusive: %v", g)
	}
	h.unlock(x.ID)
	// Once nothing is queued, the next request declares the count afresh.
	if g := h.mustLockM("s1", "pay", "1/2"); !g.Granted {
		t.Fatal("a new count on a free resource")
	}
}

func TestMixedModesOneAtomicRequest(t *testing.T) {
	h := newHarness(t, Config{})
	r := h.mustLockM("s1", "t2", "s")
	// Write t1, read t2 t3 t4: granted at once next to a reader of t2.
	job := h.mustLockM("s2", "t1|t2|t3|t4", "x|s|s|s")
	if !job.Granted {
		t.Fatal("mixed request not granted")
	}
	li, _ := h.tab.Lookup(job.ID)
	if got := strings.Join(modeStrings(li.Modes), "|"); got != "x|s|s|s" {
		t.Fatalf("modes %s", got)
	}
	w := h.mustLockM("s3", "t3", "x")
	h.unlock(r.ID)
	if w.Granted || len(h.grantedNow()) != 0 {
		t.Fatal("writer of t3 granted while the job reads it")
	}
	// Modes per resource must match the resources, and a name given twice
	// has one mode.
	for _, c := range [][2]string{{"a|b|c", "s|x"}, {"a|a", "s|x"}} {
		if _, err := h.lockM("s1", c[0], c[1], false, ""); !errors.Is(err, ErrInvalidMode) {
			t.Fatalf("%s in %s: %v", c[0], c[1], err)
		}
	}
	for _, m := range []Mode{{Permits: 3, Of: 2}, {Permits: 2, Of: 0}, {Permits: 0, Of: 4}, {Permits: 1, Of: MaxPermits + 1}} {
		_, err := h.tab.Lock(h.now, &Request{Session: "s1", Resources: []string{"a"}, TTL: time.Second, Modes: []Mode{m}})
		if !errors.Is(err, ErrInvalidMode) {
			t.Fatalf("mode %+v: %v", m, err)
		}
	}
	if _, err := h.lockM("s1", "a|a", "s|s", false, ""); err != nil {
		t.Fatalf("a name twice in one mode: %v", err)
	}
}

func modeStrings(ms []Mode) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.String())
	}
	return out
}

func TestOwnerReentryKeepsItsModeAndRefusesUpgrade(t *testing.T) {
	h := newHarness(t, Config{})
	h.mustLockM("s1", "doc", "s")
	g, err := h.lockM("s2", "doc", "s", false, "o")
	if err != nil || !g.Granted {
		t.Fatal(err)
	}
	again, err := h.lockM("s2", "doc", "s", false, "o")
	if err != nil || !again.Renewed || again.ID != g.ID || again.Token != g.Token {
		t.Fatalf("re-entry in the same mode: %+v %v", again, err)
	}
	if _, err := h.lockM("s2", "doc", "x", false, "o"); !errors.Is(err, ErrModeChange) {
		t.Fatalf("upgrade by re-entry: %v", err)
	}
	if _, err := h.lockM("s2", "doc", "1/3", false, "o"); !errors.Is(err, ErrPermitsConflict) {
		t.Fatalf("re-entry as a semaphore: %v", err)
	}
	if _, err := h.tab.Renew(h.now, "o", []string{"doc"}, time.Second, "s2"); err != nil {
		t.Fatalf("renew a shared lock by owner: %v", err)
	}
	if !h.tab.Release(h.now, "o", []string{"doc"}) {
		t.Fatal("release of the owner's shared lock")
	}
	if h.tab.QueueLen("doc") != 1 {
		t.Fatal("release took more than the owner's lock")
	}
}

func TestEvictRevokesEveryReader(t *testing.T) {
	h := newHarness(t, Config{})
	a := h.mustLockM("s1", "cat", "s")
	b := h.mustLockM("s2", "cat", "s")
	h.mustLockM("s3", "cat", "x")
	n, err := h.tab.Evict(h.now, []string{"cat"})
	if err != nil || n != 2 {
		t.Fatalf("evict = %d %v, want both readers", n, err)
	}
	for _, id := range []ID{a.ID, b.ID} {
		if li, _ := h.tab.Lookup(id); !li.Revoked {
			t.Fatalf("%s not revoked", id.Short())
		}
	}
}

func TestSnapshotKeepsModes(t *testing.T) {
	h := newHarness(t, Config{})
	h.mustLockM("s1", "cat|pay", "s|2/3")
	h.mustLockM("s2", "cat|pay", "s|1/3")
	h.mustLockM("s3", "cat", "x")
	h.mustLockM("s1", "cat|pay", "s|1/3")
	snap := mustMarshal(t, h.tab)
	r, err := Restore(Config{}, snap)
	if err != nil {
		t.Fatal(err)
	}
	if again := mustMarshal(t, r); string(again) != string(snap) {
		t.Fatal("restored table snapshots differently")
	}
	var got []string
	r.QueuesPage("", "", 10, 100, func(qi QueueInfo) bool {
		for _, e := range qi.Entries {
			got = append(got, qi.Resource+":"+e.Mode.String()+":"+map[bool]string{true: "held", false: "wait"}[e.Granted])
		}
		return true
	})
	want := "cat:s:held cat:s:held cat:x:wait cat:s:wait pay:2/3:held pay:1/3:held pay:1/3:wait"
	if strings.Join(got, " ") != want {
		t.Fatalf("restored queues %v\nwant %s", got, want)
	}
}

// A try-lock joins the admitted entries when it fits them, a reserving one
// (of a request still waiting for another resource) included, and is
// refused when an entry waits for admission ahead of it.
func TestTryJoinsAReservingEntry(t *testing.T) {
	h := newHarness(t, Config{})
	h.tab.Attach(h.now, "s")
	x := h.mustLockM("s", "b", "x")
	r := h.mustLockM("s", "a|b", "s") // admitted on a, waits for b
	if r.Granted || !x.Granted {
		t.Fatalf("x %+v, r %+v", x, r)
	}
	if g, err := h.lockM("s", "a", "s", true, ""); err != nil || !g.Granted {
		t.Fatalf("shared try-lock beside a reserving reader: %+v %v", g, err)
	}
	if _, err := h.lockM("s", "a", "x", true, ""); !errors.Is(err, ErrBusy) {
		t.Fatalf("exclusive try-lock on a reserved resource: %v", err)
	}
	h.mustLockM("s", "a", "x") // waits for admission
	if _, err := h.lockM("s", "a", "s", true, ""); !errors.Is(err, ErrBusy) {
		t.Fatalf("shared try-lock behind a waiting writer: %v", err)
	}
}
