package locktable

import (
	"slices"
)

// readyLock is a request that became grantable while grants were deferred.
// id tells whether l is still the same live request when the grants run.
type readyLock struct {
	l  *lock
	id ID
}

// flushGrants ends deferring and grants, in the order they became
// grantable, the deferred requests that are still live and waiting. While
// grants are held (or the token limit is reached) it leaves them in ready
// for endHold (or SetTokenLimit).
func (t *Table) flushGrants() {
	t.deferring = false
	if t.grantsHeld() {
		return
	}
	t.grantReady()
}

// grantReady grants, in their order in ready, the requests of ready that
// are still grantable, until the token limit stops it: ready keeps the rest.
func (t *Table) grantReady() {
	n := 0
	for i, r := range t.ready {
		t.ready[i] = readyLock{}
		if !r.grantable(t) {
			continue
		}
		if t.grantsHeld() {
			t.ready[n] = r
			n++
			continue
		}
		t.grantEmit(r.l)
	}
	t.ready = t.ready[:n]
}

// grantable reports whether r is still the same live request, waiting, at
// the head of all its queues.
func (r *readyLock) grantable(t *Table) bool {
	l := r.l
	return t.lookup(r.id) == l && l.state == stateWaiting && l.waiting == 0 && !t.late(l)
}

// late reports whether l is a waiting request whose wait deadline is before
// now. Only the deadline processing of advance meets one (it processes
// every deadline due by now before it returns): a queue freed at an earlier
// instant of the same call, or the end of a hold, must not grant it at now,
// since its client gave up at its deadline; advance times it out instead.
// A wait deadline at now itself is a tie, settled in arrival order (see
// advance): the request may still be granted.
// With Config.LateGrants no request is late.
func (t *Table) late(l *lock) bool {
	return !t.lateOK && l.state == stateWaiting && l.deadline != 0 && l.deadline < t.now
}

// addReady puts l, which just became grantable, in ready. While grants are
// held, ready can collect many requests that went away since; it is
// compacted when it outgrows the live requests, so its size stays O(n) and
// the cost amortised O(1).
func (t *Table) addReady(l *lock) {
	if len(t.ready) >= 2*t.live+64 {
		t.ready = slices.DeleteFunc(t.ready, func(r readyLock) bool { return !r.grantable(t) })
	}
	t.ready = append(t.ready, readyLock{l: l, id: l.id})
}

// grantEmit grants the waiting request l at t.now and reports it.
func (t *Table) grantEmit(l *lock) {
	t.grant(t.now, l)
	t.emit(Event{Kind: Granted, ID: l.id, Session: l.sess.id, Owner: l.owner(), Token: l.token, ExpiresAt: l.deadline, Since: l.created})
}
