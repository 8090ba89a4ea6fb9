package locktable

import (
	"slices"
	"time"
)

// Request is one lock request.
type Request struct {
	// Session the request belongs to; it must be attached. For a re-entry
	// it is also the caller's session (see Table.Lock).
	Session string
	// Resources to lock, 1..MaxResources names. Duplicates are folded.
	// Lock does not keep or modify the slice.
	Resources []string
	// Modes are the modes the resources are taken in: none (every resource
	// exclusive, the default), one for every resource, or one per resource
	// in the order of Resources. A name given twice must have one mode.
	// Lock does not keep or modify the slice.
	Modes []Mode
	// TTL is the lease, > 0 and <= MaxTTL.
	TTL time.Duration
	// Timeout is the longest wait; 0 waits without limit.
	Timeout time.Duration
	// Tolerate > 0 refuses the request at once if any of its queues already
	// holds more than Tolerate entries. 0 means no limit.
	Tolerate int
	// Try refuses the request unless it can be granted at once.
	Try bool
	// Owner, if set, makes the request re-entrant: the same owner asking for
	// exactly the resources it holds renews that lock. Release and
	// ReleaseAll find locks by owner.
	Owner string
	// NoReentry records Owner for Release and ReleaseAll but turns re-entry
	// off: asking again queues (or, with Try, is refused) like anyone else,
	// and Renew does not find the lock.
	NoReentry bool
}

// Grant is the answer to an accepted Lock request.
type Grant struct {
	ID        ID
	Granted   bool   // granted at once (otherwise waiting)
	Renewed   bool   // an owner's existing lock was renewed (re-entry or Renew); ID is that lock's
	Token     uint64 // fencing token, when Granted
	ExpiresAt int64  // expiry in ns, when Granted
	// Ahead is the most entries ahead of the request in one of the queues
	// it joined (0 when granted at once or renewed; it counts the holder).
	Ahead int
}

// Lock enqueues req. It returns ErrTolerate or ErrBusy when the request is
// refused for its queues, ErrOwnerConflict when req.Owner already holds an
// overlapping but different set, and one of the validation errors when it is
// malformed; in every case nothing changes. ErrBusy, ErrTolerate and
// ErrOwnerConflict come as a *ResourceError that names the first resource of
// req (in request order) that is busy, whose queue is too long, or that the
// owner already holds; errors.Is matches the sentinel. A request granted at
// once is reported in the returned Grant only, not through OnEvent.
//
// A new request is refused with ErrSessionLimit when its session already
// has Config.MaxLocksPerSession requests or would go above
// Config.MaxSessionBytes, and with ErrServerFull when the Table would go
// above Config.MaxLocks, MaxEntries or MaxNameBytes. A re-entry adds
// nothing to the Table and is not refused by its caps; one that moves the
// lock into another session is refused with ErrSessionLimit when that
// session cannot take it.
//
// Re-entry from a session other than the lock's (req.Session is the
// caller) never shortens the lock: see Extend. A lock revoked by Evict is
// not the owner's any more: asking for it again queues behind it (or, with
// Try, is refused with ErrBusy) like any request.
func (t *Table) Lock(now int64, req *Request) (Grant, error) {
	now = t.advance(now)
	s := t.session(req.Session)
	if s == nil {
		return Grant{}, ErrUnknownSession
	}
	if err := t.checkRequest(req); err != nil {
		return Grant{}, err
	}
	mine, size, err := t.scan(req)
	if err != nil || mine != nil {
		if mine != nil {
			return t.reenter(now, s, mine, req)
		}
		return Grant{}, err
	}
	k := len(req.Resources)
	if t.trefuse && t.tlimit != 0 && t.next >= t.tlimit {
		t.stats.Refused++
		return Grant{}, ErrNoTokens
	}
	if req.Try && t.grantsHeld() {
		t.stats.Refused++
		return Grant{}, &ResourceError{Err: ErrBusy, Resource: req.Resources[0]}
	}
	if s.n >= t.maxPerSess {
		return Grant{}, ErrSessionLimit
	}
	if t.fits(s, k, size) != nil {
		if err := t.checkCaps(s, req, k, size); err != nil {
			return Grant{}, err
		}
	}
	l, ahead := t.insert(now, s, req)
	if l.waiting == 0 {
		if !t.grantsHeld() {
			t.grant(now, l)
			return Grant{ID: l.id, Granted: true, Token: l.token, ExpiresAt: l.deadline}, nil
		}
		t.addReady(l)
	}
	if req.Timeout > 0 {
		l.deadline = now + int64(req.Timeout)
		t.heap.push(deadline{at: l.deadline, l: l})
	}
	return Grant{ID: l.id, Ahead: ahead}, nil
}

// checkRequest validates what req says on its own (its resource names are
// checked by scan).
func (t *Table) checkRequest(req *Request) error {
	switch k := len(req.Resources); {
	case k == 0:
		return ErrInvalidResource
	case k > t.maxRes:
		return ErrTooManyResources
	case req.TTL <= 0 || req.TTL > t.maxTTL:
		return ErrInvalidTTL
	case req.Timeout < 0 || req.Timeout > t.maxTimeout:
		return ErrInvalidTimeout
	case req.Tolerate < 0:
		return ErrInvalidTolerate
	case !t.checkOwner(req.Owner):
		return ErrInvalidOwner
	}
	return req.checkModes()
}

// scan checks req's resources against their queues, in request order, and
// records the queues found in t.found. It returns the owner's lock if req
// is a re-entry (every resource held by that one lock of req.Owner), or
// the error that refuses req, and the name bytes of req (duplicates
// included).
func (t *Table) scan(req *Request) (mine *lock, size int64, err error) {
	mineRes := 0     // index in req.Resources of the first resource mine holds
	foreign := false // some resource is not held by mine
	size = int64(len(req.Owner))
	t.found = t.found[:0]
	for i, r := range req.Resources {
		// A name with a queue, live or parked, keeps the rule of names
		// (it was checked when its queue was made): only the longest
		// name may have changed since (SetLimits).
		q := t.queues[r]
		if q == nil || len(r) > t.maxName {
			if err := CheckName(r, t.maxName); err != nil {
				return nil, 0, err
			}
		}
		size += int64(len(r))
		t.found = append(t.found, q)
		if q == nil || q.parked > 0 {
			foreign = true
			continue
		}
		m := req.modeAt(i)
		if m.Permits > 0 && q.nshared > 0 && q.of != m.Of {
			return nil, 0, &ResourceError{Err: ErrPermitsConflict, Resource: r}
		}
		if req.Owner != "" && !req.NoReentry {
			if h := t.heldBy(q, req.Owner); h != nil {
				if mine != nil && mine != h {
					return nil, 0, &ResourceError{Err: ErrOwnerConflict, Resource: r}
				}
				if mine == nil {
					mine, mineRes = h, i
				}
				continue
			}
		}
		foreign = true
		if err := t.admissible(req, q, m); err != nil {
			return nil, 0, err
		}
	}
	if mine != nil && foreign {
		return nil, 0, &ResourceError{Err: ErrOwnerConflict, Resource: req.Resources[mineRes]}
	}
	return mine, size, nil
}

// admissible reports whether a new entry of req in mode m may join q:
// ErrBusy for a try-lock that q would not admit at once, ErrTolerate for a
// queue longer than req tolerates, ErrQueueFull for a full one.
func (t *Table) admissible(req *Request, q *queue, m Mode) error {
	switch {
	case req.Try && (q.gate != nil || !q.fits(m.Permits)):
		t.stats.Refused++
		return &ResourceError{Err: ErrBusy, Resource: q.name}
	case req.Tolerate > 0 && q.tolerateLen() > req.Tolerate:
		t.stats.Refused++
		return &ResourceError{Err: ErrTolerate, Resource: q.name}
	case q.n >= t.maxQueue:
		return ErrQueueFull
	}
	return nil
}

// insert makes a lock of req, which scan and the caps accepted, in session
// s, queues it on its resources (the queues scan found in t.found, or new
// ones) and returns it with the most entries ahead of it in one queue.
func (t *Table) insert(now int64, s *session, req *Request) (*lock, int) {
	l := t.newLock(len(req.Resources))
	nds := l.nodes()
	l.ttl, l.created = req.TTL, now
	l.setOwner(req.Owner)
	if req.NoReentry {
		l.flags = flagNoReentry
	}
	b := int64(len(req.Owner))
	ahead := 0
	for i, r := range req.Resources {
		q := t.found[i]
		switch {
		case q == nil && len(req.Resources) > 1:
			// A name given twice: its first entry may have made its queue.
			if q = t.queues[r]; q == nil {
				q = t.newQueue(r)
			} else if q.tail.l == l {
				continue
			}
		case q == nil:
			q = t.newQueue(r)
		case q.parked > 0:
			t.unpark(q)
		case q.tail.l == l:
			continue // duplicate resource
		}
		n := &nds[i]
		n.l = l
		ahead = max(ahead, q.n)
		t.enqueue(q, n, req.modeAt(i))
		b += int64(len(r))
	}
	for i := range t.found {
		t.found[i] = nil
	}
	t.entries += int(l.live)
	t.bytes += b
	s.bytes += b
	s.add(l)
	if l.owner() != "" {
		t.ownerAdd(l)
	}
	t.stats.Requests++
	t.seq++
	l.seq = t.seq
	return l, ahead
}

// enqueue puts n, a node of a new request, at the tail of q in mode m,
// and admits it if it is compatible with everything ahead of it.
func (t *Table) enqueue(q *queue, n *node, m Mode) {
	l := n.l
	n.permits = m.Permits
	if m.Permits > 0 {
		if q.nshared == 0 {
			q.of = m.Of
		}
		q.nshared++
	}
	if t.plant != 0 && t.barge(q, n) {
		return
	}
	t.pushBack(q, n)
	l.live++
	if q.gate == nil && q.fits(n.permits) {
		q.admit(n)
		return
	}
	if q.gate == nil {
		q.gate = n
	}
	l.waiting++
}

// checkCaps reports whether a new request of session s, naming k resources
// whose names and owner add up to size bytes (duplicates included), fits
// the session's bytes cap and the Table's caps, and counts a refusal.
// Duplicates are folded, at O(k²), only when the sums with duplicates do
// not fit.
func (t *Table) checkCaps(s *session, req *Request, k int, size int64) error {
	err := t.fits(s, k, size)
	if err != nil && k > 1 {
		k, size = distinctSize(req.Resources)
		err = t.fits(s, k, size+int64(len(req.Owner)))
	}
	if err == ErrServerFull {
		t.stats.ServerFull++
	}
	return err
}

// fits reports whether a new request of session s with k entries and size
// name bytes fits the caps.
func (t *Table) fits(s *session, k int, size int64) error {
	switch {
	case s.bytes+size > t.maxSessB:
		return ErrSessionLimit
	case t.live >= t.maxLocks || t.entries+k > t.maxEntries || t.bytes+size > t.maxBytes:
		return ErrServerFull
	}
	return nil
}

// distinctSize returns the number of distinct names in res and the sum of
// their lengths, at O(k²).
func distinctSize(res []string) (int, int64) {
	n, size := 0, int64(0)
	for i, r := range res {
		if !slices.Contains(res[:i], r) {
			n++
			size += int64(len(r))
		}
	}
	return n, size
}

// sizeOf returns l's name bytes: the names of the queues it is in and its
// owner. It costs O(k).
func (t *Table) sizeOf(l *lock) int64 {
	b := int64(len(l.owner()))
	nds := l.nodes()
	for i := range nds {
		if q := nds[i].q; q != nil {
			b += int64(len(q.name))
		}
	}
	return b
}

// reenter handles an owner asking again, through Lock, for a lock it holds:
// the lock is renewed and moves into req's session. A move is reported to
// the session the lock leaves (Released with Moved): from then on only the
// new session holds it, and that session's end drops it, so the old one
// must stop believing it holds it. A re-entry from another session never
// shortens the lock (see setExpiry): the session it leaves may still
// believe it holds the lock until the Released event reaches it.
func (t *Table) reenter(now int64, s *session, l *lock, req *Request) (Grant, error) {
	// Every resource of req is held by l; the request must name all of them.
	if distinct(req.Resources) != int(l.live) {
		return Grant{}, &ResourceError{Err: ErrOwnerConflict, Resource: req.Resources[0]}
	}
	// In the same modes: no upgrade, no downgrade.
	for i, r := range req.Resources {
		q := t.queue(r)
		if q.mode(l.nodeIn(q)) != req.modeAt(i) {
			return Grant{}, &ResourceError{Err: ErrModeChange, Resource: r}
		}
	}
	from := l.sess
	own := from == s && s.id != ""
	if from != s {
		b := t.sizeOf(l)
		if s.n >= t.maxPerSess || s.bytes+b > t.maxSessB {
			return Grant{}, ErrSessionLimit
		}
		from.del(l)
		from.bytes -= b
		s.add(l)
		s.bytes += b
		t.emit(Event{Kind: Released, ID: l.id, Session: from.id, Owner: l.owner(), Token: l.token, Moved: true, Since: l.since()})
	}
	t.setExpiry(now, l, req.TTL, own)
	// The answer tells the caller it holds the lock, as it is now, under
	// this ID: Extend finds it again after a partial Release.
	l.flags &^= flagPartial
	t.stats.Requests++
	return Grant{ID: l.id, Granted: true, Renewed: true, Token: l.token, ExpiresAt: l.deadline}, nil
}

// since is when l was granted, or made if it is waiting.
func (l *lock) since() int64 {
	if l.state == stateGranted {
		return l.granted
	}
	return l.created
}

func (t *Table) grant(now int64, l *lock) {
	if l.hidx >= 0 {
		t.heap.remove(int(l.hidx))
	}
	l.state = stateGranted
	l.granted = now
	l.token = t.next
	t.next++
	l.deadline = now + int64(l.ttl)
	t.heap.push(deadline{at: l.deadline, l: l})
	t.held++
	t.stats.Granted++
}
