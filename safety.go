package mlock

import (
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mlock-dev/mlock/internal/lease"
	"github.com/mlock-dev/mlock/internal/protocol"
)

// The safety rule: what a holder believes, it can justify with its own
// clock. See the package documentation ("Safety") for the rule; this file
// holds its machinery: send times, the session's one timer (deadlines of
// held locks, backstops of waits) and the keep-alive period.

// epoch is the origin of the monotonic times the session keeps (a
// time.Duration since epoch): comparing them is cheaper than comparing
// time.Time values, and epoch.Add(d) turns one back into a time.Time that
// carries the monotonic reading.
var epoch = time.Now()

// monoNow returns the monotonic time since epoch.
func monoNow() time.Duration { return time.Since(epoch) }

// minKeepAlive bounds the keep-alive period from below (a server announcing
// a grace of 0 cannot be kept up with by pinging).
const minKeepAlive = 5 * time.Millisecond

// clockSlack: the session's timer loses every lock whose deadline is at most
// this far ahead when it fires, instead of firing again for each: losing a
// lock a little early is safe.
const clockSlack = time.Millisecond

// deadlineLocked returns when l (held) stops being believed held:
// min(base + ttl - Margin(ttl), lastAck + grace - Margin(grace)), the second
// only if the server announced its grace. bySession reports that the
// session's end is the earlier.
func (s *session) deadlineLocked(l *Lock) (d time.Duration, bySession bool) {
	d = l.base + l.ttl - lease.Margin(l.ttl)
	if s.graceKnown {
		if e := s.lastAck + s.grace - s.graceMargin; e < d {
			return e, true
		}
	}
	return d, false
}

// heldLocked notes a lock that became held, or whose lease moved: the
// session's timer is moved earlier if the lock's deadline comes first
// (never later: when it fires it finds the next deadline itself), and the
// pinger is woken if the lock needs a shorter keep-alive period.
func (s *session) heldLocked(l *Lock) {
	if d, _ := s.deadlineLocked(l); !s.clockOn || d < s.clockAt {
		s.armLocked(d)
	}
	span := l.ttl
	if s.graceKnown {
		span = min(span, s.grace)
	}
	s.keepAliveLocked(span)
}

// waitingLocked notes a lock whose request is queued: the session must stay
// alive for it, so the keep-alive follows the grace.
func (s *session) waitingLocked() {
	if s.graceKnown {
		s.keepAliveLocked(s.grace)
	}
}

// keepAliveLocked wakes the pinger if span/3 is shorter than the period it
// sleeps with.
func (s *session) keepAliveLocked(span time.Duration) {
	if p := max(span/3, minKeepAlive); p < s.pingEvery {
		s.pingEvery = p
		select {
		case s.pingKick <- struct{}{}:
		default:
		}
	}
}

// pingPeriodLocked computes the keep-alive period from the session's state:
// a third of the shortest of the grace and the ttls of the held locks while
// the session holds or waits for locks, else Options.PingInterval.
func (s *session) pingPeriodLocked() time.Duration {
	p := s.opts.PingInterval
	for _, l := range s.locks {
		span := time.Duration(1<<63 - 1)
		if s.graceKnown {
			span = s.grace
		}
		if l.state == held {
			span = min(span, l.ttl)
		}
		p = min(p, max(span/3, minKeepAlive))
	}
	return p
}

// armLocked arms the session's timer for at.
func (s *session) armLocked(at time.Duration) {
	s.clockAt, s.clockOn = at, true
	d := at - monoNow()
	if s.clock == nil {
		s.clock = time.AfterFunc(d, s.tick)
	} else {
		s.clock.Reset(d)
	}
}

// rearmLocked arms the session's timer for the earliest deadline of the
// held locks and backstop of the waits (or leaves it off if there is none),
// losing the held locks already past their deadline and failing the waits
// past their backstop.
func (s *session) rearmLocked() {
	now := monoNow()
	var next time.Duration
	on := false
	for _, l := range s.locks {
		var at time.Duration
		switch {
		case l.state == held:
			d, bySession := s.deadlineLocked(l)
			if d <= now+clockSlack {
				s.expireLocked(l, bySession)
				continue
			}
			at = d
		case l.state == waiting && l.waitEnd != 0:
			if l.waitEnd <= now {
				// The server's timeout push was lost with a connection.
				delete(s.locks, l.id)
				s.forgetLocked(l.id)
				l.failLocked(&Error{Type: TypeTimeout, Msg: "Lock timeout"}, nil)
				continue
			}
			at = l.waitEnd
		default:
			continue
		}
		if !on || at < next {
			next, on = at, true
		}
	}
	if on {
		s.armLocked(next)
	} else {
		s.clockOn = false
	}
}

// tick runs when the session's timer fires.
func (s *session) tick() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.clockOn = false
	s.rearmLocked()
}

// expireLocked loses a held lock whose deadline passed without word from
// the server, and asks the server (best effort) to drop it.
func (s *session) expireLocked(l *Lock, bySession bool) {
	e := deadlineError(bySession)
	s.log.Warn("mlock: lock given up at its deadline", "resources", l.resources, "reason", e.Msg)
	id := l.id
	s.loseLocked(l, e)
	s.forgetLocked(id)
}

// deadlineError is the loss of a lock whose Deadline passed.
func deadlineError(bySession bool) *Error {
	if bySession {
		return &Error{Type: TypeLost, Msg: "no answer from the server within its session grace", Err: ErrSessionLost}
	}
	return &Error{Type: TypeLost, Msg: "lease ran out without word from the server", Err: ErrExpired}
}

// lossOf returns why l is lost: its loss if it is, else the loss its
// Deadline passing means.
func (s *session) lossOf(l *Lock) *Error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.lostErr != nil {
		return l.lostErr
	}
	if l.state != held {
		return deadlineError(false)
	}
	_, bySession := s.deadlineLocked(l)
	return deadlineError(bySession)
}

// giveUp loses l, if still held, with e: its holder no longer believes it
// holds it. The server is asked (best effort) to drop it.
func (s *session) giveUp(l *Lock, e *Error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.state == held {
		id := l.id
		s.loseLocked(l, e)
		s.forgetLocked(id)
	}
}

// newSessionLocked handles a handshake that started a new session although
// the client had one: the server lost it (it restarted, or the grace
// passed). Held locks are lost; waiting requests held nothing, so they are
// asked again on the new session with what is left of their timeout.
func (s *session) newSessionLocked(box *protocol.Outbox, now time.Duration) {
	s.log.Warn("mlock: the server lost this session; its locks are gone")
	lostErr := &Error{Type: TypeLost, Msg: "session lost", Err: ErrSessionLost}
	for id, l := range s.locks {
		delete(s.locks, id)
		switch l.state {
		case held:
			l.failLocked(nil, lostErr)
		case waiting:
			s.reaskLocked(l, box, now)
		}
	}
}

// reaskLocked sends a waiting lock's request again, on a new session.
func (s *session) reaskLocked(l *Lock, box *protocol.Outbox, now time.Duration) {
	cl := l.wait
	l.wait, l.id = nil, ""
	if cl == nil {
		l.state = failed
		return
	}
	res, ttl := l.resources, ms(l.ttl)
	var args [5]string
	n := 0
	add := func(a string) { args[n] = a; n++ }
	add(res)
	add(ttl)
	verb := protocol.VerbTryLock
	if !l.try {
		verb = protocol.VerbLock
		timeout := "0"
		if l.timeout > 0 {
			left := l.waitEnd - s.opts.DialTimeout - now
			if left < time.Millisecond {
				l.state = failed
				cl.ch <- reply{err: &Error{Type: TypeTimeout, Msg: "Lock timeout"}}
				return
			}
			timeout = ms(left)
		}
		add(timeout)
		add(strconv.Itoa(max(l.tolerate, 0)))
	}
	if l.owner != "" {
		add(l.owner)
	}
	s.seq++
	seq := s.seq
	cl.seq, cl.sent, l.sent = seq, now, now
	s.calls[seq] = cl
	box.Build(func(b []byte) []byte { return protocol.AppendCommandSeq(b, verb, seq, args[:n]...) })
}

// shuttingDownLocked handles the server's "error server shutting down!":
// every held lock is gone (the server pushed their expiry first, if it
// could). Waiting requests are asked again once the client reconnects to
// a new session.
func (s *session) shuttingDownLocked() {
	s.log.Warn("mlock: the server is shutting down; its locks are gone")
	e := &Error{Type: TypeLost, Msg: "server shutting down", Err: ErrSessionLost}
	for id, l := range s.locks {
		if l.state == held {
			delete(s.locks, id)
			l.failLocked(nil, e)
		}
	}
}

// renewedByOwnerLocked moves the lease of this session's held handles of
// owner on exactly the resources res (order and duplicates do not matter),
// after a renew-by-owner sent at sent succeeded.
func (s *session) renewedByOwnerLocked(owner, res string, sent, ttl time.Duration, expiresAt time.Time) {
	var set []string
	for _, l := range s.locks {
		if l.state != held || l.owner != owner {
			continue
		}
		if set == nil {
			set = nameSet(res)
		}
		if slices.Equal(set, nameSet(l.resources)) {
			l.renewedLocked(sent, ttl, expiresAt)
		}
	}
}

// nameSet returns the names of "a|b|c" sorted, without duplicates.
func nameSet(res string) []string {
	set := strings.Split(res, "|")
	slices.Sort(set)
	return slices.Compact(set)
}
