package locktable

import (
	"errors"
	"testing"
	"time"
)

// SetLimits changes the caps for what comes next and leaves what is live
// as it is; an invalid configuration changes nothing.
func TestSetLimits(t *testing.T) {
	h := newHarness(t, Config{MaxLocksPerSession: 3, MaxQueueLen: 2, SessionGrace: time.Second})
	h.mustLock("s1", "a", time.Minute, 0)
	h.mustLock("s1", "b", time.Minute, 0)
	if err := h.tab.SetLimits(Config{MaxLocksPerSession: 1, MaxQueueLen: 2, SessionGrace: 4 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if st := h.tab.Stats(); st.Live != 2 {
		t.Fatalf("live requests after lowering the cap: %d", st.Live)
	}
	if _, err := h.lock("s1", "c", time.Minute, 0); !errors.Is(err, ErrSessionLimit) {
		t.Fatalf("a third lock over the new per-session cap of 1: %v", err)
	}
	h.mustLock("s2", "c", time.Minute, 0)
	if err := h.tab.SetLimits(Config{MaxLocksPerSession: 3, MaxQueueLen: 1, SessionGrace: time.Microsecond}); err == nil {
		t.Fatal("a grace below 1ms was accepted")
	}
	if h.tab.SessionGrace() != 4*time.Second {
		t.Fatalf("grace after a refused change: %v", h.tab.SessionGrace())
	}
	if _, err := h.lock("s3", "a", time.Minute, time.Second); err != nil {
		t.Fatalf("queue of 2 after a refused change: %v", err)
	}
	h.tab.Detach(h.now, "s3")
	if at, ok := h.tab.NextDeadline(); !ok || at != h.now+int64(time.Second) {
		// the wait timeout of s3's request comes first, at 1 s
		t.Fatalf("next deadline %d %v", at, ok)
	}
	h.advance(time.Second)
	if at, ok := h.tab.NextDeadline(); !ok || at != h.now-int64(time.Second)+int64(4*time.Second) {
		t.Fatalf("the grace of s3 ends at %d %v, want the detach + the new grace 4s", at, ok)
	}
}
