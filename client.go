package mlock

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mlock-dev/mlock/internal/lease"
	"github.com/mlock-dev/mlock/internal/protocol"
)

// Client talks to one mlockd server, or to the nodes of one mlockd cluster
// (Options.Addrs), one node at a time. Create it with New or NewClient; it
// is safe for concurrent use. Every Client of the same address (host:port)
// or set of addresses (in any order), credentials (Options.Name,
// Options.Token) and TLS settings shares one session: one socketId, one
// connection that reconnects by itself (to the next node of a cluster), and
// the calls and locks in flight on it. The session closes with the last
// Client that shares it.
type Client struct {
	opts      Options
	s         *session
	closeOnce sync.Once
	// closed is set, and done closed, by Close (under the session's mu):
	// the Client's calls waiting for the connection fail, and no command
	// of it is queued any more.
	closed bool // guarded by s.mu
	done   chan struct{}
	// afterGrant, if not nil, runs in Lock's goroutine when the grant
	// reaches it (tests only, see usable).
	afterGrant func()
}

// LockOptions tunes one lock request. A nil *LockOptions, and every zero
// field, takes the Client's Options.
type LockOptions struct {
	// TTL is the lease, whole milliseconds. 0: Options.TTL (default 60 s).
	TTL time.Duration
	// Timeout is the longest wait, enforced by the server. 0: Options.Timeout;
	// negative: no limit. The context can end the wait earlier. Ignored by
	// TryLock.
	Timeout time.Duration
	// Tolerate > 0 fails at once with an Error of Type tolerate when a queue
	// already holds more than Tolerate entries. 0: Options.Tolerate;
	// negative: no limit. Ignored by TryLock.
	Tolerate int
	// Owner, if set, makes the lock re-entrant for that owner: asking again
	// for exactly the same resources renews the lease. It also lets Release,
	// ReleaseAll and Renew find it. No spaces, no '|'.
	Owner string
	// Lead makes Do and Hold declare the lock lost (cancel the job's
	// context) this long before its Deadline, for a job that needs time to
	// stop before anyone else may get the lock (a command to kill, say).
	// Default 0; it must be below half the TTL.
	Lead time.Duration
	// Mode takes every resource in this mode: Exclusive (the default),
	// Shared, or Permits(k, n). See Mode.
	Mode Mode
	// Modes, if not nil, gives one mode per resource, in the order of the
	// resources, instead of Mode: a write lock on one table and read locks
	// on three others in one request, say, granted all at once. Its length
	// must be the number of resources; a resource named twice must have one
	// mode.
	Modes []Mode
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
// connection: calls wait for it (at most Options.DialTimeout), and fail at
// once while the server refuses it (see the package documentation,
// "Credentials and TLS").
func NewClient(o Options) (*Client, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	o = o.withDefaults()
	s, err := sessions.acquire(o)
	if err != nil {
		return nil, err
	}
	return &Client{opts: o, s: s, done: make(chan struct{})}, nil
}

// Close releases this Client: its waiting and held locks are unlocked (best
// effort, without waiting for answers), its waits fail with an Error of Type
// connection wrapping ErrClosed, and its held locks are lost for their
// holders (Type lost wrapping ErrClosed: Lost closes, the jobs of Do and Hold
// are cancelled). Its calls waiting for the connection, and its later calls,
// fail with ErrClosed.
// The shared session closes with the last Client of its address; other
// Clients' calls are not disturbed. Close is idempotent.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.s.detach(c)
		sessions.release(c.s)
	})
	return nil
}

// Options returns the Client's options, defaults filled in.
func (c *Client) Options() Options { return c.opts }

// SocketID returns the session id of this Client's connection.
func (c *Client) SocketID() string { return c.s.sid }

// Addrs returns the addresses (host:port, the host in lower case) of the
// server, or of the nodes of the cluster, in the order the session dials
// them: that of the first Client of the session (Clients naming the same
// nodes in another order share it).
func (c *Client) Addrs() []string {
	a := make([]string, len(c.s.nodes))
	for i, n := range c.s.nodes {
		a[i] = n.addr
	}
	return a
}

// Node returns the address (one of Addrs) of the node the session is
// connected to, or "" while it is not connected. It may change at any
// time, as the session reconnects; Status.AnsweredBy names the node that
// answered a status.
func (c *Client) Node() string {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	return c.s.node
}

// splitNames splits "a|b|c" at the API's edge; one is the storage for a
// single name.
func splitNames(resources string, one *[1]string) []string {
	if strings.IndexByte(resources, '|') < 0 {
		one[0] = resources
		return one[:]
	}
	return strings.Split(resources, "|")
}

// join checks the names with the server's rule, applies the prefix to each
// and joins them for the wire.
func (c *Client) join(names []string) (string, error) {
	if len(names) == 0 {
		return "", &Error{Type: TypeRequest, Msg: "no resource"}
	}
	for _, n := range names {
		if !protocol.ValidName(n, 0) {
			return "", &Error{Type: TypeRequest, Msg: `resource can not be empty or include " " or "|": ` + strconv.Quote(n)}
		}
	}
	if len(names) == 1 && c.opts.Prefix == "" {
		return names[0], nil
	}
	var b strings.Builder
	for i, n := range names {
		if i > 0 {
			b.WriteByte('|')
		}
		b.WriteString(c.opts.Prefix)
		b.WriteString(n)
	}
	return b.String(), nil
}

// checkOwner checks an owner that must be given.
func checkOwner(owner string) error {
	if !protocol.ValidOwner(owner, 0) {
		return &Error{Type: TypeRequest, Msg: "invalid owner " + strconv.Quote(owner)}
	}
	return nil
}

// Lock waits until it holds every resource of "a|b|c" (the prefix applies to
// each) and returns the lock. It fails with an Error of Type tolerate (queue
// too long), timeout (the wait's timeout or ctx's deadline passed), canceled
// (ctx cancelled), request (bad arguments, an owner conflict), or connection. A
// wait given up through ctx leaves the server's queues at once; ctx.Err()
// stays in the error chain. An owner asking again for exactly the resources
// it holds gets its held Lock back, renewed. If the server loses the session
// while the request waits in a queue (it restarted), the request is asked
// again on the new session with what is left of its timeout, and Lock keeps
// waiting. A request whose answer had not arrived when the connection broke
// is asked again on the next connection (see the package documentation).
func (c *Client) Lock(ctx context.Context, resources string, o *LockOptions) (*Lock, error) {
	var one [1]string
	return c.lock(ctx, splitNames(resources, &one), o, false)
}

// LockAll is Lock for a list of resources.
func (c *Client) LockAll(ctx context.Context, resources []string, o *LockOptions) (*Lock, error) {
	return c.lock(ctx, resources, o, false)
}

// TryLock takes the lock only if it can be granted at once; otherwise it
// fails with an Error of Type tolerate wrapping ErrBusy, whose Resource
// names a resource that is taken.
func (c *Client) TryLock(ctx context.Context, resources string, o *LockOptions) (*Lock, error) {
	var one [1]string
	return c.lock(ctx, splitNames(resources, &one), o, true)
}

// TryLockAll is TryLock for a list of resources.
func (c *Client) TryLockAll(ctx context.Context, resources []string, o *LockOptions) (*Lock, error) {
	return c.lock(ctx, resources, o, true)
}

func (c *Client) lock(ctx context.Context, names []string, o *LockOptions, try bool) (*Lock, error) {
	var lo LockOptions
	if o != nil {
		lo = *o
	}
	res, err := c.join(names)
	if err != nil {
		return nil, err
	}
	if lo.TTL == 0 {
		lo.TTL = c.opts.TTL
	} else if lo.TTL < time.Millisecond || lo.TTL%time.Millisecond != 0 {
		return nil, &Error{Type: TypeRequest, Msg: "ttl should be whole milliseconds > 0"}
	}
	if lo.Owner != "" {
		if err := checkOwner(lo.Owner); err != nil {
			return nil, err
		}
	}
	if lo.Lead < 0 || lo.Lead >= lo.TTL/2 {
		return nil, &Error{Type: TypeRequest, Msg: "lead should be >= 0 and below half the ttl"}
	}
	modes, err := modeArg(lo.Mode, lo.Modes, len(names))
	if err != nil {
		return nil, err
	}
	l := &Lock{s: c.s, c: c, owner: lo.Owner, ttl: lo.TTL, lead: lo.Lead}
	l.req = protocol.LockArgs{Try: try, Resources: res, TTL: lo.TTL.Milliseconds(), Owner: lo.Owner, Modes: modes}
	if !try {
		if lo.Timeout == 0 {
			lo.Timeout = c.opts.Timeout
		}
		if lo.Tolerate == 0 {
			lo.Tolerate = c.opts.Tolerate
		}
		l.req.Timeout, l.req.Tolerate = max(lo.Timeout, 0).Milliseconds(), int64(max(lo.Tolerate, 0))
		l.timeout = lo.Timeout
	}
	var bounds []shortened
	if lo.Owner != "" {
		// A re-entry renews the owner's held lock to this ttl.
		now := c.s.clk.now()
		c.s.mu.Lock()
		bounds = c.s.shortenOwnedLocked(lo.Owner, res, now, lo.TTL)
		c.s.mu.Unlock()
	}
	start := c.s.clk.now()
	r, rerr := c.s.roundTrip(ctx, c, l, &l.req)
	if rerr != nil {
		c.s.notShortened(bounds, rerr)
		return nil, rerr
	}
	return c.usable(ctx, names, lo, try, r.lock, start)
}

// usable hands over l, granted to a Lock call of names with options lo
// started at start (on the session's clock), only if it leaves at least
// lease.MinUsable to believe now, in the caller's goroutine: the session
// checked it when the grant was read, but the caller may run much later
// on a busy machine. A grant short by then is confirmed with an extend
// (at most maxConfirms+1 of them, each answered too late); one still
// short, or lost, is given back and asked again with what is left of the
// wait's timeout (none left: an Error of Type timeout).
func (c *Client) usable(ctx context.Context, names []string, lo LockOptions, try bool, l *Lock, start time.Duration) (*Lock, error) {
	if c.afterGrant != nil {
		c.afterGrant() // tests: the time the caller takes to run
	}
	for i := 0; c.s.short(l); i++ {
		if i > maxConfirms {
			break
		}
		if _, err := l.Extend(ctx, 0); err != nil {
			if errors.Is(err, ErrLost) {
				break
			}
			uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.DialTimeout)
			_ = l.Unlock(uctx)
			ucancel()
			return nil, err
		}
	}
	if !c.s.short(l) {
		return l, nil
	}
	c.s.log.Warn("mlock: a grant could not be confirmed in time; asking again", "resources", l.Resources())
	uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.DialTimeout)
	_ = l.Unlock(uctx)
	ucancel()
	if !try && lo.Timeout > 0 {
		left := lo.Timeout - (c.s.clk.now() - start)
		if left < time.Millisecond {
			return nil, &Error{Type: TypeTimeout, Msg: "Lock timeout"}
		}
		lo.Timeout = left.Truncate(time.Millisecond)
	}
	return c.lock(ctx, names, &lo, try)
}

// Do runs fn while holding the lock: it acquires resources, extends the
// lease every ttl/3 while fn runs, cancels fn's context if the lock is lost
// (context.Cause is then the loss) or at the lock's Deadline at the latest
// (LockOptions.Lead earlier), and unlocks when fn returns (or panics: the
// panic goes on once the lock is given back). fn finds the lock, and its
// fencing token, with HeldLock(ctx). It returns fn's error, or the loss (an
// Error of Type lost) if the lock was lost.
func (c *Client) Do(ctx context.Context, resources string, o *LockOptions, fn func(context.Context) error) error {
	l, err := c.Lock(ctx, resources, o)
	if err != nil {
		return err
	}
	return c.Hold(ctx, l, fn)
}

// Hold is Do for a lock already acquired (for example with TryLock): it runs
// fn, extends l every ttl/3 meanwhile, cancels fn's context if l is lost
// (the server says so, its Deadline passed: no extension succeeded in time,
// or nothing was answered on the session for the server's grace; or the
// Client was closed) or no longer held, the Lead of the LockOptions l was
// asked with before its Deadline, and unlocks l when fn returns (or
// panics: the panic goes on once l is unlocked). If l is
// not held when Hold is called, fn is not run: Hold returns l's loss (an
// Error of Type lost), or an Error of Type request if l was unlocked.
func (c *Client) Hold(ctx context.Context, l *Lock, fn func(context.Context) error) error {
	v := l.s.view(l)
	switch v.state {
	case held:
	case lost:
		return v.lostErr
	default: // unlocked, or never granted: nothing would protect fn
		return &Error{Type: TypeRequest, Msg: "lock is not held"}
	}
	// A job that panics (or calls runtime.Goexit) gives the lock back as
	// one that returns; the panic goes on.
	returned := false
	defer func() {
		if !returned {
			uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.DialTimeout)
			_ = l.Unlock(uctx)
			ucancel()
		}
	}()
	start := l.s.clk.wall(v.base)
	fnErr, lostErr := lease.Run(ctx, lease.Options{
		TTL:      v.ttl,
		Lead:     l.lead,
		Deadline: l.Deadline,
		Start:    start,
		Renew: func(ctx context.Context) (bool, error) {
			_, err := l.Extend(ctx, 0)
			switch {
			case err == nil:
				return true, nil
			case errors.Is(err, ErrLost):
				return false, nil
			}
			if l.s.view(l).state != held {
				return false, nil // unlocked meanwhile
			}
			return false, err // connection trouble: retried next tick
		},
		Lost:  l.Lost(),
		Clock: leaseClock{l.s.clk},
		Cause: func() error { return l.s.lossOf(l) },
	}, func(ctx context.Context) error { return fn(context.WithValue(ctx, heldKey{}, l)) })
	returned = true
	if lostErr != nil {
		// The lock is gone for this holder (its Deadline passed, or the
		// server said so): give it up without waiting for the server.
		var e *Error
		if !errors.As(lostErr, &e) || e.Type != TypeLost {
			e = deadlineError(false)
		}
		l.s.giveUp(l, e)
	}
	uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.DialTimeout)
	uerr := l.Unlock(uctx)
	ucancel()
	if lostErr != nil {
		if fnErr != nil && !errors.Is(fnErr, context.Canceled) {
			return errors.Join(lostErr, fnErr)
		}
		return lostErr
	}
	if fnErr == nil && errors.Is(uerr, ErrLost) {
		return uerr // the lease ran out just as fn returned
	}
	return fnErr
}

// heldKey is the context key of the lock Hold runs its fn under.
type heldKey struct{}

// HeldLock returns the lock that Do or Hold runs the function under, from
// the function's context (or a context derived from it): its Token fences
// the function's writes (see package fence). It returns nil for any other
// context.
func HeldLock(ctx context.Context) *Lock {
	l, _ := ctx.Value(heldKey{}).(*Lock)
	return l
}

// Release releases, for each resource of "a|b" (prefix applied), the lock
// owner holds on it, and reports whether every one was held by owner. Other
// owners' locks are untouched. A lock released only in part is lost for its
// holder's handle (its Lost channel closes). It is not retried after a
// connection error; if it was sent but not answered (the connection
// dropped, or ctx ended), this session's held handles of owner on any of
// the resources are lost at once (ErrReleased): it may have freed them.
func (c *Client) Release(ctx context.Context, owner, resources string) (bool, error) {
	var one [1]string
	res, err := c.join(splitNames(resources, &one))
	if err != nil {
		return false, err
	}
	if err := checkOwner(owner); err != nil {
		return false, err
	}
	r, rerr, sent := c.s.exchange(ctx, c, nil, &protocol.ReleaseArgs{Owner: owner, Resources: res})
	if rerr != nil {
		if sent && unanswered(rerr) {
			c.s.mayBeReleased(owner, res)
		}
		return false, rerr
	}
	return r.n == 1, nil
}

// ReleaseAll releases every lock owner holds and returns how many. It is
// not retried after a connection error; if it was sent but not answered,
// this session's held handles of owner are lost at once (ErrReleased).
func (c *Client) ReleaseAll(ctx context.Context, owner string) (int, error) {
	if err := checkOwner(owner); err != nil {
		return 0, err
	}
	r, err, sent := c.s.exchange(ctx, c, nil, &protocol.ReleaseArgs{All: true, Owner: owner})
	if err != nil {
		if sent && unanswered(err) {
			c.s.mayBeReleased(owner, "")
		}
		return 0, err
	}
	return int(r.n), nil
}

// Renew sets the lease of the lock owner holds on exactly resources (prefix
// applied; order and duplicates do not matter) to now + ttl (0:
// Options.TTL), whichever session holds it, and returns the new expiry on
// the server's clock and the lock's fencing token (unchanged by renewals).
// A handle of this Client's session that holds exactly that lock (same
// owner, resources and fencing token) has its lease (and Deadline) moved
// too, counted from when the renew was sent.
// If owner holds no such lock (or it was partly released) it returns an
// Error of Type request wrapping ErrNotHeld. A connection error is retried
// once: renewing twice is harmless.
func (c *Client) Renew(ctx context.Context, owner string, resources []string, ttl time.Duration) (time.Time, uint64, error) {
	res, err := c.join(resources)
	if err != nil {
		return time.Time{}, 0, err
	}
	if err := checkOwner(owner); err != nil {
		return time.Time{}, 0, err
	}
	if ttl == 0 {
		ttl = c.opts.TTL
	}
	if ttl < time.Millisecond || ttl%time.Millisecond != 0 {
		return time.Time{}, 0, &Error{Type: TypeRequest, Msg: "ttl should be whole milliseconds > 0"}
	}
	now := c.s.clk.now()
	c.s.mu.Lock()
	bounds := c.s.shortenOwnedLocked(owner, res, now, ttl)
	c.s.mu.Unlock()
	r, rerr := c.s.retry(ctx, c, &protocol.RenewArgs{Owner: owner, Resources: res, TTL: ttl.Milliseconds()})
	if rerr != nil {
		c.s.notShortened(bounds, rerr)
		return time.Time{}, 0, rerr
	}
	exp := time.UnixMilli(r.n)
	c.s.mu.Lock()
	c.s.renewedByOwnerLocked(owner, res, r.token, r.sent, ttl, exp)
	c.s.mu.Unlock()
	return exp, r.token, nil
}

// Ping checks the server (of a cluster: the node connected to; see
// Client.Node). A connection error is retried up to twice, each after a
// reconnect.
func (c *Client) Ping(ctx context.Context) error {
	if _, err := c.s.retry(ctx, c, &protocol.Words{V: protocol.VerbPing}); err != nil {
		return err
	}
	return nil
}

// Status returns the status of the server (of a cluster: of the node that
// answered, named by Status.AnsweredBy). A connection error is retried up
// to twice.
func (c *Client) Status(ctx context.Context) (*Status, error) {
	r, err := c.s.retry(ctx, c, &protocol.Words{V: protocol.VerbStatus})
	if err != nil {
		return nil, err
	}
	var st Status
	if err := json.Unmarshal(r.data, &st); err != nil {
		return nil, &Error{Type: TypeRequest, Msg: "invalid status", Err: err}
	}
	st.AnsweredBy = r.node
	return &st, nil
}

// Locks lists the holders and waiters of the resources whose names start
// with prefix (the Client's prefix is put first): the first page, as long
// as the server allows (its --status-limit); Locks.Next is set when there
// is more (see LocksPage). A server with authentication shows a principal
// that does not administer only the resources it may lock, and other
// principals' entries without owner, session, lock or token. A connection
// error is retried up to twice.
func (c *Client) Locks(ctx context.Context, prefix string) (*Locks, error) {
	return c.LocksPage(ctx, prefix, 0, "")
}

// noPrefix stands for the empty prefix in a locks command that gives a
// limit or a cursor: no resource name contains '|'.
const noPrefix = "|"

// LocksPage is Locks for one page: at most limit resources (0: as many as
// the server allows) whose names, after the prefix, sort after the resource
// after ("": from the first). When there are more, the answer's Next is
// set: pass it as after to get the next page. A connection error is
// retried up to twice.
func (c *Client) LocksPage(ctx context.Context, prefix string, limit int, after string) (*Locks, error) {
	prefix = c.opts.Prefix + prefix
	switch {
	case strings.ContainsAny(prefix, " |"):
		return nil, &Error{Type: TypeRequest, Msg: "invalid prefix " + strconv.Quote(prefix)}
	case limit < 0:
		return nil, &Error{Type: TypeRequest, Msg: "negative limit"}
	case after != "" && !protocol.ValidName(after, 0):
		return nil, &Error{Type: TypeRequest, Msg: "invalid resource " + strconv.Quote(after)}
	}
	// locks <req> [<prefix> [<limit> [<after>]]]
	var args [3]string
	n := 0
	if prefix != "" || limit > 0 || after != "" {
		args[0], n = prefix, 1
		if prefix == "" {
			args[0] = noPrefix
		}
	}
	if limit > 0 || after != "" {
		args[1], n = strconv.Itoa(limit), 2
	}
	if after != "" {
		args[2], n = after, 3
	}
	r, err := c.s.retry(ctx, c, &protocol.Words{V: protocol.VerbLocks, Args: args[:n]})
	if err != nil {
		return nil, err
	}
	var ls Locks
	if err := json.Unmarshal(r.data, &ls); err != nil {
		return nil, &Error{Type: TypeRequest, Msg: "invalid locks listing", Err: err}
	}
	return &ls, nil
}

// Evict releases the granted lock holding each resource of "a|b" (prefix
// applied), whoever holds it, and returns how many locks it released. A
// lock of several resources is released whole; its holder is told at once
// (its Lock is lost: Type lost, ErrReleased). Waiting requests are
// untouched. Only an administrator may evict: for others the server
// answers an Error of Type request wrapping ErrForbidden. It is not retried
// after a connection error (the resources may have been granted anew).
func (c *Client) Evict(ctx context.Context, resources string) (int, error) {
	var one [1]string
	res, err := c.join(splitNames(resources, &one))
	if err != nil {
		return 0, err
	}
	r, rerr := c.s.roundTrip(ctx, c, nil, &protocol.EvictArgs{Resources: res})
	if rerr != nil {
		return 0, rerr
	}
	return int(r.n), nil
}

// ClusterJoin adds a voter to the cluster of the connected node: id is the
// new node's --cluster-id and raftAddr its --raft-addr. The node asked
// hands the change to the leader and answers once it is committed (at most
// 15 s; an election in between is waited out). Adding a member that exists
// with the same address does nothing. Administrators only (else ErrForbidden);
// ErrNotCluster on a single server; a refused or failed change is an Error
// of Type request saying why. It is not retried after a connection error.
//
// The change runs in its turn among the session's requests: those sent
// after it on the same session (every Client of the same nodes shares one,
// unless Options.SocketID differs) are answered after it, so a process that
// holds locks should make membership changes from a Client with a SocketID
// of its own (as mlock cluster does, being a process of its own).
//
// A node started with --cluster-join asks to join by itself: ClusterJoin is
// for a node started without it.
func (c *Client) ClusterJoin(ctx context.Context, id, raftAddr string) error {
	if err := checkWord("node id", id); err != nil {
		return err
	}
	if err := checkWord("raft address", raftAddr); err != nil {
		return err
	}
	_, err := c.s.roundTrip(ctx, c, nil, &protocol.Words{V: protocol.VerbCluster, Args: []string{"join", id, raftAddr}})
	if err != nil {
		return err
	}
	return nil
}

// ClusterRemove removes member id (its --cluster-id) from the cluster of the
// connected node, through the leader; a leader removing itself steps down
// once the change commits. The removed node's sessions move to other nodes
// as their connections drop. Like ClusterJoin: administrators only,
// ErrNotCluster on a single server, at most 15 s, not retried.
func (c *Client) ClusterRemove(ctx context.Context, id string) error {
	if err := checkWord("node id", id); err != nil {
		return err
	}
	_, err := c.s.roundTrip(ctx, c, nil, &protocol.Words{V: protocol.VerbCluster, Args: []string{"remove", id}})
	if err != nil {
		return err
	}
	return nil
}

// ClusterRollback lowers the cluster version of the connected node's
// cluster to version (1: the log format of the previous release, v0.1.0,
// the only one supported), through the leader, and pins it there: the
// leader no longer raises it on its own (docs/cluster.md, "Rollback").
// With dryRun it only checks that the lowering is possible now. A refused
// rollback is an Error of Type request saying why (a member that is not
// reached or does not read the cluster version, settings the previous
// release does not read alike, another version). Asking again once the
// version is lowered succeeds. Like ClusterJoin: administrators only,
// ErrNotCluster on a single server, at most 15 s, not retried.
func (c *Client) ClusterRollback(ctx context.Context, version int, dryRun bool) error {
	if version < 1 {
		return &Error{Type: TypeRequest, Msg: "invalid cluster version " + strconv.Itoa(version)}
	}
	args := []string{"rollback", strconv.Itoa(version)}
	if dryRun {
		args = append(args, "check")
	}
	_, err := c.s.roundTrip(ctx, c, nil, &protocol.Words{V: protocol.VerbCluster, Args: args})
	if err != nil {
		return err
	}
	return nil
}

// ClusterRollbackCancel lifts a rollback's pin: the leader raises the
// cluster version to the highest log format every member reads. It is
// refused (an Error of Type request saying why) while a member is not
// reached or has not said lately which formats it reads (the previous
// release says nothing): run the current build on every member first. It
// succeeds when the version is raised already. Like ClusterJoin.
func (c *Client) ClusterRollbackCancel(ctx context.Context) error {
	_, err := c.s.roundTrip(ctx, c, nil, &protocol.Words{V: protocol.VerbCluster, Args: []string{"rollback", "cancel"}})
	if err != nil {
		return err
	}
	return nil
}

// checkWord refuses an empty argument or one the protocol cannot carry.
func checkWord(what, v string) error {
	if v == "" || strings.ContainsAny(v, " \r\n\x00") {
		return &Error{Type: TypeRequest, Msg: "invalid " + what + " " + strconv.Quote(v)}
	}
	return nil
}
