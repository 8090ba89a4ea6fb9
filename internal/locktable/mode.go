package locktable

import "strconv"

// Mode is how a request takes one resource. The zero value is exclusive.
//
// A resource's queue admits, in FIFO order, each entry that is compatible
// with every entry ahead of it; a request is granted once it is admitted on
// all its resources. A set of entries is compatible when it has at most one
// entry, or none of them is exclusive and, for a semaphore (Of > 0), their
// Permits add up to at most Of. Shared is one permit of an unbounded count:
// readers never exclude each other.
type Mode struct {
	// Permits is the number of permits taken: 0 for exclusive (everything),
	// 1 for shared, 1..Of for a semaphore of Of permits.
	Permits uint32
	// Of is the resource's number of permits: 0 (unbounded) for shared and
	// exclusive. Every shared or permits entry of one queue has the same Of
	// (see ErrPermitsConflict).
	Of uint32
}

// The two common modes; Permits(k, n) is the third kind.
var (
	Exclusive = Mode{}
	Shared    = Mode{Permits: 1}
)

// MaxPermits is the largest permit count of a semaphore.
const MaxPermits = 1_000_000_000

// Valid reports whether m is exclusive, shared, or k of n permits with
// 1 <= k <= n <= MaxPermits.
func (m Mode) Valid() bool {
	switch {
	case m.Of == 0:
		return m.Permits <= 1
	default:
		return m.Permits >= 1 && m.Permits <= m.Of && m.Of <= MaxPermits
	}
}

// Exclusive reports whether m is the exclusive mode.
func (m Mode) Exclusive() bool { return m.Permits == 0 }

// String returns the wire form of m: "x", "s" or "k/n".
func (m Mode) String() string { return string(m.AppendText(nil)) }

// AppendText appends the wire form of m to b.
func (m Mode) AppendText(b []byte) []byte {
	switch {
	case m.Permits == 0:
		return append(b, 'x')
	case m.Of == 0:
		return append(b, 's')
	}
	b = strconv.AppendUint(b, uint64(m.Permits), 10)
	b = append(b, '/')
	return strconv.AppendUint(b, uint64(m.Of), 10)
}

// ParseMode parses the wire form of a mode: "x" (exclusive), "s" (shared)
// or "k/n" (k of n permits, 1 <= k <= n <= MaxPermits, decimal without
// sign or leading zeros). It reports false for anything else, and never
// allocates.
func ParseMode(b []byte) (Mode, bool) {
	switch string(b) {
	case "x":
		return Exclusive, true
	case "s":
		return Shared, true
	}
	for i, c := range b {
		if c != '/' {
			continue
		}
		k, ok1 := parseCount(b[:i])
		n, ok2 := parseCount(b[i+1:])
		m := Mode{Permits: k, Of: n}
		return m, ok1 && ok2 && n > 0 && m.Valid()
	}
	return Mode{}, false
}

// parseCount parses 1..MaxPermits in decimal, without sign or leading zero.
func parseCount(b []byte) (uint32, bool) {
	if len(b) == 0 || len(b) > 10 || b[0] == '0' {
		return 0, false
	}
	var v uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + uint64(c-'0')
	}
	if v > MaxPermits {
		return 0, false
	}
	return uint32(v), true
}

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
