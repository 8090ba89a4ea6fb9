package faulttest

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/mlock-dev/mlock/internal/lease"
)

// violation is one broken rule with the history that shows it.
type clusterViolation struct {
	kind     string // overlap, token, linearizability, check-timeout
	msg      string
	res      string
	from, to int64
}

// checkSafety requires, per resource, that no two belief intervals overlap
// and that fencing tokens strictly increase in the order of the intervals.
// An interval runs from the lock call's return to the earlier of the
// unlock's call and the holder's latest Deadline (see beliefEnd): times of
// this process's monotonic clock, read without rounding, and no margin
// added or taken: the client's Deadline has the drift margin in it already,
// and the server frees a lock no earlier (the package documentation of
// mlock, "Safety"). An overlap of any length is a violation.
// An empty interval (the lock was already past its Deadline when granted)
// is left out of both: nobody believed it; the model checks its token.
// An overlap whose earlier holder was idle (grant.Idle: its belief is its
// session's, counted from its answered pings) is a session ended while its
// client believed it alive: kind "session".
func checkSafety(grants []grant) (vs []clusterViolation, empty int) {
	byRes := map[string][]grant{}
	for _, g := range grants {
		if g.End <= g.Start {
			empty++
			continue
		}
		byRes[g.Res] = append(byRes[g.Res], g)
	}
	for _, res := range sortedKeys(byRes) {
		gs := byRes[res]
		sort.Slice(gs, func(i, j int) bool { return gs[i].Start < gs[j].Start })
		for i, a := range gs {
			for _, b := range gs[i+1:] {
				if b.Start >= a.End {
					break
				}
				v := clusterViolation{kind: "overlap", res: res, from: b.Start, to: min(a.End, b.End),
					msg: fmt.Sprintf("two holders of %s for %v: %v and %v", res, time.Duration(min(a.End, b.End)-b.Start), a, b)}
				if a.Idle {
					v.kind = "session"
					v.msg = fmt.Sprintf("the session of an idle holder of %s ended while its client, from its answered pings, "+
						"believed it alive for %v more: %v, then %v", res, time.Duration(a.End-b.Start), a, b)
				}
				vs = append(vs, v)
			}
			if i > 0 && a.Token <= gs[i-1].Token {
				p := gs[i-1]
				vs = append(vs, clusterViolation{kind: "token", res: res, from: p.Start, to: a.Start,
					msg: fmt.Sprintf("token %d does not exceed the previous holder's %d: %v after %v", a.Token, p.Token, a, p)})
			}
		}
	}
	return vs, empty
}

// faultNear is how long before a lock call a fault still counts as one
// during its wait, and after the cluster is healthy again: the client may
// still be moving to another node.
const clusterFaultNear = int64(time.Second)

// checkArrivals requires every grant whose wait saw no fault to arrive with
// at least lease.MinUsable(min(ttl, grace)) to believe (a lock lost, or about to be, on
// arrival is a bug whatever the wait), and counts those short on arrival
// whose wait saw a fault (from its first event less faultNear to its
// "healthy" event plus faultNear): a fault can hold back every answer of
// the client's confirmations, one grant per worker and fault at most.
func checkArrivals(grants []grant, events []event) (vs []clusterViolation, faulty int) {
	type window struct{ from, to int64 }
	byRound := map[int]*window{}
	for _, e := range events {
		w := byRound[e.Round]
		if w == nil {
			w = &window{e.T - clusterFaultNear, 1<<63 - 1} // until healthy again, if ever
			byRound[e.Round] = w
		}
		if strings.HasPrefix(e.What, "healthy") {
			w.to = e.T + clusterFaultNear
		}
	}
	var ws []window
	for _, w := range byRound {
		ws = append(ws, *w)
	}
	for _, g := range grants {
		if g.Arrival-g.Start >= int64(lease.MinUsable(min(ttl, grace))) {
			continue
		}
		if slices.ContainsFunc(ws, func(w window) bool { return g.Call <= w.to && g.Start >= w.from }) {
			faulty++
			continue
		}
		vs = append(vs, clusterViolation{kind: "arrival", res: g.Res, from: g.Call, to: g.Start,
			msg: fmt.Sprintf("%v arrived with %v to believe after a wait without a fault", g, time.Duration(g.Arrival-g.Start))})
	}
	return vs, faulty
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// The lock model for porcupine, per resource.

// lockState is the state of one resource.
type lockState struct {
	holder int    // handle holding it; 0 free; ghost: a lock of unknown outcome
	end    int64  // the holder's lease lasts at least until end (its latest Deadline)
	last   uint64 // the highest token granted
}

const ghost = -1

type lockInput struct {
	kind     string
	handle   int
	ret      int64 // the response time (lock ok: the grant happened before it)
	leaseEnd int64 // lock ok: the latest Deadline the holder saw
}

type lockOutput struct {
	outcome string
	token   uint64
}

// lockModel is the sequential specification of one resource's lock. A
// holder's lease may end at any time after its latest Deadline (the server
// never ends it earlier; a failover only postpones it), so another client
// may then be granted the resource. A lock of unknown outcome may have been
// granted, to nobody who knows it: a ghost, whose lease may end at any time.
var lockModel = porcupine.NondeterministicModel{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		by := map[string][]porcupine.Operation{}
		for _, o := range h {
			r := o.Metadata.(op).Res
			by[r] = append(by[r], o)
		}
		var out [][]porcupine.Operation
		for _, r := range sortedKeys(by) {
			out = append(out, by[r])
		}
		return out
	},
	Init: func() []any { return []any{lockState{}} },
	Step: func(st, in, out any) []any {
		s, i, o := st.(lockState), in.(lockInput), out.(lockOutput)
		free := lockState{last: s.last}
		mine := s.holder == i.handle
		switch i.kind + "/" + o.outcome {
		case opLock + "/" + resOK:
			if o.token <= s.last || s.holder > 0 && i.ret <= s.end {
				return nil
			}
			return []any{lockState{holder: i.handle, end: i.leaseEnd, last: o.token}}
		case opLock + "/" + resUnknown:
			return []any{s, lockState{holder: ghost, last: s.last}}
		case opExtend + "/" + resOK:
			if !mine {
				return nil
			}
			return []any{s}
		case opExtend + "/" + resLost:
			if !mine {
				return []any{s}
			}
			if i.ret > s.end {
				return []any{free} // expired
			}
			return nil // the server ended the lease before the holder's Deadline
		case opUnlock + "/" + resOK:
			if !mine {
				return nil
			}
			return []any{free}
		case opUnlock + "/" + resLost:
			// A retried unlock whose first attempt was applied says lost:
			// lenient here.
			if mine {
				return []any{free}
			}
			return []any{s}
		case opUnlock + "/" + resUnknown:
			if mine {
				return []any{s, free}
			}
			return []any{s}
		default: // no effect in any state
			return []any{s}
		}
	},
	DescribeOperation: func(in, out any) string {
		i, o := in.(lockInput), out.(lockOutput)
		s := fmt.Sprintf("%s h%d → %s", i.kind, i.handle, o.outcome)
		if o.token != 0 {
			s += fmt.Sprintf(" %d", o.token)
		}
		return s
	},
	DescribeState: func(st any) string {
		s := st.(lockState)
		return fmt.Sprintf("holder h%d until %s, last token %d", s.holder, fmtT(s.end), s.last)
	},
}

// modelOps converts the recorded operations for the model, leaving out
// those without effect in any state (refused locks, extends of unknown
// outcome, calls on a lock the client had already lost).
func modelOps(ops []op, grants []grant) []porcupine.Operation {
	lease := map[int]int64{}
	for _, g := range grants {
		lease[g.Handle] = g.LeaseEnd
	}
	var out []porcupine.Operation
	for _, o := range ops {
		switch {
		case o.Outcome == resSkip,
			o.Kind == opLock && (o.Outcome == resFail || o.Outcome == resLost),
			o.Kind == opExtend && o.Outcome != resOK && o.Outcome != resLost:
			continue
		}
		out = append(out, porcupine.Operation{
			ClientId: o.Worker,
			Input:    lockInput{kind: o.Kind, handle: o.Handle, ret: o.Return, leaseEnd: lease[o.Handle]},
			Call:     o.Call,
			Output:   lockOutput{outcome: o.Outcome, token: o.Token},
			Return:   o.Return,
			Metadata: o,
		})
	}
	return out
}

// checkLinearizable checks the history against lockModel, per resource,
// each within timeout.
func checkLinearizable(ops []op, grants []grant, timeout time.Duration) []clusterViolation {
	model := lockModel.ToModel()
	hist := modelOps(ops, grants)
	var vs []clusterViolation
	for _, part := range model.Partition(hist) {
		res := part[0].Metadata.(op).Res
		r, info := porcupine.CheckOperationsVerbose(model, part, timeout)
		switch r {
		case porcupine.Ok:
			continue
		case porcupine.Unknown:
			vs = append(vs, clusterViolation{kind: "check-timeout", res: res,
				msg: fmt.Sprintf("porcupine gave up on %s after %v (%d operations)", res, timeout, len(part))})
			continue
		}
		// The longest partial linearization shows where it got stuck.
		var longest []porcupine.Operation
		for _, p := range info.PartialLinearizationsOperations() {
			for _, l := range p {
				if len(l) > len(longest) {
					longest = l
				}
			}
		}
		from, to := int64(0), int64(0)
		var b strings.Builder
		if n := len(longest); n > 0 {
			lastOp := longest[n-1].Metadata.(op)
			from = lastOp.Call
			fmt.Fprintf(&b, "longest linearizable prefix: %d of %d operations, ending with %v; ", n, len(part), lastOp)
			// The first operation not in it that must come next.
			in := map[int]bool{}
			for _, l := range longest {
				in[l.Metadata.(op).Handle*8+kindIdx(l.Metadata.(op).Kind)] = true
			}
			first := int64(never)
			var stuck op
			for _, o := range part {
				m := o.Metadata.(op)
				if !in[m.Handle*8+kindIdx(m.Kind)] && o.Return < first {
					first, stuck = o.Return, m
				}
			}
			if first != never {
				to = max(stuck.Return, from)
				fmt.Fprintf(&b, "cannot place %v", stuck)
			}
		}
		vs = append(vs, clusterViolation{kind: "linearizability", res: res, from: from, to: max(to, from),
			msg: fmt.Sprintf("the history of %s is not linearizable: %s", res, b.String())})
	}
	return vs
}

func kindIdx(k string) int {
	switch k {
	case opLock:
		return 1
	case opExtend:
		return 2
	}
	return 3
}

// percentile returns the p-th percentile (0..100) of ds, nearest rank.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(float64(len(s))*p/100+0.999999) - 1
	return s[max(0, min(i, len(s)-1))]
}

// TestCheckers runs the safety checker and the model on hand-made
// histories.
func TestCheckers(t *testing.T) {
	ms := int64(time.Millisecond)
	lock := func(w, h int, call, ret int64, outcome string, token uint64) op {
		return op{Worker: w, Kind: opLock, Res: "r", Handle: h, Call: call * ms, Return: ret * ms, Outcome: outcome, Token: token}
	}
	ext := func(w, h int, call, ret int64, outcome string) op {
		return op{Worker: w, Kind: opExtend, Res: "r", Handle: h, Call: call * ms, Return: ret * ms, Outcome: outcome}
	}
	unl := func(w, h int, call, ret int64, outcome string) op {
		return op{Worker: w, Kind: opUnlock, Res: "r", Handle: h, Call: call * ms, Return: ret * ms, Outcome: outcome}
	}
	gr := func(w, h int, token uint64, start, end, lease int64) grant {
		return grant{Worker: w, Res: "r", Handle: h, Token: token, Start: start * ms, End: end * ms, LeaseEnd: lease * ms}
	}
	unknown := func(o op) op { o.Return = never; return o }
	idle := func(g grant) grant { g.Idle = true; return g }
	for _, tc := range []struct {
		name   string
		ops    []op
		grants []grant
		safety []string
		lin    bool
	}{
		{"sequential",
			[]op{lock(0, 1, 0, 10, resOK, 5), ext(0, 1, 20, 30, resOK), unl(0, 1, 40, 50, resOK),
				lock(1, 2, 5, 55, resOK, 6), unl(1, 2, 60, 70, resOK)},
			[]grant{gr(0, 1, 5, 10, 40, 1000), gr(1, 2, 6, 55, 60, 1000)}, nil, true},
		{"two holders",
			[]op{lock(0, 1, 0, 10, resOK, 5), lock(1, 2, 5, 20, resOK, 6), unl(0, 1, 40, 50, resOK), unl(1, 2, 60, 70, resOK)},
			[]grant{gr(0, 1, 5, 10, 40, 1000), gr(1, 2, 6, 20, 60, 1000)}, []string{"overlap"}, false},
		{"taken after the holder's lease",
			[]op{lock(0, 1, 0, 10, resOK, 5), lock(1, 2, 5, 120, resOK, 6), unl(1, 2, 130, 140, resOK)},
			[]grant{gr(0, 1, 5, 10, 100, 100), gr(1, 2, 6, 120, 130, 1000)}, nil, true},
		{"tokens go down",
			[]op{lock(0, 1, 0, 10, resOK, 6), unl(0, 1, 20, 30, resOK), lock(1, 2, 25, 40, resOK, 5), unl(1, 2, 50, 60, resOK)},
			[]grant{gr(0, 1, 6, 10, 20, 1000), gr(1, 2, 5, 40, 50, 1000)}, []string{"token"}, false},
		{"extend after another's grant",
			[]op{lock(0, 1, 0, 10, resOK, 5), unl(0, 1, 20, 30, resOK), lock(1, 2, 25, 40, resOK, 6), ext(0, 1, 50, 60, resOK)},
			[]grant{gr(0, 1, 5, 10, 20, 1000), gr(1, 2, 6, 40, 70, 1000)}, nil, false},
		{"lock of unknown outcome",
			[]op{unknown(lock(0, 1, 0, 10, resUnknown, 0)), lock(1, 2, 5, 40, resOK, 6), unl(1, 2, 50, 60, resOK),
				lock(2, 3, 55, 70, resOK, 9)},
			[]grant{gr(1, 2, 6, 40, 50, 1000), gr(2, 3, 9, 70, 80, 1000)}, nil, true},
		{"unlock of unknown outcome, then taken",
			[]op{lock(0, 1, 0, 10, resOK, 5), unknown(unl(0, 1, 20, 30, resUnknown)), lock(1, 2, 25, 40, resOK, 6)},
			[]grant{gr(0, 1, 5, 10, 20, 1000), gr(1, 2, 6, 40, 50, 1000)}, nil, true},
		{"expired before the holder's Deadline",
			[]op{lock(0, 1, 0, 10, resOK, 5), ext(0, 1, 20, 30, resLost)},
			[]grant{gr(0, 1, 5, 10, 20, 1000)}, nil, false},
		{"an idle holder's session ended early",
			[]op{lock(0, 1, 0, 10, resOK, 5), lock(1, 2, 5, 20, resOK, 6), unl(1, 2, 30, 40, resOK)},
			[]grant{idle(gr(0, 1, 5, 10, 50, 50)), gr(1, 2, 6, 20, 30, 1000)}, []string{"session"}, false},
		{"an idle holder's session ended after its belief",
			[]op{lock(0, 1, 0, 10, resOK, 5), lock(1, 2, 5, 60, resOK, 6), unl(1, 2, 70, 80, resOK)},
			[]grant{idle(gr(0, 1, 5, 10, 50, 50)), gr(1, 2, 6, 60, 70, 1000)}, nil, true},
		{"granted already expired",
			[]op{lock(0, 1, 0, 300, resOK, 5), lock(1, 2, 5, 200, resOK, 6), unl(1, 2, 210, 220, resOK)},
			[]grant{gr(0, 1, 5, 300, 250, 0), gr(1, 2, 6, 200, 210, 1000)}, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vs, _ := checkSafety(tc.grants)
			var got []string
			for _, v := range vs {
				got = append(got, v.kind)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.safety) {
				t.Errorf("safety violations %v, want %v", vs, tc.safety)
			}
			lv := checkLinearizable(tc.ops, tc.grants, 5*time.Second)
			if (len(lv) == 0) != tc.lin {
				t.Errorf("linearizability violations %v, want linearizable %v", lv, tc.lin)
			}
		})
	}
}

// beliefEnd ends the interval at the unlock's call or the Deadline, exact
// readings; a loss seen earlier does not end it (its sighting is late by the
// sampler's wake-up, and the server may not free the lock before the
// Deadline but through the holder's unlock), so a grant between the loss's
// sighting and the Deadline is an overlap, and one after the Deadline is
// not, however late the loss was seen.
func TestBeliefEnd(t *testing.T) {
	us := int64(time.Microsecond)
	for _, tc := range []struct {
		name                    string
		unlockCall, lease, lost int64
		end                     int64
		why                     string
		next                    int64 // the next grant's start
		overlap                 bool
	}{
		{"unlocked", 500 * us, 1000 * us, 0, 500 * us, "unlock", 600 * us, false},
		{"unlocked, granted before the unlock", 500 * us, 1000 * us, 0, 500 * us, "unlock", 499 * us, true},
		{"lost at its Deadline, seen late", 5000 * us, 1000 * us, 1024 * us, 1000 * us, "deadline", 1000 * us, false},
		{"lost before its Deadline, granted after the sighting", 5000 * us, 1000 * us, 400 * us, 1000 * us,
			"lost at 0.000400s, before its deadline", 424 * us, true},
		{"lost before its unlock, granted after it", 500 * us, 1000 * us, 400 * us, 500 * us,
			"lost at 0.000400s, before its unlock", 510 * us, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			end, why := beliefEnd(tc.unlockCall, tc.lease, tc.lost)
			if end != tc.end || why != tc.why {
				t.Fatalf("beliefEnd = %v, %q; want %v, %q", end, why, tc.end, tc.why)
			}
			a := grant{Worker: 0, Res: "r", Handle: 1, Token: 5, Start: 0, End: end, LeaseEnd: tc.lease, Why: why}
			b := grant{Worker: 1, Res: "r", Handle: 2, Token: 6, Start: tc.next, End: tc.next + 1000*us, LeaseEnd: tc.next + 1000*us}
			vs, _ := checkSafety([]grant{a, b})
			if (len(vs) > 0) != tc.overlap {
				t.Fatalf("violations %v, want an overlap: %v", vs, tc.overlap)
			}
		})
	}
}

// checkArrivals flags a grant short on arrival after a quiet wait, and only
// counts one whose wait saw a fault.
func TestCheckArrivals(t *testing.T) {
	sec := int64(time.Second)
	usable := grant{Res: "r", Call: 0, Start: 5 * sec, Arrival: 5*sec + int64(lease.MinUsable(min(ttl, grace)))}
	short := grant{Res: "r", Call: 10 * sec, Start: 12 * sec, Arrival: 12*sec + int64(lease.MinUsable(min(ttl, grace)))/2}
	lost := grant{Res: "r", Call: 20 * sec, Start: 22 * sec}
	faultDuring := []event{{T: 11 * sec, Round: 1, What: "kill"}, {T: 11*sec + sec/2, Round: 1, What: "healthy, leader"}}
	faultBefore := []event{{T: 1 * sec, Round: 1, What: "kill"}, {T: 2 * sec, Round: 1, What: "healthy, leader"}}
	for _, tc := range []struct {
		name       string
		grants     []grant
		events     []event
		vs, faulty int
	}{
		{"usable", []grant{usable}, nil, 0, 0},
		{"short and lost without a fault", []grant{usable, short, lost}, nil, 2, 0},
		{"short after a fault in its wait", []grant{short}, faultDuring, 0, 1},
		{"short after a fault long before its wait", []grant{short}, faultBefore, 1, 0},
		{"a fault never healed covers what follows", []grant{short, lost}, faultDuring[:1], 0, 2},
	} {
		vs, faulty := checkArrivals(tc.grants, tc.events)
		if len(vs) != tc.vs || faulty != tc.faulty {
			t.Errorf("%s: %d violations, %d after a fault; want %d, %d (%v)", tc.name, len(vs), faulty, tc.vs, tc.faulty, vs)
		}
	}
}
