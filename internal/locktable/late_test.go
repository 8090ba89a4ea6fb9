package locktable

import (
	"slices"
	"testing"
	"time"
)

// A waiter whose wait deadline passed before the engine ran again is timed
// out, never granted, even when the holder's expiry that frees its queue
// fell before that deadline: its client has given up.
func TestLateWaiterTimedOutNotGranted(t *testing.T) {
	cases := []struct {
		name  string
		setup func(h *harness) (waiter ID, names map[ID]string)
	}{
		{"expiry", func(h *harness) (ID, map[ID]string) {
			a := h.mustLock("s1", "r", 10*time.Millisecond, 0)
			w := h.mustLock("s2", "r", time.Second, 20*time.Millisecond)
			return w.ID, map[ID]string{a.ID: "a", w.ID: "w"}
		}},
		{"hold", func(h *harness) (ID, map[ID]string) {
			h.tab.HoldGrants(h.now, h.now+int64(10*time.Millisecond))
			w := h.mustLock("s2", "r", time.Second, 20*time.Millisecond)
			return w.ID, map[ID]string{w.ID: "w"}
		}},
		{"session", func(h *harness) (ID, map[ID]string) {
			h.tab.Attach(h.now, "s3")
			a := h.mustLock("s3", "r", time.Hour, 0)
			w := h.mustLock("s2", "r", time.Second, h.tab.SessionGrace()+20*time.Millisecond)
			h.tab.Detach(h.now, "s3")
			return w.ID, map[ID]string{a.ID: "a", w.ID: "w"}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, Config{SessionGrace: 50 * time.Millisecond})
			w, names := tc.setup(h)
			behind := h.mustLock("s1", "r", time.Second, 0)
			names[behind.ID] = "behind"
			h.events = nil
			h.advance(time.Second) // past both the freeing and the wait deadline
			if h.granted(w) {
				t.Fatalf("the waiter past its wait deadline was granted: %v", h.take(names))
			}
			ev := h.take(names)
			if !slices.Contains(ev, "timeout:w") {
				t.Fatalf("the waiter was not timed out: %v", ev)
			}
			if !h.granted(behind.ID) || !slices.Contains(ev, "granted:behind") {
				t.Fatalf("the request behind it was not granted: %v", ev)
			}
		})
	}
}

// A waiter whose wait deadline is still ahead when its queue is freed late
// is granted.
func TestLateFreeGrantsLiveWaiter(t *testing.T) {
	h := newHarness(t, Config{})
	h.mustLock("s1", "r", 10*time.Millisecond, 0)
	w := h.mustLock("s2", "r", time.Second, time.Hour)
	h.advance(time.Second)
	if !h.granted(w.ID) {
		t.Fatal("the waiter was not granted")
	}
}

// With LateGrants (a replicated log whose members may run earlier builds),
// the waiter freed late is granted at the processing's time, as before.
func TestLateGrantsKeepsTheEarlierRule(t *testing.T) {
	h := newHarness(t, Config{LateGrants: true})
	h.mustLock("s1", "r", 10*time.Millisecond, 0)
	w := h.mustLock("s2", "r", time.Second, 20*time.Millisecond)
	h.advance(time.Second)
	if !h.granted(w.ID) {
		t.Fatal("with LateGrants the late waiter was not granted")
	}
}

// SetLateGrants switches the rule at a point of the table's history, both
// ways: the same late waiter is granted while the rule of earlier builds is
// in force, and timed out once it is not (a cluster whose version rises to
// the format that carries the rule, or is lowered again).
func TestSetLateGrantsSwitchesTheRule(t *testing.T) {
	for _, tc := range []struct {
		name        string
		start, then bool
	}{
		{"on-to-off", true, false},
		{"off-to-on", false, true},
		{"on-stays-on", true, true},
		{"off-stays-off", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, Config{LateGrants: tc.start})
			if h.tab.LateGrants() != tc.start {
				t.Fatalf("LateGrants() = %v, configured %v", h.tab.LateGrants(), tc.start)
			}
			a := h.mustLock("s1", "r", 10*time.Millisecond, 0)
			w := h.mustLock("s2", "r", time.Second, 20*time.Millisecond)
			names := map[ID]string{a.ID: "a", w.ID: "w"}
			h.tab.SetLateGrants(tc.then)
			if h.tab.LateGrants() != tc.then {
				t.Fatalf("LateGrants() = %v after SetLateGrants(%v)", h.tab.LateGrants(), tc.then)
			}
			h.events = nil
			h.advance(time.Second) // past a's expiry and w's wait deadline
			ev := h.take(names)
			if got := h.granted(w.ID); got != tc.then {
				t.Fatalf("late waiter granted = %v with the rule %v: %v", got, tc.then, ev)
			}
			want := "timeout:w"
			if tc.then {
				want = "granted:w"
			}
			if !slices.Contains(ev, want) {
				t.Fatalf("events %v, want %s", ev, want)
			}
		})
	}
}
