package mlock

import (
	"context"
	"slices"
	"time"

	"github.com/mlock-dev/mlock/internal/protocol"
)

type lockState uint8

const (
	waiting  lockState = iota
	held               // granted
	released           // unlocked, abandoned or closed by its holder
	failed             // the wait failed before a grant
	lost               // a held lock is gone
)

// Lock is a lock request: a granted lock once Client.Lock returns it. Its
// methods are safe for concurrent use. Its state belongs to the session of
// its Client's address (or cluster nodes); the methods ask the session.
//
// A held lock is believed held only until its Deadline, which the client
// computes with its own clock from what the server has provably answered
// (see the package documentation, "Safety"). It is lost when the server
// says so (it expired, or was released by its owner, even in part: the
// handle no longer holds what it was granted), when the session is lost,
// or when the Deadline passes without word from the server. Either way
// Lost is closed and Err says why.
type Lock struct {
	s       *session
	c       *Client
	owner   string
	timeout time.Duration // the wait's timeout (<= 0: none)
	lead    time.Duration // LockOptions.Lead: Do and Hold stop the job this long before the Deadline
	// req is the request as first sent (lock or trylock). Only its
	// timeout changes, guarded by s.mu, when the request is asked again.
	req protocol.LockArgs

	// All below guarded by s.mu. Times are monotonic, read from the session's clock.
	id        string
	state     lockState
	ttl       time.Duration
	token     uint64
	expiresAt time.Time     // reported by the server
	sent      time.Duration // when the lock request was queued
	base      time.Duration // held: the lease counts from here (see grantedLocked)
	waitEnd   time.Duration // waiting with a timeout: when to give up if the timeout push is lost (0: never)
	wait      *call         // waiting: the caller's call, answered by the grant or the failure
	// confirming: waiting, granted, but the grant arrived with less than
	// usableLocked to believe: an extend sent after its arrival
	// (a probe, see confirmLocked) makes it usable before it is handed over.
	confirming bool
	confirms   uint8         // confirming: extends sent after the first (see maxConfirms)
	unlocking  bool          // held: Unlock's unlock is in flight
	lapsed     bool          // lost because its Deadline passed (see expireLocked), not by word from the server
	lost       chan struct{} // made on first use; closed when a held lock is lost
	lostErr    *Error
	// Renewals to a shorter lease whose outcome is not known yet (in
	// flight, or their answers lost): each bounds the Deadline until a
	// renewal sent at or after it is answered (see shortenLocked).
	shorts []*shortening
}

// shortening is a renewal of a held lock to a shorter lease, sent at sent
// or later: if the server applied it, the lease ends at at (its drift
// margin applied) or later.
type shortening struct{ at, sent time.Duration }

// ID returns the lock id: 32 hex digits, a secret that lets its holder
// extend and unlock it.
func (l *Lock) ID() string { return l.s.view(l).id }

// Resources returns the locked resources as sent, prefix included, joined
// with '|'.
func (l *Lock) Resources() string { return l.req.Resources }

// Token returns the fencing token of the grant: strictly greater than every
// token given before it by the same server (or cluster). Guard writes with it.
func (l *Lock) Token() uint64 { return l.s.view(l).token }

// ExpiresAt returns the end of the lease as the server reported it (grant or
// last Extend), on the server's clock. The client does not rely on it: see
// Deadline.
func (l *Lock) ExpiresAt() time.Time { return l.s.view(l).expiresAt }

// Deadline returns the moment, on this process's monotonic clock, until
// which the client believes the lock held: the earlier of the end of the
// lease (the send time of the request that granted or last extended or
// renewed it, plus its ttl) and the end of the session (the send time of
// the last request the server answered on the session, plus the session
// grace the server announced), each less its clock-drift margin (span/100 +
// 5 ms). It never lies later than what the client can justify; it moves
// later as the client extends the lock and talks to the server. When it
// passes without news, the lock is lost (Lost closes). Deadline returns the
// zero time when the lock is not held (still waiting, unlocked, or lost).
func (l *Lock) Deadline() time.Time {
	s := l.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.state != held {
		return time.Time{}
	}
	d, _ := s.deadlineLocked(l)
	return s.clk.wall(d)
}

// Lost returns a channel closed when the held lock is lost: it expired, was
// released (wholly or in part) by its owner through Release or ReleaseAll,
// its session was lost, or its Deadline passed without word from the
// server. It is not closed by Unlock.
func (l *Lock) Lost() <-chan struct{} { return l.s.lostChan(l) }

// Err returns nil while the lock is held (or was unlocked normally), and the
// reason once it is lost: an *Error of Type lost whose cause is ErrExpired
// (expired, or released by its owner: the server does not always say
// which; or its lease ran out without word from the server), ErrReleased
// (released by its owner, wholly or in part) or ErrSessionLost (the server
// lost the session, is shutting down, or may have dropped the session
// because it heard nothing from the client for its grace period).
func (l *Lock) Err() error {
	if e := l.s.view(l).lostErr; e != nil {
		return e
	}
	return nil
}

// Extend sets the lease to now + ttl (ttl 0: the lock's current ttl) and
// returns the new expiry from the server. The Deadline then counts from
// when the extend was sent. If the lock is gone it returns an Error of Type
// lost and the lock counts as lost; so it does if the lock was lost while
// the extend was on its way (its Deadline passed first), whatever the server
// answered. A connection error is retried up to twice, each after a
// reconnect: extending twice is harmless.
func (l *Lock) Extend(ctx context.Context, ttl time.Duration) (time.Time, error) {
	if ttl < 0 || ttl%time.Millisecond != 0 {
		return time.Time{}, &Error{Type: TypeRequest, Msg: "ttl should be whole milliseconds > 0"}
	}
	return l.s.extend(ctx, l, ttl)
}

// Unlock releases the lock. Unlocking twice is not an error. If the server
// no longer had the lock Unlock returns an Error of Type lost: the loss the
// session learned meanwhile (Err), else ErrReleased when the answer came
// while the lock was still believed held (a server expires a lease only
// after the Deadline: something else ended it, a release by its owner
// elsewhere or an eviction), else ErrExpired.
// A connection error is retried up to twice, each after a reconnect; if
// the lock is gone then, and Unlock was called before its Deadline and no
// word from the server ended it since (only the Deadline passing while the
// unlock waited for the connection, as in a failover), Unlock succeeds:
// either the earlier unlock (whose answer was lost) freed it, or the lease
// ended after Unlock was called, which the Deadline proves. If every
// try fails on the connection, Unlock returns that Error of Type
// connection, and the session releases the lock when it is connected again
// (or the lease ends it).
func (l *Lock) Unlock(ctx context.Context) error { return l.s.unlock(ctx, l) }

// ---- state changes, by the session, under s.mu ----

// grantedLocked makes a waiting lock held. Its lease counts from the later
// of the send time of its request and resultAck: a request that waited in
// the queue was granted after every result read before the grant. Not from
// a handshake: a grant kept for the session while it was away, or announced
// again after a reconnect, comes after the handshake but was made before
// it (such pushes come before the first result on the new connection).
//
// A grant that leaves less than usableLocked to believe when it arrives (it waited longer than the keep-alive period allows for: a
// pause, a slow answer, a resumed session, a failover) is not handed over
// yet: it is
// confirmed by an extend sent now (see confirmLocked), whose answer makes
// the lease count from its send time, so that every holder gets a lock it
// can use.
func (l *Lock) grantedLocked(token uint64, expiresAt time.Time) {
	if l.state == held {
		// Announced again after a reconnect: the lease does not move.
		l.token, l.expiresAt = token, expiresAt
		return
	}
	if l.state != waiting {
		return
	}
	s := l.s
	l.token = token
	l.expiresAt = expiresAt
	if l.confirming {
		return // announced again while its confirmation is asked (see probeWaitsLocked)
	}
	l.base = max(l.sent, s.resultAck)
	now := s.clk.now()
	if s.staleLocked(l, now) {
		l.confirming = true
		s.confirmLocked(l, now)
		return
	}
	l.holdLocked()
}

// holdLocked makes a waiting lock, whose base is set, held and answers its
// caller.
func (l *Lock) holdLocked() {
	s := l.s
	l.state = held
	s.heldLocked(l)
	if l.wait != nil {
		s.answerLocked(l.wait, reply{lock: l})
		l.wait = nil
	}
}

// renewedLocked moves the lease of a held lock: the request that extended
// or renewed it to ttl was sent at sent.
func (l *Lock) renewedLocked(sent, ttl time.Duration, expiresAt time.Time) {
	if l.state != held {
		return
	}
	l.base = max(l.base, sent)
	l.ttl = ttl
	if len(l.shorts) > 0 {
		// The server's lease is this renewal's, or a later one's.
		l.shorts = slices.DeleteFunc(l.shorts, func(sh *shortening) bool { return sh.sent <= sent })
	}
	if !expiresAt.IsZero() {
		l.expiresAt = expiresAt
	}
	l.s.heldLocked(l) // a shorter ttl can move the deadline earlier
}

// failLocked ends a waiting lock with waitErr or a held one with lostErr
// (either may be nil: no change in that state).
func (l *Lock) failLocked(waitErr, lostErr *Error) {
	switch {
	case l.state == waiting && waitErr != nil:
		l.state = failed
		if l.wait != nil {
			l.wait.ch <- reply{err: waitErr}
			l.wait = nil
		}
	case l.state == held && lostErr != nil:
		l.state = lost
		l.lostErr = lostErr
		if l.lost == nil {
			l.lost = closedChan
		} else {
			close(l.lost)
		}
	}
}
