package mlock

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Client talks to one mlockd server. Create it with New or NewClient; it is
// safe for concurrent use. Every Client of the same address (host:port)
// shares one connection and one session; the connection reconnects by itself
// and closes with the last Client.
type Client struct {
	opts      Options
	conn      *conn
	closeOnce sync.Once
}

// LockOptions tunes one lock request. A nil *LockOptions, and every zero
// field, takes the Client's Options.
type LockOptions struct {
	// TTL is the lease, whole milliseconds. 0: Options.TTL (default 60 s).
	TTL time.Duration
	// Timeout is the longest wait, enforced by the server. 0: Options.Timeout;
	// negative: no limit. The context can end the wait earlier.
	Timeout time.Duration
	// Tolerate > 0 fails at once with an Error of Type tolerate when a queue
	// already holds more than Tolerate entries. 0: Options.Tolerate;
	// negative: no limit.
	Tolerate int
	// Owner, if set, makes the lock re-entrant for that owner: asking again
	// for exactly the same resources renews the lease. It also lets Release
	// and ReleaseAll find it. No spaces.
	Owner string
}

// New returns a Client configured by an mlock:// URI (see ParseURI).
func New(uri string) (*Client, error) {
	o, err := ParseURI(uri)
	if err != nil {
		return nil, err
	}
	return NewClient(o)
}

// NewClient returns a Client configured by o. It does not wait for the
// connection: calls wait for it (at most Options.DialTimeout).
func NewClient(o Options) (*Client, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	o = o.withDefaults()
	cn, err := acquireConn(o)
	if err != nil {
		return nil, err
	}
	return &Client{opts: o, conn: cn}, nil
}

// Close releases this Client: its waiting and held locks are unlocked (best
// effort, without waiting for answers) and their waits fail with ErrClosed.
// The shared connection closes with the last Client of its address; other
// Clients' calls are not disturbed. Close is idempotent.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		cn := c.conn
		cn.mu.Lock()
		e := &Error{Type: TypeConnection, Err: ErrClosed}
		for id, l := range cn.locks {
			if l.c == c {
				delete(cn.locks, id)
				cn.forgetLocked(id)
				l.failLocked(e, nil)
				if l.state == held {
					l.state = released
					l.stopLocked()
				}
			}
		}
		for _, cl := range cn.calls {
			if cl.lock != nil && cl.lock.c == c {
				cl.abandoned = true
			}
		}
		cn.mu.Unlock()
		cn.release()
	})
	return nil
}

// Options returns the Client's options, defaults filled in.
func (c *Client) Options() Options { return c.opts }

// SocketID returns the session id of this Client's connection.
func (c *Client) SocketID() string { return c.conn.sid }

// resources applies the prefix to each name and checks them.
func (c *Client) resources(names []string) (string, error) {
	if len(names) == 0 {
		return "", &Error{Type: TypeRequest, Msg: "no resource"}
	}
	var b strings.Builder
	for i, n := range names {
		if n == "" || strings.ContainsAny(n, " |") {
			return "", &Error{Type: TypeRequest, Msg: `resource can not be empty or include " " or "|": ` + strconv.Quote(n)}
		}
		if i > 0 {
			b.WriteByte('|')
		}
		b.WriteString(c.opts.Prefix)
		b.WriteString(n)
	}
	return b.String(), nil
}

func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// Lock waits until it holds every resource of "a|b|c" (the prefix applies to
// each) and returns the lock. It fails with an Error of Type tolerate (queue
// too long), timeout (the wait's timeout or ctx's deadline passed), request
// (bad arguments, or ctx cancelled), or connection. A wait given up through
// ctx leaves the server's queues at once; ctx.Err() stays in the error chain.
func (c *Client) Lock(ctx context.Context, resources string, o *LockOptions) (*Lock, error) {
	return c.lock(ctx, strings.Split(resources, "|"), o, false)
}

// LockAll is Lock for a list of resources.
func (c *Client) LockAll(ctx context.Context, resources []string, o *LockOptions) (*Lock, error) {
	return c.lock(ctx, resources, o, false)
}

// TryLock takes the lock only if it can be granted at once; otherwise it
// fails with an Error of Type tolerate wrapping ErrBusy.
func (c *Client) TryLock(ctx context.Context, resources string, o *LockOptions) (*Lock, error) {
	return c.lock(ctx, strings.Split(resources, "|"), o, true)
}

func (c *Client) lock(ctx context.Context, names []string, o *LockOptions, try bool) (*Lock, error) {
	var lo LockOptions
	if o != nil {
		lo = *o
	}
	res, err := c.resources(names)
	if err != nil {
		return nil, err
	}
	if lo.TTL == 0 {
		lo.TTL = c.opts.TTL
	}
	if lo.TTL < time.Millisecond || lo.TTL%time.Millisecond != 0 {
		return nil, &Error{Type: TypeRequest, Msg: "ttl should be whole milliseconds > 0"}
	}
	if lo.Timeout == 0 {
		lo.Timeout = c.opts.Timeout
	}
	if lo.Tolerate == 0 {
		lo.Tolerate = c.opts.Tolerate
	}
	timeout, tolerate := max(lo.Timeout, 0), max(lo.Tolerate, 0)
	if strings.ContainsAny(lo.Owner, " |") {
		return nil, &Error{Type: TypeRequest, Msg: "invalid owner " + strconv.Quote(lo.Owner)}
	}
	l := newLock(c, res, lo.Owner, lo.TTL)
	var args []string
	cmd := "lock"
	if try {
		cmd = "trylock"
		args = []string{res, ms(lo.TTL)}
	} else {
		args = []string{res, ms(lo.TTL), ms(timeout), strconv.Itoa(tolerate)}
	}
	if lo.Owner != "" {
		args = append(args, lo.Owner)
	}
	if _, err := c.conn.roundTrip(ctx, l, cmd, args...); err != nil {
		return nil, err
	}
	if l.renewed != nil {
		return l.renewed, nil // set before the reply was delivered
	}
	var backstop <-chan time.Time
	if timeout > 0 {
		// The server's timeout push can be lost with a connection.
		t := time.NewTimer(timeout + c.opts.DialTimeout)
		defer t.Stop()
		backstop = t.C
	}
	select {
	case <-l.waited:
		c.conn.mu.Lock()
		st, werr := l.state, l.waitErr
		c.conn.mu.Unlock()
		if st == failed {
			return nil, werr
		}
		return l, nil
	case <-ctx.Done():
		c.abandon(l)
		return nil, ctxError(ctx)
	case <-backstop:
		c.abandon(l)
		return nil, &Error{Type: TypeTimeout, Msg: "Lock timeout"}
	}
}

// abandon gives a lock back because its caller stopped waiting.
func (c *Client) abandon(l *Lock) {
	cn := c.conn
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if l.state == waiting || l.state == held {
		delete(cn.locks, l.id)
		cn.forgetLocked(l.id)
		l.state = released
		l.stopLocked()
	}
}

// retry is roundTrip for idempotent commands: a connection error is retried
// once, after the connection is back.
func (c *Client) retry(ctx context.Context, cmd string, args ...string) (string, error) {
	p, err := c.conn.roundTrip(ctx, nil, cmd, args...)
	if errors.Is(err, ErrConnection) && !errors.Is(err, ErrClosed) && ctx.Err() == nil {
		p, err = c.conn.roundTrip(ctx, nil, cmd, args...)
	}
	return p, err
}

// Do runs fn while holding the lock: it acquires resources, extends the
// lease every ttl/3 while fn runs, cancels fn's context if the lock is lost
// (context.Cause is then the loss), and unlocks when fn returns. It returns
// fn's error, or the loss (an Error of Type lost) if the lock was lost.
func (c *Client) Do(ctx context.Context, resources string, o *LockOptions, fn func(context.Context) error) error {
	l, err := c.Lock(ctx, resources, o)
	if err != nil {
		return err
	}
	return c.Hold(ctx, l, fn)
}

// Hold is Do for a lock already acquired (for example with TryLock): it runs
// fn, extends l every ttl/3 meanwhile, cancels fn's context if l is lost,
// and unlocks l when fn returns.
func (c *Client) Hold(ctx context.Context, l *Lock, fn func(context.Context) error) error {
	jctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := make(chan struct{})
	kept := make(chan struct{})
	c.conn.mu.Lock()
	period := max(l.ttl/3, time.Millisecond)
	c.conn.mu.Unlock()
	go func() {
		defer close(kept)
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-l.Lost():
				cancel(l.Err())
				return
			case <-t.C:
				ectx, ecancel := context.WithTimeout(context.WithoutCancel(ctx), period)
				_, err := l.Extend(ectx, 0)
				ecancel()
				if errors.Is(err, ErrLost) {
					cancel(err)
					return
				}
				// Other errors (connection trouble): try again next tick; the
				// local end of the lease reports the loss if it comes to that.
			}
		}
	}()
	ferr := fn(jctx)
	close(stop)
	<-kept
	uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.DialTimeout)
	uerr := l.Unlock(uctx)
	ucancel()
	if lerr := l.Err(); lerr != nil {
		if ferr != nil && !errors.Is(ferr, context.Canceled) {
			return errors.Join(lerr, ferr)
		}
		return lerr
	}
	if ferr == nil && errors.Is(uerr, ErrLost) {
		return uerr // the lease ran out just as fn returned
	}
	return ferr
}

// Release releases, for each resource of "a|b" (prefix applied), the lock
// owner holds on it, and reports whether every one was held by owner. Other
// owners' locks are untouched. It is not retried after a connection error.
func (c *Client) Release(ctx context.Context, owner, resources string) (bool, error) {
	res, err := c.resources(strings.Split(resources, "|"))
	if err != nil {
		return false, err
	}
	if owner == "" || strings.ContainsAny(owner, " |") {
		return false, &Error{Type: TypeRequest, Msg: "invalid owner " + strconv.Quote(owner)}
	}
	p, err := c.conn.roundTrip(ctx, nil, "release", owner, res)
	return p == "true", err
}

// ReleaseAll releases every lock owner holds and returns how many. It is
// not retried after a connection error.
func (c *Client) ReleaseAll(ctx context.Context, owner string) (int, error) {
	if owner == "" || strings.ContainsAny(owner, " |") {
		return 0, &Error{Type: TypeRequest, Msg: "invalid owner " + strconv.Quote(owner)}
	}
	p, err := c.conn.roundTrip(ctx, nil, "releaseall", owner)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(p)
}

// Ping checks the server. A connection error is retried once.
func (c *Client) Ping(ctx context.Context) error {
	_, err := c.retry(ctx, "ping")
	return err
}

// Status returns the server's status. A connection error is retried once.
func (c *Client) Status(ctx context.Context) (*Status, error) {
	p, err := c.retry(ctx, "status")
	if err != nil {
		return nil, err
	}
	var st Status
	if err := json.Unmarshal([]byte(p), &st); err != nil {
		return nil, &Error{Type: TypeRequest, Msg: "invalid status", Err: err}
	}
	return &st, nil
}

// Locks lists the holders and waiters of the resources whose names start
// with prefix (the Client's prefix is put first). A connection error is
// retried once.
func (c *Client) Locks(ctx context.Context, prefix string) (*Locks, error) {
	prefix = c.opts.Prefix + prefix
	if strings.ContainsAny(prefix, " |") {
		return nil, &Error{Type: TypeRequest, Msg: "invalid prefix " + strconv.Quote(prefix)}
	}
	args := []string{}
	if prefix != "" {
		args = append(args, prefix)
	}
	p, err := c.retry(ctx, "locks", args...)
	if err != nil {
		return nil, err
	}
	var ls Locks
	if err := json.Unmarshal([]byte(p), &ls); err != nil {
		return nil, &Error{Type: TypeRequest, Msg: "invalid locks listing", Err: err}
	}
	return &ls, nil
}
