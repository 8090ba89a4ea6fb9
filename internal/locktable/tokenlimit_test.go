package locktable

import (
	"errors"
	"slices"
	"testing"
	"time"
)

// TestTokenLimit: no token at or above the limit is given; a new request
// queues, or with refuse is refused with ErrNoTokens; a waiter that becomes grantable waits and is
// granted when the limit rises; Extend and the timeouts work as usual.
func TestTokenLimit(t *testing.T) {
	h := newHarness(t, Config{FirstToken: 10, TokenLimit: 12})
	a := h.mustLock("s1", "a", time.Second, 0)
	c := h.mustLock("s2", "a", time.Second, 0) // behind a
	w := h.mustLock("s2", "a", time.Second, 0) // behind c
	b := h.mustLock("s1", "b", time.Second, 0)
	if a.Token != 10 || b.Token != 11 {
		t.Fatalf("tokens %d, %d; want 10, 11", a.Token, b.Token)
	}
	// Without refuse, a new request queues; a try-lock is busy.
	q := h.mustLock("s2", "q", time.Second, 0)
	if q.Granted {
		t.Fatal("granted at the limit")
	}
	if _, err := h.tab.Lock(h.now, &Request{Session: "s2", Resources: []string{"d"}, TTL: time.Second, Try: true}); !errors.Is(err, ErrBusy) {
		t.Fatalf("try-lock at the limit: %v, want ErrBusy", err)
	}
	if err := h.unlock(q.ID); err != nil {
		t.Fatal(err)
	}
	h.tab.SetTokenLimit(h.now, 12, true)
	if g, err := h.lock("s2", "d", time.Second, 0); !errors.Is(err, ErrNoTokens) {
		t.Fatalf("a new request at the limit: %+v, %v; want ErrNoTokens", g, err)
	}
	if _, err := h.tab.Lock(h.now, &Request{Session: "s2", Resources: []string{"d"}, TTL: time.Second, Try: true}); !errors.Is(err, ErrNoTokens) {
		t.Fatalf("try-lock at the limit: %v, want ErrNoTokens", err)
	}
	names := map[ID]string{a.ID: "a", b.ID: "b", c.ID: "c", w.ID: "w"}
	if err := h.unlock(a.ID); err != nil {
		t.Fatal(err)
	}
	if ev := h.take(names); len(ev) != 0 || h.granted(c.ID) {
		t.Fatalf("granted at the limit: %v", ev)
	}
	h.tab.SetTokenLimit(h.now, 13, true) // room for one
	if ev := h.take(names); !slices.Equal(ev, []string{"granted:c"}) {
		t.Fatalf("raised by one: %v", ev)
	}
	if li, _ := h.tab.Lookup(c.ID); li.Token != 12 {
		t.Fatalf("c's token %d, want 12", li.Token)
	}
	if err := h.unlock(c.ID); err != nil {
		t.Fatal(err)
	}
	if ev := h.take(names); len(ev) != 0 {
		t.Fatalf("granted at the limit: %v", ev)
	}
	if _, err := h.extend(b.ID, 2*time.Second); err != nil {
		t.Fatalf("extend at the limit: %v", err)
	}
	h.tab.SetTokenLimit(h.now, 0, false) // no bound
	if ev := h.take(names); !slices.Equal(ev, []string{"granted:w"}) {
		t.Fatalf("unbounded: %v", ev)
	}
	// A waiter held by the limit past its wait deadline times out.
	h.tab.SetTokenLimit(h.now, h.tab.LastToken()+1, false)
	h.tab.SetTokenLimit(h.now, 0, false)
	x := h.mustLock("s1", "b", time.Second, 10*time.Millisecond) // behind b
	names[x.ID] = "x"
	h.tab.SetTokenLimit(h.now, h.tab.LastToken()+1, false)
	if err := h.unlock(b.ID); err != nil {
		t.Fatal(err)
	}
	h.advance(20 * time.Millisecond)
	if ev := h.take(names); !slices.Equal(ev, []string{"timeout:x"}) {
		t.Fatalf("a held waiter past its deadline: %v", ev)
	}
	if h.tab.LastToken() != 13 {
		t.Fatalf("last token %d, want 13", h.tab.LastToken())
	}
}
