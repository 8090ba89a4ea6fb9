package locktable

import (
	"time"
)

// setExpiry sets the granted lock l's expiry for a renewal of ttl at now.
// From the lock's own session (own) the expiry becomes now + ttl exactly, and
// the lock's TTL becomes ttl. From anywhere else it never moves earlier: it
// becomes max(expiry, now + ttl), and the TTL changes only if the expiry
// moves. The holder computes how long it may believe it holds the lock from
// its own requests; an expiry shortened by someone else would let the lock
// go to another while the holder still believes it holds it.
func (t *Table) setExpiry(now int64, l *lock, ttl time.Duration, own bool) {
	at := now + int64(ttl)
	if !own && at <= l.deadline {
		return
	}
	l.ttl = ttl
	l.deadline = at
	t.heap[l.hidx].at = at
	t.heap.fix(int(l.hidx))
}

// Extend renews a granted lock by id for ttl and returns its expiry (ns).
// from is the caller's session. From the lock's own session the expiry
// becomes now + ttl. From any other session, the empty one included, it
// never moves earlier: it becomes max(expiry, now + ttl), and the lock's TTL
// changes only if the expiry moves; the returned expiry is the lock's. It
// returns ErrNotFound for an unknown id, for a lock revoked by Evict, and
// for a lock that a partial Release took resources from (its holder was
// told it no longer holds it; Renew by owner on exactly the rest still
// finds it), ErrNotGranted for a waiting request and ErrInvalidTTL for a
// ttl not in (0, MaxTTL].
func (t *Table) Extend(now int64, id ID, ttl time.Duration, from string) (int64, error) {
	now = t.advance(now)
	l := t.lookup(id)
	switch {
	case l == nil || l.flags&(flagPartial|flagRevoked) != 0:
		t.stats.ExtendFails++
		return 0, ErrNotFound
	case l.state != stateGranted:
		t.stats.ExtendFails++
		return 0, ErrNotGranted
	case ttl <= 0 || ttl > t.maxTTL:
		t.stats.ExtendFails++
		return 0, ErrInvalidTTL
	}
	t.setExpiry(now, l, ttl, t.own(l, from))
	t.stats.Extended++
	return l.deadline, nil
}

// own reports whether from, a caller's session, is l's session. The empty
// session is never a lock's own.
func (t *Table) own(l *lock, from string) bool { return from != "" && l.sess.id == from }

// Renew renews, by owner, the granted lock of owner whose resources are
// exactly resources (duplicates folded, in any order) for ttl. from is the
// caller's session: from the lock's own session its expiry becomes
// now + ttl; from any other it never moves earlier, as with Extend. The
// lock keeps its ID and token and stays in its session; no token is used.
// A lock that a partial Release took resources from stays unknown to
// Extend. It returns ErrInvalidOwner (empty owner too),
// ErrInvalidResource, ErrTooManyResources or ErrInvalidTTL for a malformed
// call, and ErrNotFound if owner holds no such lock: also when its lock holds
// more or fewer resources (after a partial Release it holds only the rest,
// and only exactly the rest is found), when the lock is still waiting,
// when it was taken with Request.NoReentry, and when Evict revoked it. It
// costs O(k² + log n), k the number of resources.
func (t *Table) Renew(now int64, owner string, resources []string, ttl time.Duration, from string) (Grant, error) {
	now = t.advance(now)
	switch {
	case owner == "" || !t.checkOwner(owner):
		return Grant{}, ErrInvalidOwner
	case len(resources) == 0:
		return Grant{}, ErrInvalidResource
	case len(resources) > t.maxRes:
		return Grant{}, ErrTooManyResources
	case ttl <= 0 || ttl > t.maxTTL:
		return Grant{}, ErrInvalidTTL
	}
	for _, r := range resources {
		if err := CheckName(r, t.maxName); err != nil {
			return Grant{}, err
		}
	}
	l := t.ownerLock(owner, resources)
	if l == nil {
		t.stats.ExtendFails++
		return Grant{}, ErrNotFound
	}
	t.setExpiry(now, l, ttl, t.own(l, from))
	t.stats.Extended++
	return Grant{ID: l.id, Granted: true, Renewed: true, Token: l.token, ExpiresAt: l.deadline}, nil
}

// ownerLock returns owner's granted, re-entrant lock that holds exactly
// resources, or nil. An owner may hold several shared locks on one
// resource: each of them is tried.
func (t *Table) ownerLock(owner string, resources []string) *lock {
	q := t.queue(resources[0])
	if q == nil {
		return nil
	}
	k := distinct(resources)
	var found *lock
	t.ownerOn(q, owner, func(n *node) bool {
		l := n.l
		if l.flags&(flagNoReentry|flagRevoked) != 0 || int(l.live) != k {
			return true
		}
		for _, r := range resources[1:] {
			if q := t.queue(r); q == nil || l.nodeIn(q) == nil {
				return true
			}
		}
		found = l
		return false
	})
	return found
}
