package locktable

import (
	"encoding/binary"

	"github.com/google/btree"
)

// A queue's admitted entries are a prefix of it: the head, and each next
// entry while it is compatible with all of them (see Mode). gate is the
// first entry not admitted; no entry behind it is admitted either.
type queue struct {
	name       string
	head, tail *node
	n          int
	gate       *node  // the first entry not admitted, nil if none
	nadm       int    // admitted entries
	used       uint64 // permits of the admitted entries
	nshared    int    // entries in a shared or permits mode
	of         uint32 // their permit count (0: unbounded); valid while nshared > 0
	// list is the Table's list of the queues with two entries or more
	// (contended), which cprev and cnext link while q is on it.
	list         *queueList
	cprev, cnext *queue
}

// queueList is a list of queues.
type queueList struct {
	head *queue
	n    int
}

// nameDegree is the degree of the B-tree of queue names: each node holds
// up to 2*nameDegree-1 names. Chosen by the engine benchmarks.
const nameDegree = 16

// nameKey is a queue name in the B-tree. pre, its first 8 bytes, orders
// most pairs of names without reading them: a comparison that reads the
// names costs a cache miss each in a large tree.
type nameKey struct {
	pre  uint64 // the first 8 bytes of name, big-endian, zero-padded
	name string
}

func keyOf(name string) nameKey {
	var b [8]byte
	copy(b[:], name)
	return nameKey{pre: binary.BigEndian.Uint64(b[:]), name: name}
}

// nameLess orders queue names by bytes, as <. Names that differ in their
// padded first 8 bytes are ordered by pre; if they differ at byte i there,
// either both have a byte at i, or the shorter one ends at i and is a
// prefix of the other (a padding 0 differs only from a non-zero byte). It
// is a variable so that tests can count the comparisons of a listing.
var nameLess btree.LessFunc[nameKey] = func(a, b nameKey) bool {
	if a.pre != b.pre {
		return a.pre < b.pre
	}
	return a.name < b.name
}

func (t *Table) newQueue(name string) *queue {
	var q *queue
	if n := len(t.free); n > 0 {
		q = t.free[n-1]
		t.free = t.free[:n-1]
	} else {
		q = new(queue)
	}
	q.name, q.list = name, &t.busy
	t.queues[name] = q
	t.names.ReplaceOrInsert(keyOf(name))
	return q
}

func (q *queue) pushBack(n *node) {
	n.q = q
	n.prev = q.tail
	n.next = nil
	if q.tail != nil {
		q.tail.next = n
	} else {
		q.head = n
	}
	q.tail = n
	q.n++
	if q.n == 2 {
		l := q.list
		q.cprev, q.cnext = nil, l.head
		if l.head != nil {
			l.head.cprev = q
		}
		l.head = q
		l.n++
	}
}

func (q *queue) unlink(n *node) {
	if n.prev != nil {
		n.prev.next = n.next
	} else {
		q.head = n.next
	}
	if n.next != nil {
		n.next.prev = n.prev
	} else {
		q.tail = n.prev
	}
	n.prev, n.next, n.q = nil, nil, nil
	q.n--
	if q.n == 1 {
		l := q.list
		if q.cprev != nil {
			q.cprev.cnext = q.cnext
		} else {
			l.head = q.cnext
		}
		if q.cnext != nil {
			q.cnext.cprev = q.cprev
		}
		q.cprev, q.cnext = nil, nil
		l.n--
	}
}
