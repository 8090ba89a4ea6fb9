package mlock

import (
	"math"
	"slices"
	"strings"
	"time"

	"github.com/mlock-dev/mlock/internal/lease"
	"github.com/mlock-dev/mlock/internal/protocol"
)

// The safety rule: what a holder believes, it can justify with its own
// clock. See the package documentation ("Safety") for the rule; this file
// holds its machinery: send times, the session's one timer (deadlines of
// held locks, backstops of waits) and the keep-alive period.

// minKeepAlive bounds the keep-alive period from below (a server announcing
// a grace of 0 cannot be kept up with by pinging).
const minKeepAlive = 5 * time.Millisecond

// deadlineLocked returns when l (held) stops being believed held:
// min(base + ttl - Margin(ttl), lastAck + grace - Margin(grace)), the second
// only if the server announced its grace. bySession reports that the
// session's end is the earlier.
func (s *session) deadlineLocked(l *Lock) (d time.Duration, bySession bool) {
	d = l.base + l.ttl - lease.Margin(l.ttl)
	for _, sh := range l.shorts {
		d = min(d, sh.at)
	}
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
	s.keepAliveLocked(s.keepSpanLocked(l))
}

// shortenLocked notes a request about to be sent (at now or later) that
// renews held lock l to ttl from when the server handles it: an extend, an
// owner's re-entry or a renew by owner. If that lease may end before the
// one l is believed to hold, the Deadline is bounded by it at once: the
// answer may never arrive (the connection drops, the caller gives up) while
// the server applied it. The bound goes when a renewal sent at or after
// the request is answered (see renewedLocked), or when the server refuses
// the request (see unshortenLocked). It returns the bound, or nil.
func (s *session) shortenLocked(l *Lock, now, ttl time.Duration) *shortening {
	if l.state != held {
		return nil
	}
	at := now + ttl - lease.Margin(ttl)
	if at >= l.base+l.ttl-lease.Margin(l.ttl) {
		return nil // no shorter than the lease believed
	}
	sh := &shortening{at: at, sent: now}
	l.shorts = append(l.shorts, sh)
	s.heldLocked(l)
	return sh
}

// unshortenLocked drops the bound sh of l: the server refused its request.
func (s *session) unshortenLocked(l *Lock, sh *shortening) {
	if sh != nil {
		l.shorts = slices.DeleteFunc(l.shorts, func(x *shortening) bool { return x == sh })
	}
}

// shortened is a bound shortenOwnedLocked set.
type shortened struct {
	l  *Lock
	sh *shortening
}

// shortenOwnedLocked is shortenLocked for every held handle of owner on
// exactly the resources res (as renewedByOwnerLocked finds them).
func (s *session) shortenOwnedLocked(owner, res string, now, ttl time.Duration) []shortened {
	var set []string
	var out []shortened
	for _, l := range s.locks {
		if l.state != held || l.owner != owner {
			continue
		}
		if set == nil {
			set = nameSet(res)
		}
		if slices.Equal(set, nameSet(l.Resources())) {
			if sh := s.shortenLocked(l, now, ttl); sh != nil {
				out = append(out, shortened{l, sh})
			}
		}
	}
	return out
}

// notShortened drops the bounds shortenOwnedLocked set for a request that err
// shows the server refused (its answer: it was not applied).
func (s *session) notShortened(bounds []shortened, err *Error) {
	if len(bounds) == 0 || err == nil || unanswered(err) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range bounds {
		s.unshortenLocked(b.l, b.sh)
	}
}

// keepSpanLocked returns the span within which the session must be answered
// for l's sake: the shorter of the session grace (if the server announced
// it) and its ttl while it is held, and three quarters of that while it
// waits. The keep-alive period is a third of it (see keepAliveLocked): a
// waiting session is answered at least every quarter of the shorter of the
// grace and the smallest ttl it waits for, so a grant, whose lease counts
// from the last answer read before it, arrives with about three quarters of
// both to believe (see usableLocked).
func (s *session) keepSpanLocked(l *Lock) time.Duration {
	span := time.Duration(math.MaxInt64)
	if s.graceKnown {
		span = s.grace
	}
	switch l.state {
	case held:
		span = min(span, l.ttl)
	case waiting:
		span = min(span, l.ttl) / 4 * 3
	}
	return span
}

// usableLocked is the least time a grant of l must leave to believe when
// it reaches the caller: lease.MinUsable of the shorter of its ttl and the
// session grace (the Deadline counts both). A grant that arrives with less
// is confirmed first (see grantedLocked), which leaves the span less its
// margin and one round trip.
func (s *session) usableLocked(l *Lock) time.Duration {
	span := l.ttl
	if s.graceKnown {
		span = min(span, s.grace)
	}
	return lease.MinUsable(span)
}

// staleLocked reports whether waiting lock l, its base set, would leave
// less than usableLocked to believe from now.
func (s *session) staleLocked(l *Lock, now time.Duration) bool {
	d, _ := s.deadlineLocked(l)
	return d-now < s.usableLocked(l)
}

// short reports whether l is not held, or held with less than
// usableLocked to believe from now.
func (s *session) short(l *Lock) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.state != held {
		return true
	}
	d, _ := s.deadlineLocked(l)
	return d-s.clk.now() < s.usableLocked(l)
}

// maxConfirms bounds the extends that confirm one grant after the first:
// a grant whose confirmations all come back too late to leave lease.MinUsable
// (every answer held up longer than a third of the span) is never handed
// over: it is given back and asked again, with what is left of the wait's
// timeout (none left: the wait fails with Type timeout).
const maxConfirms = 2

// confirmLocked sends an extend of waiting lock l, whose grant arrived
// stale, to its ttl. Its answer (see probedLocked) makes l held with a
// lease that counts from now, or asks again if the grant is gone. If the
// connection drops first, the resumed session probes l with the same
// extend (see probeWaitsLocked).
func (s *session) confirmLocked(l *Lock, now time.Duration) {
	s.seq++
	cl := &call{ch: make(chan reply, 1), seq: s.seq, sent: now, verb: protocol.VerbExtend, probe: l}
	s.calls[cl.seq] = cl
	s.queueLocked(cl.seq, &protocol.ExtendArgs{ID: l.id, TTL: l.ttl.Milliseconds()})
	if !s.answered {
		s.kick()
	}
}

// keepAlivePeriod is the keep-alive period for a span.
func keepAlivePeriod(span time.Duration) time.Duration { return max(span/3, minKeepAlive) }

// keepAliveLocked wakes the pinger if the keep-alive period of span is
// shorter than the period it sleeps with.
func (s *session) keepAliveLocked(span time.Duration) {
	if p := keepAlivePeriod(span); p < s.pingEvery {
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
		p = min(p, keepAlivePeriod(s.keepSpanLocked(l)))
	}
	return p
}

// armLocked arms the session's timer for at.
func (s *session) armLocked(at time.Duration) {
	s.clockAt, s.clockOn = at, true
	d := at - s.clk.now()
	if s.clock == nil {
		s.clock = s.clk.afterFunc(d, s.tick)
	} else {
		s.clock.Reset(d)
	}
}

// rearmLocked arms the session's timer for the earliest deadline of the
// held locks and backstop of the waits (or leaves it off if there is none),
// losing the held locks already past their deadline and failing the waits
// past their backstop. A held lock is lost once its Deadline has passed,
// never before, even if it falls due a moment after the one the timer
// fired for (the timer fires again): losing a lock gives it back to the
// server (see expireLocked), which must not grant it to the next waiter
// before the Deadline its holder was told (see the package documentation,
// "Safety").
func (s *session) rearmLocked() {
	now := s.clk.now()
	var next time.Duration
	on := false
	for _, l := range s.locks {
		var at time.Duration
		switch {
		case l.state == held:
			d, bySession := s.deadlineLocked(l)
			if d <= now {
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
	for i := 0; i < len(s.reasks); {
		l := s.reasks[i].lock
		if l.waitEnd == 0 {
			i++
			continue
		}
		if l.waitEnd <= now {
			l.state = failed
			s.reasks[i].ch <- reply{err: &Error{Type: TypeTimeout, Msg: "Lock timeout"}}
			s.reasks = slices.Delete(s.reasks, i, i+1)
			continue
		}
		if !on || l.waitEnd < next {
			next, on = l.waitEnd, true
		}
		i++
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
	s.log.Warn("mlock: lock given up at its deadline", "resources", l.Resources(), "reason", e.Msg)
	id := l.id
	s.loseLocked(l, e)
	l.lapsed = l.state == lost
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
	switch {
	case l.lostErr != nil:
		return l.lostErr
	case l.state == released:
		return &Error{Type: TypeLost, Msg: "lock unlocked while held"}
	case l.state != held:
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
func (s *session) newSessionLocked(now time.Duration) {
	s.log.Warn("mlock: the server lost this session; its locks are gone")
	lostErr := &Error{Type: TypeLost, Msg: "session lost", Err: ErrSessionLost}
	for id, l := range s.locks {
		delete(s.locks, id)
		switch l.state {
		case held:
			l.failLocked(nil, lostErr)
		case waiting:
			s.reaskLocked(l, now)
		}
	}
}

// reaskLocked sends a waiting lock's request again, as first sent but with
// what is left of its timeout, on the current connection: the request it
// waited with is gone (its session was lost, or it was granted and the grant
// was lost with a connection and is over). The caller has removed l from
// s.locks. With no time left the wait fails with Type timeout.
func (s *session) reaskLocked(l *Lock, now time.Duration) {
	cl := l.wait
	l.wait, l.id, l.confirming, l.confirms = nil, "", false, 0
	if cl == nil {
		l.state = failed
		return
	}
	l.state = waiting
	if s.box == nil {
		s.reasks = append(s.reasks, cl) // on the next connection
		return
	}
	s.resendLocked(cl, now)
}

// reaskCallsLocked sends again, on the connection just made, the lock
// requests whose connection dropped before their result. The server may have
// queued the first request (in a cluster, the log may hold it although the
// node that took it died): that request's grant then arrives for no waiting
// handle and is given back (see dispatch), so the client never believes it
// holds a grant it did not ask for on a live connection.
func (s *session) reaskCallsLocked(now time.Duration) {
	cls := s.reasks
	s.reasks = nil
	for _, cl := range cls {
		s.resendLocked(cl, now)
	}
}

// resendLocked queues cl's lock request again, with what is left of its
// timeout (none left: the wait fails with Type timeout).
func (s *session) resendLocked(cl *call, now time.Duration) {
	l := cl.lock
	if !l.req.Try && l.timeout > 0 {
		left := l.waitEnd - s.opts.DialTimeout - now
		if left < time.Millisecond {
			l.state = failed
			cl.ch <- reply{err: &Error{Type: TypeTimeout, Msg: "Lock timeout"}}
			return
		}
		l.req.Timeout = left.Milliseconds()
	}
	s.seq++
	cl.seq, cl.sent = s.seq, now
	l.sent = now
	s.calls[cl.seq] = cl
	s.queueLocked(cl.seq, &l.req)
}

// roundFailed fails, once a whole round of dials failed, the try-locks
// waiting to be asked again (a try asks not to wait: no node took the
// session at once, so the client says so rather than wait for the server
// to come back), and every request waiting to be asked again if the server
// refused the connection (the refusal is their error). A lock request that
// waits keeps waiting, as a request the server has queued does across a
// reconnect: it is asked again once a node takes the session, and ends at
// its wait's timeout (see rearmLocked), its context, or once maxDrops
// connections were lost with it in flight.
func (s *session) roundFailed(err error, refusal *Error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := refusal
	if e == nil {
		e = &Error{Type: TypeConnection, Msg: "connection lost", Err: err}
	}
	s.reasks = slices.DeleteFunc(s.reasks, func(cl *call) bool {
		if refusal == nil && !cl.lock.req.Try {
			return false
		}
		cl.lock.state = failed
		cl.ch <- reply{err: e}
		return true
	})
}

// probeWaitsLocked asks the server about every waiting request after the
// session resumed: the server announces again only the locks it holds for
// the session, so a request whose grant (and expiry, or timeout) was pushed
// to a connection that died would wait forever. Each is probed with an
// extend of its id, answered to probedLocked.
func (s *session) probeWaitsLocked(now time.Duration) {
	for _, l := range s.locks {
		if l.state != waiting {
			continue
		}
		s.seq++
		cl := &call{ch: make(chan reply, 1), seq: s.seq, sent: now, verb: protocol.VerbExtend, probe: l}
		s.calls[cl.seq] = cl
		s.queueLocked(cl.seq, &protocol.ExtendArgs{ID: l.id, TTL: l.ttl.Milliseconds()})
	}
}

// probedLocked handles the answer to an extend of waiting lock l sent at
// sent: probeWaitsLocked's after a resume, or confirmLocked's for a grant
// that arrived stale. "not locked yet!": l still waits; "lock not exist!":
// the request is gone (granted and expired, or timed out), so it is asked
// again with what is left of its timeout; success: it is granted, and the
// server announced the grant before this answer. For a grant being
// confirmed, success makes l held, its lease counting from sent (the
// extend renewed it), and any other failure gives it back and asks again.
// A success for a lock still waiting here whose grant was never announced
// (its token is unknown) gives the lock back and asks again.
func (s *session) probedLocked(l *Lock, m *protocol.Message, sent time.Duration) {
	if l.state != waiting || l.id == "" || s.locks[l.id] != l {
		return // held, failed, lost or asked again meanwhile
	}
	switch {
	case m.OK && l.confirming:
		l.base = max(l.base, sent)
		if n, ok := protocol.Int(m.Payload); ok {
			l.expiresAt = time.UnixMilli(n)
		}
		now := s.clk.now()
		if s.staleLocked(l, now) && l.confirms < maxConfirms {
			// Answered too late to leave lease.MinUsable (the answers are held
			// up: a paused server, an election): once more.
			l.confirms++
			s.confirmLocked(l, now)
			return
		}
		l.confirming, l.confirms = false, 0
		if s.staleLocked(l, now) {
			// Every confirmation came back too late to leave
			// lease.MinUsable (or after the lease it gave had ended): a
			// holder must get a lock it can use. Give it back, ask again.
			s.log.Warn("mlock: a grant could not be confirmed in time; asking again", "resources", l.Resources())
			delete(s.locks, l.id)
			s.forgetLocked(l.id)
			s.reaskLocked(l, now)
			return
		}
		l.holdLocked()
	case m.OK, l.confirming && m.Code.Class() != protocol.ClassNotFound:
		s.log.Warn("mlock: a grant was not announced, or could not be confirmed; asking again",
			"resources", l.Resources(), "ok", m.OK, "code", m.Code)
		delete(s.locks, l.id)
		s.forgetLocked(l.id)
		s.reaskLocked(l, s.clk.now())
	case m.Code.Class() == protocol.ClassNotFound:
		delete(s.locks, l.id)
		s.reaskLocked(l, s.clk.now())
	}
}

// shuttingDownLocked handles the server's "error server shutting down!":
// every held lock is gone (the server pushed their expiry first, if it
// could). Waiting requests are asked again once the client reconnects to
// a new session.
func (s *session) shuttingDownLocked() {
	s.log.Warn("mlock: the server is shutting down; its locks are gone")
	e := errShutdownLost()
	for id, l := range s.locks {
		if l.state == held {
			delete(s.locks, id)
			l.failLocked(nil, e)
		}
	}
}

// errShutdownLost is the loss of a held lock to a server shutdown.
func errShutdownLost() *Error {
	return &Error{Type: TypeLost, Msg: "server shutting down", Err: ErrSessionLost}
}

// renewedByOwnerLocked moves the lease of this session's held handle of
// owner on exactly the resources res (order and duplicates do not matter)
// whose fencing token is token, after a renew-by-owner sent at sent
// succeeded: the server renewed that very grant.
func (s *session) renewedByOwnerLocked(owner, res string, token uint64, sent, ttl time.Duration, expiresAt time.Time) {
	var set []string
	for _, l := range s.locks {
		if l.state != held || l.owner != owner || l.token != token {
			continue
		}
		if set == nil {
			set = nameSet(res)
		}
		if slices.Equal(set, nameSet(l.Resources())) {
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

// SessionGrace returns the session grace the server announced in its last
// handshake: how long the server keeps the session, and its locks, after
// its last answer once the connection is gone. A lock is believed held at
// most this long (less the drift margin, 1 % + 5 ms) after an answer from
// the server. ok is false before the first connection, and when the
// server announced no grace (a 1.0 server).
func (c *Client) SessionGrace() (grace time.Duration, ok bool) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.grace, s.everUp && s.graceKnown
}
