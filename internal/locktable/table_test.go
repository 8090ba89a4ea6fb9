package locktable

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

const ms = int64(time.Millisecond)

// harness wraps a Table with a fake clock and records events.
type harness struct {
	t      testing.TB
	tab    *Table
	now    int64
	events []Event
}

func newHarness(t testing.TB, cfg Config) *harness {
	t.Helper()
	h := &harness{t: t, now: 1_000_000 * ms}
	seed := [32]byte{1}
	cfg.Seed = &seed
	cfg.OnEvent = func(e Event) { h.events = append(h.events, e) }
	tab, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.tab = tab
	tab.Attach(h.now, "s1")
	tab.Attach(h.now, "s2")
	tab.Attach(h.now, "s3")
	return h
}

func (h *harness) lock(sess, res string, ttl, timeout time.Duration) (Grant, error) {
	h.t.Helper()
	return h.tab.Lock(h.now, &Request{Session: sess, Resources: strings.Split(res, "|"), TTL: ttl, Timeout: timeout})
}

func (h *harness) mustLock(sess, res string, ttl, timeout time.Duration) Grant {
	h.t.Helper()
	g, err := h.lock(sess, res, ttl, timeout)
	if err != nil {
		h.t.Fatalf("lock %s: %v", res, err)
	}
	return g
}

func (h *harness) advance(d time.Duration) {
	h.now += int64(d)
	h.tab.Advance(h.now)
}

// take returns and clears the recorded events, as "kind:id" strings mapped
// through names.
func (h *harness) take(names map[ID]string) []string {
	var out []string
	for _, e := range h.events {
		if e.Kind == SessionClosed {
			out = append(out, "closed:"+e.Session)
			continue
		}
		n := names[e.ID]
		if n == "" {
			n = e.ID.Short()
		}
		out = append(out, e.Kind.String()+":"+n)
	}
	h.events = nil
	return out
}

func (h *harness) granted(id ID) bool {
	li, ok := h.tab.Lookup(id)
	return ok && li.Granted
}

func TestSeedScenarioAllFree(t *testing.T) {
	h := newHarness(t, Config{})
	g := h.mustLock("s1", "res-a|res-b|res-c", time.Second, 0)
	if !g.Granted || g.Token == 0 || g.ExpiresAt != h.now+int64(time.Second) {
		t.Fatalf("grant = %+v, want granted at once with expiry now+1s", g)
	}
	if len(h.events) != 0 {
		t.Fatalf("an immediate grant must not be reported as an event: %v", h.take(nil))
	}
}

func TestSeedScenarioPartlyTaken(t *testing.T) {
	h := newHarness(t, Config{})
	a := h.mustLock("s1", "res-a", time.Second, 0)
	b := h.mustLock("s2", "res-a|res-b|res-c", time.Second, 0)
	if b.Granted {
		t.Fatal("client2 must wait while res-a is held")
	}
	if err := h.unlock(a.ID); err != nil {
		t.Fatal(err)
	}
	if got := h.take(map[ID]string{b.ID: "b"}); !slices.Equal(got, []string{"granted:b"}) {
		t.Fatalf("events = %v", got)
	}
	if !h.granted(b.ID) {
		t.Fatal("client2 not granted after unlock")
	}
}

func TestSeedScenarioQueue(t *testing.T) {
	h := newHarness(t, Config{})
	names := map[ID]string{}
	a := h.mustLock("s1", "res-a", time.Second, 0)
	b := h.mustLock("s2", "res-a|res-b", time.Second, 0)
	c := h.mustLock("s3", "res-a|res-b", time.Second, 0)
	names[b.ID], names[c.ID] = "b", "c"
	h.unlock(a.ID)
	if got := h.take(names); !slices.Equal(got, []string{"granted:b"}) {
		t.Fatalf("after unlock a: %v", got)
	}
	h.unlock(b.ID)
	if got := h.take(names); !slices.Equal(got, []string{"granted:c"}) {
		t.Fatalf("after unlock b: %v", got)
	}
}

func TestHeadOfLineReservation(t *testing.T) {
	h := newHarness(t, Config{})
	b := h.mustLock("s1", "B", time.Second, 0)
	ab := h.mustLock("s2", "A|B", time.Second, 0)
	a := h.mustLock("s3", "A", time.Second, 0)
	if ab.Granted || a.Granted {
		t.Fatal("A|B waits for B; A must wait behind A|B although A is free")
	}
	h.unlock(b.ID)
	if got := h.take(map[ID]string{ab.ID: "ab", a.ID: "a"}); !slices.Equal(got, []string{"granted:ab"}) {
		t.Fatalf("events = %v", got)
	}
	h.unlock(ab.ID)
	if !h.granted(a.ID) {
		t.Fatal("A not granted after A|B released")
	}
}

func TestFIFOHotResource(t *testing.T) {
	h := newHarness(t, Config{})
	var ids []ID
	names := map[ID]string{}
	for i := range 5 {
		g := h.mustLock("s1", "hot", time.Second, 0)
		ids = append(ids, g.ID)
		names[g.ID] = fmt.Sprint(i)
	}
	var order []string
	for range 5 {
		li, _ := h.tab.Lookup(ids[len(order)])
		if !li.Granted {
			t.Fatalf("request %d not granted in turn", len(order))
		}
		order = append(order, names[li.ID])
		h.unlock(li.ID)
	}
	if !slices.Equal(order, []string{"0", "1", "2", "3", "4"}) {
		t.Fatalf("order = %v", order)
	}
}

func TestTokensStrictlyIncreaseAndStartAtFirstToken(t *testing.T) {
	h := newHarness(t, Config{FirstToken: 1000})
	var last uint64
	for i := range 10 {
		g := h.mustLock("s1", fmt.Sprint("r", i%3), time.Second, 0)
		if g.Granted {
			if g.Token <= last || (last == 0 && g.Token != 1000) {
				t.Fatalf("token %d after %d", g.Token, last)
			}
			last = g.Token
			h.unlock(g.ID)
		}
	}
	g := h.mustLock("s1", "x", time.Second, 0)
	e, _ := h.extend(g.ID, time.Minute)
	li, _ := h.tab.Lookup(g.ID)
	if li.Token != g.Token || e != h.now+int64(time.Minute) {
		t.Fatal("extend must keep the token and count from now")
	}
}

func TestTolerate(t *testing.T) {
	tests := []struct {
		name     string
		ahead    int // entries already in the queue
		tolerate int
		wantErr  error
	}{
		{"holder only, tolerate 1", 1, 1, nil},
		{"holder and one waiter, tolerate 1", 2, 1, ErrTolerate},
		{"holder and one waiter, tolerate 2", 2, 2, nil},
		{"empty queue, tolerate 1", 0, 1, nil},
		{"long queue, tolerate 0 means no limit", 5, 0, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, Config{})
			for range tc.ahead {
				h.mustLock("s1", "r", time.Second, 0)
			}
			before := h.tab.QueueLen("r")
			_, err := h.tab.Lock(h.now, &Request{Session: "s2", Resources: []string{"x", "r"}, TTL: time.Second, Tolerate: tc.tolerate})
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if err != nil && (h.tab.QueueLen("r") != before || h.tab.QueueLen("x") != 0) {
				t.Fatal("a refused request must leave every queue as it was")
			}
		})
	}
}

func TestTryLock(t *testing.T) {
	h := newHarness(t, Config{})
	g, err := h.tab.Lock(h.now, &Request{Session: "s1", Resources: []string{"a", "b"}, TTL: time.Second, Try: true})
	if err != nil || !g.Granted {
		t.Fatalf("try on free resources: %+v %v", g, err)
	}
	if _, err := h.tab.Lock(h.now, &Request{Session: "s2", Resources: []string{"c", "b"}, TTL: time.Second, Try: true}); !errors.Is(err, ErrBusy) {
		t.Fatalf("try on a held resource: %v", err)
	}
	if h.tab.QueueLen("c") != 0 || h.tab.QueueLen("b") != 1 {
		t.Fatal("a refused try-lock must not enqueue anything")
	}
}

func TestWaitTimeout(t *testing.T) {
	h := newHarness(t, Config{})
	a := h.mustLock("s1", "A", 10*time.Second, 0)
	w := h.mustLock("s2", "A|B", time.Second, 100*time.Millisecond)
	x := h.mustLock("s3", "B", time.Second, 0) // behind w on B
	names := map[ID]string{a.ID: "a", w.ID: "w", x.ID: "x"}
	if d, ok := h.tab.NextDeadline(); !ok || d != h.now+100*ms {
		t.Fatalf("next deadline = %d, %v", d, ok)
	}
	h.advance(99 * time.Millisecond)
	if got := h.take(names); len(got) != 0 {
		t.Fatalf("too early: %v", got)
	}
	h.advance(time.Millisecond)
	if got := h.take(names); !slices.Equal(got, []string{"timeout:w", "granted:x"}) {
		t.Fatalf("events = %v", got)
	}
	if h.tab.QueueLen("A") != 1 || h.tab.QueueLen("B") != 1 {
		t.Fatal("the timed-out request must leave all queues")
	}
}

func TestTimeoutZeroWaitsForever(t *testing.T) {
	h := newHarness(t, Config{})
	a := h.mustLock("s1", "A", time.Hour, 0)
	w := h.mustLock("s2", "A", time.Second, 0)
	h.advance(59 * time.Minute)
	if _, ok := h.tab.Lookup(w.ID); !ok {
		t.Fatal("a waiter without timeout must keep waiting")
	}
	h.advance(time.Minute)
	if got := h.take(map[ID]string{a.ID: "a", w.ID: "w"}); !slices.Equal(got, []string{"expired:a", "granted:w"}) {
		t.Fatalf("events = %v", got)
	}
}

func TestExpiryGrantsNextInSameStep(t *testing.T) {
	h := newHarness(t, Config{})
	a := h.mustLock("s1", "A|B", 50*time.Millisecond, 0)
	b := h.mustLock("s2", "B", time.Second, 0)
	c := h.mustLock("s3", "A", time.Second, 0)
	h.advance(50 * time.Millisecond)
	got := h.take(map[ID]string{a.ID: "a", b.ID: "b", c.ID: "c"})
	slices.Sort(got[1:])
	if !slices.Equal(got, []string{"expired:a", "granted:b", "granted:c"}) {
		t.Fatalf("events = %v", got)
	}
	li, _ := h.tab.Lookup(b.ID)
	if li.Deadline != h.now+int64(time.Second) {
		t.Fatal("a cascaded grant expires ttl after the grant")
	}
}

func TestOperationsProcessDueDeadlinesFirst(t *testing.T) {
	h := newHarness(t, Config{})
	a := h.mustLock("s1", "A", 10*time.Millisecond, 0)
	h.now += 20 * ms // the owner's timer has not fired yet
	g := h.mustLock("s2", "A", time.Second, 0)
	if !g.Granted {
		t.Fatal("a lock past its expiry must not block a new request")
	}
	if _, err := h.extend(a.ID, time.Second); !errors.Is(err, ErrNotFound) {
		t.Fatalf("extend of an expired lock: %v", err)
	}
}

func TestExtend(t *testing.T) {
	h := newHarness(t, Config{})
	a := h.mustLock("s1", "A", time.Second, 0)
	w := h.mustLock("s2", "A", time.Second, 0)
	h.advance(900 * time.Millisecond)
	exp, err := h.extend(a.ID, time.Second)
	if err != nil || exp != h.now+int64(time.Second) {
		t.Fatalf("extend = %d, %v; want now+1s (not old expiry+1s)", exp, err)
	}
	if _, err := h.extend(w.ID, time.Second); !errors.Is(err, ErrNotGranted) {
		t.Fatalf("extend of a waiter: %v", err)
	}
	if _, err := h.extend(ID{9}, time.Second); !errors.Is(err, ErrNotFound) {
		t.Fatalf("extend of unknown: %v", err)
	}
	if _, err := h.extend(a.ID, 0); !errors.Is(err, ErrInvalidTTL) {
		t.Fatalf("extend with ttl 0: %v", err)
	}
	h.advance(999 * time.Millisecond)
	if !h.granted(a.ID) {
		t.Fatal("extended lock expired early")
	}
	h.advance(time.Millisecond)
	if h.granted(a.ID) || !h.granted(w.ID) {
		t.Fatal("extended lock must expire at now+ttl and hand over")
	}
}

func TestUnlockWaitingLock(t *testing.T) {
	h := newHarness(t, Config{})
	a := h.mustLock("s1", "B", time.Second, 0)
	w := h.mustLock("s2", "A|B", time.Second, 0)
	x := h.mustLock("s3", "A", time.Second, 0)
	if err := h.unlock(w.ID); err != nil {
		t.Fatal(err)
	}
	if got := h.take(map[ID]string{a.ID: "a", w.ID: "w", x.ID: "x"}); !slices.Equal(got, []string{"granted:x"}) {
		t.Fatalf("events = %v (unlocking a waiter tells nobody, and frees its reservation)", got)
	}
	if err := h.unlock(w.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second unlock: %v", err)
	}
}

func TestDuplicateResourcesFolded(t *testing.T) {
	h := newHarness(t, Config{})
	g := h.mustLock("s1", "dup|dup|x|dup", time.Second, 0)
	if !g.Granted {
		t.Fatal("a request naming a resource twice must be grantable")
	}
	if h.tab.QueueLen("dup") != 1 {
		t.Fatalf("queue len = %d, want 1", h.tab.QueueLen("dup"))
	}
	li, _ := h.tab.Lookup(g.ID)
	slices.Sort(li.Resources)
	if !slices.Equal(li.Resources, []string{"dup", "x"}) {
		t.Fatalf("resources = %v", li.Resources)
	}
	w := h.mustLock("s2", "dup|dup", time.Second, 10*time.Millisecond)
	h.advance(10 * time.Millisecond)
	h.unlock(g.ID)
	if h.tab.QueueLen("dup") != 0 {
		t.Fatal("an orphan entry was left behind")
	}
	if _, ok := h.tab.Lookup(w.ID); ok {
		t.Fatal("timed-out duplicate request still live")
	}
}

func TestValidation(t *testing.T) {
	long := strings.Repeat("x", 513)
	many := make([]string, 65)
	for i := range many {
		many[i] = fmt.Sprint("r", i)
	}
	tests := []struct {
		name string
		req  Request
		want error
	}{
		{"no resources", Request{TTL: time.Second}, ErrInvalidResource},
		{"empty name", Request{Resources: []string{""}, TTL: time.Second}, ErrInvalidResource},
		{"space in name", Request{Resources: []string{"a b"}, TTL: time.Second}, ErrInvalidResource},
		{"bar in name", Request{Resources: []string{"a|b"}, TTL: time.Second}, ErrInvalidResource},
		{"name too long", Request{Resources: []string{long}, TTL: time.Second}, ErrInvalidResource},
		{"too many", Request{Resources: many, TTL: time.Second}, ErrTooManyResources},
		{"ttl zero", Request{Resources: []string{"a"}}, ErrInvalidTTL},
		{"ttl negative", Request{Resources: []string{"a"}, TTL: -1}, ErrInvalidTTL},
		{"ttl too long", Request{Resources: []string{"a"}, TTL: 25 * time.Hour}, ErrInvalidTTL},
		{"timeout negative", Request{Resources: []string{"a"}, TTL: time.Second, Timeout: -1}, ErrInvalidTimeout},
		{"tolerate negative", Request{Resources: []string{"a"}, TTL: time.Second, Tolerate: -1}, ErrInvalidTolerate},
		{"owner with space", Request{Resources: []string{"a"}, TTL: time.Second, Owner: "a b"}, ErrInvalidOwner},
		{"unknown session", Request{Session: "nope", Resources: []string{"a"}, TTL: time.Second}, ErrUnknownSession},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, Config{})
			if tc.req.Session == "" {
				tc.req.Session = "s1"
			}
			if _, err := h.tab.Lock(h.now, &tc.req); !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if st := h.tab.Stats(); st.Live != 0 || st.Queues != 0 {
				t.Fatalf("a refused request changed state: %+v", st)
			}
		})
	}
}

func TestLimits(t *testing.T) {
	h := newHarness(t, Config{MaxLocksPerSession: 2, MaxQueueLen: 3})
	h.mustLock("s1", "a", time.Second, 0)
	h.mustLock("s1", "b", time.Second, 0)
	if _, err := h.lock("s1", "c", time.Second, 0); !errors.Is(err, ErrSessionLimit) {
		t.Fatalf("session limit: %v", err)
	}
	h.mustLock("s2", "a", time.Second, 0)
	h.mustLock("s3", "a", time.Second, 0)
	h.tab.Attach(h.now, "s4")
	if _, err := h.lock("s4", "a", time.Second, 0); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("queue limit: %v", err)
	}
}

func TestOwnerReentryRenews(t *testing.T) {
	h := newHarness(t, Config{})
	req := Request{Session: "s1", Resources: []string{"a", "b"}, TTL: time.Second, Owner: "o1"}
	g1, _ := h.tab.Lock(h.now, &req)
	h.advance(500 * time.Millisecond)
	req.Resources = []string{"b", "a", "b"}
	req.TTL = 2 * time.Second
	g2, err := h.tab.Lock(h.now, &req)
	if err != nil || !g2.Renewed || g2.ID != g1.ID || g2.Token != g1.Token || g2.ExpiresAt != h.now+2*int64(time.Second) {
		t.Fatalf("re-entry = %+v, %v; want the same lock renewed from now", g2, err)
	}
	if h.tab.QueueLen("a") != 1 {
		t.Fatal("re-entry must not queue")
	}
	// Another owner queues; an overlapping set of the same owner is refused.
	if g, _ := h.tab.Lock(h.now, &Request{Session: "s2", Resources: []string{"a"}, TTL: time.Second, Owner: "o2"}); g.Granted {
		t.Fatal("another owner must wait")
	}
	_, err = h.tab.Lock(h.now, &Request{Session: "s1", Resources: []string{"a"}, TTL: time.Second, Owner: "o1"})
	if !errors.Is(err, ErrOwnerConflict) {
		t.Fatalf("subset re-entry: %v", err)
	}
	var re *ResourceError
	if !errors.As(err, &re) || re.Resource != "a" {
		t.Fatalf("subset re-entry must name the resource the owner holds: %v", err)
	}
	_, err = h.tab.Lock(h.now, &Request{Session: "s1", Resources: []string{"a", "b", "c"}, TTL: time.Second, Owner: "o1"})
	if !errors.Is(err, ErrOwnerConflict) {
		t.Fatalf("superset re-entry: %v", err)
	}
}

func TestReleaseByOwner(t *testing.T) {
	h := newHarness(t, Config{})
	g, _ := h.tab.Lock(h.now, &Request{Session: "s1", Resources: []string{"a", "b"}, TTL: time.Second, Owner: "o1"})
	w, _ := h.tab.Lock(h.now, &Request{Session: "s2", Resources: []string{"a"}, TTL: time.Second})
	names := map[ID]string{g.ID: "g", w.ID: "w"}
	if h.tab.Release(h.now, "o2", []string{"a", "b"}) {
		t.Fatal("another owner's release must return false")
	}
	if h.tab.Release(h.now, "", []string{"a"}) {
		t.Fatal("a release without owner must return false")
	}
	if !h.granted(g.ID) || len(h.events) != 0 {
		t.Fatal("a refused release must change nothing")
	}
	if !h.tab.Release(h.now, "o1", []string{"a"}) {
		t.Fatal("owner release of a held resource")
	}
	if len(h.events) == 0 || !h.events[0].Partial || h.events[0].Token != g.Token {
		t.Fatalf("a partial release must be reported as such: %+v", h.events)
	}
	if got := h.take(names); !slices.Equal(got, []string{"released:g", "granted:w"}) {
		t.Fatalf("events = %v", got)
	}
	if !h.granted(g.ID) {
		t.Fatal("the rest of the lock stays held")
	}
	if h.tab.Release(h.now, "o1", []string{"a", "b"}) {
		t.Fatal("a is no longer o1's: release must report false")
	}
	if len(h.events) != 1 || h.events[0].Partial {
		t.Fatalf("the release of the rest must be a full release: %+v", h.events)
	}
	if got := h.take(names); !slices.Equal(got, []string{"released:g"}) {
		t.Fatalf("events = %v", got)
	}
	if _, ok := h.tab.Lookup(g.ID); ok {
		t.Fatal("lock with no resources left must be gone")
	}
}

func TestReleaseAll(t *testing.T) {
	h := newHarness(t, Config{})
	mk := func(sess, res, owner string) Grant {
		g, err := h.tab.Lock(h.now, &Request{Session: sess, Resources: strings.Split(res, "|"), TTL: time.Second, Owner: owner})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	a := mk("s1", "a", "mine")
	b := mk("s2", "b|c", "mine")
	x := mk("s1", "x", "theirs")
	wm := mk("s3", "x", "mine") // waiting behind theirs
	if n := h.tab.ReleaseAll(h.now, "mine"); n != 2 {
		t.Fatalf("released %d, want 2", n)
	}
	for _, id := range []ID{a.ID, b.ID} {
		if _, ok := h.tab.Lookup(id); ok {
			t.Fatal("owner's lock survived ReleaseAll")
		}
	}
	if !h.granted(x.ID) {
		t.Fatal("another owner's lock was released")
	}
	if _, ok := h.tab.Lookup(wm.ID); !ok {
		t.Fatal("a waiting request of the owner must stay queued")
	}
	if n := h.tab.ReleaseAll(h.now, ""); n != 0 {
		t.Fatal("ReleaseAll without owner must do nothing")
	}
}

func TestSessionGrace(t *testing.T) {
	h := newHarness(t, Config{SessionGrace: 10 * time.Second})
	held := h.mustLock("s1", "A", time.Hour, 0)
	wait := h.mustLock("s1", "B", time.Hour, 0)
	_ = wait
	other := h.mustLock("s2", "A", time.Hour, 0)
	h.tab.Detach(h.now, "s1")
	h.advance(9 * time.Second)
	if !h.tab.Attach(h.now, "s1") || !h.granted(held.ID) {
		t.Fatal("re-attach within grace must keep everything")
	}
	h.tab.Detach(h.now, "s1")
	h.advance(10*time.Second - time.Millisecond)
	if !h.granted(held.ID) {
		t.Fatal("dropped before the grace period ended")
	}
	h.advance(time.Millisecond)
	got := h.take(map[ID]string{held.ID: "held", wait.ID: "wait", other.ID: "other"})
	slices.Sort(got)
	if !slices.Equal(got, []string{"closed:s1", "dropped:held", "dropped:wait", "granted:other"}) {
		t.Fatalf("events = %v", got)
	}
	if h.tab.HasSession("s1") || h.tab.QueueLen("B") != 0 {
		t.Fatal("session and its queue entries must be gone")
	}
	if _, err := h.lock("s1", "C", time.Second, 0); !errors.Is(err, ErrUnknownSession) {
		t.Fatalf("lock in a dropped session: %v", err)
	}
}

func TestNegativeGraceDropsAtOnce(t *testing.T) {
	h := newHarness(t, Config{SessionGrace: -1})
	h.mustLock("s1", "A", time.Hour, 0)
	h.tab.Detach(h.now, "s1")
	if h.tab.QueueLen("A") != 0 {
		t.Fatal("locks kept after detach with no grace")
	}
}

func TestIDs(t *testing.T) {
	h := newHarness(t, Config{})
	seen := map[string]bool{}
	for i := range 1000 {
		g := h.mustLock("s1", fmt.Sprint("r", i), time.Second, 0)
		s := g.ID.String()
		if len(s) != IDLen || seen[s] {
			t.Fatalf("bad or repeated id %q", s)
		}
		seen[s] = true
		back, ok := ParseID([]byte(s))
		if !ok || back != g.ID {
			t.Fatal("id does not round-trip")
		}
	}
	for _, bad := range []string{"", "xyz", strings.Repeat("g", 32), strings.Repeat("a", 31)} {
		if _, ok := ParseID([]byte(bad)); ok {
			t.Fatalf("ParseID(%q) accepted", bad)
		}
	}
}

func TestNoDeadlockOppositeOrder(t *testing.T) {
	h := newHarness(t, Config{})
	hold := h.mustLock("s3", "B", time.Second, 0)
	x := h.mustLock("s1", "A|B", time.Second, 0)
	y := h.mustLock("s2", "B|A", time.Second, 0)
	h.unlock(hold.ID)
	if !h.granted(x.ID) || h.granted(y.ID) {
		t.Fatal("the earlier request must be granted first")
	}
	h.unlock(x.ID)
	if !h.granted(y.ID) {
		t.Fatal("the later request must follow")
	}
}

func TestListing(t *testing.T) {
	h := newHarness(t, Config{})
	a, _ := h.tab.Lock(h.now, &Request{Session: "s1", Resources: []string{"order:1"}, TTL: time.Second, Owner: "w1"})
	b := h.mustLock("s2", "order:1|order:2", time.Second, 0)
	h.mustLock("s2", "other", time.Second, 0)
	var got []QueueInfo
	h.tab.QueuesPage("order:", "", 100, 100, func(q QueueInfo) bool { got = append(got, q); return true })
	if len(got) != 2 || got[0].Resource != "order:1" || len(got[0].Entries) != 2 {
		t.Fatalf("queues = %+v", got)
	}
	if e := got[0].Entries; e[0].ID != a.ID || !e[0].Granted || e[0].Owner != "w1" || e[1].ID != b.ID || e[1].Granted {
		t.Fatalf("entries = %+v", e)
	}
	var ids []ID
	h.tab.Locks(2, func(li LockInfo) bool { ids = append(ids, li.ID); return true })
	if len(ids) != 2 || ids[1] != b.ID {
		t.Fatalf("Locks with limit 2 gave %v, want the two newest", ids)
	}
	ids = nil
	h.tab.Locks(0, func(li LockInfo) bool { ids = append(ids, li.ID); return len(ids) < 3 })
	if len(ids) != 3 || ids[2] != a.ID {
		t.Fatalf("Locks gave %v", ids)
	}
}

func TestNoReentry(t *testing.T) {
	h := newHarness(t, Config{})
	req := Request{Session: "s1", Resources: []string{"a"}, TTL: time.Second, Owner: "*", NoReentry: true}
	g, err := h.tab.Lock(h.now, &req)
	if err != nil || !g.Granted {
		t.Fatal(err)
	}
	req.Try = true
	if _, err := h.tab.Lock(h.now, &req); !errors.Is(err, ErrBusy) {
		t.Fatalf("anonymous re-acquire: %v", err)
	}
	if !h.tab.Release(h.now, "*", []string{"a"}) {
		t.Fatal("release by the recorded owner")
	}
}

// unlock, extend and renew call the Table from the lock's own session.

func (h *harness) unlock(id ID) error {
	return h.tab.Unlock(h.now, id, h.sessionOf(id))
}

func (h *harness) extend(id ID, ttl time.Duration) (int64, error) {
	return h.tab.Extend(h.now, id, ttl, h.sessionOf(id))
}

// sessionOf returns the session of the live request id, or "". It does not
// allocate.
func (h *harness) sessionOf(id ID) string {
	if l := h.tab.lookup(id); l != nil {
		return l.sess.id
	}
	return ""
}

func (h *harness) renew(owner string, res []string, ttl time.Duration) (Grant, error) {
	from := ""
	if len(res) > 0 {
		if l := h.tab.ownerLock(owner, res); l != nil {
			from = l.sess.id
		}
	}
	return h.tab.Renew(h.now, owner, res, ttl, from)
}
