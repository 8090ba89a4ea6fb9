package mlock

import (
	"context"
	"strconv"
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
// methods are safe for concurrent use.
//
// The server tells the holder when a lock expires; as a backstop, once the
// connection has dropped (pushes can be lost with it), the client also
// declares a lock lost when its lease runs out without an Extend (the lease
// counted from when the grant arrived, or from when the last Extend was
// sent). Either way Lost is closed and Err says why.
type Lock struct {
	c         *Client
	resources string
	owner     string

	// All below guarded by c.conn.mu.
	id        string
	state     lockState
	ttl       time.Duration
	token     uint64
	expiresAt time.Time     // reported by the server
	deadline  time.Time     // local estimate of the end of the lease
	timer     *time.Timer   // the backstop, armed once the connection has dropped
	waited    chan struct{} // closed when the wait ends: granted or failed
	lost      chan struct{} // closed when a held lock is lost
	waitErr   *Error
	lostErr   *Error
	renewed   *Lock // set on a request that renewed this held lock instead
}

func newLock(c *Client, resources, owner string, ttl time.Duration) *Lock {
	return &Lock{c: c, resources: resources, owner: owner, ttl: ttl,
		waited: make(chan struct{}), lost: make(chan struct{})}
}

// ID returns the lock id: 32 hex digits, a secret that lets its holder
// extend and unlock it.
func (l *Lock) ID() string {
	l.c.conn.mu.Lock()
	defer l.c.conn.mu.Unlock()
	return l.id
}

// Resources returns the locked resources as sent, prefix included, joined
// with '|'.
func (l *Lock) Resources() string { return l.resources }

// Token returns the fencing token of the grant: strictly greater than every
// token given before it by the same server. Guard writes with it.
func (l *Lock) Token() uint64 {
	l.c.conn.mu.Lock()
	defer l.c.conn.mu.Unlock()
	return l.token
}

// ExpiresAt returns the end of the lease as the server reported it (grant or
// last Extend), on the server's clock.
func (l *Lock) ExpiresAt() time.Time {
	l.c.conn.mu.Lock()
	defer l.c.conn.mu.Unlock()
	return l.expiresAt
}

// Lost returns a channel closed when the held lock is lost: it expired, was
// released by its owner elsewhere, or its session was lost. It is not closed
// by Unlock.
func (l *Lock) Lost() <-chan struct{} { return l.lost }

// Err returns nil while the lock is held (or was unlocked normally), and the
// reason once it is lost: an *Error of Type lost.
func (l *Lock) Err() error {
	l.c.conn.mu.Lock()
	defer l.c.conn.mu.Unlock()
	if l.lostErr != nil {
		return l.lostErr
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
	cn := l.c.conn
	cn.mu.Lock()
	if ttl == 0 {
		ttl = l.ttl
	}
	id, st, lostErr := l.id, l.state, l.lostErr
	cn.mu.Unlock()
	switch st {
	case lost:
		return time.Time{}, lostErr
	case held:
	default:
		return time.Time{}, &Error{Type: TypeRequest, Msg: "lock is not held"}
	}
	sent := time.Now()
	p, err := l.c.retry(ctx, "extend", id, strconv.FormatInt(ttl.Milliseconds(), 10))
	if err != nil {
		if e, ok := err.(*Error); ok && e.Msg == txtNotExist {
			lerr := &Error{Type: TypeLost, Msg: txtNotExist, Err: ErrExpired}
			cn.mu.Lock()
			delete(cn.locks, id)
			l.failLocked(nil, lerr)
			cn.mu.Unlock()
			return time.Time{}, lerr
		}
		return time.Time{}, err
	}
	ms, _ := strconv.ParseInt(p, 10, 64)
	exp := time.UnixMilli(ms)
	cn.mu.Lock()
	if l.state == held {
		l.ttl = ttl
		l.expiresAt = exp
		l.armLocked(sent.Add(ttl))
	}
	cn.mu.Unlock()
	return exp, nil
}

// Unlock releases the lock. Unlocking twice is not an error. If the server
// no longer had the lock (it expired) Unlock returns an Error of Type lost.
// A connection error is retried once after a reconnect.
func (l *Lock) Unlock(ctx context.Context) error {
	cn := l.c.conn
	cn.mu.Lock()
	id, st, lostErr := l.id, l.state, l.lostErr
	cn.mu.Unlock()
	switch st {
	case released:
		return nil
	case lost:
		return lostErr
	}
	_, err := l.c.retry(ctx, "unlock", id)
	cn.mu.Lock()
	if l.state == held || l.state == waiting {
		delete(cn.locks, id)
		l.state = released
		l.stopLocked()
	}
	cn.mu.Unlock()
	if e, ok := err.(*Error); ok && e.Msg == txtNotExist {
		return &Error{Type: TypeLost, Msg: txtNotExist, Err: ErrExpired}
	}
	return err
}

// ---- state changes, under c.conn.mu ----

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
	close(l.waited)
	l.armLocked(time.Now().Add(l.ttl))
}

// failLocked ends a waiting lock with waitErr or a held one with lostErr
// (either may be nil: no change in that state).
func (l *Lock) failLocked(waitErr, lostErr *Error) {
	switch {
	case l.state == waiting && waitErr != nil:
		l.state = failed
		l.waitErr = waitErr
		close(l.waited)
	case l.state == held && lostErr != nil:
		l.state = lost
		l.lostErr = lostErr
		l.stopLocked()
		close(l.lost)
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
// expired push is reliable; once the connection drops, a push may be lost.
func (l *Lock) armBackstopLocked() {
	if l.state == held && l.timer == nil {
		l.timer = time.AfterFunc(time.Until(l.deadline), l.backstop)
	}
}

func (l *Lock) stopLocked() {
	if l.timer != nil {
		l.timer.Stop()
	}
}

// backstop declares the lock lost when its lease ran out without word from
// the server (the expired push can be lost with a connection).
func (l *Lock) backstop() {
	cn := l.c.conn
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if l.state != held || time.Now().Before(l.deadline) {
		return
	}
	delete(cn.locks, l.id)
	l.failLocked(nil, &Error{Type: TypeLost, Msg: "lease ran out", Err: ErrExpired})
}
