package locktable

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// A renewal from a session other than the lock's never shortens it; from its
// own session it sets now + ttl exactly. The TTL changes only with the
// expiry.
func TestRenewalFromElsewhereNeverShortens(t *testing.T) {
	const long, short = 10 * time.Second, time.Second
	renewals := []struct {
		name  string
		renew func(h *harness, g Grant, ttl time.Duration, from string) (int64, error)
	}{
		{"extend", func(h *harness, g Grant, ttl time.Duration, from string) (int64, error) {
			return h.tab.Extend(h.now, g.ID, ttl, from)
		}},
		{"renew", func(h *harness, g Grant, ttl time.Duration, from string) (int64, error) {
			r, err := h.tab.Renew(h.now, "o1", []string{"a", "b"}, ttl, from)
			return r.ExpiresAt, err
		}},
		{"reentry", func(h *harness, g Grant, ttl time.Duration, from string) (int64, error) {
			r, err := h.tab.Lock(h.now, &Request{Session: from, Resources: []string{"b", "a"}, TTL: ttl, Owner: "o1"})
			return r.ExpiresAt, err
		}},
	}
	cases := []struct {
		from    string
		ttl     time.Duration
		longer  bool // the expiry moves to now + ttl
		ownSess bool
	}{
		{"s1", short, true, true}, // own session: exactly now + ttl, shorter
		{"s1", long, true, true},
		{"s2", short, false, false}, // elsewhere: never shorter
		{"s2", long, true, false},   // elsewhere: longer is fine
		{"", short, false, false},   // the empty session is elsewhere
		{"", long, true, false},
	}
	for _, rn := range renewals {
		for _, tc := range cases {
			if rn.name == "reentry" && tc.from == "" {
				continue // Lock needs an attached session
			}
			t.Run(fmt.Sprintf("%s/from=%q/ttl=%v", rn.name, tc.from, tc.ttl), func(t *testing.T) {
				h := newHarness(t, Config{})
				g := h.ownerLock("s1", "a|b", "o1", 5*time.Second)
				h.advance(time.Second) // expires at now + 4 s
				before := g.ExpiresAt
				exp, err := rn.renew(h, g, tc.ttl, tc.from)
				want, wantTTL := before, 5*time.Second
				if tc.longer {
					want, wantTTL = h.now+int64(tc.ttl), tc.ttl
				}
				li, _ := h.tab.Lookup(g.ID)
				if err != nil || exp != want || li.Deadline != want || li.TTL != wantTTL {
					t.Fatalf("expiry %d (engine %d, ttl %v), %v; want %d, ttl %v", exp, li.Deadline, li.TTL, err, want, wantTTL)
				}
				// The engine keeps the lock until exactly the returned expiry.
				h.now = exp - 1
				h.tab.Advance(h.now)
				if !h.granted(g.ID) {
					t.Fatal("lock gone before its expiry")
				}
				h.now = exp
				h.tab.Advance(h.now)
				if h.granted(g.ID) {
					t.Fatal("lock live at its expiry")
				}
			})
		}
	}
}

// Unlock of a granted lock from another session is reported to its holder
// before the waiters it lets through are granted; from its own session, or
// of a waiting request, it reports nothing.
func TestUnlockFromElsewhereTellsTheHolder(t *testing.T) {
	tests := []struct {
		name    string
		from    string
		waiting bool // unlock the waiter instead of the holder
		want    []string
	}{
		{"own session", "s1", false, []string{"granted:w"}},
		{"other session", "s2", false, []string{"released:a", "granted:w"}},
		{"empty session", "", false, []string{"released:a", "granted:w"}},
		{"waiting from elsewhere", "s1", true, nil},
		{"waiting from its own", "s2", true, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, Config{})
			a := h.mustLock("s1", "x", time.Second, 0)
			w := h.mustLock("s2", "x", time.Second, 0)
			id := a.ID
			if tc.waiting {
				id = w.ID
			}
			if err := h.tab.Unlock(h.now, id, tc.from); err != nil {
				t.Fatal(err)
			}
			var ev Event
			for _, e := range h.events {
				if e.Kind == Released {
					ev = e
				}
			}
			if got := h.take(map[ID]string{a.ID: "a", w.ID: "w"}); !slices.Equal(got, tc.want) {
				t.Fatalf("events %v, want %v", got, tc.want)
			}
			if ev.Kind == Released && (ev.Session != "s1" || ev.Token != a.Token || ev.Partial || ev.Moved) {
				t.Fatalf("released event %+v", ev)
			}
			if _, ok := h.tab.Lookup(id); ok {
				t.Fatal("still live")
			}
		})
	}
}

// After a partial release, Extend by id no longer finds the lock, Renew by
// owner on exactly the rest does, and Unlock by id still removes it.
func TestPartiallyReleasedLock(t *testing.T) {
	h := newHarness(t, Config{})
	g := h.ownerLock("s1", "a|b|c", "o1", time.Second)
	if !h.tab.Release(h.now, "o1", []string{"a"}) {
		t.Fatal("release a")
	}
	before := h.tab.Stats().ExtendFails
	for _, from := range []string{"s1", "s2", ""} {
		if _, err := h.tab.Extend(h.now, g.ID, time.Minute, from); !errors.Is(err, ErrNotFound) {
			t.Fatalf("extend from %q after a partial release: %v", from, err)
		}
	}
	if st := h.tab.Stats(); st.ExtendFails != before+3 {
		t.Fatalf("extend fails %d, want %d", st.ExtendFails, before+3)
	}
	if li, ok := h.tab.Lookup(g.ID); !ok || li.Deadline != g.ExpiresAt {
		t.Fatalf("the refused extends changed the lock: %+v %v", li, ok)
	}
	if _, err := h.tab.Renew(h.now, "o1", []string{"a", "b", "c"}, time.Minute, "s1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("renew of the whole set: %v", err)
	}
	r, err := h.tab.Renew(h.now, "o1", []string{"c", "b"}, time.Minute, "s1")
	if err != nil || r.ID != g.ID || r.ExpiresAt != h.now+int64(time.Minute) {
		t.Fatalf("renew of the rest: %+v %v", r, err)
	}
	if _, err := h.tab.Extend(h.now, g.ID, time.Minute, "s1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("extend after renewing the rest: %v", err)
	}
	// A re-entry on the rest answers with the lock's ID: Extend finds it
	// again.
	if r := h.ownerLock("s2", "b|c", "o1", time.Minute); r.ID != g.ID || !r.Renewed {
		t.Fatalf("re-entry on the rest: %+v", r)
	}
	if exp, err := h.tab.Extend(h.now, g.ID, 2*time.Minute, "s2"); err != nil || exp != h.now+int64(2*time.Minute) {
		t.Fatalf("extend after a re-entry: %d %v", exp, err)
	}
	h.events = nil
	if err := h.tab.Unlock(h.now, g.ID, "s2"); err != nil {
		t.Fatalf("unlock: %v", err)
	}
	if st := h.tab.Stats(); st.Live != 0 || st.Entries != 0 || st.NameBytes != 0 || len(h.events) != 0 {
		t.Fatalf("after unlock: %+v, events %v", st, h.events)
	}
}

// With no session grace (SessionGrace < 0) an evicted lock goes at once:
// there is no grace in which its holder may still believe it holds it.
func TestEvictWithoutGrace(t *testing.T) {
	h := newHarness(t, Config{SessionGrace: -1})
	ab := h.ownerLock("s1", "a|b", "o1", time.Second)
	c := h.mustLock("s2", "c", time.Second, 0)
	wa := h.mustLock("s3", "a", time.Second, 0)    // waits for a
	wcd := h.mustLock("s3", "c|d", time.Second, 0) // holds d's head, reserving, waits for c
	label := map[ID]string{ab.ID: "ab", c.ID: "c", wa.ID: "wa", wcd.ID: "wcd"}

	// One resource of a multi-resource lock removes all of it; a lock
	// named twice counts once; free and reserved resources are left alone.
	n, err := h.tab.Evict(h.now, []string{"b", "a", "d", "free"})
	if err != nil || n != 1 {
		t.Fatalf("evict = %d, %v", n, err)
	}
	if got := h.take(label); !slices.Equal(got, []string{"released:ab", "granted:wa"}) {
		t.Fatalf("events %v", got)
	}
	if _, ok := h.tab.Lookup(ab.ID); ok || h.tab.QueueLen("b") != 0 || !h.granted(wa.ID) || h.granted(wcd.ID) {
		t.Fatal("evict did not remove the whole lock, or did not grant the waiter")
	}
	// What the call grants is not evicted by it: c's removal grants wcd,
	// which heads c (named again) and d when the call ends.
	n, err = h.tab.Evict(h.now, []string{"c", "c", "d"})
	if err != nil || n != 1 {
		t.Fatalf("second evict = %d, %v", n, err)
	}
	if got := h.take(label); !slices.Equal(got, []string{"released:c", "granted:wcd"}) {
		t.Fatalf("events %v", got)
	}
	if !h.granted(wcd.ID) {
		t.Fatal("the lock granted by the evict was evicted by it")
	}
	if st := h.tab.Stats(); st.Evicted != 2 || st.Live != 2 {
		t.Fatalf("stats %+v", st)
	}
	// Everything named is removed before anything is granted.
	p := h.mustLock("s1", "x", time.Second, 0)
	w := h.mustLock("s2", "x", time.Second, 0)
	q := h.mustLock("s1", "y", time.Second, 0)
	label[p.ID], label[w.ID], label[q.ID] = "p", "w", "q"
	if n, err := h.tab.Evict(h.now, []string{"x", "y"}); err != nil || n != 2 {
		t.Fatalf("evict x, y = %d, %v", n, err)
	}
	if got := h.take(label); !slices.Equal(got, []string{"released:p", "released:q", "granted:w"}) || !h.granted(w.ID) {
		t.Fatalf("events %v", got)
	}
	// Malformed calls remove nothing.
	for _, res := range [][]string{nil, {"c", "a b"}, {"c", ""}, {"c", "x|y"}} {
		if _, err := h.tab.Evict(h.now, res); !errors.Is(err, ErrInvalidResource) {
			t.Fatalf("evict %q: %v", res, err)
		}
	}
	if _, err := h.tab.Evict(h.now, names("r", DefaultMaxResources+1)); !errors.Is(err, ErrTooManyResources) {
		t.Fatalf("evict of too many: %v", err)
	}
	if !h.granted(wcd.ID) || !h.granted(wa.ID) || len(h.events) != 0 {
		t.Fatal("a refused evict changed something")
	}
}

// revokeHarness returns a harness (grace 10 s) where s1 holds a|b as owner
// o1 until now + 1 min, s2 waits for b, and a|b has just been evicted.
func revokeHarness(t *testing.T) (h *harness, g, w Grant, label map[ID]string) {
	t.Helper()
	h = newHarness(t, Config{SessionGrace: 10 * time.Second})
	g = h.ownerLock("s1", "a|b", "o1", time.Minute)
	w = h.mustLock("s2", "b", time.Minute, 0)
	label = map[ID]string{g.ID: "g", w.ID: "w"}
	if n, err := h.tab.Evict(h.now, []string{"b"}); err != nil || n != 1 {
		t.Fatalf("evict = %d, %v", n, err)
	}
	if got := h.take(label); !slices.Equal(got, []string{"released:g"}) {
		t.Fatalf("evict events %v", got)
	}
	return h, g, w, label
}

// Evict revokes: the holder is told at once, the lock keeps its resources
// until min(expiry, now + grace), when it expires as any lock, and only
// then are its waiters granted.
func TestEvictRevokes(t *testing.T) {
	h, g, w, label := revokeHarness(t)
	end := h.now + int64(10*time.Second)
	li, ok := h.tab.Lookup(g.ID)
	if !ok || !li.Granted || !li.Revoked || li.Deadline != end || h.granted(w.ID) {
		t.Fatalf("revoked lock %+v %v; waiter granted %v", li, ok, h.granted(w.ID))
	}
	var page []QueueInfo
	h.tab.QueuesPage("", "", 10, 10, func(qi QueueInfo) bool { page = append(page, qi); return true })
	if len(page) != 2 || !page[1].Entries[0].Revoked || page[1].Entries[1].Revoked {
		t.Fatalf("page %+v", page)
	}
	if st := h.tab.Stats(); st.Evicted != 1 || st.Held != 1 || st.Live != 2 {
		t.Fatalf("stats %+v", st)
	}
	if at, ok := h.tab.NextDeadline(); !ok || at != end {
		t.Fatalf("next deadline %d %v, want %d", at, ok, end)
	}
	h.now = end - 1
	h.tab.Advance(h.now)
	if len(h.events) != 0 || h.granted(w.ID) {
		t.Fatalf("before the end: %v", h.take(label))
	}
	h.now = end
	h.tab.Advance(h.now)
	if got := h.take(label); !slices.Equal(got, []string{"expired:g", "granted:w"}) || !h.granted(w.ID) {
		t.Fatalf("at the end: %v", got)
	}
	if st := h.tab.Stats(); st.Evicted != 1 || st.Expired != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// A lock that expires before now + grace keeps its expiry.
func TestEvictKeepsAnEarlierExpiry(t *testing.T) {
	h := newHarness(t, Config{SessionGrace: 10 * time.Second})
	g := h.mustLock("s1", "a", 3*time.Second, 0)
	if n, err := h.tab.Evict(h.now, []string{"a"}); err != nil || n != 1 {
		t.Fatalf("evict = %d, %v", n, err)
	}
	if li, _ := h.tab.Lookup(g.ID); li.Deadline != g.ExpiresAt || !li.Revoked {
		t.Fatalf("revoked lock %+v, want expiry %d", li, g.ExpiresAt)
	}
}

// Evicting a revoked lock again changes nothing, and a lock named through
// several resources counts once.
func TestEvictAgain(t *testing.T) {
	h, g, _, label := revokeHarness(t)
	end := h.now + int64(10*time.Second)
	h.advance(time.Second)
	if n, err := h.tab.Evict(h.now, []string{"a", "b", "a"}); err != nil || n != 0 {
		t.Fatalf("evict again = %d, %v", n, err)
	}
	li, _ := h.tab.Lookup(g.ID)
	if st := h.tab.Stats(); st.Evicted != 1 || len(h.events) != 0 || li.Deadline != end {
		t.Fatalf("evict again: stats %+v, events %v, expiry %d want %d", st, h.take(label), li.Deadline, end)
	}
	x := h.mustLock("s3", "x|y", time.Minute, 0)
	if n, _ := h.tab.Evict(h.now, []string{"y", "x", "b"}); n != 1 {
		t.Fatalf("evict of x|y through both = %d", n)
	}
	if got := h.take(map[ID]string{x.ID: "x"}); !slices.Equal(got, []string{"released:x"}) {
		t.Fatalf("events %v", got)
	}
}

// A revoked lock is nobody's: Extend, Renew and re-entry do not find it.
func TestRevokedLockIsNobodys(t *testing.T) {
	h, g, w, label := revokeHarness(t)
	end := h.now + int64(10*time.Second)
	for _, from := range []string{"s1", "s2", ""} {
		if _, err := h.tab.Extend(h.now, g.ID, time.Hour, from); !errors.Is(err, ErrNotFound) {
			t.Fatalf("extend from %q: %v", from, err)
		}
		if r, err := h.tab.Renew(h.now, "o1", []string{"a", "b"}, time.Hour, from); !errors.Is(err, ErrNotFound) {
			t.Fatalf("renew from %q: %+v %v", from, r, err)
		}
	}
	if _, err := h.tab.Lock(h.now, &Request{Session: "s1", Resources: []string{"a", "b"}, TTL: time.Hour, Owner: "o1", Try: true}); !errors.Is(err, ErrBusy) {
		t.Fatalf("try re-entry: %v", err)
	}
	// The owner's new request queues behind its revoked lock (and w).
	r, err := h.tab.Lock(h.now, &Request{Session: "s1", Resources: []string{"b", "a"}, TTL: time.Hour, Owner: "o1"})
	if err != nil || r.Granted || r.Renewed || r.ID == g.ID {
		t.Fatalf("re-entry on a revoked lock: %+v %v", r, err)
	}
	label[r.ID] = "r"
	if li, _ := h.tab.Lookup(g.ID); li.Deadline != end || len(h.events) != 0 {
		t.Fatalf("revoked lock renewed: %+v, events %v", li, h.take(label))
	}
	h.now = end
	h.tab.Advance(h.now)
	if got := h.take(label); !slices.Equal(got, []string{"expired:g", "granted:w"}) {
		t.Fatalf("at the end: %v", got)
	}
	h.unlock(w.ID)
	if got := h.take(label); !slices.Equal(got, []string{"granted:r"}) {
		t.Fatalf("after w: %v", got)
	}
}

// Its holder still ends a revoked lock at once, as its own act, and is
// told nothing more.
func TestRevokedLockEndedByItsHolder(t *testing.T) {
	ends := []struct {
		name string
		end  func(h *harness, g Grant) error
	}{
		{"unlock", func(h *harness, g Grant) error { return h.tab.Unlock(h.now, g.ID, "s1") }},
		{"unlock from elsewhere", func(h *harness, g Grant) error { return h.tab.Unlock(h.now, g.ID, "s3") }},
		{"release", func(h *harness, g Grant) error {
			if !h.tab.Release(h.now, "o1", []string{"a", "b"}) {
				return errors.New("release = false")
			}
			return nil
		}},
		{"releaseall", func(h *harness, g Grant) error {
			if n := h.tab.ReleaseAll(h.now, "o1"); n != 1 {
				return fmt.Errorf("releaseall = %d", n)
			}
			return nil
		}},
	}
	for _, e := range ends {
		t.Run(e.name, func(t *testing.T) {
			h, g, w, label := revokeHarness(t)
			if err := e.end(h, g); err != nil {
				t.Fatal(err)
			}
			if got := h.take(label); !slices.Equal(got, []string{"granted:w"}) {
				t.Fatalf("events %v", got)
			}
			if _, ok := h.tab.Lookup(g.ID); ok || !h.granted(w.ID) {
				t.Fatal("the revoked lock was not freed at once")
			}
			checkTotals(t, h.tab)
		})
	}
	// A partial release of a revoked lock frees what it names, at once.
	h, g, w, label := revokeHarness(t)
	if !h.tab.Release(h.now, "o1", []string{"b"}) {
		t.Fatal("partial release = false")
	}
	if got := h.take(label); !slices.Equal(got, []string{"granted:w"}) || !h.granted(w.ID) || !slices.Equal(h.resources(g.ID), []string{"a"}) {
		t.Fatalf("partial release: events %v, left %v", got, h.resources(g.ID))
	}
	if li, _ := h.tab.Lookup(g.ID); !li.Revoked {
		t.Fatal("the rest is no longer revoked")
	}
}

// A revoked lock of a session that ends is dropped with it.
func TestRevokedLockDroppedWithItsSession(t *testing.T) {
	h, g, w, label := revokeHarness(t)
	h.tab.Detach(h.now, "s1")
	h.advance(5 * time.Second) // the session ends at 10 s too: the same deadline
	if len(h.events) != 0 {
		t.Fatalf("events %v", h.take(label))
	}
	h.advance(5 * time.Second)
	got := h.take(label)
	if !slices.Contains(got, "granted:w") || len(got) != 3 || !h.granted(w.ID) {
		t.Fatalf("events %v", got)
	}
	if _, ok := h.tab.Lookup(g.ID); ok {
		t.Fatal("revoked lock outlived its session")
	}
}

// checkTotals compares the engine's counters with a recount from its
// requests.
func checkTotals(t *testing.T, tab *Table) {
	t.Helper()
	var entries int
	var bytes int64
	sess := map[string]int64{}
	tab.Locks(0, func(li LockInfo) bool {
		b := int64(len(li.Owner))
		for _, r := range li.Resources {
			b += int64(len(r))
		}
		entries += len(li.Resources)
		bytes += b
		sess[li.Session] += b
		return true
	})
	if st := tab.Stats(); st.Entries != entries || st.NameBytes != bytes {
		t.Fatalf("engine counts %d entries and %d bytes; recount %d and %d", st.Entries, st.NameBytes, entries, bytes)
	}
	for id, s := range tab.sessions {
		if s.bytes != sess[id] {
			t.Fatalf("session %s counts %d bytes; recount %d", id, s.bytes, sess[id])
		}
	}
}

// The counters stay exact through every way a request changes or leaves.
func TestCapsAccountingThroughEveryRemoval(t *testing.T) {
	h := newHarness(t, Config{SessionGrace: time.Second})
	h.tab.Attach(h.now, "gone")
	step := func(what string, f func()) {
		t.Helper()
		f()
		checkTotals(t, h.tab)
		if t.Failed() {
			t.Fatalf("after %s", what)
		}
	}
	var a, b, c Grant
	step("locks", func() {
		a = h.ownerLock("s1", "alpha|beta|gamma|alpha", "owner1", time.Minute) // duplicate folded
		b = h.ownerLock("s2", "delta", "o2", time.Minute)
		c = h.mustLock("s3", "alpha|epsilon", time.Minute, 10*time.Second) // waits
		h.mustLock("gone", "zeta|beta", time.Minute, 0)                    // waits
		h.ownerLock("s3", "eta", "o3", 12*time.Second)
	})
	if st := h.tab.Stats(); st.Entries != 9 || st.NameBytes != int64(len("alphabetagammaowner1")+len("deltao2")+
		len("alphaepsilon")+len("zetabeta")+len("etao3")) {
		t.Fatalf("stats %+v", st)
	}
	step("partial release", func() { h.tab.Release(h.now, "owner1", []string{"gamma"}) })
	step("re-entry moving sessions", func() { h.ownerLock("s3", "alpha|beta", "owner1", time.Minute) })
	step("unlock", func() { h.unlock(b.ID) })
	step("timeout", func() { h.advance(10 * time.Second) })
	if _, ok := h.tab.Lookup(c.ID); ok {
		t.Fatal("c did not time out")
	}
	step("expiry", func() { h.advance(3 * time.Second) })
	if h.tab.QueueLen("eta") != 0 {
		t.Fatal("eta did not expire")
	}
	step("session drop", func() { h.tab.Detach(h.now, "gone"); h.advance(time.Second) })
	step("evict", func() {
		h.ownerLock("s2", "theta", "o4", time.Minute)
		h.tab.Evict(h.now, []string{"theta"})
	})
	step("revoked lock's end", func() { h.advance(time.Second) })
	step("revoked lock unlocked", func() {
		g := h.ownerLock("s2", "lambda", "o4", time.Minute)
		h.tab.Evict(h.now, []string{"lambda"})
		h.unlock(g.ID)
	})
	step("release all", func() { h.tab.ReleaseAll(h.now, "owner1") })
	step("release whole", func() {
		h.ownerLock("s1", "iota|kappa", "o5", time.Minute)
		h.tab.Release(h.now, "o5", []string{"kappa", "iota"})
	})
	if st := h.tab.Stats(); st.Live != 0 || st.Entries != 0 || st.NameBytes != 0 {
		t.Fatalf("not empty at the end: %+v (a %s)", st, a.ID.Short())
	}
}

func TestCaps(t *testing.T) {
	lockN := func(h *harness, sess, owner string, res ...string) error {
		_, err := h.tab.Lock(h.now, &Request{Session: sess, Resources: res, TTL: time.Minute, Owner: owner})
		return err
	}
	t.Run("MaxLocks", func(t *testing.T) {
		h := newHarness(t, Config{MaxLocks: 2})
		if lockN(h, "s1", "o", "a") != nil || lockN(h, "s2", "", "b") != nil {
			t.Fatal("under the cap")
		}
		if err := lockN(h, "s3", "", "c"); !errors.Is(err, ErrServerFull) {
			t.Fatalf("third lock: %v", err)
		}
		if err := lockN(h, "s2", "o", "a"); err != nil {
			t.Fatalf("re-entry (moving) at the cap: %v", err)
		}
		if st := h.tab.Stats(); st.ServerFull != 1 || st.Live != 2 {
			t.Fatalf("stats %+v", st)
		}
		h.tab.ReleaseAll(h.now, "o")
		if err := lockN(h, "s3", "", "c"); err != nil {
			t.Fatalf("after a release: %v", err)
		}
	})
	t.Run("MaxEntries", func(t *testing.T) {
		h := newHarness(t, Config{MaxEntries: 3})
		if err := lockN(h, "s1", "", "a", "b", "a", "b", "c"); err != nil { // 3 distinct
			t.Fatalf("duplicates counted: %v", err)
		}
		if err := lockN(h, "s1", "", "a"); !errors.Is(err, ErrServerFull) {
			t.Fatalf("fourth entry: %v", err)
		}
	})
	t.Run("MaxNameBytes", func(t *testing.T) {
		h := newHarness(t, Config{MaxNameBytes: 10})
		if err := lockN(h, "s1", "ow", "abc", "abc", "def"); err != nil { // 3+3+2
			t.Fatalf("8 bytes: %v", err)
		}
		if err := lockN(h, "s2", "", "xyz"); !errors.Is(err, ErrServerFull) {
			t.Fatalf("11 bytes: %v", err)
		}
		if err := lockN(h, "s2", "", "xy"); err != nil {
			t.Fatalf("10 bytes: %v", err)
		}
		if err := lockN(h, "s3", "ow", "def", "abc"); err != nil {
			t.Fatalf("re-entry at the cap: %v", err)
		}
	})
	t.Run("MaxSessionBytes", func(t *testing.T) {
		h := newHarness(t, Config{MaxSessionBytes: 6})
		if err := lockN(h, "s1", "o", "ab", "ab", "cd"); err != nil { // 5
			t.Fatalf("5 bytes: %v", err)
		}
		if err := lockN(h, "s1", "", "ef"); !errors.Is(err, ErrSessionLimit) {
			t.Fatalf("7 bytes in s1: %v", err)
		}
		if err := lockN(h, "s2", "", "ef", "gh"); err != nil {
			t.Fatalf("another session: %v", err)
		}
		// A re-entry that would move the lock into a session without room
		// is refused and changes nothing.
		if err := lockN(h, "s2", "o", "ab", "cd"); !errors.Is(err, ErrSessionLimit) {
			t.Fatalf("move into a full session: %v", err)
		}
		if li, _ := h.tab.Head("ab"); li.Session != "s1" || len(h.events) != 0 {
			t.Fatalf("refused move moved it: %+v %v", li, h.events)
		}
		if err := lockN(h, "s1", "o", "cd", "ab"); err != nil {
			t.Fatalf("re-entry in its own session at the cap: %v", err)
		}
		if st := h.tab.Stats(); st.ServerFull != 0 {
			t.Fatalf("a session limit counted as server full: %+v", st)
		}
	})
	t.Run("defaults and no limit", func(t *testing.T) {
		tab, _ := New(Config{})
		if tab.maxLocks != DefaultMaxLocks || tab.maxEntries != DefaultMaxEntries ||
			tab.maxBytes != DefaultMaxNameBytes || tab.maxSessB != DefaultMaxSessionBytes {
			t.Fatalf("defaults %d %d %d %d", tab.maxLocks, tab.maxEntries, tab.maxBytes, tab.maxSessB)
		}
		if DefaultMaxNameBytes != 256<<20 || DefaultMaxSessionBytes != 8<<20 {
			t.Fatal("default sizes")
		}
		tab, _ = New(Config{MaxLocks: -1, MaxEntries: -1, MaxNameBytes: -1, MaxSessionBytes: -1, MaxLocksPerSession: -1})
		tab.Attach(0, "s")
		for i := range 1000 {
			if _, err := tab.Lock(0, &Request{Session: "s", Resources: names("r", 3), TTL: time.Minute, Owner: fmt.Sprint("o", i)}); err != nil {
				t.Fatalf("lock %d without caps: %v", i, err)
			}
		}
	})
}

func TestHead(t *testing.T) {
	h := newHarness(t, Config{})
	if _, ok := h.tab.Head("x"); ok {
		t.Fatal("head of a free resource")
	}
	a := h.ownerLock("s1", "x", "o1", time.Second)
	w := h.mustLock("s2", "x|y", time.Second, 0)
	li, ok := h.tab.Head("x")
	if !ok || li.ID != a.ID || !li.Granted || li.Owner != "o1" || li.Session != "s1" || li.Token != a.Token {
		t.Fatalf("head of x: %+v %v", li, ok)
	}
	li, ok = h.tab.Head("y") // reserved by a waiting request
	if !ok || li.ID != w.ID || li.Granted || !slices.Equal(li.Resources, []string{"x", "y"}) {
		t.Fatalf("head of y: %+v %v", li, ok)
	}
}

func TestQueuesPage(t *testing.T) {
	h := newHarness(t, Config{MaxLocksPerSession: -1})
	var all []string
	for i := range 50 {
		name := fmt.Sprintf("q:%02d", i)
		all = append(all, name)
		h.mustLock("s1", name, time.Minute, 0)
	}
	h.mustLock("s1", "other", time.Minute, 0)
	for range 9 {
		h.mustLock("s2", "q:07", time.Minute, 0) // q:07 has 10 entries
	}
	// Paging through everything under "q:" returns each queue once, in
	// order.
	var got []string
	after, pages := "", 0
	for {
		next := h.tab.QueuesPage("q:", after, 7, 1000, func(qi QueueInfo) bool {
			got = append(got, qi.Resource)
			if len(qi.Entries) != qi.Len || qi.Len != h.tab.QueueLen(qi.Resource) {
				t.Fatalf("queue %s: %d entries, len %d", qi.Resource, len(qi.Entries), qi.Len)
			}
			return true
		})
		pages++
		if next == "" {
			break
		}
		if next != got[len(got)-1] {
			t.Fatalf("next %q is not the last queue returned %q", next, got[len(got)-1])
		}
		after = next
	}
	if !slices.Equal(got, all) || pages != 8 {
		t.Fatalf("paged %d pages: %v", pages, got)
	}
	// The entries budget cuts a long queue and ends the page there.
	var page []QueueInfo
	next := h.tab.QueuesPage("q:", "q:05", 10, 5, func(qi QueueInfo) bool { page = append(page, qi); return true })
	if len(page) != 2 || page[0].Resource != "q:06" || len(page[1].Entries) != 4 || page[1].Len != 10 || next != "q:07" {
		t.Fatalf("cut page %+v next %q", page, next)
	}
	if !page[1].Entries[0].Granted || page[1].Entries[1].Granted || page[1].Entries[1].Session != "s2" {
		t.Fatalf("entries not head first: %+v", page[1].Entries)
	}
	// fn stopping early; the last queue needs no next.
	page = nil
	if next := h.tab.QueuesPage("", "", 100, 1000, func(qi QueueInfo) bool { page = append(page, qi); return len(page) < 3 }); next != "q:01" || len(page) != 3 {
		t.Fatalf("stopped page: %d queues, next %q", len(page), next)
	}
	if next := h.tab.QueuesPage("q:4", "q:48", 1, 1, func(QueueInfo) bool { return true }); next != "" {
		t.Fatalf("the last queue: next %q", next)
	}
	if next := h.tab.QueuesPage("none", "", 10, 10, func(QueueInfo) bool { t.Fatal("called"); return true }); next != "" {
		t.Fatalf("no match: next %q", next)
	}
}

// QueuesPage's memory is bounded by its limits, not by the table: a page of
// one queue from a 100 000-entry queue among 10 000 queues, once the first
// listing has built the index of names.
func TestQueuesPageMemoryIsBounded(t *testing.T) {
	h := newHarness(t, Config{MaxLocksPerSession: -1, MaxQueueLen: -1})
	for i := range 10_000 {
		h.mustLock("s1", fmt.Sprintf("q%05d", i), time.Hour, 0)
	}
	for range 100_000 {
		h.mustLock("s2", "q00000", time.Hour, 0)
	}
	h.tab.QueuesPage("", "", 1, 1, func(QueueInfo) bool { return true })
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var got QueueInfo
	next := h.tab.QueuesPage("q", "", 1, 10, func(qi QueueInfo) bool { got = qi; return true })
	runtime.ReadMemStats(&after)
	if next != "q00000" || len(got.Entries) != 10 || got.Len != 100_001 {
		t.Fatalf("page %s %d/%d next %q", got.Resource, len(got.Entries), got.Len, next)
	}
	if b := after.TotalAlloc - before.TotalAlloc; b > 16<<10 {
		t.Fatalf("QueuesPage allocated %d bytes", b)
	}
}

// A page among 1 000 000 queues costs the page, not the queues: it seeks
// in the ordered index of names and walks on. It compares O(log Q + page)
// names, calls fn at most maxQueues times and allocates O(page). The
// first listing builds the index, once, in O(Q log Q); queues created and
// freed between listings cost the next one at most youngMax insertions.
func TestQueuesPageAmongAMillionQueues(t *testing.T) {
	// Not parallel: it counts the bytes a listing allocates.
	// The bounds count comparisons, not time: a tenth of a million proves
	// the same with the suite; MLOCK_MODEL_LONG=1 (CI, without the race
	// detector) takes the million.
	total := 100_000
	if os.Getenv("MLOCK_MODEL_LONG") != "" {
		total = 1_000_000
	}
	qn := func(i int) string { return fmt.Sprintf("q%07d", i) }
	qnames := func(from, n int) (out []string) {
		for i := from; i < from+n; i++ {
			out = append(out, fmt.Sprintf("q%07d", i))
		}
		return out
	}
	var cmps int
	saved := nameLess
	nameLess = func(a, b nameKey) bool { cmps++; return saved(a, b) }
	defer func() { nameLess = saved }()
	h := newHarness(t, Config{MaxLocksPerSession: -1, MaxSessionBytes: -1, MaxLocks: -1})
	req := Request{Session: "s1", TTL: time.Hour, Resources: make([]string, 1)}
	for i := range total {
		req.Resources[0] = qnames(i, 1)[0]
		if _, err := h.tab.Lock(h.now, &req); err != nil {
			t.Fatal(err)
		}
	}
	if cmps != 0 {
		t.Fatalf("taking locks compared %d names: the index is built by the first listing", cmps)
	}
	h.tab.QueuesPage("", "", 1, 1, func(QueueInfo) bool { return true })
	t.Logf("building the index: %d comparisons", cmps)
	if limit := 4 * total * 20; cmps > limit { // a sort and the ascending insertions: O(Q log Q)
		t.Fatalf("building the index compared %d names (limit %d)", cmps, limit)
	}
	// Between listings: young queues (created after the build, some freed
	// again) and queues of the tree freed.
	var young []ID
	for i := range youngMax - 1 {
		req.Resources[0] = fmt.Sprintf("q%07d", total+i)
		g, err := h.tab.Lock(h.now, &req)
		if err != nil {
			t.Fatal(err)
		}
		young = append(young, g.ID)
	}
	for _, id := range young[:youngMax/2] {
		if err := h.tab.Unlock(h.now, id, "s1"); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		prefix, after string
		maxQueues     int
		want          []string
		next          string
	}{
		{"q", qn(total / 2), 10, qnames(total/2+1, 10), qn(total/2 + 10)},
		{"", "", 3, qnames(0, 3), "q0000002"},
		{qn(total - 10)[:7], "", 20, qnames(total-10, 10), ""},
		{qn(total - 1)[:5], qn(total - 3), 20, qnames(total-2, 2), ""},
		{"q05", "q0600000", 20, nil, ""},
		{"r", "", 20, nil, ""},
		{qn(total)[:5], "", 3, qnames(total+youngMax/2, 3), qn(total + youngMax/2 + 2)},
	}
	for i, tc := range cases {
		var got []string
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		cmps = 0
		next := h.tab.QueuesPage(tc.prefix, tc.after, tc.maxQueues, 1000, func(qi QueueInfo) bool {
			got = append(got, qi.Resource)
			return true
		})
		n := cmps
		runtime.ReadMemStats(&after)
		t.Logf("QueuesPage(%q, %q, %d): %d comparisons, %d bytes", tc.prefix, tc.after, tc.maxQueues, n, after.TotalAlloc-before.TotalAlloc)
		if !slices.Equal(got, tc.want) || next != tc.next {
			t.Fatalf("QueuesPage(%q, %q, %d) = %v next %q; want %v next %q", tc.prefix, tc.after, tc.maxQueues, got, next, tc.want, tc.next)
		}
		// A full scan would compare a million names; a seek compares
		// about log2(total) = 20, and the walk a few per queue. The first
		// listing after the young queues moves them into the tree.
		limit := 64 + 4*tc.maxQueues
		if i == 0 {
			limit += youngMax * 2 * 20
		}
		if n > limit {
			t.Fatalf("QueuesPage(%q, %q, %d) compared %d names (limit %d)", tc.prefix, tc.after, tc.maxQueues, n, limit)
		}
		if b := after.TotalAlloc - before.TotalAlloc; b > 16<<10 && i > 0 {
			t.Fatalf("QueuesPage(%q, %q, %d) allocated %d bytes", tc.prefix, tc.after, tc.maxQueues, b)
		}
		// Tree deletions between listings cost O(log Q) each, no more.
		if i == 1 {
			cmps = 0
			freed := young[200:] // in the tree since the first case
			for _, id := range freed {
				if err := h.tab.Unlock(h.now, id, "s1"); err != nil {
					t.Fatal(err)
				}
			}
			if limit := len(freed) * 2 * 24; cmps > limit {
				t.Fatalf("freeing %d queues of the tree compared %d names (limit %d)", len(freed), cmps, limit)
			}
		}
	}
}

func BenchmarkQueuesPage(b *testing.B) {
	t := benchTable(b)
	fill(b, t, 100_000)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		n := 0
		t.QueuesPage("live:", "", 100, 1000, func(QueueInfo) bool { n++; return true })
		if n != 100 {
			b.Fatal(n)
		}
	}
}

// The index orders names exactly as < does, also for names that share
// their first 8 bytes, are prefixes of each other or hold zero bytes.
func TestNameLessIsStringOrder(t *testing.T) {
	name := rapid.StringOfN(rapid.SampledFrom([]rune{0, 1, 'a', 'b', 0xff}), 0, 12, -1)
	rapid.Check(t, func(rt *rapid.T) {
		a, b := name.Draw(rt, "a"), name.Draw(rt, "b")
		if got := nameLess(keyOf(a), keyOf(b)); got != (a < b) {
			rt.Fatalf("nameLess(%q, %q) = %v", a, b, got)
		}
	})
	for _, p := range [][2]string{{"ab", "ab\x00"}, {"abcdefgh", "abcdefgh\x00"}, {"abcdefgh1", "abcdefgh2"}, {"a\x00", "a\x01"}, {"", "\x00"}} {
		if !nameLess(keyOf(p[0]), keyOf(p[1])) || nameLess(keyOf(p[1]), keyOf(p[0])) {
			t.Fatalf("%q and %q misordered", p[0], p[1])
		}
	}
}

// NoID names no lock, not even the first lock of slot 0: extending it fails
// as not found and counts as a failed extend.
func TestNoIDIsNoLock(t *testing.T) {
	h := newHarness(t, Config{})
	g := h.ownerLock("s1", "a", "o1", time.Second)
	if g.ID == NoID {
		t.Fatal("a lock got NoID")
	}
	before := h.tab.Stats().ExtendFails
	if _, err := h.tab.Extend(h.now, NoID, time.Minute, "s1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("extend NoID: %v", err)
	}
	if st := h.tab.Stats(); st.ExtendFails != before+1 {
		t.Fatalf("extend fails %d, want %d", st.ExtendFails, before+1)
	}
	if _, ok := h.tab.Lookup(NoID); ok {
		t.Fatal("Lookup(NoID) found a lock")
	}
}
