package mlock

import (
	"context"
	"time"
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
// its Client's address; the methods ask the session.
//
// The server tells the holder when a lock expires or is released by its
// owner (even in part: the handle is then lost as a whole, since it no
// longer holds what it was granted); as a backstop, once the connection has
// dropped (pushes can be lost with it), the client also declares a lock
// lost when its lease runs out without an Extend (the lease counted from
// when the grant arrived, or from when the last Extend was sent). Either way
// Lost is closed and Err says why.
type Lock struct {
	s         *session
	c         *Client
	resources string // as sent: prefixed names joined with '|'
	owner     string

	// All below guarded by s.mu.
	id        string
	state     lockState
	ttl       time.Duration
	token     uint64
	expiresAt time.Time     // reported by the server
	deadline  time.Time     // held: local estimate of the end of the lease
	waitEnd   time.Time     // waiting with a timeout: when to give up if the timeout push is lost
	timer     *time.Timer   // the backstop, armed once the connection has dropped
	wait      *call         // waiting: the caller's call, answered by the grant or the failure
	lost      chan struct{} // made on first use; closed when a held lock is lost
	lostErr   *Error
}

// ID returns the lock id: 32 hex digits, a secret that lets its holder
// extend and unlock it.
func (l *Lock) ID() string { return l.s.view(l).id }

// Resources returns the locked resources as sent, prefix included, joined
// with '|'.
func (l *Lock) Resources() string { return l.resources }

// Token returns the fencing token of the grant: strictly greater than every
// token given before it by the same server. Guard writes with it.
func (l *Lock) Token() uint64 { return l.s.view(l).token }

// ExpiresAt returns the end of the lease as the server reported it (grant or
// last Extend), on the server's clock.
func (l *Lock) ExpiresAt() time.Time { return l.s.view(l).expiresAt }

// Lost returns a channel closed when the held lock is lost: it expired, was
// released (wholly or in part) by its owner through Release or ReleaseAll,
// or its session was lost. It is not closed by Unlock.
func (l *Lock) Lost() <-chan struct{} { return l.s.lostChan(l) }

// Err returns nil while the lock is held (or was unlocked normally), and the
// reason once it is lost: an *Error of Type lost whose cause is ErrExpired
// (expired, or released by its owner: the server does not always say
// which), ErrReleased (released by its owner, wholly or in part) or
// ErrSessionLost.
func (l *Lock) Err() error {
	if e := l.s.view(l).lostErr; e != nil {
		return e
	}
	return nil
}

// Extend sets the lease to now + ttl (ttl 0: the lock's current ttl) and
// returns the new expiry from the server. If the lock is gone it returns an
// Error of Type lost and the lock counts as lost. A connection error is
// retried once after a reconnect: extending twice is harmless.
func (l *Lock) Extend(ctx context.Context, ttl time.Duration) (time.Time, error) {
	if ttl < 0 || ttl%time.Millisecond != 0 {
		return time.Time{}, &Error{Type: TypeRequest, Msg: "ttl should be whole milliseconds > 0"}
	}
	return l.s.extend(ctx, l, ttl)
}

// Unlock releases the lock. Unlocking twice is not an error. If the server
// no longer had the lock (it expired) Unlock returns an Error of Type lost.
// A connection error is retried once after a reconnect.
func (l *Lock) Unlock(ctx context.Context) error { return l.s.unlock(ctx, l) }

// ---- state changes, by the session, under s.mu ----

func (l *Lock) grantedLocked(token uint64, expiresAt time.Time) {
	if l.state == held {
		// Announced again (after a reconnect, or an owner's renewal).
		l.token, l.expiresAt = token, expiresAt
		return
	}
	if l.state != waiting {
		return
	}
	l.state = held
	l.token = token
	l.expiresAt = expiresAt
	l.armLocked(time.Now().Add(l.ttl))
	if l.wait != nil {
		l.wait.ch <- reply{lock: l}
		l.wait = nil
	}
}

// failLocked ends a waiting lock with waitErr or a held one with lostErr
// (either may be nil: no change in that state).
func (l *Lock) failLocked(waitErr, lostErr *Error) {
	switch {
	case l.state == waiting && waitErr != nil:
		l.state = failed
		l.stopLocked()
		if l.wait != nil {
			l.wait.ch <- reply{err: waitErr}
			l.wait = nil
		}
	case l.state == held && lostErr != nil:
		l.state = lost
		l.lostErr = lostErr
		l.stopLocked()
		if l.lost == nil {
			l.lost = closedChan
		} else {
			close(l.lost)
		}
	}
}

// armLocked sets the local end of the lease (and moves the backstop, if it
// is armed).
func (l *Lock) armLocked(deadline time.Time) {
	l.deadline = deadline
	if l.timer != nil {
		l.timer.Reset(time.Until(deadline))
	}
}

// armBackstopLocked starts the backstop: while connected the server's
// pushes are reliable; once the connection drops, one may be lost.
func (l *Lock) armBackstopLocked() {
	if l.timer != nil {
		return
	}
	switch {
	case l.state == held:
		l.timer = time.AfterFunc(time.Until(l.deadline), l.backstop)
	case l.state == waiting && !l.waitEnd.IsZero():
		l.timer = time.AfterFunc(time.Until(l.waitEnd), l.backstop)
	}
}

func (l *Lock) stopLocked() {
	if l.timer != nil {
		l.timer.Stop()
	}
}

// backstop declares a held lock lost when its lease ran out, and gives up a
// wait past its timeout, without word from the server (the push can be
// lost with a connection).
func (l *Lock) backstop() {
	s := l.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	switch {
	case l.state == held && !now.Before(l.deadline):
		s.loseLocked(l, &Error{Type: TypeLost, Msg: "lease ran out", Err: ErrExpired})
	case l.state == held:
		l.timer.Reset(l.deadline.Sub(now))
	case l.state == waiting && !now.Before(l.waitEnd):
		if s.locks[l.id] == l {
			delete(s.locks, l.id)
			s.forgetLocked(l.id)
		}
		l.failLocked(&Error{Type: TypeTimeout, Msg: "Lock timeout"}, nil)
	}
}
