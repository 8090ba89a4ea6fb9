package locktable

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// The model is the simplest statement of the rules: live requests in arrival
// order; a request is admitted on a resource when it and every earlier live
// request naming it are compatible (see Mode: at most one of them, or no
// exclusive one and no more permits than the semaphore has), and it holds
// its resources exactly when it is admitted on all of them. So no
// incompatible requests hold one resource, a waiting request blocks every
// later one it does not fit with (no barging), and no request waits while
// it is admitted everywhere. The engine's answers and events drive the model; every
// event is checked for legality, and after every step the model and the
// engine must agree and the invariants must hold: among them, what a holder
// was told it holds (its grant, less what a partial release reported taking)
// is exactly what the engine gives it, nothing is granted to a dropped
// session, Renew finds exactly the lock the model says the owner holds,
// nothing is granted while grants are held (HoldGrants), after which
// everything grantable is, a renewal from another session never shortens a
// lock, an unlock from another session and an eviction tell the holder, an
// evicted lock is revoked (it keeps its resources until min(expiry, now +
// grace), and is nobody's: Extend, Renew and re-entry do not find it, while
// Unlock, Release and ReleaseAll free it without telling its holder again),
// the caps refuse exactly the requests that do not fit, the engine's
// counters equal a recount, and Head and QueuesPage list what the model
// holds.

type mreq struct {
	id        ID
	session   string
	owner     string
	noReentry bool
	res       map[string]bool // what the holder was told it holds (or waits for)
	modes     map[string]Mode // the mode of each resource
	granted   bool
	token     uint64
	expires   int64
	deadline  int64 // wait deadline, 0 none
	partial   bool  // a Release took some of its resources: Extend does not find it
	revoked   bool  // evicted: nobody's, ends at expires
}

// size is r's name bytes, as the caps count them.
func (r *mreq) size() int64 {
	b := int64(len(r.owner))
	for res := range r.res {
		b += int64(len(res))
	}
	return b
}

type model struct {
	t         *rapid.T
	tab       *Table
	now       int64
	grace     int64   // the session grace; 0 with noGrace
	noGrace   bool    // SessionGrace < 0: a detach drops at once, an eviction removes at once
	reqs      []*mreq // arrival order
	detached  map[string]int64
	dropped   map[string]bool
	lastToken uint64
	holdUntil int64 // grants are held while now < holdUntil
	pending   []Event
	// During a release step: the Released events the model expects, by
	// request, true for a partial release.
	expect map[ID]bool
	// evicting: during an evict step, a Released event revokes the lock
	// instead of removing it.
	evicting bool
	// believers: for each granted request, the sessions that were told they
	// hold it and not told since that they do not (a grant, a re-entry; a
	// Released with Moved, a partial release). Only the engine's holder may
	// believe it holds a lock.
	believers map[ID]map[string]bool
	// moves: the Released events with Moved not yet matched to the
	// re-entry that made them.
	moves []Event
	// The caps in force (Config.MaxLocks etc.; no limit when negative).
	maxLocks, maxEntries       int
	maxNameBytes, maxSessBytes int64
}

// totals recounts the live requests' queue entries and name bytes, and the
// name bytes of session sess.
func (m *model) totals(sess string) (entries int, bytes, sessBytes int64) {
	for _, r := range m.reqs {
		entries += len(r.res)
		bytes += r.size()
		if r.session == sess {
			sessBytes += r.size()
		}
	}
	return entries, bytes, sessBytes
}

// over reports whether v is above the cap c (no limit when c < 0).
func over[T int | int64](v, c T) bool { return c >= 0 && v > c }

// expiry is the expiry of r after a renewal for ttl from session from.
func (m *model) expiry(r *mreq, ttl time.Duration, from string) int64 {
	at := m.now + int64(ttl)
	if from != r.session {
		at = max(at, r.expires)
	}
	return at
}

func (m *model) find(id ID) (int, *mreq) {
	for i, r := range m.reqs {
		if r.id == id {
			return i, r
		}
	}
	return -1, nil
}

func (m *model) del(id ID) {
	i, _ := m.find(id)
	m.reqs = slices.Delete(m.reqs, i, i+1)
	delete(m.believers, id)
}

// believe records that session was told it holds id.
func (m *model) believe(id ID, session string) {
	if m.believers[id] == nil {
		m.believers[id] = map[string]bool{}
	}
	m.believers[id][session] = true
}

// isDropped reports whether session s has been dropped by now.
func (m *model) isDropped(s string) bool {
	if at, ok := m.detached[s]; ok && at+m.grace <= m.now {
		m.dropped[s] = true
	}
	return m.dropped[s]
}

// holding reports whether grants are held.
func (m *model) holding() bool { return m.now < m.holdUntil }

// compatible reports whether entries in modes ms may hold one resource
// together.
func compatible(ms []Mode) bool {
	if len(ms) <= 1 {
		return true
	}
	sum := uint64(0)
	for _, md := range ms {
		if md.Permits == 0 {
			return false
		}
		sum += uint64(md.Permits)
	}
	return ms[0].Of == 0 || sum <= uint64(ms[0].Of)
}

// admitted reports whether request i is admitted on resource r: it and
// every earlier request naming r are compatible.
func (m *model) admitted(i int, r string) bool {
	var ms []Mode
	for _, p := range m.reqs[:i+1] {
		if p.res[r] {
			ms = append(ms, p.modes[r])
		}
	}
	return compatible(ms)
}

// blocked reports whether request i waits for some resource: it is not
// admitted on all of them.
func (m *model) blocked(i int) bool {
	for r := range m.reqs[i].res {
		if !m.admitted(i, r) {
			return true
		}
	}
	return false
}

func (m *model) token(tok uint64) {
	if tok <= m.lastToken {
		m.t.Fatalf("token %d not above %d", tok, m.lastToken)
	}
	m.lastToken = tok
}

// apply checks and applies the events the engine reported.
func (m *model) apply() {
	evs := m.pending
	m.pending = nil
	for _, e := range evs {
		if e.Kind == SessionClosed {
			if at, ok := m.detached[e.Session]; !ok || at+m.grace > m.now {
				m.t.Fatalf("closed live session %s", e.Session)
			}
			m.dropped[e.Session] = true
			continue
		}
		i, r := m.find(e.ID)
		if r == nil {
			m.t.Fatalf("event %v for unknown request %s", e.Kind, e.ID.Short())
		}
		switch e.Kind {
		case Granted:
			if r.granted {
				m.t.Fatalf("granted twice: %s", e.ID.Short())
			}
			if m.holding() {
				m.t.Fatalf("granted %s at %d while grants are held until %d", e.ID.Short(), m.now, m.holdUntil)
			}
			if m.blocked(i) {
				m.t.Fatalf("granted %s past an earlier request it does not fit with (FIFO, no barging)", e.ID.Short())
			}
			if m.dropped[r.session] {
				m.t.Fatalf("granted %s to the dropped session %s", e.ID.Short(), r.session)
			}
			if r.deadline != 0 && r.deadline < m.now {
				m.t.Fatalf("granted %s at %d past its wait deadline %d", e.ID.Short(), m.now, r.deadline)
			}
			if e.Session != r.session {
				m.t.Fatalf("granted %s in session %s, model %s", e.ID.Short(), e.Session, r.session)
			}
			m.token(e.Token)
			r.granted, r.token, r.expires, r.deadline = true, e.Token, e.ExpiresAt, 0
			m.believe(r.id, r.session)
		case TimedOut:
			if r.granted || r.deadline == 0 || r.deadline > m.now {
				m.t.Fatalf("illegal timeout of %+v at %d", r, m.now)
			}
			m.del(e.ID)
		case Expired:
			if !r.granted || r.expires > m.now {
				m.t.Fatalf("illegal expiry of %+v at %d", r, m.now)
			}
			m.del(e.ID)
		case Released:
			if !r.granted || e.Token != r.token {
				m.t.Fatalf("released %+v with token %d", r, e.Token)
			}
			if e.Moved {
				// A re-entry from another session: checked by lock. The
				// session it leaves no longer believes it holds it.
				if e.Partial || e.Session != r.session {
					m.t.Fatalf("move of %s reported to %s (partial=%v); it was in %s", e.ID.Short(), e.Session, e.Partial, r.session)
				}
				m.moves = append(m.moves, e)
				delete(m.believers[e.ID], e.Session)
				continue
			}
			if m.expect != nil {
				partial, ok := m.expect[e.ID]
				if !ok || partial != e.Partial {
					m.t.Fatalf("release reported %s partial=%v; model expects %v (%v)", e.ID.Short(), e.Partial, partial, ok)
				}
				delete(m.expect, e.ID)
			} else if e.Partial {
				m.t.Fatalf("partial release of %s outside Release", e.ID.Short())
			}
			switch {
			case m.evicting && m.noGrace:
				m.del(e.ID) // no grace: removed at once
			case m.evicting:
				r.revoked = true
				r.expires = min(r.expires, m.now+m.grace)
				delete(m.believers, e.ID) // its holder is told it lost it
			case !e.Partial:
				m.del(e.ID)
			default:
				delete(m.believers, e.ID) // its holder is told it lost it
			}
		case Dropped:
			at, ok := m.detached[r.session]
			if !ok || at+m.grace > m.now || e.Session != r.session {
				m.t.Fatalf("dropped a request of a live session %s (event session %s)", r.session, e.Session)
			}
			if e.Held != r.granted {
				m.t.Fatalf("dropped %s held=%v, model granted=%v", e.ID.Short(), e.Held, r.granted)
			}
			m.dropped[r.session] = true
			m.del(e.ID)
		}
	}
}

func (m *model) check() {
	m.apply()
	if err := checkIndex(m.tab); err != nil {
		m.t.Fatal(err)
	}
	if len(m.moves) != 0 {
		m.t.Fatalf("moves reported outside a re-entry: %+v", m.moves)
	}
	for id, sessions := range m.believers {
		_, r := m.find(id)
		for s := range sessions {
			if r == nil || !r.granted || r.session != s {
				m.t.Fatalf("session %s believes it holds %s, which the engine gives to %+v", s, id.Short(), r)
			}
		}
	}
	wantHold := int64(0)
	if m.holding() {
		wantHold = m.holdUntil
	}
	if got := m.tab.HoldUntil(); got != wantHold {
		m.t.Fatalf("engine holds grants until %d, model %d", got, wantHold)
	}
	for i, r := range m.reqs {
		// While grants are held, a grantable request waits.
		switch want := !m.blocked(i); {
		case r.granted && !want:
			m.t.Fatalf("request %s granted past an earlier request it does not fit with (FIFO, no barging)", r.id.Short())
		case !r.granted && want && !m.holding():
			m.t.Fatalf("request %s waits while admitted on all its queues", r.id.Short())
		}
		if r.granted {
			if r.expires <= m.now {
				m.t.Fatalf("request %s held past its expiry", r.id.Short())
			}
		} else if r.deadline != 0 && r.deadline <= m.now {
			m.t.Fatalf("request %s waiting past its timeout", r.id.Short())
		}
		if at, ok := m.detached[r.session]; ok && at+m.grace <= m.now {
			m.t.Fatalf("request %s of a dropped session still live", r.id.Short())
		}
		li, ok := m.tab.Lookup(r.id)
		if !ok || li.Granted != r.granted || (r.granted && li.Token != r.token) || li.Session != r.session || li.Revoked != r.revoked {
			m.t.Fatalf("engine and model disagree on %s: %+v vs %+v", r.id.Short(), li, r)
		}
		if r.granted && li.Deadline != r.expires {
			m.t.Fatalf("engine expiry of %s is %d, model %d", r.id.Short(), li.Deadline, r.expires)
		}
		// What the holder was told it holds is what the engine gives it,
		// in the modes it asked for.
		same := len(li.Resources) == len(r.res) && (li.Modes == nil || len(li.Modes) == len(li.Resources))
		for j, res := range li.Resources {
			md := Exclusive
			if li.Modes != nil {
				md = li.Modes[j]
			}
			same = same && r.res[res] && md == r.modes[res]
		}
		if !same {
			m.t.Fatalf("request %s holds or waits for %v %v in the engine, model %v %v", r.id.Short(), li.Resources, li.Modes, r.res, r.modes)
		}
	}
	// No incompatible holders on any resource; one count of permits per
	// queue.
	for _, res := range modelResources {
		var held []Mode
		of := map[uint32]bool{}
		for _, r := range m.reqs {
			if md, ok := r.modes[res]; ok && r.res[res] {
				if r.granted {
					held = append(held, md)
				}
				if md.Permits > 0 {
					of[md.Of] = true
				}
			}
		}
		if !compatible(held) || len(of) > 1 {
			m.t.Fatalf("resource %s held in %v (permit counts %v)", res, held, of)
		}
	}
	entries, bytes, _ := m.totals("")
	if st := m.tab.Stats(); st.Live != len(m.reqs) || st.Entries != entries || st.NameBytes != bytes {
		m.t.Fatalf("engine has %d live requests, %d entries, %d name bytes; model %d, %d, %d",
			st.Live, st.Entries, st.NameBytes, len(m.reqs), entries, bytes)
	}
	for id, s := range m.tab.sessions {
		if _, _, want := m.totals(id); s.bytes != want {
			m.t.Fatalf("session %s has %d name bytes in the engine, model %d", id, s.bytes, want)
		}
	}
	inGroup, groupSessions := 0, 0
	for _, r := range m.reqs {
		if strings.HasPrefix(r.session, "g\x00") {
			inGroup++
		}
	}
	for id := range m.tab.sessions {
		if strings.HasPrefix(id, "g\x00") {
			groupSessions++
		}
	}
	if got := m.tab.GroupSessions("g"); got != groupSessions {
		m.t.Fatalf("group g has %d sessions in the engine, model %d", got, groupSessions)
	}
	if got := m.tab.GroupRequests("g"); got != inGroup {
		m.t.Fatalf("group g has %d live requests in the engine, model %d", got, inGroup)
	}
	if g := m.tab.groups["g"]; (g != nil) != (groupSessions > 0) || (g != nil && g.sessions != groupSessions) {
		m.t.Fatalf("group g: %+v in the engine, %d sessions", g, groupSessions)
	}
	if m.tab.GroupRequests("s0") != 0 || len(m.tab.groups) > 1 {
		m.t.Fatalf("groups %v: only g is one", m.tab.groups)
	}
	if len(m.tab.sessions) == 0 && (m.tab.entries != 0 || m.tab.bytes != 0) {
		m.t.Fatalf("no session, yet %d entries and %d bytes", m.tab.entries, m.tab.bytes)
	}
	for _, res := range modelResources {
		q := m.queue(res)
		if got := m.tab.QueueLen(res); got != len(q) {
			m.t.Fatalf("queue %s has %d entries, model %d (orphan entries)", res, got, len(q))
		}
		li, ok := m.tab.Head(res)
		if ok != (len(q) > 0) || (ok && (li.ID != q[0].id || li.Granted != q[0].granted)) {
			m.t.Fatalf("head of %s is %+v (%v), model %v", res, li, ok, q)
		}
	}
}

// queue returns resource's queue in the model: the requests naming it, in
// arrival order.
func (m *model) queue(resource string) []*mreq {
	var q []*mreq
	for _, r := range m.reqs {
		if r.res[resource] {
			q = append(q, r)
		}
	}
	return q
}

// modelModes are the modes a request draws: mostly exclusive and shared,
// and a semaphore of 3 permits, sometimes declared with 2 (a conflict).
var modelModes = []Mode{Exclusive, Exclusive, Shared, Shared, {Permits: 1, Of: 3}, {Permits: 1, Of: 3}, {Permits: 2, Of: 3}, {Permits: 3, Of: 3}, {Permits: 1, Of: 2}}

// drawModes draws the modes of a request on res: none (exclusive), one for
// all, or one each, mostly one per name given twice.
func drawModes(rt *rapid.T, res []string) []Mode {
	switch rapid.IntRange(0, 3).Draw(rt, "modes") {
	case 0:
		return nil
	case 1:
		return []Mode{rapid.SampledFrom(modelModes).Draw(rt, "mode")}
	}
	ms := rapid.SliceOfN(rapid.SampledFrom(modelModes), len(res), len(res)).Draw(rt, "each")
	if rapid.IntRange(0, 9).Draw(rt, "dupModes") > 0 {
		for i, r := range res {
			ms[i] = ms[slices.Index(res, r)]
		}
	}
	return ms
}

var (
	modelResources = []string{"r0", "r1", "r2", "r3", "r4"}
	// s1 and s2 are one group ("g": the server's principals), s0 none.
	modelSessions = []string{"s0", "g\x00s1", "g\x00s2"}
	modelOwners   = []string{"", "", "o1", "o2", anonOwner}
	// modelCallers are the sessions an Extend, Unlock or Renew comes from:
	// mostly the attached ones; "" is elsewhere for every lock.
	modelCallers = []string{"s0", "g\x00s1", "g\x00s2", ""}
)

// modelTTL draws leases, short and long against the 40 ms grace (rapid's
// integer ranges favour small values).
var modelTTL = rapid.Custom(func(rt *rapid.T) time.Duration {
	return time.Duration(rapid.SampledFrom([]int{1, 5, 15, 30, 45, 60, 90}).Draw(rt, "ms")) * time.Millisecond
})

// anonOwner is recorded with NoReentry, as a server records anonymous locks.
const anonOwner = "*"

func sameSet(set map[string]bool, res []string) bool {
	n := 0
	for r := range set {
		if !slices.Contains(res, r) {
			return false
		}
		n++
	}
	for _, r := range res {
		if !set[r] {
			return false
		}
	}
	return n > 0
}

// TestModel runs short histories (-rapid.steps actions on average, 30 by
// default).
func TestModel(t *testing.T) {
	rapid.Check(t, modelProp(0))
}

// modelLongRuns and modelLongSteps size TestModelLong: modelLongRuns runs of
// rapid.Check, each of -rapid.checks histories (100 by default, a fifth with
// -short) of exactly modelLongSteps actions: 6 runs (600 histories of 1 000
// actions) with the test suite, 1 under the race detector (which finds
// nothing in the engine's single goroutine and makes each run 5 to 10 times
// slower), 24 with MLOCK_MODEL_LONG=1, which CI runs without the race
// detector after the suite (.ci/run).
func modelLongRuns() int {
	switch {
	case os.Getenv("MLOCK_MODEL_LONG") != "":
		return 24
	case raceDetector:
		return 1
	}
	return 6
}

const modelLongSteps = 1000

func TestModelLong(t *testing.T) {
	for i := range modelLongRuns() {
		t.Run(fmt.Sprint("run", i), func(t *testing.T) {
			t.Parallel()
			rapid.Check(t, modelProp(modelLongSteps))
		})
	}
}

// modelProp returns the model property. steps > 0 runs exactly that many
// actions; otherwise rapid's Repeat chooses (-rapid.steps on average).
func modelProp(steps int) func(*rapid.T) { return plantedProp(steps, 0) }

// plantedProp is modelProp on an engine with a planted bug (Table.plant).
func plantedProp(steps int, plant uint8) func(*rapid.T) {
	return func(rt *rapid.T) {
		seed := [32]byte{7}
		m := &model{t: rt, now: 1000 * ms, grace: 40 * ms, detached: map[string]int64{}, dropped: map[string]bool{},
			believers: map[ID]map[string]bool{}}
		// Caps: none, or small enough to be reached.
		m.maxLocks = rapid.SampledFrom([]int{-1, 3, 6}).Draw(rt, "maxLocks")
		m.maxEntries = rapid.SampledFrom([]int{-1, 4, 9}).Draw(rt, "maxEntries")
		m.maxNameBytes = int64(rapid.SampledFrom([]int{-1, 10, 20}).Draw(rt, "maxNameBytes"))
		m.maxSessBytes = int64(rapid.SampledFrom([]int{-1, 6, 12}).Draw(rt, "maxSessionBytes"))
		if plant != 0 {
			// Histories that reach the planted bug sooner: no caps, and
			// more requests (below).
			m.maxLocks, m.maxEntries, m.maxNameBytes, m.maxSessBytes = -1, -1, -1, -1
		}
		// Sometimes no session grace: a detach drops the session at once
		// and an eviction removes the locks at once.
		grace := 40 * time.Millisecond
		if plant == 0 && rapid.IntRange(0, 4).Draw(rt, "noGrace") == 0 {
			grace, m.grace, m.noGrace = -1, 0, true
		}
		tab, err := New(Config{Seed: &seed, SessionGrace: grace, FirstToken: 100,
			MaxLocks: m.maxLocks, MaxEntries: m.maxEntries, MaxNameBytes: int(m.maxNameBytes),
			MaxSessionBytes: int(m.maxSessBytes),
			OnEvent:         func(e Event) { m.pending = append(m.pending, e) }})
		if err != nil {
			rt.Fatal(err)
		}
		m.tab = tab
		tab.plant = plant
		// A small index of names, so that the listings meet every state of
		// it: built, young queues moved in, dropped and built again.
		tab.idx.max = rapid.IntRange(1, 4).Draw(rt, "youngMax")
		tab.idx.slack = rapid.IntRange(0, 6).Draw(rt, "dropSlack")
		// A small ring of parked queues, so that emptied queues are
		// taken back, and forgotten, on the way.
		tab.parked.max = rapid.IntRange(1, 3).Draw(rt, "maxParked")
		for _, s := range modelSessions {
			tab.Attach(m.now, s)
		}
		actions := m.actions()
		if steps <= 0 {
			rt.Repeat(actions)
			return
		}
		keys := make([]string, 0, len(actions))
		for k := range actions {
			if k != "" {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		if plant != 0 {
			keys = append(keys, "lock", "lock", "lock", "lock", "unlock", "unlock")
		}
		pick := rapid.SampledFrom(keys)
		for range steps {
			actions[pick.Draw(rt, "action")](rt)
			m.check()
		}
	}
}

func (m *model) ids() []ID {
	var out []ID
	for _, r := range m.reqs {
		out = append(out, r.id)
	}
	return append(out, ID{0xff})
}

func (m *model) actions() map[string]func(*rapid.T) {
	tab := m.tab
	return map[string]func(*rapid.T){
		"lock": func(rt *rapid.T) {
			tab.Advance(m.now)
			m.apply()
			sess := rapid.SampledFrom(modelSessions).Draw(rt, "session")
			res := rapid.SliceOfN(rapid.SampledFrom(modelResources), 1, 4).Draw(rt, "resources")
			req := Request{
				Session:   sess,
				Resources: res,
				TTL:       modelTTL.Draw(rt, "ttl"),
				Timeout:   time.Duration(rapid.SampledFrom([]int{0, 0, 5, 20, 50}).Draw(rt, "timeout")) * time.Millisecond,
				Tolerate:  rapid.SampledFrom([]int{0, 0, 0, 1, 2}).Draw(rt, "tolerate"),
				Try:       rapid.Float64Range(0, 1).Draw(rt, "try") < 0.15,
				Owner:     rapid.SampledFrom(modelOwners).Draw(rt, "owner"),
				Modes:     drawModes(rt, res),
			}
			req.NoReentry = req.Owner == anonOwner
			m.lock(rt, &req)
		},
		"reenter": func(rt *rapid.T) {
			// An owner asks again, from any session, for exactly what it
			// holds: the lock is renewed and moves into that session.
			tab.Advance(m.now)
			m.apply()
			p := m.pickOwned(rt)
			if p == nil {
				return
			}
			req := Request{
				Session:   rapid.SampledFrom(modelSessions).Draw(rt, "session"),
				Resources: m.resourcesOf(rt, p),
				TTL:       modelTTL.Draw(rt, "ttl"),
				Owner:     p.owner,
			}
			// In its modes, or (an upgrade, a downgrade) not.
			for _, r := range req.Resources {
				req.Modes = append(req.Modes, p.modes[r])
			}
			if rapid.IntRange(0, 4).Draw(rt, "change") == 0 {
				md := rapid.SampledFrom(modelModes).Draw(rt, "mode")
				for i, r := range req.Resources {
					if r == req.Resources[0] {
						req.Modes[i] = md
					}
				}
			}
			m.lock(rt, &req)
		},
		"renew": func(rt *rapid.T) {
			tab.Advance(m.now)
			m.apply()
			owner := rapid.SampledFrom(modelOwners).Draw(rt, "owner")
			res := rapid.SliceOfN(rapid.SampledFrom(modelResources), 1, 4).Draw(rt, "resources")
			if p := m.pickOwned(rt); p != nil && rapid.Bool().Draw(rt, "held") {
				owner, res = p.owner, m.resourcesOf(rt, p)
			}
			m.renew(rt, owner, res)
		},
		"unlock": func(rt *rapid.T) {
			tab.Advance(m.now)
			m.apply()
			id := rapid.SampledFrom(m.ids()).Draw(rt, "id")
			from := rapid.SampledFrom(modelCallers).Draw(rt, "from")
			_, r := m.find(id)
			// A granted lock unlocked from elsewhere is reported to its
			// session; anything else is not.
			m.expect = map[ID]bool{}
			// A revoked lock's holder has been told already.
			if r != nil && r.granted && r.session != from && !r.revoked {
				m.expect[id] = false
			}
			err := tab.Unlock(m.now, id, from)
			if r != nil {
				if err != nil {
					rt.Fatalf("unlock: %v", err)
				}
				if len(m.expect) == 0 {
					m.del(id)
				}
			} else if !errors.Is(err, ErrNotFound) {
				rt.Fatalf("unlock of unknown: %v", err)
			}
			m.apply()
			if _, r := m.find(id); len(m.expect) != 0 || r != nil {
				rt.Fatalf("unlock from %s: not reported %v, still live %v", from, m.expect, r)
			}
			m.expect = nil
		},
		"evict": func(rt *rapid.T) {
			tab.Advance(m.now)
			m.apply()
			res := rapid.SliceOfN(rapid.SampledFrom(modelResources), 1, 3).Draw(rt, "resources")
			m.expect = map[ID]bool{}
			for _, r := range res {
				for _, p := range m.queue(r) {
					if p.granted && !p.revoked {
						m.expect[p.id] = false
					}
				}
			}
			want := len(m.expect)
			n, err := tab.Evict(m.now, res)
			m.evicting = true
			m.apply()
			m.evicting = false
			if err != nil || n != want || len(m.expect) != 0 {
				rt.Fatalf("evict %v = %d, %v; want %d; not reported: %v", res, n, err, want, m.expect)
			}
			m.expect = nil
		},
		"page": func(rt *rapid.T) {
			tab.Advance(m.now)
			m.apply()
			m.page(rt)
		},
		"extend": func(rt *rapid.T) {
			tab.Advance(m.now)
			m.apply()
			id := rapid.SampledFrom(m.ids()).Draw(rt, "id")
			ttl := modelTTL.Draw(rt, "ttl")
			from := rapid.SampledFrom(modelCallers).Draw(rt, "from")
			exp, err := tab.Extend(m.now, id, ttl, from)
			m.apply()
			_, r := m.find(id)
			switch {
			case r == nil || r.partial || r.revoked:
				if !errors.Is(err, ErrNotFound) {
					rt.Fatalf("extend unknown, partially released or revoked: %v", err)
				}
			case !r.granted:
				if !errors.Is(err, ErrNotGranted) {
					rt.Fatalf("extend waiting: %v", err)
				}
			default:
				if want := m.expiry(r, ttl, from); err != nil || exp != want {
					rt.Fatalf("extend of %s (expires %d) from %s = %d, %v; want %d", r.id.Short(), r.expires, from, exp, err, want)
				}
				r.expires = exp
			}
		},
		"advance": func(rt *rapid.T) {
			m.now += int64(rapid.IntRange(1, 100).Draw(rt, "ms")) * ms // past several deadlines at once, at times
			tab.Advance(m.now)
		},
		"detach": func(rt *rapid.T) {
			tab.Advance(m.now)
			m.apply()
			s := rapid.SampledFrom(modelSessions).Draw(rt, "session")
			_, was := m.detached[s]
			was = was || m.isDropped(s)
			if !was && m.noGrace {
				m.detached[s] = m.now // dropped by the Detach itself
			}
			tab.Detach(m.now, s)
			m.apply()
			if !was && !m.noGrace {
				m.detached[s] = m.now
			}
			if !was && m.noGrace && !m.dropped[s] {
				rt.Fatalf("detach of %s with no grace did not drop it", s)
			}
		},
		"attach": func(rt *rapid.T) {
			tab.Advance(m.now)
			m.apply()
			s := rapid.SampledFrom(modelSessions).Draw(rt, "session")
			existed := tab.Attach(m.now, s)
			m.apply()
			if existed == m.isDropped(s) {
				rt.Fatalf("attach(%s) existed=%v, dropped=%v", s, existed, m.dropped[s])
			}
			delete(m.detached, s)
			delete(m.dropped, s)
		},
		"release": func(rt *rapid.T) {
			tab.Advance(m.now)
			m.apply()
			owner := rapid.SampledFrom(modelOwners).Draw(rt, "owner")
			res := rapid.SliceOfN(rapid.SampledFrom(modelResources), 1, 3).Draw(rt, "resources")
			if p := m.pickOwned(rt); p != nil && rapid.Bool().Draw(rt, "held") {
				// Some of what an owner holds, and maybe more.
				owner = p.owner
				res = append(m.resourcesOf(rt, p)[:rapid.IntRange(1, len(p.res)).Draw(rt, "n")], res[:rapid.IntRange(0, 1).Draw(rt, "more")]...)
			}
			// What the owner holds when it calls, and so what it gives up.
			want := owner != ""
			cut := map[*mreq]map[string]bool{}
			for _, r := range res {
				found := false
				for _, holder := range m.reqs {
					if !holder.granted || !holder.res[r] || holder.owner != owner || owner == "" {
						continue
					}
					found = true
					if cut[holder] == nil {
						cut[holder] = map[string]bool{}
					}
					cut[holder][r] = true
				}
				want = want && found
			}
			m.expect = map[ID]bool{}
			for h, rs := range cut {
				partial := len(rs) < len(h.res)
				if !h.revoked { // a revoked lock's holder has been told already
					m.expect[h.id] = partial
				}
				if !partial && h.revoked {
					m.del(h.id)
				}
				if partial {
					h.partial = true
					for r := range rs {
						delete(h.res, r)
						delete(h.modes, r)
					}
				}
			}
			ok := tab.Release(m.now, owner, res)
			m.apply()
			if len(m.expect) != 0 {
				rt.Fatalf("release did not report %v", m.expect)
			}
			m.expect = nil
			if ok != want {
				rt.Fatalf("release = %v, want %v", ok, want)
			}
		},
		"releaseAll": func(rt *rapid.T) {
			tab.Advance(m.now)
			m.apply()
			owner := rapid.SampledFrom(modelOwners).Draw(rt, "owner")
			m.expect = map[ID]bool{}
			for _, p := range m.reqs {
				if owner != "" && p.owner == owner && p.granted {
					m.expect[p.id] = false
				}
			}
			want := len(m.expect)
			for _, p := range slices.Clone(m.reqs) {
				if _, ok := m.expect[p.id]; ok && p.revoked {
					delete(m.expect, p.id) // its holder has been told already
					m.del(p.id)
				}
			}
			n := tab.ReleaseAll(m.now, owner)
			m.apply()
			if n != want || len(m.expect) != 0 {
				rt.Fatalf("releaseAll = %d, want %d; not reported: %v", n, want, m.expect)
			}
			m.expect = nil
		},
		"hold": func(rt *rapid.T) {
			tab.Advance(m.now)
			m.apply()
			until := m.now + int64(rapid.IntRange(-5, 60).Draw(rt, "ms"))*ms
			tab.HoldGrants(m.now, until)
			m.apply()
			if until > m.now {
				m.holdUntil = max(m.holdUntil, until)
			}
		},
		"": func(rt *rapid.T) { m.check() },
	}
}

// pickOwned returns a granted request with an owner (re-entrant or not), or
// nil if there is none.
func (m *model) pickOwned(rt *rapid.T) *mreq {
	var owned []*mreq
	for _, p := range m.reqs {
		if p.granted && p.owner != "" {
			owned = append(owned, p)
		}
	}
	if len(owned) == 0 {
		return nil
	}
	return rapid.SampledFrom(owned).Draw(rt, "owned")
}

// resourcesOf returns p's resources in a drawn order, one maybe twice.
func (m *model) resourcesOf(rt *rapid.T, p *mreq) []string {
	var res []string
	for r := range p.res {
		res = append(res, r)
	}
	slices.Sort(res)
	res = rapid.Permutation(res).Draw(rt, "order")
	if rapid.IntRange(0, 3).Draw(rt, "dup") == 0 {
		res = append(res, res[0])
	}
	return res
}

// renew runs Renew on the engine and checks and applies its answer.
func (m *model) renew(rt *rapid.T, owner string, res []string) {
	tab := m.tab
	ttl := modelTTL.Draw(rt, "ttl")
	from := rapid.SampledFrom(modelCallers).Draw(rt, "from")
	lastToken := tab.LastToken()
	g, err := tab.Renew(m.now, owner, res, ttl, from)
	m.apply()
	if tab.LastToken() != lastToken {
		rt.Fatalf("renew used a token")
	}
	var want *mreq // the lock renewed; with several candidates (shared), any of them
	for _, p := range m.reqs {
		if owner != "" && p.granted && p.owner == owner && !p.noReentry && !p.revoked && sameSet(p.res, res) &&
			(want == nil || p.id == g.ID) {
			want = p
		}
	}
	switch {
	case owner == "":
		if !errors.Is(err, ErrInvalidOwner) {
			rt.Fatalf("renew without owner: %v", err)
		}
	case want == nil:
		if !errors.Is(err, ErrNotFound) {
			rt.Fatalf("renew of %s %v that the owner does not hold: %+v %v", owner, res, g, err)
		}
	default:
		if err != nil || g.ID != want.id || !g.Granted || !g.Renewed || g.Token != want.token || g.ExpiresAt != m.expiry(want, ttl, from) {
			rt.Fatalf("renew from %s = %+v %v, want %s renewed to %d", from, g, err, want.id.Short(), m.expiry(want, ttl, from))
		}
		want.expires = g.ExpiresAt
	}
}

// lock runs Lock(req) on the engine and checks and applies its answer.
func (m *model) lock(rt *rapid.T, req *Request) {
	tab, sess, res := m.tab, req.Session, req.Resources
	set := map[string]bool{}
	modes := map[string]Mode{}
	badModes := false // a name given twice with two modes
	for i, r := range res {
		md := req.modeAt(i)
		if old, ok := modes[r]; ok && old != md {
			badModes = true
		}
		set[r] = true
		modes[r] = md
	}
	lastToken := tab.LastToken()
	g, err := tab.Lock(m.now, req)
	m.apply() // deadlines due before the request
	// The requests on each resource, with the new one last.
	newReq := &mreq{res: set, modes: modes}
	m.reqs = append(m.reqs, newReq)
	mines := map[*mreq]bool{} // the owner's locks that hold some resource
	busy, tooLong, conflict := "", "", ""
	for _, r := range res {
		var ms []Mode
		n, adm := 0, false // waiting entries; whether some are admitted
		for j, p := range m.reqs[:len(m.reqs)-1] {
			if !p.res[r] {
				continue
			}
			ms = append(ms, p.modes[r])
			if m.admitted(j, r) {
				adm = true
			} else {
				n++
			}
			if req.Owner != "" && !req.NoReentry && p.granted && p.owner == req.Owner && !p.revoked {
				mines[p] = true
			}
			if md := modes[r]; md.Permits > 0 && p.modes[r].Permits > 0 && p.modes[r].Of != md.Of && conflict == "" {
				conflict = r
			}
		}
		if adm {
			n++
		}
		if busy == "" && !compatible(append(ms, modes[r])) {
			busy = r
		}
		if tooLong == "" && req.Tolerate > 0 && n > req.Tolerate {
			tooLong = r
		}
	}
	m.reqs = m.reqs[:len(m.reqs)-1]
	var mine *mreq
	for p := range mines {
		mine = p
	}
	var re *ResourceError
	if err != nil && (errors.Is(err, ErrBusy) || errors.Is(err, ErrTolerate) || errors.Is(err, ErrOwnerConflict) ||
		errors.Is(err, ErrPermitsConflict) || errors.Is(err, ErrModeChange)) {
		if !errors.As(err, &re) || !slices.Contains(res, re.Resource) {
			rt.Fatalf("refusal %v does not name a resource of %v", err, res)
		}
	}
	if errors.Is(err, ErrPermitsConflict) {
		ok := false
		for _, p := range m.reqs {
			md := modes[re.Resource]
			ok = ok || p.res[re.Resource] && p.modes[re.Resource].Permits > 0 && md.Permits > 0 && p.modes[re.Resource].Of != md.Of
		}
		if !ok {
			rt.Fatalf("permits conflict on %s, which has none", re.Resource)
		}
	}
	switch {
	case m.isDropped(sess):
		if !errors.Is(err, ErrUnknownSession) {
			rt.Fatalf("lock in dropped session: %v", err)
		}
	case badModes:
		if !errors.Is(err, ErrInvalidMode) {
			rt.Fatalf("a name twice in two modes: %+v %v", g, err)
		}
	case conflict != "":
		if err == nil {
			rt.Fatalf("request declaring other permits on %s accepted", conflict)
		}
	case len(mines) > 1:
		// The owner holds several shared locks that the request overlaps:
		// a refusal, or the renewal of one it names exactly.
		if err == nil {
			if !mines[m.byID(g.ID)] || !g.Renewed || !sameSet(m.byID(g.ID).res, res) {
				rt.Fatalf("owner request over several of its locks: %+v", g)
			}
			m.reentered(rt, m.byID(g.ID), req, g, lastToken)
		}
	case mine != nil:
		_, _, sessBytes := m.totals(sess)
		sameModes := true
		for r, md := range modes {
			sameModes = sameModes && mine.modes[r] == md
		}
		switch {
		case sameSet(mine.res, res) && !sameModes:
			if !errors.Is(err, ErrModeChange) || mine.modes[re.Resource] == modes[re.Resource] {
				rt.Fatalf("owner asking for its lock in another mode: %+v %v", g, err)
			}
		case sameSet(mine.res, res) && mine.session != sess && over(sessBytes+mine.size(), m.maxSessBytes):
			// The session it would move into cannot take it.
			if !errors.Is(err, ErrSessionLimit) || len(m.moves) != 0 {
				rt.Fatalf("re-entry into a full session: %+v %v, moves %v", g, err, m.moves)
			}
		case sameSet(mine.res, res):
			if want := m.expiry(mine, req.TTL, sess); err != nil || !g.Renewed || g.ID != mine.id || g.Token != mine.token || g.ExpiresAt != want {
				rt.Fatalf("owner re-entry from %s (lock in %s, expires %d) not renewed to %d: %+v %v", sess, mine.session, mine.expires, want, g, err)
			}
			m.reentered(rt, mine, req, g, lastToken)
		case err == nil:
			rt.Fatalf("overlapping owner request accepted")
		case errors.Is(err, ErrOwnerConflict):
			held := false
			for _, p := range m.reqs {
				held = held || (p.granted && p.owner == req.Owner && !p.revoked && p.res[re.Resource])
			}
			if !held {
				rt.Fatalf("owner conflict names %s, which the owner does not hold", re.Resource)
			}
		}
	case req.Try && (busy != "" || m.holding()):
		if busy == "" {
			busy = res[0] // refused for the hold: the first resource
		}
		if !errors.Is(err, ErrBusy) || re.Resource != busy {
			rt.Fatalf("try on busy resources or during a hold: %v, want busy %s", err, busy)
		}
	case tooLong != "" && !req.Try:
		if !errors.Is(err, ErrTolerate) || re.Resource != tooLong {
			rt.Fatalf("tolerate: %v, want %s", err, tooLong)
		}
	case m.overCaps(sess, &mreq{owner: req.Owner, res: set}) != nil:
		if want := m.overCaps(sess, &mreq{owner: req.Owner, res: set}); !errors.Is(err, want) {
			rt.Fatalf("lock %v over the caps: %+v %v, want %v", res, g, err, want)
		}
	default:
		if err != nil {
			rt.Fatalf("lock refused: %v", err)
		}
		r := &mreq{id: g.ID, session: sess, owner: req.Owner, noReentry: req.NoReentry, res: set, modes: modes}
		m.reqs = append(m.reqs, r)
		if g.Granted {
			if m.holding() {
				rt.Fatalf("lock granted at once while grants are held until %d", m.holdUntil)
			}
			m.token(g.Token)
			r.granted, r.token, r.expires = true, g.Token, g.ExpiresAt
			m.believe(r.id, sess)
		} else if req.Timeout > 0 {
			r.deadline = m.now + int64(req.Timeout)
		}
	}
}

// byID returns the live request with this id, or nil.
func (m *model) byID(id ID) *mreq {
	_, r := m.find(id)
	return r
}

// reentered checks and applies the re-entry of mine by req, answered g.
func (m *model) reentered(rt *rapid.T, mine *mreq, req *Request, g Grant, lastToken uint64) {
	sess := req.Session
	if m.tab.LastToken() != lastToken {
		rt.Fatalf("re-entry used a token")
	}
	// A move tells the session the lock leaves, and nothing else.
	wantMoves := 0
	if mine.session != sess {
		wantMoves = 1
	}
	if len(m.moves) != wantMoves || (wantMoves == 1 && m.moves[0].ID != mine.id) {
		rt.Fatalf("re-entry of %s from %s into %s reported moves %+v", mine.id.Short(), mine.session, sess, m.moves)
	}
	m.moves = nil
	mine.expires = g.ExpiresAt
	mine.session = sess
	mine.partial = false // the answer gave it anew, by ID
	m.believe(mine.id, sess)
}

// overCaps returns the error of a new request r of session sess that the
// caps refuse, or nil if it fits.
func (m *model) overCaps(sess string, r *mreq) error {
	entries, bytes, sessBytes := m.totals(sess)
	switch {
	case over(sessBytes+r.size(), m.maxSessBytes):
		return ErrSessionLimit
	case over(len(m.reqs)+1, m.maxLocks) || over(entries+len(r.res), m.maxEntries) || over(bytes+r.size(), m.maxNameBytes):
		return ErrServerFull
	}
	return nil
}

// page runs QueuesPage with drawn arguments and checks it against the
// model's queues.
func (m *model) page(rt *rapid.T) {
	prefix := rapid.SampledFrom([]string{"", "r", "r1", "x"}).Draw(rt, "prefix")
	after := rapid.SampledFrom([]string{"", "r0", "r2", "r4"}).Draw(rt, "after")
	maxQ := rapid.IntRange(0, 6).Draw(rt, "maxQueues")
	maxE := rapid.IntRange(0, 10).Draw(rt, "maxEntries")
	stopAt := rapid.IntRange(0, 6).Draw(rt, "stopAt") // fn returns false on that call (0: never)
	var want []QueueInfo
	for _, res := range modelResources { // sorted
		if q := m.queue(res); len(q) > 0 && res > after && strings.HasPrefix(res, prefix) {
			qi := QueueInfo{Resource: res, Len: len(q)}
			for _, r := range q {
				qi.Entries = append(qi.Entries, QueueEntry{ID: r.id, Granted: r.granted, Mode: r.modes[res]})
			}
			want = append(want, qi)
		}
	}
	// The page the rules give: at most max(maxQ, 1) queues and
	// max(maxE, 1) entries, stopping after the queue that used the last
	// entry or on which fn returns false.
	budget, wantNext := max(maxE, 1), ""
	var page []QueueInfo
	for i, qi := range want {
		if i == max(maxQ, 1) {
			wantNext = page[len(page)-1].Resource
			break
		}
		qi.Entries = qi.Entries[:min(len(qi.Entries), budget)]
		budget -= len(qi.Entries)
		page = append(page, qi)
		if (budget == 0 || len(page) == stopAt) && i+1 < len(want) {
			wantNext = qi.Resource
			break
		}
		if budget == 0 || len(page) == stopAt {
			break
		}
	}
	var got []QueueInfo
	next := m.tab.QueuesPage(prefix, after, maxQ, maxE, func(qi QueueInfo) bool {
		got = append(got, qi)
		return len(got) != stopAt
	})
	same := next == wantNext && len(got) == len(page)
	for i := 0; same && i < len(got); i++ {
		g, w := got[i], page[i]
		same = g.Resource == w.Resource && g.Len == w.Len && len(g.Entries) == len(w.Entries)
		for j := 0; same && j < len(g.Entries); j++ {
			same = g.Entries[j].ID == w.Entries[j].ID && g.Entries[j].Granted == w.Entries[j].Granted &&
				g.Entries[j].Mode == w.Entries[j].Mode
		}
	}
	if !same {
		rt.Fatalf("QueuesPage(%q, %q, %d, %d, stop at %d) = %+v next %q; model %+v next %q",
			prefix, after, maxQ, maxE, stopAt, got, next, page, wantNext)
	}
}

// failures is a rapid.TB that records a failure instead of failing the
// test, for TestModelCatchesPlantedBugs.
type failures struct {
	testing.TB
	failed bool
	msg    string
}

func (f *failures) Errorf(format string, args ...any) {
	f.failed = true
	if f.msg == "" {
		f.msg = fmt.Sprintf(format, args...)
	}
}
func (f *failures) Error(args ...any)                 { f.Errorf("%s", fmt.Sprint(args...)) }
func (f *failures) Fatalf(format string, args ...any) { f.Errorf(format, args...) }
func (f *failures) Fatal(args ...any)                 { f.Error(args...) }
func (f *failures) Fail()                             { f.failed = true }
func (f *failures) FailNow()                          { f.failed = true }
func (f *failures) Failed() bool                      { return f.failed }
func (f *failures) Logf(string, ...any)               {}
func (f *failures) Log(...any)                        {}

// TestModelCatchesPlantedBugs shows that the model's checks are not
// vacuous: on an engine with a planted bug, the property fails. The bugs: a
// shared entry admitted past a waiting writer when it fits the holders
// (barging, which starves writers), and the permits of a semaphore entry
// not returned when it leaves (a leak, after which a request that fits
// waits).
func TestModelCatchesPlantedBugs(t *testing.T) {
	// No fail file, and the first failure as it is found: shrinking the
	// history would take longer than finding it. Up to 2 000 histories:
	// the first failure comes within a few dozen.
	for name, v := range map[string]string{"rapid.nofailfile": "true", "rapid.shrinktime": "1ms", "rapid.checks": "2000"} {
		old := flag.Lookup(name).Value.String()
		if err := flag.Set(name, v); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = flag.Set(name, old) })
	}
	for _, bug := range []struct {
		name  string
		plant uint8
	}{
		{"barge", plantBarge},
		{"leak", plantLeak},
	} {
		t.Run(bug.name, func(t *testing.T) {
			f := &failures{TB: t}
			rapid.Check(f, plantedProp(300, bug.plant))
			if !f.failed {
				t.Fatalf("the model did not catch the planted bug %s", bug.name)
			}
			// A check failed, not the engine.
			if !strings.Contains(f.msg, "[rapid] failed after") {
				t.Fatalf("the planted bug %s: %.300s", bug.name, f.msg)
			}
			t.Logf("caught: %.300s", f.msg)
		})
	}
}
