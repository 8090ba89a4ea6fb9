package locktable

import (
	"slices"
	"strings"
)

// Busiest calls fn for the n longest queues whose resource starts with
// prefix, longest first (equal lengths in name order), until fn returns
// false; each QueueInfo holds at most maxEntries of its queue's entries,
// head first (Len is the full length). It returns the number of queues
// that match prefix. n and maxEntries below 1 count as 1.
//
// The Table keeps a list of the queues with two entries or more: Busiest
// visits those, then queues of one entry in name order until it has n.
// Without a prefix that is O(C log n + n log Q) time for C contended
// queues of Q; with a prefix, counting the matching queues adds a walk of
// them in the ordered index of names, O(M) for M matches (no lookup per
// queue). Memory is O(n·maxEntries). The Entries slices of different
// calls of fn do not overlap, so fn may keep them. The ordered index is
// the listings' (see QueuesPage): a call that needs it builds it if there
// is none.
func (t *Table) Busiest(prefix string, n, maxEntries int, fn func(QueueInfo) bool) (matched int) {
	n, maxEntries = max(n, 1), max(maxEntries, 1)
	top := make(queueHeap, 0, min(n, t.queueCount()))
	for _, q := range t.busy {
		if !strings.HasPrefix(q.name, prefix) {
			continue
		}
		switch {
		case len(top) < n:
			top.push(q)
		case longer(q, top[0]):
			top[0] = q
			top.down(0)
		}
	}
	// Fill with queues of one entry, in name order; count the matches.
	need := n - len(top)
	if prefix == "" {
		matched = t.queueCount()
	}
	if need > 0 || prefix != "" {
		t.index().AscendGreaterOrEqual(keyOf(prefix), func(k nameKey) bool {
			if !strings.HasPrefix(k.name, prefix) {
				return false
			}
			if prefix != "" {
				matched++
			}
			if need > 0 {
				if q := t.queue(k.name); q.n == 1 {
					top.push(q)
					need--
				}
			}
			return need > 0 || prefix != ""
		})
	}
	slices.SortFunc(top, func(a, b *queue) int {
		if longer(a, b) {
			return -1
		}
		return 1
	})
	total := 0
	for _, q := range top {
		total += min(q.n, maxEntries)
	}
	buf := make([]QueueEntry, 0, total)
	for _, q := range top {
		start := len(buf)
		for nd, i := q.head, 0; nd != nil && i < maxEntries; nd, i = nd.next, i+1 {
			buf = append(buf, queueEntry(q, nd))
		}
		if !fn(QueueInfo{Resource: q.name, Entries: buf[start:len(buf):len(buf)], Len: q.n}) {
			break
		}
	}
	return matched
}

// longer orders queues by length, then by name: a before b.
func longer(a, b *queue) bool {
	if a.n != b.n {
		return a.n > b.n
	}
	return a.name < b.name
}

// queueHeap is a heap of queues whose root is the one longer puts last.
type queueHeap []*queue

func (h *queueHeap) push(q *queue) {
	*h = append(*h, q)
	s := *h
	for i := len(s) - 1; i > 0; {
		p := (i - 1) / 2
		if !longer(s[p], s[i]) {
			break
		}
		s[p], s[i] = s[i], s[p]
		i = p
	}
}

func (h queueHeap) down(i int) {
	for {
		l, m := 2*i+1, i
		if l < len(h) && longer(h[m], h[l]) {
			m = l
		}
		if r := l + 1; r < len(h) && longer(h[m], h[r]) {
			m = r
		}
		if m == i {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}
