package locktable

import (
	"strings"
)

// Unlock removes a granted or waiting lock from every queue and grants what
// becomes grantable. from is the caller's session: a granted lock unlocked
// from any other session (the empty one included) is reported to its own
// session as Released, so that its holder learns at once that it no longer
// holds it. Unlocking a waiting request reports nothing to its session,
// whoever unlocks it, nor unlocking a lock revoked by Evict (its session
// was told at the eviction). It returns ErrNotFound for an unknown id; a
// lock that a partial Release took resources from, or that Evict revoked,
// is still found.
func (t *Table) Unlock(now int64, id ID, from string) error {
	t.advance(now)
	l := t.lookup(id)
	if l == nil {
		return ErrNotFound
	}
	t.stats.Unlocked++
	if l.state == stateGranted && !t.own(l, from) && l.flags&flagRevoked == 0 {
		t.emit(Event{Kind: Released, ID: l.id, Session: l.sess.id, Owner: l.owner(), Token: l.token, Since: l.since()})
	}
	t.remove(l)
	return nil
}

// Release releases, for each named resource, the owner's granted lock on it.
// It reports true only if every resource was held by owner when it was
// called. Resources held by another owner, or only waited for, are left
// alone; a name given twice counts once. Releasing some resources of a
// multi-resource lock leaves it holding the rest and reports it as Released
// with Partial set; a lock left with none is removed and reported as
// Released. From then on Extend by id no longer finds a partially released
// lock (its holder was told it is gone); Renew by owner on exactly the rest
// and Unlock by id still do, and a re-entry on exactly the rest, which
// answers with the lock's ID, makes Extend find it again. Waiters are
// granted only after everything named has been released, so no lock
// granted by this call is released by it. A lock revoked by Evict is still
// its owner's to release, at once, and nothing more is reported for it.
func (t *Table) Release(now int64, owner string, resources []string) bool {
	return t.ReleaseIn(now, owner, resources, "")
}

// ReleaseIn is Release confined to the resources whose name starts with
// prefix (the scope; "" is every resource): a named resource outside the
// scope is left alone, as one the owner does not hold, and makes the answer
// false. It costs what Release costs.
func (t *Table) ReleaseIn(now int64, owner string, resources []string, prefix string) bool {
	t.advance(now)
	if owner == "" || len(resources) == 0 {
		return false
	}
	all := true
	cut := t.cut[:0]
	for _, r := range resources {
		q := t.queue(r)
		if q == nil || !strings.HasPrefix(r, prefix) {
			all = false
			continue
		}
		n := len(cut)
		t.ownerOn(q, owner, func(nd *node) bool {
			cut = append(cut, nd)
			return true
		})
		if len(cut) == n {
			all = false
		}
	}
	t.releaseCut(cut)
	return all
}

// releaseCut unqueues the nodes of cut (granted locks' entries; a node may
// appear twice), reports each lock they belong to as Released (Partial if
// it keeps other resources), removes the locks left with none, and then
// grants what became grantable.
func (t *Table) releaseCut(cut []*node) {
	t.deferring = true
	for _, n := range cut {
		if n.q == nil {
			continue // named twice
		}
		l := n.l
		b := int64(len(n.q.name))
		t.unqueue(n)
		l.live--
		l.flags |= flagCut
		t.entries--
		t.bytes -= b
		l.sess.bytes -= b
	}
	for _, n := range cut {
		l := n.l
		if l == nil || l.flags&flagCut == 0 {
			continue // removed, or reported already
		}
		l.flags &^= flagCut
		if l.live > 0 {
			l.flags |= flagPartial
		}
		if l.flags&flagRevoked == 0 {
			t.emit(Event{Kind: Released, ID: l.id, Session: l.sess.id, Owner: l.owner(), Token: l.token, Partial: l.live > 0, Since: l.since()})
		}
		if l.live == 0 {
			t.stats.Unlocked++
			t.remove(l)
		}
	}
	clear(cut)
	t.cut = cut[:0]
	t.flushGrants()
}

// ReleaseAll releases every granted lock of owner, reporting each as Released
// (except locks revoked by Evict, whose sessions were told already), and
// returns how many it released. Waiting requests of owner stay queued,
// even those that the release lets through: they are granted after the
// releases, and stay granted.
func (t *Table) ReleaseAll(now int64, owner string) int {
	t.advance(now)
	ol := t.owners[owner]
	if ol == nil || owner == "" {
		return 0
	}
	t.deferring = true
	n := 0
	for l := ol.head; l != nil; {
		next := l.own.next
		if l.state == stateGranted {
			n++
			t.stats.Unlocked++
			if l.flags&flagRevoked == 0 {
				t.emit(Event{Kind: Released, ID: l.id, Session: l.sess.id, Owner: l.owner(), Token: l.token, Since: l.since()})
			}
			t.remove(l)
		}
		l = next
	}
	t.flushGrants()
	return n
}

// ReleaseAllIn is ReleaseAll confined to the resources whose name starts
// with prefix (the scope; "" is ReleaseAll): it releases, of each granted
// lock of owner, the resources in the scope, and returns how many locks it
// released wholly or in part. A lock with no resource in the scope is not
// touched; one with resources on both sides keeps those outside, and is
// reported as Released with Partial set, as Release does. It costs
// O(locks of owner · k).
func (t *Table) ReleaseAllIn(now int64, owner, prefix string) int {
	if prefix == "" {
		return t.ReleaseAll(now, owner)
	}
	t.advance(now)
	ol := t.owners[owner]
	if ol == nil || owner == "" {
		return 0
	}
	cut := t.cut[:0]
	n := 0
	for l := ol.head; l != nil; l = l.own.next {
		if l.state != stateGranted {
			continue
		}
		k := len(cut)
		nds := l.nodes()
		for i := range nds {
			if nd := &nds[i]; nd.q != nil && strings.HasPrefix(nd.q.name, prefix) {
				cut = append(cut, nd)
			}
		}
		if len(cut) > k {
			n++
		}
	}
	t.releaseCut(cut)
	return n
}

// remove deletes l everywhere and grants what becomes grantable.
func (t *Table) remove(l *lock) {
	if l.hidx >= 0 {
		t.heap.remove(int(l.hidx))
	}
	if l.state == stateGranted {
		t.held--
	}
	s := l.sess
	s.del(l)
	if l.owner() != "" {
		t.ownerDel(l)
	}
	t.entries -= int(l.live)
	b := int64(len(l.owner()))
	// Unlink every node first, then grant, so a grant never sees l.
	nds := l.nodes()
	for i := range nds {
		if n := &nds[i]; n.q != nil {
			b += int64(len(n.q.name))
			t.unqueue(n)
		}
	}
	t.bytes -= b
	s.bytes -= b
	t.freeLock(l)
}

// unqueue unlinks n from its queue and admits the entries behind it that
// now fit; each whose request is then admitted in all its queues is
// granted (or, while deferring, put in ready), in queue order.
func (t *Table) unqueue(n *node) {
	q := n.q
	switch {
	case n.adm:
		q.nadm--
		if t.plant != plantLeak || q.of == 0 {
			q.used -= n.permits
		}
		n.adm = false
	case q.gate == n:
		q.gate = n.next
	}
	if n.permits > 0 {
		q.nshared--
	}
	t.unlink(q, n)
	if q.n == 0 {
		t.park(q)
		return
	}
	// Admit what now fits: O(entries admitted).
	for g := q.gate; g != nil && q.fits(g.permits); g = q.gate {
		q.admit(g)
		q.gate = g.next
		h := g.l
		h.waiting--
		if h.waiting == 0 {
			if t.deferring || t.grantsHeld() {
				t.addReady(h)
				continue
			}
			if t.late(h) {
				continue // advance times it out
			}
			t.grantEmit(h)
		}
	}
}
