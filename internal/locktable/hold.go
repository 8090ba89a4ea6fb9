package locktable

import (
	"cmp"
	"slices"
)

// HoldGrants holds every grant until until (ns): from now on nothing is
// granted before that time. Requests are still accepted and queued as
// usual; Tolerate, queue limits, wait timeouts, expiries, Extend, Renew,
// re-entry (an owner renewing a lock it already holds), Unlock, Release and
// sessions all work as usual, but a request that would be granted waits
// instead, and a try-lock (Request.Try) is refused with ErrBusy (naming its
// first resource, or the first busy one). The end of the hold is a deadline
// like the others (NextDeadline reports it): at until, the first call that
// processes deadlines grants, in arrival order and with a Granted event
// each, every request that is then at the head of all its queues; that
// costs O(m log m) for m such requests. HoldGrants itself costs O(log n).
//
// A hold only ever grows: an until earlier than the hold in force, or not
// after now, changes nothing. A server that starts after a crash holds
// grants for its session grace period, so that no holder of the previous
// run can still believe it holds a lock when something is granted again.
func (t *Table) HoldGrants(now, until int64) {
	now = t.advance(now)
	if until <= now || until <= t.holdUntil && t.holding() {
		return
	}
	t.holdUntil = until
	if t.holding() {
		t.heap[t.hold.tm.hidx].at = until
		t.heap.fix(int(t.hold.tm.hidx))
		return
	}
	t.heap.push(deadline{at: until, l: t.hold.tm})
}

// HoldUntil returns the end (ns) of the hold on grants in force, or 0 if
// grants are not held.
func (t *Table) HoldUntil() int64 {
	if t.holding() {
		return t.holdUntil
	}
	return 0
}

// holding reports whether grants are held.
func (t *Table) holding() bool { return t.hold.tm.hidx >= 0 }

// endHold ends the hold on grants, whose deadline has just been removed from
// the heap, and grants in arrival order every request that became
// grantable during it and still is.
func (t *Table) endHold() {
	t.holdUntil = 0
	t.grantReadyInOrder()
}

// grantReadyInOrder grants, in arrival order, the requests of ready that
// are still grantable, as far as the token limit lets it.
func (t *Table) grantReadyInOrder() {
	t.ready = slices.DeleteFunc(t.ready, func(r readyLock) bool { return !r.grantable(t) })
	slices.SortFunc(t.ready, func(a, b readyLock) int { return cmp.Compare(a.l.seq, b.l.seq) })
	t.grantReady()
}

// grantsHeld reports whether a request that becomes grantable must wait:
// grants are held (HoldGrants), or the next token would not be below the
// token limit (SetTokenLimit).
func (t *Table) grantsHeld() bool {
	return t.holding() || (t.tlimit != 0 && t.next >= t.tlimit)
}

// SetTokenLimit sets the bound of the tokens to limit (0: none): from now
// on every token given is below it. While the next token is not, a request
// that would be granted waits instead, as while grants are held (a
// try-lock is refused with ErrBusy), and with refuse a new request (a
// try-lock too; not an owner's re-entry, which renews) is refused with
// ErrNoTokens instead of queued; the rest (timeouts, expiries, Extend,
// Renew, Unlock, sessions) works as usual. A bound raised
// above the next token grants, in arrival order and with a Granted event
// each, every request then grantable, unless grants are held. A server
// keeps it at its token high-water mark on disk: a token above the mark
// could be given again after a crash. It costs O(m log m) for m requests
// that wait for the bound.
func (t *Table) SetTokenLimit(now int64, limit uint64, refuse bool) {
	t.advance(now)
	t.tlimit, t.trefuse = limit, refuse
	if !t.grantsHeld() && len(t.ready) > 0 {
		t.grantReadyInOrder()
	}
}

// TokenLimit returns the bound of the tokens (0: none).
func (t *Table) TokenLimit() uint64 { return t.tlimit }
