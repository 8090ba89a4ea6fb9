package bench

import (
	"math"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// step is one event of a constructed history: worker w asks at at (ask), or
// is answered: granted (grant) or not (giveUp).
type step struct {
	w    int
	kind byte // 'a' ask, 'g' grant, 'x' give up
	at   time.Duration
}

func ask(w int, at time.Duration) step { return step{w: w, kind: 'a', at: at} }
func grant(w int) step                 { return step{w: w, kind: 'g'} }
func giveUp(w int) step                { return step{w: w, kind: 'x'} }

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func replay(workers int, h ...step) *fairness {
	f := newFairness(workers)
	for _, s := range h {
		switch s.kind {
		case 'a':
			f.request(s.w, epoch.Add(s.at))
		default:
			f.done(s.w, s.kind == 'g')
		}
	}
	return f
}

const ms = time.Millisecond

// Constructed histories, each with its exact measures.
func TestFairnessHistories(t *testing.T) {
	// FIFO: four workers ask 10 ms apart and are served in that order, three
	// times over, each asking again after its grant but the last.
	var fifo []step
	for w := range 4 {
		fifo = append(fifo, ask(w, time.Duration(w)*10*ms))
	}
	at := 40 * ms
	for round := range 3 {
		for w := range 4 {
			fifo = append(fifo, grant(w))
			if round < 2 {
				fifo = append(fifo, ask(w, at))
				at += 10 * ms
			}
		}
	}
	// Barging: four workers ask 10 ms apart; worker 0, granted first, asks
	// again after each release and is granted again before the waiters, 8
	// times over (each time overtaking worker 1, waiting since 10 ms); then
	// it stops and the waiters are served in order.
	barging := []step{ask(0, 0), ask(1, 10*ms), ask(2, 20*ms), ask(3, 30*ms), grant(0)}
	for i := range 8 {
		barging = append(barging, ask(0, time.Duration(40+10*i)*ms), grant(0))
	}
	barging = append(barging, grant(1), grant(2), grant(3))
	tests := []struct {
		name      string
		workers   int
		h         []step
		grants    []int64
		overtaken int64 // grants out of FIFO order
		jain      float64
		fifoShare float64
	}{
		{"fifo", 4, fifo, []int64{3, 3, 3, 3}, 0, 1, 1},
		// Grants 9, 1, 1, 1: Jain 12² / (4 × 84) = 3/7; 8 of 12 out of order.
		{"barging", 4, barging, []int64{9, 1, 1, 1}, 8, 3.0 / 7, 1.0 / 3},
		{"no grants", 3, []step{ask(0, 0), ask(1, ms), giveUp(0), giveUp(1)}, []int64{0, 0, 0}, 0, 0, 0},
		{"nothing", 2, nil, []int64{0, 0}, 0, 0, 0},
		{"one worker", 1, []step{ask(0, 0), grant(0), ask(0, 5*ms), grant(0), ask(0, 9*ms), giveUp(0)}, []int64{2}, 0, 1, 1},
		// Requests FIFOSlack apart may reach the lock in either order.
		{"within the slack", 2, []step{ask(0, 0), ask(1, FIFOSlack), grant(1), grant(0)}, []int64{1, 1}, 0, 1, 1},
		{"past the slack", 2, []step{ask(0, 0), ask(1, FIFOSlack+1), grant(1), grant(0)}, []int64{1, 1}, 1, 1, 0.5},
		// A worker that gave up waits no more: the later one is served in order.
		{"gave up", 2, []step{ask(0, 0), ask(1, 10*ms), giveUp(0), grant(1)}, []int64{0, 1}, 0, 0.5, 1},
		// One grant can pass several waiters over: it counts once.
		{"passes two", 3, []step{ask(0, 0), ask(1, 10*ms), ask(2, 20*ms), grant(2), grant(0), grant(1)}, []int64{1, 1, 1}, 1, 1, 2.0 / 3},
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-12 }
	for _, tc := range tests {
		f := replay(tc.workers, tc.h...)
		if !slices.Equal(f.grants, tc.grants) || f.overtake != tc.overtaken || !near(f.jain(), tc.jain) || !near(f.fifo(), tc.fifoShare) {
			t.Errorf("%s: grants %v, %d overtaken, Jain %v, FIFO %v; want %v, %d, %v, %v", tc.name, f.grants, f.overtake,
				f.jain(), f.fifo(), tc.grants, tc.overtaken, tc.jain, tc.fifoShare)
		}
		if len(f.waitFrom) != 0 {
			t.Errorf("%s: still waiting: %v", tc.name, f.waitFrom)
		}
	}
}

// randomHistory replays a random history of workers that ask, wait and are
// answered, the answered waiter chosen by pick among the waiters (oldest
// request first). Requests are gap apart. It returns the grants per worker
// and how many grants went to a waiter other than the oldest.
func randomHistory(rt *rapid.T, f *fairness, workers int, gap *rapid.Generator[time.Duration],
	pick func(rt *rapid.T, waiting int) int) (grants []int64, passed int64) {
	grants = make([]int64, workers)
	var waiting, idle []int
	for w := range workers {
		idle = append(idle, w)
	}
	at := epoch
	for range rapid.IntRange(0, 200).Draw(rt, "steps") {
		if len(idle) > 0 && (len(waiting) == 0 || rapid.Bool().Draw(rt, "ask")) {
			i := rapid.IntRange(0, len(idle)-1).Draw(rt, "asker")
			w := idle[i]
			idle = slices.Delete(idle, i, i+1)
			at = at.Add(gap.Draw(rt, "gap"))
			f.request(w, at)
			waiting = append(waiting, w)
			continue
		}
		i := pick(rt, len(waiting))
		w := waiting[i]
		waiting = slices.Delete(waiting, i, i+1)
		idle = append(idle, w)
		granted := rapid.IntRange(0, 4).Draw(rt, "answer") > 0 // a grant 4 times in 5
		f.done(w, granted)
		if granted {
			grants[w]++
			if i > 0 {
				passed++
			}
		}
	}
	return grants, passed
}

func anyWaiter(rt *rapid.T, n int) int { return rapid.IntRange(0, n-1).Draw(rt, "answered") }
func oldestWaiter(*rapid.T, int) int   { return 0 }

// share is the expected FIFO share of g grants, passed of them out of order.
func share(g, passed int64) float64 {
	if g == 0 {
		return 0
	}
	return 1 - float64(passed)/float64(g)
}

func checkHistory(rt *rapid.T, f *fairness, grants []int64, passed int64) {
	g := int64(0)
	for _, n := range grants {
		g += n
	}
	if !slices.Equal(f.grants, grants) || f.granted != g || f.overtake != passed || f.jain() != Jain(grants) ||
		f.fifo() != share(g, passed) {
		rt.Fatalf("grants %v (%d), %d overtaken, Jain %v, FIFO %v; want %v, %d, %v, %v", f.grants, f.granted, f.overtake,
			f.jain(), f.fifo(), grants, passed, Jain(grants), share(g, passed))
	}
}

func TestFairnessProperties(t *testing.T) {
	// Requests more than FIFOSlack apart: every grant to a waiter other than
	// the oldest passes the oldest over.
	t.Run("apart", func(t *testing.T) {
		rapid.Check(t, func(rt *rapid.T) {
			f := newFairness(rapid.IntRange(1, 8).Draw(rt, "workers"))
			grants, passed := randomHistory(rt, f, len(f.grants), durations(FIFOSlack+1, time.Second), anyWaiter)
			checkHistory(rt, f, grants, passed)
		})
	})
	// The oldest waiter always answered first: FIFO, however close the requests.
	t.Run("fifo", func(t *testing.T) {
		rapid.Check(t, func(rt *rapid.T) {
			f := newFairness(rapid.IntRange(1, 8).Draw(rt, "workers"))
			grants, _ := randomHistory(rt, f, len(f.grants), durations(0, time.Second), oldestWaiter)
			checkHistory(rt, f, grants, 0)
		})
	})
	// All requests within FIFOSlack: any order is FIFO order.
	t.Run("close", func(t *testing.T) {
		rapid.Check(t, func(rt *rapid.T) {
			f := newFairness(rapid.IntRange(1, 8).Draw(rt, "workers"))
			grants, _ := randomHistory(rt, f, len(f.grants), durations(0, FIFOSlack/200), anyWaiter)
			checkHistory(rt, f, grants, 0)
		})
	})
}

func durations(lo, hi time.Duration) *rapid.Generator[time.Duration] {
	return rapid.Custom(func(rt *rapid.T) time.Duration {
		return time.Duration(rapid.Int64Range(int64(lo), int64(hi)).Draw(rt, "d"))
	})
}

// Jain's index of any grant counts: 0 with none, else between 1/n (one
// worker has them all) and 1 (all equal), regardless of the workers' order.
func TestJainProperties(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		xs := rapid.SliceOfN(rapid.Int64Range(0, 1000), 1, 16).Draw(rt, "grants")
		j, n := Jain(xs), float64(len(xs))
		nonzero, equal := false, true
		for _, x := range xs {
			nonzero = nonzero || x != 0
			equal = equal && x == xs[0]
		}
		switch {
		case !nonzero:
			if j != 0 {
				rt.Fatalf("Jain(%v) = %v, want 0", xs, j)
			}
		case j < 1/n || j > 1 || (j == 1) != equal:
			rt.Fatalf("Jain(%v) = %v: want within [1/%v, 1], 1 exactly when all are equal", xs, j, n)
		}
		one := make([]int64, len(xs))
		one[rapid.IntRange(0, len(xs)-1).Draw(rt, "holder")] = rapid.Int64Range(1, 1000).Draw(rt, "all")
		if Jain(one) != 1/n {
			rt.Fatalf("Jain(%v) = %v, want 1/%v", one, Jain(one), n)
		}
		if p := rapid.Permutation(xs).Draw(rt, "perm"); Jain(p) != j {
			rt.Fatalf("Jain(%v) = %v, Jain(%v) = %v", xs, j, p, Jain(p))
		}
	})
}
