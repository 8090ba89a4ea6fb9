package locktable

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// replica is a Table that records, as text, every event it reports.
type replica struct {
	tab *Table
	log []string
}

func (r *replica) onEvent(e Event) { r.log = append(r.log, fmt.Sprintf("event %+v", e)) }

// fataler is what the helpers need of testing.TB and *rapid.T.
type fataler interface {
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

func snapConfig(r *replica) Config {
	seed := [32]byte{9}
	return Config{Seed: &seed, SessionGrace: 40 * time.Millisecond, FirstToken: 100, MaxQueueLen: 4,
		MaxLocks: 12, OnEvent: r.onEvent}
}

func newReplica(t fataler) *replica {
	r := &replica{}
	tab, err := New(snapConfig(r))
	if err != nil {
		t.Fatal(err)
	}
	r.tab = tab
	return r
}

func restoreReplica(t fataler, data []byte) *replica {
	r := &replica{}
	cfg := snapConfig(r)
	cfg.Seed = &[32]byte{1} // ignored: the generator comes from the snapshot
	cfg.FirstToken = 7      // ignored too
	tab, err := Restore(cfg, data)
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	r.tab = tab
	return r
}

func mustMarshal(t fataler, tab *Table) []byte {
	b, err := tab.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// snapOp is one call on a Table, drawn once and applied to several.
type snapOp struct {
	kind           string
	now            int64 // the call's time; may be earlier than the Table's
	sess, owner    string
	from           string
	res            []string
	modes          []Mode
	ttl, timeout   time.Duration
	tolerate       int
	try, noReentry bool
	id             int // index into the ids seen (one past: an unknown id)
	until          int64
}

var snapKinds = []string{"attach", "detach", "lock", "lock", "lock", "extend", "unlock", "renew", "release",
	"releaseAll", "evict", "hold", "failover", "advance", "advance", "page", "lookup", "sessionLocks", "locks"}

func drawSnapOp(rt *rapid.T, now int64, nids int) snapOp {
	op := snapOp{
		kind:      rapid.SampledFrom(snapKinds).Draw(rt, "kind"),
		now:       now,
		sess:      rapid.SampledFrom(modelSessions).Draw(rt, "session"),
		owner:     rapid.SampledFrom(modelOwners).Draw(rt, "owner"),
		from:      rapid.SampledFrom(modelCallers).Draw(rt, "from"),
		res:       rapid.SliceOfN(rapid.SampledFrom(modelResources), 1, 3).Draw(rt, "resources"),
		ttl:       time.Duration(rapid.SampledFrom([]int{5, 10, 20, 20, 40}).Draw(rt, "ttl")) * time.Millisecond,
		timeout:   time.Duration(rapid.SampledFrom([]int{0, 0, 5, 20, 40}).Draw(rt, "timeout")) * time.Millisecond,
		tolerate:  rapid.SampledFrom([]int{0, 0, 0, 1, 2}).Draw(rt, "tolerate"),
		try:       rapid.IntRange(0, 6).Draw(rt, "try") == 0,
		noReentry: rapid.IntRange(0, 4).Draw(rt, "noReentry") == 0,
		id:        rapid.IntRange(0, nids).Draw(rt, "id"),
	}
	op.modes = drawModes(rt, op.res)
	switch op.kind {
	case "advance":
		// Often to a deadline exactly, so that several fall due at once.
		op.now += int64(rapid.SampledFrom([]int{0, 5, 5, 10, 20, 40}).Draw(rt, "ms")) * ms
	case "hold", "failover":
		op.until = now + int64(rapid.IntRange(-5, 60).Draw(rt, "until"))*ms
	}
	if rapid.IntRange(0, 20).Draw(rt, "backwards") == 0 {
		op.now -= 3 * ms // time never runs backwards: the Table clamps it
	}
	return op
}

// apply runs op on r and logs its result; it returns the ids it made known.
func (op *snapOp) apply(r *replica, ids []ID) []ID {
	tab := r.tab
	id := ID{0xff, 0xff, 0xff}
	if op.id < len(ids) {
		id = ids[op.id]
	}
	var res any
	switch op.kind {
	case "attach":
		res = tab.Attach(op.now, op.sess)
	case "detach":
		tab.Detach(op.now, op.sess)
	case "lock":
		g, err := tab.Lock(op.now, &Request{Session: op.sess, Resources: op.res, TTL: op.ttl, Timeout: op.timeout,
			Tolerate: op.tolerate, Try: op.try, Owner: op.owner, NoReentry: op.noReentry, Modes: op.modes})
		if err == nil && !g.Renewed {
			ids = append(ids, g.ID)
		}
		res = fmt.Sprint(g, err)
	case "extend":
		exp, err := tab.Extend(op.now, id, op.ttl, op.from)
		res = fmt.Sprint(exp, err)
	case "unlock":
		res = tab.Unlock(op.now, id, op.from)
	case "renew":
		g, err := tab.Renew(op.now, op.owner, op.res, op.ttl, op.from)
		res = fmt.Sprint(g, err)
	case "release":
		res = tab.Release(op.now, op.owner, op.res)
	case "releaseAll":
		res = tab.ReleaseAll(op.now, op.owner)
	case "evict":
		n, err := tab.Evict(op.now, op.res)
		res = fmt.Sprint(n, err)
	case "hold":
		tab.HoldGrants(op.now, op.until)
		res = tab.HoldUntil()
	case "failover":
		res = tab.Failover(op.now, op.until)
	case "advance":
		tab.Advance(op.now)
	case "page":
		var qs []QueueInfo
		next := tab.QueuesPage("", "", 10, 100, func(qi QueueInfo) bool { qs = append(qs, qi); return true })
		res = fmt.Sprintf("%+v %q", qs, next)
	case "lookup":
		li, ok := tab.Lookup(id)
		res = fmt.Sprintf("%+v %v", li, ok)
	case "sessionLocks":
		var ls []LockInfo
		tab.SessionLocks(op.sess, func(li LockInfo) { ls = append(ls, li) })
		res = fmt.Sprintf("%+v", ls)
	case "locks":
		var ls []LockInfo
		tab.Locks(0, func(li LockInfo) bool { ls = append(ls, li); return true })
		res = fmt.Sprintf("%+v", ls)
	}
	d, ok := tab.NextDeadline()
	r.log = append(r.log, fmt.Sprintf("%s -> %v; stats %+v; next %d %v; now %d", op.kind, res, tab.Stats(), d, ok, tab.Now()))
	return ids
}

// TestSnapshotRestoreBehavesTheSame runs random calls on a Table A and, from
// a random point on, on B restored from A's snapshot taken there, and on C,
// a Table with A's seed that went through the same calls: every result and
// event must be the same, and so must the snapshots at the end, byte for
// byte. A snapshot of B right after Restore is the snapshot it came from.
func TestSnapshotRestoreBehavesTheSame(t *testing.T) {
	t.Parallel() // CPU-bound: beside the other, on the second core
	rapid.Check(t, func(rt *rapid.T) {
		a, c := newReplica(rt), newReplica(rt)
		var b *replica
		now := 1000 * ms
		for _, s := range modelSessions {
			for _, r := range []*replica{a, c} {
				r.tab.Attach(now, s)
			}
		}
		var ids []ID
		steps := rapid.IntRange(1, 120).Draw(rt, "steps")
		at := rapid.IntRange(0, steps).Draw(rt, "snapshot at")
		for i := range steps {
			if i == at {
				snap := mustMarshal(rt, a.tab)
				b = restoreReplica(rt, snap)
				if again := mustMarshal(rt, b.tab); !bytes.Equal(again, snap) {
					rt.Fatalf("the snapshot of a restored table differs from its source")
				}
				a.log = nil
			}
			op := drawSnapOp(rt, now, len(ids))
			now = max(now, op.now)
			newIDs := op.apply(a, ids)
			op.apply(c, ids)
			if b != nil {
				op.apply(b, ids)
			}
			ids = newIDs
		}
		sa, sc := mustMarshal(rt, a.tab), mustMarshal(rt, c.tab)
		if !bytes.Equal(sa, sc) {
			rt.Fatalf("two tables with one seed and one history have different snapshots")
		}
		if b == nil {
			return
		}
		if sb := mustMarshal(rt, b.tab); !bytes.Equal(sa, sb) {
			rt.Fatalf("the restored table's snapshot differs from the original's")
		}
		n := len(b.log)
		a.log = a.log[len(a.log)-n:] // a's log since the snapshot; b's since its restore
		for i := range n {
			if a.log[i] != b.log[i] {
				rt.Fatalf("after the restore, step %d:\noriginal %s\nrestored %s", i, a.log[i], b.log[i])
			}
		}
	})
}

// scenario builds a Table in most of the states a snapshot must keep: held,
// waiting, multi-resource, revoked, partially released and no-reentry locks,
// wait timeouts, a detached session, a hold on grants with a grantable
// waiter, and deadlines due at one instant.
func scenario(t testing.TB) *harness {
	h := newHarness(t, Config{SessionGrace: 50 * time.Millisecond})
	tab := h.tab
	h.mustLock("s1", "a|b|c", 100*time.Millisecond, 0)
	h.mustLock("s2", "b", 30*time.Millisecond, 20*time.Millisecond)
	h.mustLock("s3", "d", 40*time.Millisecond, 0)
	h.mustLock("s3", "e|a", 40*time.Millisecond, 0)
	if _, err := tab.Lock(h.now, &Request{Session: "s2", Resources: []string{"f", "g"}, TTL: time.Second, Owner: "o"}); err != nil {
		t.Fatal(err)
	}
	if _, err := tab.Lock(h.now, &Request{Session: "s2", Resources: []string{"h"}, TTL: time.Second, Owner: "n", NoReentry: true}); err != nil {
		t.Fatal(err)
	}
	tab.Release(h.now, "o", []string{"g"})
	if _, err := tab.Evict(h.now, []string{"d"}); err != nil {
		t.Fatal(err)
	}
	// Readers and a waiting writer behind them; a semaphore with a waiter.
	for _, m := range []string{"s", "s", "x", "s"} {
		if _, err := h.lockM("s1", "r", m, false, ""); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range []string{"2/3|s", "1/3|s", "2/3|x"} {
		if _, err := h.lockM("s2", "p|r2", m, false, ""); err != nil {
			t.Fatal(err)
		}
	}
	tab.Detach(h.now, "s3")
	tab.Attach(h.now, "s4")
	tab.HoldGrants(h.now, h.now+int64(10*time.Millisecond))
	h.mustLock("s4", "z", time.Second, 0) // grantable, held back
	h.events = nil
	return h
}

func TestSnapshotRoundTrip(t *testing.T) {
	h := scenario(t)
	snap := mustMarshal(t, h.tab)
	var events []Event
	b, err := Restore(Config{SessionGrace: 50 * time.Millisecond, OnEvent: func(e Event) { events = append(events, e) }}, snap)
	if err != nil {
		t.Fatal(err)
	}
	if again := mustMarshal(t, b); !bytes.Equal(again, snap) {
		t.Fatal("snapshot of the restored table differs")
	}
	if sa, sb := h.tab.Stats(), b.Stats(); sa != sb {
		t.Fatalf("stats %+v, restored %+v", sa, sb)
	}
	dump := func(tab *Table) string {
		var sb strings.Builder
		tab.Locks(0, func(li LockInfo) bool { fmt.Fprintf(&sb, "%+v\n", li); return true })
		tab.QueuesPage("", "", 100, 100, func(qi QueueInfo) bool { fmt.Fprintf(&sb, "%+v\n", qi); return true })
		for _, s := range []string{"s1", "s2", "s3", "s4"} {
			tab.SessionLocks(s, func(li LockInfo) { fmt.Fprintf(&sb, "%s %v\n", s, li.ID) })
		}
		d, ok := tab.NextDeadline()
		fmt.Fprintln(&sb, d, ok, tab.HoldUntil(), tab.Now(), tab.HasSession("s3"))
		return sb.String()
	}
	if da, db := dump(h.tab), dump(b); da != db {
		t.Fatalf("state differs:\n%s\nrestored:\n%s", da, db)
	}
	// The same future: run both past every deadline.
	for range 30 {
		h.now += 5 * ms
		h.tab.Advance(h.now)
		b.Advance(h.now)
		req := Request{Session: "s1", Resources: []string{"a", "q"}, TTL: 7 * time.Millisecond}
		ga, ea := h.tab.Lock(h.now, &req)
		gb, eb := b.Lock(h.now, &req)
		if ga != gb || fmt.Sprint(ea) != fmt.Sprint(eb) {
			t.Fatalf("lock: %+v %v, restored %+v %v", ga, ea, gb, eb)
		}
	}
	if fmt.Sprint(h.events) != fmt.Sprint(events) {
		t.Fatalf("events:\n%+v\nrestored:\n%+v", h.events, events)
	}
	if len(events) < 10 {
		t.Fatalf("only %d events: the scenario did not run its course", len(events))
	}
	if !bytes.Equal(mustMarshal(t, h.tab), mustMarshal(t, b)) {
		t.Fatal("final snapshots differ")
	}
}

func TestRestoreRejectsCorruptSnapshots(t *testing.T) {
	t.Parallel() // CPU-bound: beside the other, on the second core
	snap := mustMarshal(t, scenario(t).tab)
	for n := range len(snap) {
		if _, err := Restore(Config{}, snap[:n]); err == nil {
			t.Fatalf("restore of %d of %d bytes succeeded", n, len(snap))
		}
	}
	if _, err := Restore(Config{}, append(snap[:len(snap):len(snap)], 0)); !errors.Is(err, ErrCorruptSnapshot) {
		t.Fatalf("trailing byte: %v", err)
	}
	v3 := append([]byte(snapshotMagic), snapshotVersion+1)
	if _, err := Restore(Config{}, append(v3, snap[len(v3):]...)); err == nil || errors.Is(err, ErrCorruptSnapshot) ||
		!strings.Contains(err.Error(), "version 3") {
		t.Fatalf("version 3: %v", err)
	}
	if _, err := Restore(Config{MaxTTL: -1}, snap); err == nil {
		t.Fatal("restore with a bad config succeeded")
	}
	// Every single-byte change either fails or gives a table that works
	// and snapshots as it was read.
	for i := range snap {
		bad := bytes.Clone(snap)
		bad[i] ^= 0x41
		checkRestored(t, bad)
	}
}

// checkRestored restores data and, if that succeeds, checks that the table
// snapshots as it was read and runs to its end without a panic.
func checkRestored(t *testing.T, data []byte) {
	tab, err := Restore(Config{}, data)
	if err != nil {
		if !errors.Is(err, ErrCorruptSnapshot) && !strings.Contains(err.Error(), "version") {
			t.Fatalf("unexpected error %v", err)
		}
		return
	}
	again, err := tab.MarshalBinary()
	if len(data) > len(snapshotMagic) && data[len(snapshotMagic)] == 1 {
		// A version 1 snapshot has no grant times: compare it written again
		// as version 1.
		again, err = tab.appendVersion(nil, 1)
	}
	if err != nil || !bytes.Equal(again, data) {
		t.Fatalf("a restored snapshot does not marshal as it was read (%v)", err)
	}
	tab.Attach(tab.Now(), "x")
	for i := range 5 {
		g, err := tab.Lock(tab.Now(), &Request{Session: "x", Resources: []string{"a", "b", fmt.Sprint(i)}, TTL: time.Second, Timeout: time.Second})
		if err == nil {
			_, _ = tab.Extend(tab.Now(), g.ID, time.Second, "x")
		}
		tab.ReleaseAll(tab.Now(), "o")
		tab.Failover(tab.Now(), tab.Now()+int64(time.Second))
	}
	tab.Detach(tab.Now(), "x")
	for range 100 {
		d, ok := tab.NextDeadline()
		if !ok {
			break
		}
		tab.Advance(d)
	}
	if st := tab.Stats(); st.Sessions == 0 && (st.Live != 0 || st.Entries != 0 || st.NameBytes != 0 || st.Held != 0 || st.Queues != 0) {
		t.Fatalf("leftovers after every session ended: %+v", st)
	}
}

func FuzzRestore(f *testing.F) {
	f.Add(mustMarshal(f, scenario(f).tab))
	empty, _ := New(Config{Seed: &[32]byte{}})
	f.Add(mustMarshal(f, empty))
	h := scenario(f)
	h.advance(15 * time.Millisecond) // the hold ends
	f.Add(mustMarshal(f, h.tab))
	f.Add([]byte(snapshotMagic))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkRestored(t, data)
	})
}

// TestDeadlinesAtOneInstantInArrivalOrder: deadlines due at the same time
// are processed in the order their requests arrived (a session's grace end
// in the order of its detach), whatever order they were set in.
func TestDeadlinesAtOneInstantInArrivalOrder(t *testing.T) {
	h := newHarness(t, Config{SessionGrace: 26 * time.Millisecond})
	names := map[ID]string{}
	tab := h.tab
	tab.Attach(h.now, "s4")
	// Four locks that all expire at T+30ms, set one ms apart.
	for i, n := range []string{"a", "b", "c", "d"} {
		g := h.mustLock("s1", n, time.Duration(30-i)*time.Millisecond, 0)
		names[g.ID] = n
		h.advance(time.Millisecond)
	}
	// At T+4ms: a waiter for d that times out at T+30ms too, and two
	// sessions whose grace ends then.
	w := h.mustLock("s4", "d", time.Second, 26*time.Millisecond)
	names[w.ID] = "w"
	tab.Detach(h.now, "s3")
	tab.Detach(h.now, "s2")
	h.advance(26 * time.Millisecond)
	got := strings.Join(h.take(names), " ")
	// d expires before w's timeout is looked at, since d arrived first: w
	// is granted.
	want := "expired:a expired:b expired:c expired:d granted:w closed:s3 closed:s2"
	if got != want {
		t.Fatalf("events %s\nwant   %s", got, want)
	}
}

func TestFailover(t *testing.T) {
	h := newHarness(t, Config{SessionGrace: 50 * time.Millisecond})
	tab := h.tab
	names := map[ID]string{}
	name := func(g Grant, n string) ID { names[g.ID] = n; return g.ID }
	g1 := name(h.mustLock("s1", "a", 10*time.Millisecond, 0), "g1")
	g2 := name(h.mustLock("s1", "b", 100*time.Millisecond, 0), "g2")
	w := name(h.mustLock("s2", "a", time.Second, 20*time.Millisecond), "w")
	w2 := name(h.mustLock("s2", "b", time.Second, 0), "w2")
	g3 := name(h.mustLock("s3", "c", 30*time.Millisecond, 0), "g3")
	tab.Detach(h.now, "s3")                                // its grace ends at T+50ms
	tab.HoldGrants(h.now, h.now+int64(5*time.Millisecond)) // ends before until: left alone
	until := h.now + 60*ms
	if n := tab.Failover(h.now, until); n != 4 { // g1, w, g3, s3
		t.Fatalf("Failover moved %d deadlines, want 4", n)
	}
	for id, want := range map[ID]int64{g1: until, w: until, g3: until, g2: h.now + 100*ms, w2: 0} {
		if li, _ := tab.Lookup(id); li.Deadline != want {
			t.Fatalf("%s: deadline %d, want %d", names[id], li.Deadline, want)
		}
	}
	if li, _ := tab.Lookup(g1); li.TTL != 10*time.Millisecond {
		t.Fatalf("the TTL changed: %v", li.TTL)
	}
	if d, _ := tab.NextDeadline(); d != h.now+5*ms {
		t.Fatalf("the hold moved: next deadline %d", d)
	}
	h.advance(59 * time.Millisecond)
	if ev := h.take(names); len(ev) != 0 || !tab.HasSession("s3") {
		t.Fatalf("before until: %v, s3 live %v", ev, tab.HasSession("s3"))
	}
	h.advance(time.Millisecond)
	// At until, in arrival order: g1 expires and w, behind it, is granted
	// before its own timeout is looked at; then s3's lock and session go.
	got := strings.Join(h.take(names), " ")
	if want := "expired:g1 granted:w expired:g3 closed:s3"; got != want {
		t.Fatalf("at until: %s, want %s", got, want)
	}
	// An until not after the deadlines moves nothing.
	if n := tab.Failover(h.now, h.now); n != 0 {
		t.Fatalf("Failover to now moved %d", n)
	}
}

// TestRestoreVersion1Modes: a snapshot of the format before modes and grant
// times (version 1, every lock exclusive) still restores to the same state,
// and a version 1 snapshot that carries modes is corrupt.
func TestRestoreVersion1Modes(t *testing.T) {
	h := newHarness(t, Config{})
	h.mustLock("s1", "a|b", time.Second, 0)
	h.mustLock("s2", "b", time.Second, time.Second)
	v1, err := h.tab.appendVersion(nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	r, err := Restore(Config{}, v1)
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := r.appendVersion(nil, 1); !bytes.Equal(again, v1) {
		t.Fatal("a version 1 snapshot restores to another state")
	}
	h.mustLockM("s3", "c", "s")
	v1, _ = h.tab.appendVersion(nil, 1)
	if _, err := Restore(Config{}, v1); !errors.Is(err, ErrCorruptSnapshot) {
		t.Fatalf("version 1 with modes: %v", err)
	}
}
