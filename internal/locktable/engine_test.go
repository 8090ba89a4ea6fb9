package locktable

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

func (h *harness) ownerLock(sess, res, owner string, ttl time.Duration) Grant {
	h.t.Helper()
	g, err := h.tab.Lock(h.now, &Request{Session: sess, Resources: strings.Split(res, "|"), TTL: ttl, Owner: owner})
	if err != nil {
		h.t.Fatalf("lock %s for %s: %v", res, owner, err)
	}
	return g
}

func (h *harness) resources(id ID) []string {
	li, ok := h.tab.Lookup(id)
	if !ok {
		return nil
	}
	slices.Sort(li.Resources)
	return li.Resources
}

func TestCheckName(t *testing.T) {
	tests := []struct {
		name   string
		maxLen int
		ok     bool
	}{
		{"a", 0, true},
		{"orders:42/x.y-z_ü", 0, true},
		{strings.Repeat("x", 10_000), 0, true},
		{strings.Repeat("x", 10_000), -1, true},
		{"abc", 3, true},
		{"abcd", 3, false},
		{"", 0, false},
		{"a b", 0, false},
		{" ", 0, false},
		{"a|b", 0, false},
		{"|", 10, false},
	}
	for _, tc := range tests {
		err := CheckName(tc.name, tc.maxLen)
		if tc.ok != (err == nil) || (err != nil && err != ErrInvalidResource) {
			t.Errorf("CheckName(%.20q, %d) = %v, want ok=%v", tc.name, tc.maxLen, err, tc.ok)
		}
	}
	if n := testing.AllocsPerRun(100, func() { _ = CheckName("a b", 0) }); n != 0 {
		t.Fatalf("CheckName allocates %v times", n)
	}
}

func TestEngineUsesCheckName(t *testing.T) {
	h := newHarness(t, Config{MaxNameLen: 4})
	for _, name := range []string{"", "a b", "a|b", "abcde"} {
		if _, err := h.tab.Lock(h.now, &Request{Session: "s1", Resources: []string{"ok", name}, TTL: time.Second}); !errors.Is(err, ErrInvalidResource) {
			t.Fatalf("Lock with %q: %v", name, err)
		}
		if _, err := h.renew("o", []string{"ok", name}, time.Second); !errors.Is(err, ErrInvalidResource) {
			t.Fatalf("Renew with %q: %v", name, err)
		}
	}
	h.mustLock("s1", "abcd", time.Second, 0)
}

func TestRefusalsNameTheResource(t *testing.T) {
	h := newHarness(t, Config{})
	h.mustLock("s1", "b", time.Second, 0)
	h.mustLock("s1", "c", time.Second, 0)
	h.mustLock("s2", "c", time.Second, 0) // c: holder and one waiter
	h.ownerLock("s1", "d", "o1", time.Second)

	tests := []struct {
		name string
		req  Request
		want error
		res  string
	}{
		{"busy: first busy in request order", Request{Resources: []string{"a", "c", "b"}, Try: true}, ErrBusy, "c"},
		{"tolerate: first queue too long", Request{Resources: []string{"a", "b", "c"}, Tolerate: 1}, ErrTolerate, "c"},
		{"owner holds part of the set", Request{Resources: []string{"a", "d"}, Owner: "o1"}, ErrOwnerConflict, "d"},
		{"owner holds more than the set", Request{Resources: []string{"d", "d"}, Owner: "o1"}, nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.req.Session, tc.req.TTL = "s3", time.Second
			_, err := h.tab.Lock(h.now, &tc.req)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("err = %v", err)
				}
				return
			}
			var re *ResourceError
			if !errors.Is(err, tc.want) || !errors.As(err, &re) || re.Resource != tc.res || re.Err != tc.want {
				t.Fatalf("err = %#v, want %v naming %s", err, tc.want, tc.res)
			}
			if got, want := err.Error(), tc.want.Error()+": "+tc.res; got != want {
				t.Fatalf("Error() = %q, want %q", got, want)
			}
		})
	}
	// A second lock of the owner in the request.
	h.ownerLock("s1", "e", "o1", time.Second)
	_, err := h.tab.Lock(h.now, &Request{Session: "s3", Resources: []string{"d", "e"}, TTL: time.Second, Owner: "o1"})
	var re *ResourceError
	if !errors.As(err, &re) || re.Err != ErrOwnerConflict || re.Resource != "e" {
		t.Fatalf("two locks of the owner: %v", err)
	}
}

func TestRenew(t *testing.T) {
	h := newHarness(t, Config{})
	g := h.ownerLock("s1", "a|b", "o1", time.Second)
	w := h.mustLock("s2", "a", time.Second, 0)
	last := h.tab.LastToken()
	h.advance(900 * time.Millisecond)

	r, err := h.renew("o1", []string{"b", "a", "b"}, 2*time.Second)
	if err != nil || r.ID != g.ID || !r.Granted || !r.Renewed || r.Token != g.Token || r.ExpiresAt != h.now+2*int64(time.Second) {
		t.Fatalf("renew = %+v, %v; want lock %s renewed from now with its token", r, err, g.ID.Short())
	}
	if h.tab.LastToken() != last {
		t.Fatal("renew used a token")
	}
	if li, _ := h.tab.Lookup(g.ID); li.Session != "s1" || li.Deadline != r.ExpiresAt || li.TTL != 2*time.Second {
		t.Fatalf("after renew: %+v (must stay in its session)", li)
	}
	h.advance(1999 * time.Millisecond)
	if !h.granted(g.ID) || h.granted(w.ID) {
		t.Fatal("renewed lock expired early")
	}
	h.advance(time.Millisecond)
	if h.granted(g.ID) || !h.granted(w.ID) {
		t.Fatal("renewed lock must expire at now+ttl")
	}
	if len(h.events) != 2 {
		t.Fatalf("events = %v", h.take(nil))
	}
	h.events = nil

	notFound := []struct {
		name  string
		owner string
		res   []string
	}{
		{"expired", "o1", []string{"a", "b"}},
		{"waiting", "o2", []string{"q"}},
		{"another owner", "o2", []string{"x"}},
		{"subset", "o3", []string{"m"}},
		{"superset", "o3", []string{"m", "n", "p"}},
		{"different set", "o3", []string{"m", "p"}},
		{"free resource", "o3", []string{"zz"}},
		{"anonymous (NoReentry)", "*", []string{"anon"}},
	}
	h.ownerLock("s1", "x", "o1", time.Second)
	h.ownerLock("s1", "m|n", "o3", time.Second)
	h.ownerLock("s1", "q", "o1", time.Second)
	h.ownerLock("s2", "q", "o2", time.Second) // waiting
	if _, err := h.tab.Lock(h.now, &Request{Session: "s1", Resources: []string{"anon"}, TTL: time.Second, Owner: "*", NoReentry: true}); err != nil {
		t.Fatal(err)
	}
	before := h.tab.Stats()
	for _, tc := range notFound {
		if _, err := h.renew(tc.owner, tc.res, time.Second); !errors.Is(err, ErrNotFound) {
			t.Errorf("%s: err = %v, want ErrNotFound", tc.name, err)
		}
	}
	if st := h.tab.Stats(); st.ExtendFails != before.ExtendFails+uint64(len(notFound)) || st.Live != before.Live {
		t.Fatalf("stats after failed renewals: %+v", st)
	}

	invalid := []struct {
		name  string
		owner string
		res   []string
		ttl   time.Duration
		want  error
	}{
		{"no owner", "", []string{"x"}, time.Second, ErrInvalidOwner},
		{"owner with space", "o 1", []string{"x"}, time.Second, ErrInvalidOwner},
		{"no resources", "o1", nil, time.Second, ErrInvalidResource},
		{"bad name", "o1", []string{"x", "a|b"}, time.Second, ErrInvalidResource},
		{"too many", "o1", make([]string, 65), time.Second, ErrTooManyResources},
		{"ttl zero", "o1", []string{"x"}, 0, ErrInvalidTTL},
		{"ttl too long", "o1", []string{"x"}, 25 * time.Hour, ErrInvalidTTL},
	}
	for _, tc := range invalid {
		if _, err := h.renew(tc.owner, tc.res, tc.ttl); !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.want)
		}
	}
	if len(h.events) != 0 {
		t.Fatalf("failed renewals reported %v", h.take(nil))
	}
}

// After a partial release the lock no longer holds the whole set: renewing
// the set fails (while another owner holds what was released); only the rest
// can still be renewed.
func TestRenewAfterPartialRelease(t *testing.T) {
	h := newHarness(t, Config{})
	g := h.ownerLock("s1", "a|b", "o1", time.Second)
	if !h.tab.Release(h.now, "o1", []string{"a"}) {
		t.Fatal("release a")
	}
	other := h.ownerLock("s2", "a", "o2", time.Second)
	if !other.Granted {
		t.Fatal("a must be free for another owner")
	}
	if _, err := h.renew("o1", []string{"a", "b"}, time.Second); !errors.Is(err, ErrNotFound) {
		t.Fatalf("renew of the whole set after a partial release: %v", err)
	}
	if r, err := h.renew("o1", []string{"b"}, time.Second); err != nil || r.ID != g.ID {
		t.Fatalf("renew of what is left: %+v %v", r, err)
	}
}

// Renew does not move the lock: a lock of a detached session still goes
// with its session.
func TestRenewKeepsSession(t *testing.T) {
	h := newHarness(t, Config{SessionGrace: time.Second})
	g := h.ownerLock("s1", "a", "o1", time.Hour)
	h.tab.Detach(h.now, "s1")
	h.advance(500 * time.Millisecond)
	if _, err := h.renew("o1", []string{"a"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	h.advance(500 * time.Millisecond)
	if _, ok := h.tab.Lookup(g.ID); ok {
		t.Fatal("the lock must be dropped with its session")
	}
}

func TestPartialReleaseEvent(t *testing.T) {
	h := newHarness(t, Config{})
	g := h.ownerLock("s1", "a|b|c", "o1", time.Second)
	if !h.tab.Release(h.now, "o1", []string{"a", "c", "a"}) {
		t.Fatal("release of held resources (one named twice)")
	}
	want := Event{Kind: Released, ID: g.ID, Session: "s1", Owner: "o1", Token: g.Token, Partial: true, Since: h.now}
	if len(h.events) != 1 || h.events[0] != want {
		t.Fatalf("events = %+v, want one %+v", h.events, want)
	}
	h.events = nil
	if got := h.resources(g.ID); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("lock holds %v, want [b]", got)
	}
	if st := h.tab.Stats(); st.Held != 1 || st.Unlocked != 0 {
		t.Fatalf("stats = %+v", st)
	}
	// Releasing all of a lock in one call is one full release.
	g2 := h.ownerLock("s1", "x|y", "o1", time.Second)
	if !h.tab.Release(h.now, "o1", []string{"y", "x"}) {
		t.Fatal("release x|y")
	}
	want = Event{Kind: Released, ID: g2.ID, Session: "s1", Owner: "o1", Token: g2.Token, Since: h.now}
	if len(h.events) != 1 || h.events[0] != want {
		t.Fatalf("events = %+v, want one %+v", h.events, want)
	}
}

// Issue 10 item 4 (found by the model with seeds 1 and 14, 1000 steps): o2
// holds r0 (B); o2's own request C for r0|r1 waits behind B.
// Release(o2, r0|r1) frees r0, which grants C; the release must not then take
// r1 back from C, and must report false (o2 did not hold r1).
func TestReleaseDoesNotTakeBackWhatItGranted(t *testing.T) {
	h := newHarness(t, Config{})
	a := h.mustLock("s1", "r0", time.Second, 0)
	b := h.ownerLock("s2", "r0", "o2", time.Second)
	c := h.ownerLock("s3", "r0|r1", "o2", time.Second)
	if b.Granted || c.Granted {
		t.Fatal("B and C must wait")
	}
	h.unlock(a.ID)
	names := map[ID]string{b.ID: "b", c.ID: "c"}
	if got := h.take(names); !slices.Equal(got, []string{"granted:b"}) {
		t.Fatalf("events = %v", got)
	}
	if h.tab.Release(h.now, "o2", []string{"r0", "r1"}) {
		t.Fatal("release must report false: o2 did not hold r1")
	}
	if got := h.take(names); !slices.Equal(got, []string{"released:b", "granted:c"}) {
		t.Fatalf("events = %v", got)
	}
	if got := h.resources(c.ID); !h.granted(c.ID) || !slices.Equal(got, []string{"r0", "r1"}) {
		t.Fatalf("C holds %v, granted=%v; it was told it holds r0|r1", got, h.granted(c.ID))
	}
	if _, err := h.tab.Lock(h.now, &Request{Session: "s1", Resources: []string{"r1"}, TTL: time.Second, Try: true}); !errors.Is(err, ErrBusy) {
		t.Fatalf("r1 must be C's, not free: %v", err)
	}
}

// Issue 10 item 5: a lock renewed by its owner from another session moves
// into it; when that session is dropped, the lock must not be handed to the
// session's own waiter on the way out.
func TestDropSessionGrantsNothingToItself(t *testing.T) {
	h := newHarness(t, Config{SessionGrace: time.Second})
	a := h.ownerLock("s1", "x", "o1", time.Hour)
	w := h.mustLock("s2", "x", time.Hour, 0)
	if r := h.ownerLock("s2", "x", "o1", time.Hour); !r.Renewed || r.ID != a.ID {
		t.Fatalf("re-entry = %+v", r)
	}
	z := h.mustLock("s3", "x", time.Hour, 0)
	last := h.tab.LastToken()
	h.tab.Detach(h.now, "s2")
	h.advance(time.Second)
	var got []string
	for _, e := range h.events {
		if e.Kind == Granted && e.Session == "s2" {
			t.Fatalf("granted %s to the dropped session", e.ID.Short())
		}
	}
	got = h.take(map[ID]string{a.ID: "a", w.ID: "w", z.ID: "z"})
	// released:a is the move out of s1 (Moved), at the re-entry.
	if !slices.Equal(got, []string{"released:a", "dropped:a", "dropped:w", "granted:z", "closed:s2"}) {
		t.Fatalf("events = %v", got)
	}
	if h.tab.LastToken() != last+1 || !h.granted(z.ID) {
		t.Fatal("exactly one token (z's) must be used")
	}
}

// ReleaseAll grants what it lets through only after the releases, and never
// releases it.
func TestReleaseAllKeepsWhatItGranted(t *testing.T) {
	h := newHarness(t, Config{})
	x := h.mustLock("s1", "x", time.Second, 0)
	a := h.ownerLock("s2", "x", "mine", time.Second)
	w := h.ownerLock("s3", "x", "mine", time.Second)
	h.unlock(x.ID)
	h.events = nil
	if n := h.tab.ReleaseAll(h.now, "mine"); n != 1 {
		t.Fatalf("released %d, want 1", n)
	}
	if got := h.take(map[ID]string{a.ID: "a", w.ID: "w"}); !slices.Equal(got, []string{"released:a", "granted:w"}) {
		t.Fatalf("events = %v", got)
	}
	if !h.granted(w.ID) {
		t.Fatal("the owner's waiter must be granted and stay granted")
	}
}

// A lock that its owner asks for again from another session moves into
// that session; the session it leaves is told it no longer holds it
// (Released with Moved), or it would go on believing it holds a lock that
// the other session's end drops and the engine grants to someone else.
func TestReentryFromAnotherSessionTellsTheOldOne(t *testing.T) {
	h := newHarness(t, Config{SessionGrace: time.Second})
	a := h.ownerLock("s1", "x|y", "o1", time.Hour)
	h.events = nil
	before, _ := h.tab.Lookup(a.ID)
	if r := h.ownerLock("s2", "y|x", "o1", time.Hour); !r.Renewed || r.ID != a.ID || r.Token != a.Token {
		t.Fatalf("re-entry = %+v", r)
	}
	// Since: the lock lives on, granted when it was.
	want := []Event{{Kind: Released, ID: a.ID, Session: "s1", Owner: "o1", Token: a.Token, Moved: true, Since: before.GrantedAt}}
	if !slices.Equal(h.events, want) {
		t.Fatalf("events = %+v, want %+v", h.events, want)
	}
	if li, _ := h.tab.Lookup(a.ID); li.Session != "s2" || !li.Granted {
		t.Fatalf("lock after the move: %+v", li)
	}
	// Re-entry from the session that holds it moves nothing and says nothing.
	h.events = nil
	h.ownerLock("s2", "x|y", "o1", time.Hour)
	if len(h.events) != 0 {
		t.Fatalf("re-entry in the same session reported %+v", h.events)
	}
	// Refused for the session limit: nothing moves, nothing is reported.
	h2 := newHarness(t, Config{MaxLocksPerSession: 1})
	b := h2.ownerLock("s1", "x", "o1", time.Hour)
	h2.mustLock("s2", "z", time.Hour, 0)
	h2.events = nil
	if _, err := h2.tab.Lock(h2.now, &Request{Session: "s2", Resources: []string{"x"}, TTL: time.Hour, Owner: "o1"}); !errors.Is(err, ErrSessionLimit) {
		t.Fatalf("re-entry past the session limit: %v", err)
	}
	if li, _ := h2.tab.Lookup(b.ID); li.Session != "s1" || len(h2.events) != 0 {
		t.Fatalf("refused re-entry moved the lock (%+v) or reported %+v", li, h2.events)
	}
}
