package locktable

// Advance processes, in deadline order, every expiry, wait timeout and
// session grace period due at or before now.
func (t *Table) Advance(now int64) { t.advance(now) }

func (t *Table) advance(now int64) int64 {
	if now > t.now {
		t.now = now
	}
	now = t.now
	for len(t.heap) > 0 && t.heap[0].at <= now {
		l := t.heap[0].l
		if l.flags&flagTimer != 0 {
			t.heap.remove(0)
			if s := l.sess; s == &t.hold {
				t.endHold()
			} else {
				t.dropSession(s)
			}
			continue
		}
		if l.state == stateGranted {
			t.stats.Expired++
			t.emit(Event{Kind: Expired, ID: l.id, Session: l.sess.id, Owner: l.owner(), Token: l.token, Since: l.since(),
				Revoked: l.flags&flagRevoked != 0})
		} else {
			t.stats.TimedOut++
			t.emit(Event{Kind: TimedOut, ID: l.id, Session: l.sess.id, Owner: l.owner(), Since: l.created})
		}
		t.remove(l)
	}
	return now
}

// Now returns the latest time (ns) the Table has seen: time never runs
// backwards, so a call with an earlier now runs at this time.
func (t *Table) Now() int64 { return t.now }

// Failover postpones to until every pending deadline that would fall before
// it: the expiry of every granted lock (revoked ones included), the wait
// timeout of every waiting request and the end of every detached session's
// grace period that is due before until is set to until exactly; later
// ones, and the end of a hold on grants, are left alone. It first processes
// what is due at now, like every method, and returns how many deadlines it
// moved. Nothing is reported: a lock keeps its TTL, and its expiry, as
// Lookup shows it, is until.
//
// It is what a replicated service applies when a new leader takes over,
// with until = the end of the election window: while no leader was there to
// hear them, holders could not extend their locks, detached sessions could
// not come back and waiters could not be granted; the election itself must
// not rob a holder of its lock, end a session or time a waiter out. Moving a
// deadline later never lets two believe they hold one resource. It costs
// O(n) for n pending deadlines.
func (t *Table) Failover(now, until int64) int {
	t.advance(now)
	n := 0
	for i := range t.heap {
		d := &t.heap[i]
		if d.at >= until || d.l == t.hold.tm {
			continue
		}
		d.at = until
		if d.l.flags&flagTimer == 0 {
			d.l.deadline = until
		}
		n++
	}
	if n > 0 {
		t.heap.init()
	}
	return n
}

// NextDeadline returns the earliest pending deadline (expiry, wait timeout,
// end of a grace period or of a hold on grants), or false if there is none.
func (t *Table) NextDeadline() (int64, bool) {
	if len(t.heap) == 0 {
		return 0, false
	}
	return t.heap[0].at, true
}
