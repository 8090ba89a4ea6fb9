package locktable

import (
	"strings"
)

// A group is the sessions whose ids share the part before their first NUL
// byte (the server's principals: see GroupRequests).
type group struct {
	requests int // live requests of its sessions
	sessions int
}

type session struct {
	id       string
	grp      *group // nil: the id has no NUL byte
	attached bool
	// tm is the session's timer in the deadline heap, made at its first
	// detach: tm.hidx >= 0 while its grace runs, and tm.seq is the Table's
	// seq at its detach (it orders its grace end among deadlines due at
	// once).
	tm    *lock
	head  *lock
	n     int
	bytes int64 // name bytes of its requests (see Config.MaxNameBytes)
}

// Attach attaches session id, creating it if it is new, and stops its grace
// clock if it was detached. It reports whether the session already existed.
func (t *Table) Attach(now int64, id string) (existed bool) {
	t.advance(now)
	if s, ok := t.sessions[id]; ok {
		if s.timed() {
			t.heap.remove(int(s.tm.hidx))
		}
		s.attached = true
		return true
	}
	t.sessions[id] = t.newSession(id)
	return false
}

// session returns session id, or nil if there is none. The session of the
// previous call is remembered: a connection's requests come in runs.
func (t *Table) session(id string) *session {
	if s := t.lastSess; s != nil && s.id == id {
		return s
	}
	s := t.sessions[id]
	if s != nil {
		t.lastSess = s
	}
	return s
}

// newSession returns a new attached session, counted in its group.
func (t *Table) newSession(id string) *session {
	s := &session{id: id, attached: true}
	if name, _, ok := strings.Cut(id, "\x00"); ok {
		g := t.groups[name]
		if g == nil {
			g = &group{}
			t.groups[name] = g
		}
		g.sessions++
		s.grp = g
	}
	return s
}

// GroupSessions returns the sessions (attached or in their grace period)
// whose id starts with name and a NUL byte. O(1).
func (t *Table) GroupSessions(name string) int {
	if g := t.groups[name]; g != nil {
		return g.sessions
	}
	return 0
}

// GroupRequests returns the live requests (held and waiting) of the
// sessions whose id starts with name and a NUL byte: the server scopes the
// sessions of a principal so, and caps the principal's requests with it.
// O(1).
func (t *Table) GroupRequests(name string) int {
	if g := t.groups[name]; g != nil {
		return g.requests
	}
	return 0
}

// Detach starts session id's grace clock. At now + SessionGrace, unless it is
// attached again, all of its requests are dropped (each reported as Dropped,
// then SessionClosed); none of them is granted on the way out, and only then
// are other sessions' waiters granted. Detaching an unknown or detached
// session does nothing.
func (t *Table) Detach(now int64, id string) {
	now = t.advance(now)
	s, ok := t.sessions[id]
	if !ok || !s.attached {
		return
	}
	s.attached = false
	if t.cfg.SessionGrace < 0 {
		t.dropSession(s)
		return
	}
	t.seq++
	tm := s.timer()
	tm.seq = t.seq
	t.heap.push(deadline{at: now + int64(t.cfg.SessionGrace), l: tm})
}

// timer returns s's timer, made on first use.
func (s *session) timer() *lock {
	if s.tm == nil {
		s.tm = &lock{hidx: -1, flags: flagTimer, sess: s}
	}
	return s.tm
}

// timed reports whether s's timer is in the deadline heap.
func (s *session) timed() bool { return s.tm != nil && s.tm.hidx >= 0 }

// HasSession reports whether session id exists (attached or in its grace
// period).
func (t *Table) HasSession(id string) bool {
	_, ok := t.sessions[id]
	return ok
}

// dropSession removes every request of s, then grants what became grantable,
// so that none of s's own waiters is granted on the way out.
func (t *Table) dropSession(s *session) {
	t.deferring = true
	for s.head != nil {
		l := s.head
		t.stats.Dropped++
		t.emit(Event{Kind: Dropped, ID: l.id, Session: s.id, Owner: l.owner(), Token: l.token, Held: l.state == stateGranted, Since: l.since()})
		t.remove(l)
	}
	if s.timed() {
		t.heap.remove(int(s.tm.hidx))
	}
	delete(t.sessions, s.id)
	if t.lastSess == s {
		t.lastSess = nil
	}
	if g := s.grp; g != nil {
		if g.sessions--; g.sessions == 0 {
			name, _, _ := strings.Cut(s.id, "\x00")
			delete(t.groups, name)
		}
	}
	t.flushGrants()
	t.emit(Event{Kind: SessionClosed, Session: s.id})
}

func (s *session) add(l *lock) {
	l.sess = s
	l.sprev = nil
	l.snext = s.head
	if s.head != nil {
		s.head.sprev = l
	}
	s.head = l
	s.n++
	if s.grp != nil {
		s.grp.requests++
	}
}

func (s *session) del(l *lock) {
	if l.sprev != nil {
		l.sprev.snext = l.snext
	} else {
		s.head = l.snext
	}
	if l.snext != nil {
		l.snext.sprev = l.sprev
	}
	l.sprev, l.snext, l.sess = nil, nil, nil
	s.n--
	if s.grp != nil {
		s.grp.requests--
	}
}
