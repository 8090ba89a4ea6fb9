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
}

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

// freeQueue forgets q, which has no entry left, and keeps it for reuse.
func (t *Table) freeQueue(q *queue) {
	delete(t.queues, q.name)
	t.indexDel(q)
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
