package locktable

// A queue's admitted entries are a prefix of it: the head, and each next
// entry while it is compatible with all of them (see Mode). gate is the
// first entry not admitted; no entry behind it is admitted either.
type queue struct {
	name       string
	head, tail *node
	gate       *node // the first entry not admitted, nil if none
	n          int
	nadm       int    // admitted entries
	nshared    int32  // entries in a shared or permits mode
	of         uint32 // their permit count (0: unbounded); valid while nshared > 0
	// used is the permits of the admitted entries: at most of for a
	// semaphore, and nadm (one each) for shared entries.
	used uint32
	// young is q's position + 1 among the young queues of the index of
	// names (see nameIndex), 0 if it is not young.
	young int32
	// busy is q's position + 1 in the Table's list of the queues with two
	// entries or more (contended), 0 while it is not on it.
	busy int32
	// parked is q's position + 1 in the ring of parked queues while q is
	// parked (empty, kept under its name for the next request of it), 0
	// otherwise.
	parked int32
}

// Parked queues. A queue whose last entry leaves is not forgotten at once:
// it stays in the map of queues, empty, and enters a ring of maxParked
// slots, first in, first out. A request for its name takes it back in
// O(1), so that a resource locked and unlocked over and over costs one map
// lookup per cycle instead of a lookup, an insertion and a deletion.
// Parking into a full ring frees its oldest slot: the queue in it is
// forgotten (deleted from the map), or nothing if that queue was taken
// back (its slot is nil). So a queue is forgotten after maxParked parks
// of other queues unless a request takes it back first. A parked queue is in
// no listing, index or count: every reader but Lock goes through
// Table.queue, which does not see it. The ring is not state: snapshots do
// not hold it, and no answer, event or snapshot depends on it.
type parkRing struct {
	ring [maxParked]*queue // nil where a queue was taken back
	head int               // the oldest slot in use
	len  int               // slots in use, nil ones included
	n    int               // parked queues: non-nil slots
	max  int               // slots used of ring: maxParked (tests lower it)
}

// maxParked bounds the parked queues: at most maxParked empty queues (80
// bytes, a map entry and a name each) outlive their last entry.
const maxParked = 1024

// queue returns the queue of name, or nil if nobody holds or waits for
// name (none, or a parked one).
func (t *Table) queue(name string) *queue {
	if q := t.queues[name]; q != nil && q.parked == 0 {
		return q
	}
	return nil
}

// queueCount returns the number of non-empty queues.
func (t *Table) queueCount() int { return len(t.queues) - t.parked.n }

// newQueue returns an empty queue for name, registered in the Table.
func (t *Table) newQueue(name string) *queue {
	var q *queue
	if n := len(t.free); n > 0 {
		q = t.free[n-1]
		t.free = t.free[:n-1]
	} else {
		q = new(queue)
	}
	q.name = name
	t.queues[name] = q
	t.indexAdd(q)
	return q
}

// park keeps q, which has no entry left, under its name in the ring of
// parked queues, forgetting the one parked longest ago if the ring is full.
func (t *Table) park(q *queue) {
	t.indexDel(q)
	// An empty queue's entries and links are gone already (nil, 0).
	q.nadm, q.nshared, q.of, q.used = 0, 0, 0, 0
	r := &t.parked
	if r.len == r.max {
		old := r.ring[r.head]
		r.ring[r.head] = nil
		if r.head++; r.head == r.max {
			r.head = 0
		}
		r.len--
		if old != nil {
			r.n--
			t.freeQueue(old)
		}
	}
	i := r.head + r.len
	if i >= r.max {
		i -= r.max
	}
	r.ring[i] = q
	q.parked = int32(i + 1)
	r.len++
	r.n++
}

// unpark takes q, a parked queue, out of the ring for a new entry.
func (t *Table) unpark(q *queue) {
	r := &t.parked
	r.ring[q.parked-1] = nil
	q.parked = 0
	r.n--
	t.indexAdd(q)
}

// freeQueue forgets q, a parked queue out of the ring already, and keeps
// the struct for reuse.
func (t *Table) freeQueue(q *queue) {
	delete(t.queues, q.name)
	*q = queue{}
	t.free = append(t.free, q)
}

// pushBack appends n to q.
func (t *Table) pushBack(q *queue, n *node) {
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
	if q.n >= 2 && q.busy == 0 {
		t.busy = append(t.busy, q)
		q.busy = int32(len(t.busy))
	}
}

// unlink takes n out of its queue q.
func (t *Table) unlink(q *queue, n *node) {
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
	if q.n < 2 && q.busy > 0 {
		i, last := int(q.busy)-1, len(t.busy)-1
		if i != last {
			t.busy[i] = t.busy[last]
			t.busy[i].busy = int32(i + 1)
		}
		t.busy[last] = nil
		t.busy = t.busy[:last]
		q.busy = 0
	}
}
