package locktable

import "github.com/mlock-dev/mlock/internal/protocol"

// Mode is how a request takes one resource: the wire vocabulary's
// protocol.Mode. The zero value is exclusive.
//
// A resource's queue admits, in FIFO order, each entry that is compatible
// with every entry ahead of it; a request is granted once it is admitted on
// all its resources. A set of entries is compatible when it has at most one
// entry, or none of them is exclusive and, for a semaphore (Of > 0), their
// Permits add up to at most Of. Shared is one permit of an unbounded count:
// readers never exclude each other.
type Mode = protocol.Mode

// The two common modes; Permits(k, n) is the third kind.
var (
	Exclusive = protocol.Exclusive
	Shared    = protocol.Shared
)

// MaxPermits is the largest permit count of a semaphore.
const MaxPermits = protocol.MaxPermits

// ParseMode parses the wire form of a mode; see protocol.ParseMode.
func ParseMode(b []byte) (Mode, bool) { return protocol.ParseMode(b) }

// modeAt returns the mode of req's i-th resource.
func (req *Request) modeAt(i int) Mode {
	switch len(req.Modes) {
	case 0:
		return Exclusive
	case 1:
		return req.Modes[0]
	}
	return req.Modes[i]
}

// checkModes validates req.Modes: one mode for all, or one per resource,
// each valid, and a resource named twice with one mode only.
func (req *Request) checkModes() error {
	switch k := len(req.Modes); {
	case k == 0:
		return nil
	case k != 1 && k != len(req.Resources):
		return ErrInvalidMode
	case k == 1:
		if !req.Modes[0].Valid() {
			return ErrInvalidMode
		}
		return nil
	}
	for i, m := range req.Modes {
		if !m.Valid() {
			return ErrInvalidMode
		}
		for j := range i {
			if req.Resources[j] == req.Resources[i] && req.Modes[j] != m {
				return ErrInvalidMode
			}
		}
	}
	return nil
}

// ---- admission ----

// fits reports whether an entry taking permits (0: exclusive) can join the
// entries q admits now.
func (q *queue) fits(permits uint32) bool {
	if q.nadm == 0 {
		return true
	}
	if permits == 0 || q.head.permits == 0 {
		return false
	}
	return q.of == 0 || uint64(q.used)+uint64(permits) <= uint64(q.of)
}

// admit admits n, the first entry not admitted yet.
func (q *queue) admit(n *node) {
	n.adm = true
	q.nadm++
	q.used += n.permits
}

// tolerateLen is q's length for Request.Tolerate: its waiting entries, and
// one for the admitted ones, which hold (or reserve) it together. For a
// queue of exclusive entries it is the number of entries.
func (q *queue) tolerateLen() int { return q.n - q.nadm + min(q.nadm, 1) }

// mode returns the mode of n, queued in q.
func (q *queue) mode(n *node) Mode {
	if n.permits == 0 {
		return Exclusive
	}
	return Mode{Permits: n.permits, Of: q.of}
}

// holds returns l's node in q, or nil. It costs O(k).
func (l *lock) nodeIn(q *queue) *node {
	nds := l.nodes()
	for i := range nds {
		if nds[i].q == q {
			return &nds[i]
		}
	}
	return nil
}

// ownerOn calls fn for each granted lock of owner admitted in q (revoked
// ones included) until fn returns false. With an exclusive head that is at
// most the head; otherwise it walks the shorter of the admitted entries and
// the owner's locks: O(min(admitted, locks of owner · k)).
func (t *Table) ownerOn(q *queue, owner string, fn func(*node) bool) {
	h := q.head
	if h.permits == 0 || q.nadm == 1 {
		if h.l.state == stateGranted && h.l.owner() == owner {
			fn(h)
		}
		return
	}
	ol := t.owners[owner]
	if ol == nil {
		return
	}
	if ol.n < q.nadm {
		for l := ol.head; l != nil; l = l.own.next {
			if l.state != stateGranted {
				continue
			}
			if n := l.nodeIn(q); n != nil && !fn(n) {
				return
			}
		}
		return
	}
	n := h
	for range q.nadm {
		if n.l.state == stateGranted && n.l.owner() == owner && !fn(n) {
			return
		}
		n = n.next
	}
}

// heldBy returns a granted lock of owner on q that Evict did not revoke,
// or nil.
func (t *Table) heldBy(q *queue, owner string) *lock {
	var found *lock
	t.ownerOn(q, owner, func(n *node) bool {
		if n.l.flags&flagRevoked == 0 {
			found = n.l
			return false
		}
		return true
	})
	return found
}

// barge is the planted bug plantBarge: n, a new shared or permits entry,
// jumps ahead of a waiting exclusive entry into the admitted ones when it
// fits them. It reports whether it did.
func (t *Table) barge(q *queue, n *node) bool {
	g := q.gate
	if t.plant != plantBarge || n.permits == 0 || g == nil || g.permits != 0 || !q.fits(n.permits) {
		return false
	}
	n.q, n.prev, n.next = q, g.prev, g
	g.prev.next = n // the gate is never the head: the head is admitted
	g.prev = n
	q.n++
	n.l.live++
	q.admit(n)
	return true
}
