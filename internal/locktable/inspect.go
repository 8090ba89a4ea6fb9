package locktable

import (
	"strings"
	"time"
)

// Stats counts what the Table has done since it was created.
type Stats struct {
	Requests    uint64 // accepted lock requests (including renewals)
	Refused     uint64 // requests refused by tolerate or try
	Granted     uint64 // grants
	TimedOut    uint64
	Expired     uint64
	Unlocked    uint64 // successful unlocks and releases
	Extended    uint64 // successful Extend and Renew calls
	ExtendFails uint64 // failed Extend and Renew calls
	Dropped     uint64 // requests removed with their session
	Evicted     uint64 // locks revoked by Evict
	ServerFull  uint64 // requests refused by MaxLocks, MaxEntries or MaxNameBytes
	Live        int    // live requests (held and waiting)
	Entries     int    // queue entries (sum over live requests of their distinct resources)
	NameBytes   int64  // name bytes held: over queue entries, len(resource); plus len(owner) per live request
	Held        int    // granted locks
	Queues      int    // resources with a non-empty queue
	Sessions    int
	LastToken   uint64 // the last token given, or FirstToken-1
	HoldUntil   int64  // grants are held until this time (ns); 0: not held
}

// Stats returns the counters and sizes.
func (t *Table) Stats() Stats {
	s := t.stats
	s.Live = t.live
	s.Entries = t.entries
	s.NameBytes = t.bytes
	s.Held = t.held
	s.Queues = t.queueCount()
	s.Sessions = len(t.sessions)
	s.LastToken = t.next - 1
	s.HoldUntil = t.HoldUntil()
	return s
}

// LastToken returns the last fencing token given (FirstToken-1 before the
// first grant).
func (t *Table) LastToken() uint64 { return t.next - 1 }

// LockInfo describes one live request.
type LockInfo struct {
	ID        ID
	Session   string
	Owner     string
	Resources []string
	Modes     []Mode // the modes of Resources, in their order; nil: all exclusive
	Granted   bool
	Revoked   bool // evicted: nobody's any more, ends at Deadline (see Evict)
	Token     uint64
	TTL       time.Duration
	Created   int64
	GrantedAt int64 // when it was granted (ns); 0 while waiting, and for a lock restored from a snapshot
	Deadline  int64 // expiry if granted, wait deadline if waiting (0: none)
}

func (t *Table) info(l *lock) LockInfo {
	li := LockInfo{ID: l.id, Session: l.sess.id, Owner: l.owner(), Granted: l.state == stateGranted,
		Revoked: l.flags&flagRevoked != 0, Token: l.token, TTL: l.ttl, Created: l.created, GrantedAt: l.granted, Deadline: l.deadline}
	nds := l.nodes()
	for i := range nds {
		if q := nds[i].q; q != nil {
			li.Resources = append(li.Resources, q.name)
			if nds[i].permits != 0 && li.Modes == nil {
				li.Modes = make([]Mode, len(li.Resources)-1, cap(li.Resources))
			}
			if li.Modes != nil {
				li.Modes = append(li.Modes, q.mode(&nds[i]))
			}
		}
	}
	return li
}

// Lookup returns the request with this id.
func (t *Table) Lookup(id ID) (LockInfo, bool) {
	l := t.lookup(id)
	if l == nil {
		return LockInfo{}, false
	}
	return t.info(l), true
}

// Locks calls fn for up to limit live requests (all if limit <= 0), newest
// first, until fn returns false. It costs O(requests passed to fn).
func (t *Table) Locks(limit int, fn func(LockInfo) bool) {
	i := 0
	for l := t.all; l != nil; l = l.anext {
		if limit > 0 && i >= limit {
			return
		}
		i++
		if !fn(t.info(l)) {
			return
		}
	}
}

// SessionLocks calls fn for every live request of session id, newest first.
// It costs O(requests of the session).
func (t *Table) SessionLocks(id string, fn func(LockInfo)) {
	s := t.sessions[id]
	if s == nil {
		return
	}
	for l := s.head; l != nil; l = l.snext {
		fn(t.info(l))
	}
}

// QueueEntry is one request in a resource's queue.
type QueueEntry struct {
	ID        ID
	Session   string
	Owner     string
	Mode      Mode // how it takes the resource
	Granted   bool
	Revoked   bool // evicted: nobody's any more, ends at Deadline (see Evict)
	Token     uint64
	Created   int64
	GrantedAt int64 // when it was granted (ns); 0 while waiting, and for a lock restored from a snapshot
	Deadline  int64
}

// QueueInfo is one resource's queue, head (the holder or the reserving
// waiter) first; the shared holders of a resource, or its permit holders,
// come first in arrival order.
type QueueInfo struct {
	Resource string
	Entries  []QueueEntry // the queue, head first; QueuesPage may cut it short
	Len      int          // the queue's full number of entries
}

func queueEntry(q *queue, n *node) QueueEntry {
	l := n.l
	return QueueEntry{ID: l.id, Session: l.sess.id, Owner: l.owner(), Mode: q.mode(n), Granted: l.state == stateGranted,
		Revoked: l.flags&flagRevoked != 0, Token: l.token, Created: l.created, GrantedAt: l.granted, Deadline: l.deadline}
}

// Head returns the request at the head of resource's queue: its holder
// (the oldest of its holders, for a resource held shared), or the waiting
// request that reserves it. False if nobody holds or waits for resource. It
// costs O(k), k the request's resources.
func (t *Table) Head(resource string) (LockInfo, bool) {
	q := t.queue(resource)
	if q == nil {
		return LockInfo{}, false
	}
	return t.info(q.head.l), true
}

// QueuesPage calls fn, in name order, for the queues whose resource starts
// with prefix and sorts after after (all of them if after is ""), at most
// maxQueues of them and at most maxEntries entries in total: the last
// queue's Entries may be cut short (Len is always its full length), and no
// queue follows one that exhausted the entries. It stops early when fn
// returns false. It returns the last resource passed to fn when more
// queues match after it (pass it as after for the next page), and ""
// otherwise. Limits below 1 count as 1. It seeks the first name in the
// ordered index of queue names and walks on from there, so it costs
// O(log Q + m + e) time, for Q queues, m queues passed to fn and e entries,
// and O(m + e) memory, whatever the number of queues; the Entries slices of
// different calls of fn do not overlap, so fn may keep them. The index is
// built by the first listing, in O(Q log Q), and kept while listings come
// (see the package's Costs): a listing also moves the queues created since
// the previous one into it, at most 256 of them.
func (t *Table) QueuesPage(prefix, after string, maxQueues, maxEntries int, fn func(QueueInfo) bool) (next string) {
	maxQueues, maxEntries = max(maxQueues, 1), max(maxEntries, 1)
	// page: the first maxQueues matching queues, and one more if there is.
	names := t.index()
	page := make([]*queue, 0, min(maxQueues, names.Len(), 1024)+1)
	total := 0
	names.AscendGreaterOrEqual(keyOf(max(prefix, after)), func(k nameKey) bool {
		name := k.name
		// Names with the prefix are contiguous in the order, from prefix
		// on: the first one without it ends them.
		switch {
		case name == after:
			return true
		case !strings.HasPrefix(name, prefix):
			return false
		}
		q := t.queue(name)
		page = append(page, q)
		if len(page) <= maxQueues {
			total += q.n
		}
		return len(page) <= maxQueues
	})
	buf := make([]QueueEntry, 0, min(total, maxEntries))
	for i, q := range page[:min(len(page), maxQueues)] {
		start := len(buf)
		for n := q.head; n != nil && len(buf) < cap(buf); n = n.next {
			buf = append(buf, queueEntry(q, n))
		}
		more := i+1 < len(page)
		if !fn(QueueInfo{Resource: q.name, Entries: buf[start:len(buf):len(buf)], Len: q.n}) || len(buf) == cap(buf) {
			if more {
				return q.name
			}
			return ""
		}
	}
	return ""
}

// QueueLen returns the number of entries in resource's queue, holder
// included.
func (t *Table) QueueLen(resource string) int {
	if q := t.queue(resource); q != nil {
		return q.n
	}
	return 0
}
