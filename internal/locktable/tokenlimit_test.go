package locktable

import (
	"errors"
	"slices"
	"testing"
	"time"
)

// TestTokenLimit: no token at or above the limit is given; what would be
// granted waits (a try-lock is refused) and is granted in arrival order
// when the limit rises; a renewal needs no token.
func TestTokenLimit(t *testing.T) {
	h := newHarness(t, Config{FirstToken: 10, TokenLimit: 12})
	a := h.mustLock("s1", "a", time.Second, 0)
	b := h.mustLock("s1", "b", time.Second, 0)
	if a.Token != 10 || b.Token != 11 {
		t.Fatalf("tokens %d, %d; want 10, 11", a.Token, b.Token)
	}
	c := h.mustLock("s2", "c", time.Second, 0)
	if c.Granted {
		t.Fatalf("granted token %d at the limit 12", c.Token)
	}
	if _, err := h.tab.Lock(h.now, &Request{Session: "s2", Resources: []string{"d"}, TTL: time.Second, Try: true}); !errors.Is(err, ErrBusy) {
		t.Fatalf("try-lock at the limit: %v, want ErrBusy", err)
	}
	w := h.mustLock("s2", "a", time.Second, 0) // behind a
	names := map[ID]string{a.ID: "a", b.ID: "b", c.ID: "c", w.ID: "w"}
	if err := h.unlock(a.ID); err != nil {
		t.Fatal(err)
	}
	if h.granted(w.ID) {
		t.Fatal("a waiter was granted at the limit")
	}
	h.tab.SetTokenLimit(h.now, 13) // room for one: c came first
	if ev := h.take(names); !slices.Equal(ev, []string{"granted:c"}) || h.granted(w.ID) {
		t.Fatalf("raised by one: %v (w granted %v)", ev, h.granted(w.ID))
	}
	if li, _ := h.tab.Lookup(c.ID); li.Token != 12 {
		t.Fatalf("c's token %d, want 12", li.Token)
	}
	h.tab.SetTokenLimit(h.now, 0) // no bound
	if ev := h.take(names); !slices.Equal(ev, []string{"granted:w"}) {
		t.Fatalf("unbounded: %v", ev)
	}
	h.tab.SetTokenLimit(h.now, h.tab.LastToken()+1)
	if _, err := h.renew("", nil, time.Second); err == nil {
		t.Fatal("renew without an owner succeeded")
	}
	if _, err := h.extend(b.ID, 2*time.Second); err != nil {
		t.Fatalf("extend at the limit: %v", err)
	}
	// A waiter past its wait deadline while the limit holds it times out.
	x := h.mustLock("s1", "x", time.Second, 10*time.Millisecond)
	names[x.ID] = "x"
	h.advance(20 * time.Millisecond)
	if ev := h.take(names); !slices.Contains(ev, "timeout:x") {
		t.Fatalf("a held waiter past its deadline: %v", ev)
	}
	if h.tab.LastToken() != 13 {
		t.Fatalf("last token %d, want 13", h.tab.LastToken())
	}
}
