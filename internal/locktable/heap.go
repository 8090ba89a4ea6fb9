package locktable

// deadlines is a binary min-heap of timers ordered by time, then by arrival:
// deadlines due at the same instant are ordered by the seq of their request
// (or of the session's detach; the end of a hold on grants, seq 0, comes
// first), so the order in which they are processed is defined by the state,
// whatever the layout of the heap. Each item points back to its lock, which
// records its index so that it can be removed or moved in O(log n). A
// session's grace end, and the end of a hold on grants, is the deadline of
// the session's timer (session.tm): a lock struct marked flagTimer that
// only carries the index, the seq and the session, so that an item is 16
// bytes, one per live lock.
type deadlines []deadline

type deadline struct {
	at int64
	l  *lock // a request, or a session's timer (flagTimer)
}

func (h deadlines) setIndex(i int) { h[i].l.hidx = int32(i) }

func (h deadlines) less(i, j int) bool {
	a, b := &h[i], &h[j]
	if a.at != b.at {
		return a.at < b.at
	}
	// The tie-break: a request's arrival number, or its session's detach
	// number.
	return a.l.seq < b.l.seq
}

func (h deadlines) swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h.setIndex(i)
	h.setIndex(j)
}

func (h deadlines) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(i, p) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

func (h deadlines) down(i int) bool {
	start := i
	n := len(h)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && h.less(r, l) {
			m = r
		}
		if !h.less(m, i) {
			break
		}
		h.swap(i, m)
		i = m
	}
	return i > start
}

func (h *deadlines) push(d deadline) {
	*h = append(*h, d)
	i := len(*h) - 1
	h.setIndex(i)
	h.up(i)
}

// remove deletes item i and clears its owner's index.
func (h *deadlines) remove(i int) {
	old := *h
	n := len(old) - 1
	old[i].l.hidx = -1
	if i != n {
		old[i] = old[n]
		old.setIndex(i)
	}
	old[n] = deadline{}
	*h = old[:n]
	if i != n {
		if !h.down(i) {
			h.up(i)
		}
	}
}

// fix restores the order after item i's time changed.
func (h deadlines) fix(i int) {
	if !h.down(i) {
		h.up(i)
	}
}

// init orders h after any change to its items, in O(n), and records every
// item's index.
func (h deadlines) init() {
	for i := range h {
		h.setIndex(i)
	}
	for i := len(h)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}
