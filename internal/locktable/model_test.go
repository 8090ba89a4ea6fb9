package locktable

import (
	"errors"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// The model is the simplest statement of the rules: live requests in arrival
// order; a request holds its resources exactly when no earlier live request
// names any of them. The engine's answers and events drive the model; every
// event is checked for legality, and after every step the model and the
// engine must agree and the invariants must hold.

type mreq struct {
	id       ID
	session  string
	owner    string
	res      map[string]bool
	granted  bool
	token    uint64
	expires  int64
	deadline int64 // wait deadline, 0 none
}

type model struct {
	t         *rapid.T
	tab       *Table
	now       int64
	grace     int64
	reqs      []*mreq // arrival order
	detached  map[string]int64
	dropped   map[string]bool
	lastToken uint64
	pending   []Event
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
}

// isDropped reports whether session s has been dropped by now.
func (m *model) isDropped(s string) bool {
	if at, ok := m.detached[s]; ok && at+m.grace <= m.now {
		m.dropped[s] = true
	}
	return m.dropped[s]
}

func (m *model) sharesEarlier(i int) bool {
	for _, p := range m.reqs[:i] {
		for r := range m.reqs[i].res {
			if p.res[r] {
				return true
			}
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
			if m.sharesEarlier(i) {
				m.t.Fatalf("granted %s ahead of an earlier request (FIFO)", e.ID.Short())
			}
			if m.dropped[r.session] {
				m.t.Fatalf("granted to a dropped session")
			}
			m.token(e.Token)
			r.granted, r.token, r.expires, r.deadline = true, e.Token, e.ExpiresAt, 0
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
			if !r.granted {
				m.t.Fatalf("released a waiting request")
			}
			m.del(e.ID)
		case Dropped:
			at, ok := m.detached[r.session]
			if !ok || at+m.grace > m.now {
				m.t.Fatalf("dropped a request of a live session %s", r.session)
			}
			m.dropped[r.session] = true
			m.del(e.ID)
		}
	}
}

func (m *model) check() {
	m.apply()
	holders := map[string]ID{}
	for i, r := range m.reqs {
		if want := !m.sharesEarlier(i); r.granted != want {
			m.t.Fatalf("request %s granted=%v, want %v (FIFO / no request waits at the head of all its queues)", r.id.Short(), r.granted, want)
		}
		if r.granted {
			for res := range r.res {
				if h, ok := holders[res]; ok {
					m.t.Fatalf("two holders of %s: %s and %s", res, h.Short(), r.id.Short())
				}
				holders[res] = r.id
			}
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
		if !ok || li.Granted != r.granted || (r.granted && li.Token != r.token) {
			m.t.Fatalf("engine and model disagree on %s: %+v vs %+v", r.id.Short(), li, r)
		}
	}
	if st := m.tab.Stats(); st.Live != len(m.reqs) {
		m.t.Fatalf("engine has %d live requests, model %d", st.Live, len(m.reqs))
	}
	for _, res := range modelResources {
		n := 0
		for _, r := range m.reqs {
			if r.res[res] {
				n++
			}
		}
		if got := m.tab.QueueLen(res); got != n {
			m.t.Fatalf("queue %s has %d entries, model %d (orphan entries)", res, got, n)
		}
	}
}

var (
	modelResources = []string{"r0", "r1", "r2", "r3", "r4"}
	modelSessions  = []string{"s0", "s1", "s2"}
	modelOwners    = []string{"", "", "o1", "o2"}
)

func TestModel(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		seed := [32]byte{7}
		m := &model{t: rt, now: 1000 * ms, grace: 40 * ms, detached: map[string]int64{}, dropped: map[string]bool{}}
		tab, err := New(Config{Seed: &seed, SessionGrace: 40 * time.Millisecond, FirstToken: 100,
			OnEvent: func(e Event) { m.pending = append(m.pending, e) }})
		if err != nil {
			rt.Fatal(err)
		}
		m.tab = tab
		for _, s := range modelSessions {
			tab.Attach(m.now, s)
		}
		ids := func() []ID {
			var out []ID
			for _, r := range m.reqs {
				out = append(out, r.id)
			}
			return append(out, ID{0xff})
		}
		rt.Repeat(map[string]func(*rapid.T){
			"lock": func(rt *rapid.T) {
				tab.Advance(m.now)
				m.apply()
				sess := rapid.SampledFrom(modelSessions).Draw(rt, "session")
				res := rapid.SliceOfN(rapid.SampledFrom(modelResources), 1, 4).Draw(rt, "resources")
				req := Request{
					Session:   sess,
					Resources: res,
					TTL:       time.Duration(rapid.IntRange(1, 60).Draw(rt, "ttl")) * time.Millisecond,
					Timeout:   time.Duration(rapid.SampledFrom([]int{0, 0, 5, 20, 50}).Draw(rt, "timeout")) * time.Millisecond,
					Tolerate:  rapid.SampledFrom([]int{0, 0, 0, 1, 2}).Draw(rt, "tolerate"),
					Try:       rapid.Float64Range(0, 1).Draw(rt, "try") < 0.15,
					Owner:     rapid.SampledFrom(modelOwners).Draw(rt, "owner"),
				}
				set := map[string]bool{}
				for _, r := range res {
					set[r] = true
				}
				g, err := tab.Lock(m.now, &req)
				m.apply() // deadlines due before the request
				var mine *mreq
				busy, tooLong := false, false
				for r := range set {
					n := 0
					for _, p := range m.reqs {
						if p.res[r] {
							n++
							if req.Owner != "" && p.granted && p.owner == req.Owner {
								mine = p
							}
						}
					}
					busy = busy || n > 0
					tooLong = tooLong || (req.Tolerate > 0 && n > req.Tolerate)
				}
				switch {
				case m.isDropped(sess):
					if !errors.Is(err, ErrUnknownSession) {
						rt.Fatalf("lock in dropped session: %v", err)
					}
				case mine != nil:
					same := len(mine.res) == len(set)
					for r := range set {
						same = same && mine.res[r]
					}
					if same && (err != nil || !g.Renewed || g.ID != mine.id) {
						rt.Fatalf("owner re-entry not renewed: %+v %v", g, err)
					}
					if same {
						mine.expires = g.ExpiresAt
						mine.session = sess
					} else if err == nil {
						rt.Fatalf("overlapping owner request accepted")
					}
				case req.Try && busy:
					if !errors.Is(err, ErrBusy) {
						rt.Fatalf("try on busy resources: %v", err)
					}
				case tooLong && !req.Try:
					if !errors.Is(err, ErrTolerate) {
						rt.Fatalf("tolerate: %v", err)
					}
				default:
					if err != nil {
						rt.Fatalf("lock refused: %v", err)
					}
					r := &mreq{id: g.ID, session: sess, owner: req.Owner, res: set}
					m.reqs = append(m.reqs, r)
					if g.Granted {
						m.token(g.Token)
						r.granted, r.token, r.expires = true, g.Token, g.ExpiresAt
					} else if req.Timeout > 0 {
						r.deadline = m.now + int64(req.Timeout)
					}
				}
			},
			"unlock": func(rt *rapid.T) {
				tab.Advance(m.now)
				m.apply()
				id := rapid.SampledFrom(ids()).Draw(rt, "id")
				err := tab.Unlock(m.now, id)
				if _, r := m.find(id); r != nil {
					if err != nil {
						rt.Fatalf("unlock: %v", err)
					}
					m.del(id)
				} else if !errors.Is(err, ErrNotFound) {
					rt.Fatalf("unlock of unknown: %v", err)
				}
				m.apply()
			},
			"extend": func(rt *rapid.T) {
				tab.Advance(m.now)
				m.apply()
				id := rapid.SampledFrom(ids()).Draw(rt, "id")
				ttl := time.Duration(rapid.IntRange(1, 60).Draw(rt, "ttl")) * time.Millisecond
				exp, err := tab.Extend(m.now, id, ttl)
				m.apply()
				_, r := m.find(id)
				switch {
				case r == nil:
					if !errors.Is(err, ErrNotFound) {
						rt.Fatalf("extend unknown: %v", err)
					}
				case !r.granted:
					if !errors.Is(err, ErrNotGranted) {
						rt.Fatalf("extend waiting: %v", err)
					}
				default:
					if err != nil || exp != m.now+int64(ttl) {
						rt.Fatalf("extend = %d, %v", exp, err)
					}
					r.expires = exp
				}
			},
			"advance": func(rt *rapid.T) {
				m.now += int64(rapid.IntRange(1, 30).Draw(rt, "ms")) * ms
				tab.Advance(m.now)
			},
			"detach": func(rt *rapid.T) {
				tab.Advance(m.now)
				m.apply()
				s := rapid.SampledFrom(modelSessions).Draw(rt, "session")
				tab.Detach(m.now, s)
				m.apply()
				if _, ok := m.detached[s]; !ok && !m.isDropped(s) {
					m.detached[s] = m.now
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
				res := rapid.SliceOfNDistinct(rapid.SampledFrom(modelResources), 1, 3, rapid.ID).Draw(rt, "resources")
				ok := tab.Release(m.now, owner, res)
				want := owner != ""
				for _, r := range res {
					var holder *mreq
					for _, p := range m.reqs {
						if p.granted && p.res[r] {
							holder = p
						}
					}
					if holder == nil || holder.owner != owner || owner == "" {
						want = false
						continue
					}
					if len(holder.res) > 1 {
						delete(holder.res, r) // a lock left with none is reported as Released
					}
				}
				m.apply()
				if ok != want {
					rt.Fatalf("release = %v, want %v", ok, want)
				}
			},
			"releaseAll": func(rt *rapid.T) {
				tab.Advance(m.now)
				m.apply()
				owner := rapid.SampledFrom(modelOwners).Draw(rt, "owner")
				want := 0
				for _, p := range m.reqs {
					if owner != "" && p.owner == owner && p.granted {
						want++
					}
				}
				n := tab.ReleaseAll(m.now, owner)
				m.apply()
				if n != want {
					rt.Fatalf("releaseAll = %d, want %d", n, want)
				}
			},
			"": func(rt *rapid.T) { m.check() },
		})
	})
}
