package locktable

// Evict revokes, for each named resource, every granted lock among its
// queue's admitted entries (the holder, or all the shared holders), each
// whole (all its resources), whoever holds it: it reports the lock to its
// session as Released at once, and sets its expiry to min(expiry, now +
// SessionGrace). It returns how many locks it newly revoked. Admitted
// entries whose request still waits for another resource, and locks already
// revoked, are left alone, as is a free resource; a lock named through
// several of its resources counts once. It returns ErrInvalidResource or
// ErrTooManyResources for a malformed call, and then changes nothing. It
// costs O(a log n) for a admitted entries on the named resources.
//
// A revoked lock keeps its resources until that expiry, and then ends as
// any lock does, reported as Expired; nothing is granted by Evict itself.
// Its holder may be slow, or disconnected and in its grace period, and
// believes it holds the lock until it hears of the eviction, and at most
// until its last answered request (answered no later than now) plus the
// session grace: the waiters get the lock only when that belief has ended.
// A revoked lock is nobody's any more: Extend by id returns ErrNotFound,
// Renew does not find it, and a re-entry by its owner does not renew it but
// queues behind it like any request. Its holder can still end it at once,
// as its own act: Unlock by id, Release and ReleaseAll free it (reporting
// nothing more to its session). With SessionGrace < 0 a session's locks go
// as soon as it detaches, and evicted locks go at once too: they are
// removed (no Expired follows), and their waiters granted only after every
// named lock is gone, so no lock granted by this call is evicted by it.
func (t *Table) Evict(now int64, resources []string) (int, error) {
	now = t.advance(now)
	switch {
	case len(resources) == 0:
		return 0, ErrInvalidResource
	case len(resources) > t.maxRes:
		return 0, ErrTooManyResources
	}
	for _, r := range resources {
		if err := CheckName(r, t.maxName); err != nil {
			return 0, err
		}
	}
	if t.cfg.SessionGrace < 0 {
		return t.evictNow(resources), nil
	}
	at := now + int64(t.cfg.SessionGrace)
	n := 0
	for _, r := range resources {
		q := t.queue(r)
		if q == nil {
			continue
		}
		nd := q.head
		for range q.nadm {
			l := nd.l
			nd = nd.next
			if l.state != stateGranted || l.flags&flagRevoked != 0 {
				continue
			}
			l.flags |= flagRevoked
			n++
			t.stats.Evicted++
			t.emit(Event{Kind: Released, ID: l.id, Session: l.sess.id, Owner: l.owner(), Token: l.token, Since: l.since(), Revoked: true})
			if at < l.deadline {
				l.deadline = at
				t.heap[l.hidx].at = at
				t.heap.fix(int(l.hidx))
			}
		}
	}
	return n, nil
}

// evictNow is Evict with no session grace: it removes each evicted lock at
// once, and grants waiters only after all of them are gone.
func (t *Table) evictNow(resources []string) int {
	cut := t.cut[:0]
	for _, r := range resources {
		q := t.queue(r)
		if q == nil {
			continue
		}
		nd := q.head
		for range q.nadm {
			if nd.l.state == stateGranted {
				cut = append(cut, nd)
			}
			nd = nd.next
		}
	}
	t.deferring = true
	n := 0
	for _, nd := range cut {
		l := nd.l
		if l == nil {
			continue // removed through another of its resources
		}
		n++
		t.stats.Evicted++
		t.emit(Event{Kind: Released, ID: l.id, Session: l.sess.id, Owner: l.owner(), Token: l.token, Since: l.since(), Revoked: true})
		t.remove(l)
	}
	clear(cut)
	t.cut = cut[:0]
	t.flushGrants()
	return n
}
