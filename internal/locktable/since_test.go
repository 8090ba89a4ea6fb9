package locktable

import (
	"testing"
	"time"
)

// Events carry when their request was made or granted, and Lock says how
// many entries a waiting request found ahead of it: the wait and hold
// times and queue depths that a server's metrics are made of.
func TestEventsCarryWaitAndHoldTimes(t *testing.T) {
	h := newHarness(t, Config{})
	t0 := h.now
	a := h.mustLock("s1", "x", time.Minute, 0)
	if a.Ahead != 0 || !a.Granted {
		t.Fatalf("first lock: %+v", a)
	}
	b := h.mustLock("s2", "x|y", time.Minute, 0)
	h.now += int64(time.Second)
	c := h.mustLock("s3", "y|x", 3*time.Second, time.Hour)
	if b.Ahead != 1 || c.Ahead != 2 {
		t.Fatalf("ahead: b %d (want 1), c %d (want 2)", b.Ahead, c.Ahead)
	}
	if li, _ := h.tab.Lookup(a.ID); li.GrantedAt != t0 || li.Created != t0 {
		t.Fatalf("holder a: %+v", li)
	}
	if li, _ := h.tab.Lookup(b.ID); li.GrantedAt != 0 {
		t.Fatalf("waiting b has a grant time: %+v", li)
	}
	h.events = nil
	h.now += 4 * int64(time.Second) // t0+5s
	if err := h.tab.Unlock(h.now, a.ID, "s1"); err != nil {
		t.Fatal(err)
	}
	if len(h.events) != 1 || h.events[0].Kind != Granted || h.events[0].ID != b.ID || h.events[0].Since != t0 {
		t.Fatalf("grant of b: %+v (want Since %d, the request's time)", h.events, t0)
	}
	if li, _ := h.tab.Lookup(b.ID); li.GrantedAt != h.now {
		t.Fatalf("b granted at %d, want %d", li.GrantedAt, h.now)
	}
	// A snapshot keeps the grant time.
	snap, _ := h.tab.MarshalBinary()
	r, err := Restore(Config{}, snap)
	if err != nil {
		t.Fatal(err)
	}
	if li, _ := r.Lookup(b.ID); li.GrantedAt != t0+5*int64(time.Second) {
		t.Fatalf("restored grant time %d", li.GrantedAt)
	}
	h.events = nil
	grantedB := h.now
	h.now += int64(time.Minute) // b expires, c is granted (at this batch's time)
	h.tab.Advance(h.now)
	if len(h.events) != 2 || h.events[0].ID != b.ID || h.events[0].Kind != Expired || h.events[0].Since != grantedB ||
		h.events[1].ID != c.ID || h.events[1].Kind != Granted || h.events[1].Since != t0+int64(time.Second) {
		t.Fatalf("events %+v: want b expired (Since %d), c granted (Since %d)", h.events, grantedB, t0+int64(time.Second))
	}
	h.events = nil
	grantedC := h.now
	h.now += int64(3 * time.Second)
	h.tab.Advance(h.now)
	if len(h.events) != 1 || h.events[0].ID != c.ID || h.events[0].Kind != Expired || h.events[0].Since != grantedC {
		t.Fatalf("c's expiry %+v, want Since %d", h.events, grantedC)
	}
}

// A version 1 snapshot (before grant times) still restores; its granted
// locks have no grant time.
func TestRestoreVersion1(t *testing.T) {
	h := newHarness(t, Config{})
	g := h.mustLock("s1", "x", time.Minute, 0)
	v1, _ := h.tab.appendVersion(nil, 1)
	r, err := Restore(Config{}, v1)
	if err != nil {
		t.Fatal(err)
	}
	if li, ok := r.Lookup(g.ID); !ok || !li.Granted || li.GrantedAt != 0 {
		t.Fatalf("restored: %+v %v", li, ok)
	}
	if v2, _ := h.tab.MarshalBinary(); len(v2) != len(v1)+1 {
		t.Fatalf("version 2 is %d bytes, version 1 %d: want one more (the grant time)", len(v2), len(v1))
	}
}

// The expiry of a lock that Evict revoked says so: its holder was told at
// the eviction, so its hold ended then.
func TestExpiredAfterEvictSaysRevoked(t *testing.T) {
	h := newHarness(t, Config{SessionGrace: time.Second})
	g := h.mustLock("s1", "x", time.Minute, 0)
	if n, err := h.tab.Evict(h.now, []string{"x"}); n != 1 || err != nil {
		t.Fatalf("evict: %d %v", n, err)
	}
	h.events = nil
	h.now += int64(2 * time.Second)
	h.tab.Advance(h.now)
	if len(h.events) != 1 || h.events[0].ID != g.ID || h.events[0].Kind != Expired || !h.events[0].Revoked {
		t.Fatalf("events %+v: want the revoked lock's expiry, Revoked", h.events)
	}
	h.events = nil
	g2 := h.mustLock("s1", "x", time.Second, 0)
	h.now += int64(2 * time.Second)
	h.tab.Advance(h.now)
	if len(h.events) != 1 || h.events[0].ID != g2.ID || h.events[0].Revoked {
		t.Fatalf("events %+v: want a plain expiry", h.events)
	}
}
