package locktable

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// TestDeadlinesDueInsideCommands: every command first processes what is
// due at its time, so a table whose deadlines are left to the commands
// (lazy: the timer fired late, or a replica applies a command before the
// tick) answers and reports exactly as one advanced to the same time before
// each command (eager), deadlines falling exactly on a command's time
// included. The model test always advances first; this covers the other
// path: a connect (Attach) at the end of its session's grace, an extend at
// its lock's expiry, a lock at a holder's expiry, a release at a waiter's
// timeout, in every mode (readers granted when a writer expires, say).
//
// Histories of up to 120 commands; 40 under the race detector, which finds
// nothing in the engine's single goroutine and makes them 5 to 10 times
// slower (CI runs the long ones without it, .ci/run).
func TestDeadlinesDueInsideCommands(t *testing.T) {
	t.Parallel()
	maxSteps := 120
	if raceDetector {
		maxSteps = 40
	}
	rapid.Check(t, func(rt *rapid.T) {
		var evEager, evLazy []Event
		seed := [32]byte{9}
		mk := func(ev *[]Event) *Table {
			tab, err := New(Config{Seed: &seed, SessionGrace: 40 * time.Millisecond, FirstToken: 100,
				OnEvent: func(e Event) { *ev = append(*ev, e) }})
			if err != nil {
				rt.Fatal(err)
			}
			return tab
		}
		eager, lazy := mk(&evEager), mk(&evLazy)
		now := int64(1000 * ms)
		for _, s := range modelSessions {
			eager.Attach(now, s)
			lazy.Attach(now, s)
		}
		var ids []ID
		pickID := func() ID {
			if len(ids) == 0 || rapid.IntRange(0, 9).Draw(rt, "unknown") == 0 {
				return ID{0xff}
			}
			return rapid.SampledFrom(ids).Draw(rt, "id")
		}
		resources := func() []string {
			return rapid.SliceOfN(rapid.SampledFrom(modelResources), 1, 3).Draw(rt, "resources")
		}
		steps := rapid.IntRange(1, maxSteps).Draw(rt, "steps")
		for step := range steps {
			// Time moves by whole milliseconds, onto deadlines or past
			// them (leases, timeouts and the grace are whole ms too).
			now += int64(rapid.IntRange(0, 25).Draw(rt, "ms")) * ms
			eager.Advance(now)
			var a, b string
			switch op := rapid.IntRange(0, 9).Draw(rt, "op"); op {
			case 0, 1, 2:
				req := Request{
					Session:   rapid.SampledFrom(modelSessions).Draw(rt, "session"),
					Resources: resources(),
					TTL:       modelTTL.Draw(rt, "ttl"),
					Timeout:   time.Duration(rapid.SampledFrom([]int{0, 5, 20, 50}).Draw(rt, "timeout")) * time.Millisecond,
					Tolerate:  rapid.SampledFrom([]int{0, 0, 1, 2}).Draw(rt, "tolerate"),
					Try:       rapid.IntRange(0, 6).Draw(rt, "try") == 0,
					Owner:     rapid.SampledFrom(modelOwners).Draw(rt, "owner"),
				}
				req.NoReentry = req.Owner == anonOwner
				req.Modes = drawModes(rt, req.Resources)
				r2 := req
				r2.Resources = slices.Clone(req.Resources)
				r2.Modes = slices.Clone(req.Modes)
				g1, e1 := eager.Lock(now, &req)
				g2, e2 := lazy.Lock(now, &r2)
				if e1 == nil && !g1.Renewed {
					ids = append(ids, g1.ID)
				}
				a, b = fmt.Sprint(g1, e1), fmt.Sprint(g2, e2)
			case 3:
				id, ttl, from := pickID(), modelTTL.Draw(rt, "ttl"), rapid.SampledFrom(modelCallers).Draw(rt, "from")
				x1, e1 := eager.Extend(now, id, ttl, from)
				x2, e2 := lazy.Extend(now, id, ttl, from)
				a, b = fmt.Sprint(x1, e1), fmt.Sprint(x2, e2)
			case 4:
				id, from := pickID(), rapid.SampledFrom(modelCallers).Draw(rt, "from")
				a, b = fmt.Sprint(eager.Unlock(now, id, from)), fmt.Sprint(lazy.Unlock(now, id, from))
			case 5:
				owner, res := rapid.SampledFrom(modelOwners).Draw(rt, "owner"), resources()
				ttl, from := modelTTL.Draw(rt, "ttl"), rapid.SampledFrom(modelCallers).Draw(rt, "from")
				g1, e1 := eager.Renew(now, owner, res, ttl, from)
				g2, e2 := lazy.Renew(now, owner, res, ttl, from)
				a, b = fmt.Sprint(g1, e1), fmt.Sprint(g2, e2)
			case 6:
				owner, res := rapid.SampledFrom(modelOwners).Draw(rt, "owner"), resources()
				a, b = fmt.Sprint(eager.Release(now, owner, res)), fmt.Sprint(lazy.Release(now, owner, res))
			case 7:
				res := resources()
				n1, e1 := eager.Evict(now, res)
				n2, e2 := lazy.Evict(now, res)
				a, b = fmt.Sprint(n1, e1), fmt.Sprint(n2, e2)
			case 8:
				s := rapid.SampledFrom(modelSessions).Draw(rt, "session")
				a, b = fmt.Sprint(eager.Attach(now, s)), fmt.Sprint(lazy.Attach(now, s))
			case 9:
				s := rapid.SampledFrom(modelSessions).Draw(rt, "session")
				eager.Detach(now, s)
				lazy.Detach(now, s)
			}
			if a != b {
				rt.Fatalf("step %d at %d: eager answered %s, lazy %s", step, now, a, b)
			}
			if !slices.EqualFunc(evEager, evLazy, func(x, y Event) bool { return fmt.Sprint(x) == fmt.Sprint(y) }) {
				rt.Fatalf("step %d at %d: events differ:\neager %v\nlazy  %v", step, now, evEager, evLazy)
			}
			if eager.LastToken() != lazy.LastToken() || eager.Stats() != lazy.Stats() {
				rt.Fatalf("step %d: eager %+v, lazy %+v", step, eager.Stats(), lazy.Stats())
			}
		}
	})
}
