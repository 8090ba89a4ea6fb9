package mlock

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/mlock-dev/mlock/internal/protocol"
)

// registry shares one session per server address, principal and TLS
// configuration (see shareKey) between the Clients of a process: NewClient
// takes a reference, Client.Close drops it, and the last Close ends the
// session. Lock order: registry.mu before session.mu.
type registry struct {
	mu sync.Mutex
	m  map[string]*session // guarded by mu: by shareKey
}

// sessions is the process's registry: every Client of one address (with
// the same credentials and TLS settings) shares its session (one socketId,
// one connection at a time).
var sessions = &registry{m: map[string]*session{}}

// acquire returns the session for o's addresses (a set: their order does
// not matter), credentials and TLS settings, starting it if needed.
func (r *registry) acquire(o Options) (*session, error) {
	nodes, err := o.nodes()
	if err != nil {
		return nil, err
	}
	key := shareKey(&o, nodes)
	set := addrSet(nodes)
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.m[key]; s != nil {
		if o.SocketID != "" && o.SocketID != s.sid {
			return nil, &Error{Type: TypeRequest, Msg: "a client of " + set + " already uses another socketId"}
		}
		s.mu.Lock()
		s.refs++
		s.mu.Unlock()
		return s, nil
	}
	sid := o.SocketID
	if sid == "" {
		sid = randomID()
	} else {
		for _, s := range r.m {
			if s.sid == sid && overlap(s.nodes, nodes) {
				// Two sessions of one socketId would take each other over
				// (on one server, or on the nodes of one cluster).
				return nil, &Error{Type: TypeRequest, Msg: "a client of " + addrSet(s.nodes) + " with other addresses, credentials or TLS settings already uses this socketId"}
			}
		}
	}
	s := newSession(key, nodes, sid, o)
	r.m[key] = s
	go s.run()
	return s, nil
}

// addrSet names a set of addresses: sorted, comma-separated.
func addrSet(nodes []node) string {
	a := make([]string, len(nodes))
	for i, n := range nodes {
		a[i] = n.addr
	}
	slices.Sort(a)
	return strings.Join(a, ",")
}

// overlap reports whether two lists of addresses have one in common.
func overlap(a, b []node) bool {
	for _, x := range a {
		for _, y := range b {
			if x.addr == y.addr {
				return true
			}
		}
	}
	return false
}

// release drops one reference to s; the last one shuts the session down
// after flushing what is queued, and waits for its goroutines.
func (r *registry) release(s *session) {
	r.mu.Lock()
	s.mu.Lock()
	s.refs--
	last := s.refs == 0
	if last {
		s.closed = true
		delete(r.m, s.key)
	}
	s.mu.Unlock()
	r.mu.Unlock()
	if last {
		close(s.quit)
		s.cancel()
		<-s.done
	}
}

// session is the one owner of everything a session on a server (or on the
// nodes of a cluster) involves: the transport (one TCP connection at a
// time, to one node, the reconnect loop, pings; see conn.go), the calls in
// flight, and the waiting and held locks. Client and Lock change state
// only through its methods.
//
// Goroutines: run (the reconnect loop, which reads frames), and per TCP
// connection a writer and a pinger; all end when the last Client closes.
// One timer per session (safety.go) loses held locks at their Deadline.
// The reader also writes: the commands of the callers it has just answered
// go out in one write at the end of its read (see endBatch), the writer
// sends the others.
type session struct {
	key   string // in the registry
	nodes []node // the server's address, or the cluster's nodes': dialled in turn
	sid   string
	opts  Options
	tls   []*tls.Config // per node; nil: plain TCP
	log   *slog.Logger
	next  int // owned by run: the node to dial next

	mu     sync.Mutex
	refs   int              // guarded by mu: Clients using the session
	closed bool             // guarded by mu
	up     chan struct{}    // guarded by mu: closed while connected
	box    *protocol.Outbox // guarded by mu: the current connection's, nil while down
	nc     net.Conn         // guarded by mu: the current connection, nil while down
	node   string           // guarded by mu: the address of the current connection's node, "" while down
	seq    uint64           // guarded by mu: the last request id
	calls  map[uint64]*call // guarded by mu: waiting for their result, by request id
	locks  map[string]*Lock // guarded by mu: waiting (id known) and held, by lock id
	everUp bool             // guarded by mu
	// The last failed connection attempt, for the calls waiting for the
	// connection (see waitUp).
	dialErr  error         // guarded by mu: its error
	nodeErrs []error       // guarded by mu: per node, the error of its last attempt since the last connection (nil: none)
	refused  *Error        // guarded by mu: a refusal (see permanent): calls fail with it at once until a connection succeeds
	failed   chan struct{} // guarded by mu: closed, and made anew, at each failed attempt
	// answered is set while the reader hands out the answers of one read:
	// it writes the commands the callers queue meanwhile itself, once
	// they have had the chance to run (callers do not kick the writer, and
	// a writer kicked meanwhile leaves the write to the reader).
	answered bool // guarded by mu
	// woken counts the callers the reader answered in the current read
	// that have not queued a command since: the reader waits a little for
	// them (see endBatch), unless the last such wait ran out (skipWaits).
	woken     int           // guarded by mu
	skipWaits int           // guarded by mu: reads left to end without waiting
	misses    int           // guarded by mu: waits in a row that ran out
	wokenWait time.Duration // the bound of that wait (wokenWait)
	backoff   time.Duration // owned by run
	// Lock requests whose connection dropped before their result: the
	// server may or may not have queued them, so they are asked again on
	// the next connection (see reaskCallsLocked), unless a whole round of
	// dials fails first (see roundFailed).
	reasks []*call // guarded by mu
	// Grants being given back (see forgetLocked): id -> the request id of
	// its unlock, and back, until the unlock is answered or the connection
	// drops. A lock request answered with such an id (an owner's request
	// that renewed it by re-entry before the unlock) holds nothing once the
	// unlock is applied: it is asked again.
	giving    map[string]uint64 // guarded by mu
	givingSeq map[uint64]string // guarded by mu

	// The safety rule (safety.go). Times are monotonic, read from clk.
	lastAck     time.Duration // guarded by mu: the latest send time of a request answered on this session with success (not status, locks), handshakes included: the session's end counts from it
	resultAck   time.Duration // guarded by mu: the latest send time of a request whose success was read (not status, locks): grants count from it
	grace       time.Duration // guarded by mu: the session grace the server announced
	graceMargin time.Duration // guarded by mu: lease.Margin(grace)
	graceKnown  bool          // guarded by mu: the server announced its grace
	clk         clock         // the time of the rule (systemClock outside tests)
	clock       timer         // guarded by mu: the one timer: deadlines of held locks, backstops of waits
	clockAt     time.Duration // guarded by mu: when clock fires, if clockOn
	clockOn     bool          // guarded by mu
	pingEvery   time.Duration // guarded by mu: the keep-alive period the pinger sleeps with
	pingKick    chan struct{} // cap 1: pingEvery became shorter

	wake   chan struct{} // cap 1: the box has frames
	quit   chan struct{} // closed by the last release
	done   chan struct{} // closed when run returns
	ctx    context.Context
	cancel context.CancelFunc // ends a dial under way
}

func newSession(key string, nodes []node, sid string, o Options) *session {
	var log *slog.Logger
	if len(nodes) == 1 {
		log = o.Logger.With("server", nodes[0].addr)
	} else {
		log = o.Logger.With("servers", addrList(nodes))
	}
	if o.Name != "" {
		log = log.With("principal", o.Name)
	}
	s := &session{key: key, nodes: nodes, sid: sid, opts: o, log: log, refs: 1,
		up: make(chan struct{}), failed: make(chan struct{}), calls: map[uint64]*call{}, locks: map[string]*Lock{},
		nodeErrs: make([]error, len(nodes)), wokenWait: wokenWait,
		wake: make(chan struct{}, 1), pingKick: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
	s.clk = o.clock
	if s.clk == nil {
		s.clk = systemClock{}
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.tls = make([]*tls.Config, len(nodes))
	for i, n := range nodes {
		s.tls[i] = tlsConfig(o.TLS, n.host)
		if o.Token != "" && o.TLS == nil {
			if ip := net.ParseIP(n.host); !(n.host == "localhost" || ip != nil && ip.IsLoopback()) {
				log.Warn("mlock: the token goes to the server in clear text: use TLS (mlocks://)", "node", n.addr)
			}
		}
	}
	return s
}

// addrList names the nodes in their order, comma-separated.
func addrList(nodes []node) string {
	var b strings.Builder
	for i, n := range nodes {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(n.addr)
	}
	return b.String()
}

// call is one request in flight. A lock request's call lasts until the
// grant (or the failure), not only until its result.
type call struct {
	ch        chan reply // cap 1: the one answer
	seq       uint64
	sent      time.Duration // when the command was queued (monotonic, from the session's clock)
	verb      protocol.Verb
	c         *Client // whose call it is (nil: the session's own)
	lock      *Lock   // lock, trylock: the new handle
	probe     *Lock   // extend of a waiting lock after a resume: answered to the session (see probedLocked)
	abandoned bool    // guarded by session.mu: nobody waits; give a lock id back
	drops     uint8   // guarded by session.mu: connections lost with this lock request in flight
	// busyRetried: a try-lock asked again once more after a busy answer (see resultLocked).
	busyRetried bool // guarded by session.mu
}

// reply is a call's answer, decoded by the reader for the call's verb.
type reply struct {
	lock  *Lock         // lock, trylock: the granted handle (a renewal returns the held one)
	n     int64         // extend, renew: expiry in Unix ms; release: 1 for true; releaseall: count
	token uint64        // renew
	sent  time.Duration // when the answered command was queued
	data  []byte        // status, locks: the payload (a copy)
	node  string        // the address of the node that answered
	err   *Error
}

// calls are reused: a call goes back to the pool once its reply has been
// received (never while the reader may still answer it).
var callPool = sync.Pool{New: func() any { return &call{ch: make(chan reply, 1)} }}

func putCall(cl *call) {
	cl.lock, cl.c, cl.drops, cl.busyRetried = nil, nil, 0, false
	callPool.Put(cl)
}

// ---- calls ----

// roundTrip sends one command of client c (nil: the session's own) and
// waits for its answer: its result, or for lock and trylock (l not nil) the
// grant.
func (s *session) roundTrip(ctx context.Context, c *Client, l *Lock, cmd protocol.Command) (reply, *Error) {
	r, err, _ := s.exchange(ctx, c, l, cmd)
	return r, err
}

// exchange is roundTrip; sent reports that the command was queued (the
// server may have applied it even if err is not its answer).
func (s *session) exchange(ctx context.Context, c *Client, l *Lock, cmd protocol.Command) (r reply, err *Error, sent bool) {
	cl, err := s.send(ctx, c, l, cmd)
	if err != nil {
		return reply{}, err, false
	}
	select {
	case r := <-cl.ch:
		putCall(cl)
		return r, r.err, true
	case <-ctx.Done():
		if s.abandon(cl) {
			return reply{}, ctxError(ctx), true
		}
		r := <-cl.ch // answered meanwhile
		putCall(cl)
		return r, r.err, true
	}
}

// unanswered reports that err is not the server's answer (the connection
// dropped, or the caller gave up): the command's outcome is unknown.
func unanswered(err *Error) bool {
	return err.Type == TypeConnection || err.Type == TypeTimeout || err.Type == TypeCanceled
}

// mayBeReleased loses the held handles of owner that a release by owner
// of the resources res (all of owner's, if res is "") may have freed,
// although its answer, and the server's word of the release, never
// arrived: their holders must not go on believing them held. They are
// given back, in case the release was not applied.
func (s *session) mayBeReleased(owner, res string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var set []string
	if res != "" {
		set = nameSet(res)
	}
	e := &Error{Type: TypeLost, Msg: "a release by its owner may have freed it (its answer was lost)", Err: ErrReleased}
	for id, l := range s.locks {
		if l.state != held || l.owner != owner {
			continue
		}
		if set != nil && !slices.ContainsFunc(nameSet(l.Resources()), func(n string) bool {
			_, found := slices.BinarySearch(set, n)
			return found
		}) {
			continue
		}
		s.loseLocked(l, e)
		s.forgetLocked(id)
	}
}

// send registers a call and queues its command once the connection is up.
// A closed Client's command is not sent: it fails with ErrClosed.
func (s *session) send(ctx context.Context, c *Client, l *Lock, cmd protocol.Command) (*call, *Error) {
	// A lock waits for the connection at most its own wait timeout, if
	// shorter than DialTimeout: the caller asked not to wait longer.
	wait, lockWait := s.opts.DialTimeout, false
	if l != nil && l.timeout > 0 && l.timeout < wait {
		wait, lockWait = l.timeout, true
	}
	start := time.Now()
	end, down := start.Add(wait), !s.isUp()
	var asked time.Duration // a lock's wait timeout as the server is asked it
	if l != nil {
		asked = l.timeout
	}
	for {
		if err := s.waitUp(ctx, c, time.Until(end), lockWait); err != nil {
			return nil, err
		}
		if la, ok := cmd.(*protocol.LockArgs); ok && down && l != nil && l.timeout > 0 {
			// The wait for the connection counts in the lock's wait
			// timeout: the server is asked for what is left of it.
			la.Timeout = max((l.timeout - time.Since(start)).Milliseconds(), 1)
			asked = time.Duration(la.Timeout) * time.Millisecond
		}
		// The send time: before the command is queued, so a lower bound
		// of when the server handles it.
		now := s.clk.now()
		s.mu.Lock()
		if c != nil && c.closed {
			// Closed while the call waited for the connection: detach
			// (Close) has ended what the Client waits for and holds.
			s.mu.Unlock()
			return nil, &Error{Type: TypeConnection, Err: ErrClosed}
		}
		if s.box == nil {
			s.mu.Unlock()
			continue // went down again
		}
		s.seq++
		seq := s.seq
		cl := callPool.Get().(*call)
		cl.seq, cl.verb, cl.lock, cl.abandoned, cl.drops, cl.busyRetried, cl.sent = seq, cmd.Verb(), l, false, 0, false, now
		cl.c = c
		s.calls[seq] = cl
		if l != nil {
			l.state = waiting
			l.sent = now
			if l.timeout > 0 {
				// The server's timeout push can be lost with a connection;
				// a request asked again asks for what is left of asked.
				l.waitEnd = now + asked + s.opts.DialTimeout
			}
		}
		s.queueLocked(seq, cmd)
		if s.woken > 0 {
			s.woken--
		}
		kick := !s.answered
		s.mu.Unlock()
		// The writer goroutine (or the reader, at the end of the answers
		// of a read) gathers the commands of every caller into one write:
		// fewer system calls here and on the server.
		if kick {
			s.kick()
		}
		return cl, nil
	}
}

// abandon gives up a call whose caller stopped waiting. It reports false if
// the answer is already in the call's channel.
func (s *session) abandon(cl *call) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.calls[cl.seq] == cl {
		if cl.lock != nil {
			cl.abandoned = true // the reader gives the lock back when its id arrives
		} else {
			delete(s.calls, cl.seq)
		}
		return true
	}
	if l := cl.lock; l != nil && l.wait == cl {
		l.wait = nil
		s.dropLocked(l)
		return true
	}
	if i := slices.Index(s.reasks, cl); i >= 0 {
		s.reasks = slices.Delete(s.reasks, i, i+1)
		cl.lock.state = failed
		return true
	}
	return false
}

// isUp reports whether the connection is up now.
func (s *session) isUp() bool {
	s.mu.Lock()
	up := s.up
	s.mu.Unlock()
	select {
	case <-up:
		return true
	default:
		return false
	}
}

// waitUp waits until the connection is up, at most wait, or until client c
// (if not nil) is closed. While the server refuses the connection (see
// permanent) it fails at once with the refusal. Its errors name the node,
// or the nodes, that failed. Past wait, the error is of TypeConnection, or,
// if lockWait (wait is a lock's wait timeout), of TypeTimeout with the
// connection's error as its cause: the lock was not taken in time.
func (s *session) waitUp(ctx context.Context, c *Client, wait time.Duration, lockWait bool) *Error {
	var cdone chan struct{}
	if c != nil {
		cdone = c.done
	}
	var t *time.Timer
	for {
		s.mu.Lock()
		up, closed, refused, failed := s.up, s.closed, s.refused, s.failed
		s.mu.Unlock()
		if closed {
			return &Error{Type: TypeConnection, Err: ErrClosed}
		}
		select {
		case <-up:
			return nil
		default:
		}
		if refused != nil {
			return refused
		}
		if t == nil {
			t = time.NewTimer(max(wait, 0))
			defer t.Stop()
		}
		select {
		case <-up:
			return nil
		case <-failed: // a refusal?
			s.mu.Lock()
			if s.allRefusedLocked() {
				// Nothing listens on any node of a session that never
				// connected (a wrong port, a server not started): waiting
				// the whole DialTimeout would only hide it.
				defer s.mu.Unlock()
				return s.unreachableLocked()
			}
			s.mu.Unlock()
		case <-ctx.Done():
			return ctxError(ctx)
		case <-cdone:
			return &Error{Type: TypeConnection, Err: ErrClosed}
		case <-t.C:
			s.mu.Lock()
			defer s.mu.Unlock()
			e := s.unreachableLocked()
			if lockWait {
				return &Error{Type: TypeTimeout, Msg: "Lock timeout: no connection to the server within the lock's wait timeout",
					Node: e.Node, Err: e}
			}
			return e
		}
	}
}

// allRefusedLocked reports that the session never connected and that the
// last attempt on every node was refused at the TCP level (connection
// refused: nothing listens there).
func (s *session) allRefusedLocked() bool {
	if s.everUp {
		return false
	}
	for _, err := range s.nodeErrs {
		if err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
			return false
		}
	}
	return true
}

// unreachableLocked is the error of a call that waited DialTimeout for the
// connection in vain: it names the server, or every node of the cluster,
// with the last error of each.
func (s *session) unreachableLocked() *Error {
	if len(s.nodes) == 1 {
		addr := s.nodes[0].addr
		if e, ok := s.dialErr.(*Error); ok { // says the address
			return &Error{Type: TypeConnection, Msg: "server unreachable: " + e.Msg, Node: addr, Err: e.Err}
		}
		return &Error{Type: TypeConnection, Msg: "server unreachable", Node: addr, Err: dialCause(s.dialErr, addr)}
	}
	var errs nodeErrors
	for i, err := range s.nodeErrs {
		if err == nil {
			err = errNotTried
		}
		errs = append(errs, &nodeError{addr: s.nodes[i].addr, err: err})
	}
	return &Error{Type: TypeConnection, Msg: "no server reachable of " + addrList(s.nodes), Err: errs}
}

// dialCause returns the cause of a failed dial to addr without the address
// it repeats ("dial tcp <addr>: connect: connection refused" becomes
// "connect: connection refused"), keeping the chain for errors.Is.
func dialCause(err error, addr string) error {
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil && oe.Addr != nil && oe.Addr.String() == addr && err == error(oe) {
		return &trimmedDialError{msg: oe.Err.Error(), err: err}
	}
	return err
}

// trimmedDialError prints a dial error's inner error only; Unwrap keeps the
// whole.
type trimmedDialError struct {
	msg string
	err error
}

func (e *trimmedDialError) Error() string { return e.msg }
func (e *trimmedDialError) Unwrap() error { return e.err }

// dialFailed records a failed connection attempt to node i. roundEnd
// reports that every node has failed in turn since the last connection; at
// the end of a round a refusal (see permanent) among them is the session's:
// it fails the calls waiting for the connection, and the lock requests
// waiting in the server's queues, which the server will not grant to a
// connection it refuses: their callers would wait forever. Held locks keep
// their Deadlines.
func (s *session) dialFailed(i int, err error, refusal *Error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dialErr = err
	s.nodeErrs[i] = err
	if refusal != nil {
		s.refused = refusal
		for id, l := range s.locks {
			if l.state == waiting {
				delete(s.locks, id)
				l.failLocked(refusal, nil)
			}
		}
	}
	close(s.failed)
	s.failed = make(chan struct{})
}

// kick asks the writer goroutine to flush.
func (s *session) kick() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// queueLocked queues one command on the current connection; nothing is
// queued while it is down. A queue past maxPending (the server reads
// nothing) closes the connection: the calls in flight on it fail, and the
// session reconnects.
func (s *session) queueLocked(seq uint64, cmd protocol.Command) {
	if s.box == nil {
		return
	}
	if s.box.Build(func(b []byte) []byte { return protocol.AppendTyped(b, seq, cmd) }) {
		s.log.Warn("mlock: the server reads nothing; reconnecting", "queued", maxPending)
		s.nc.Close()
	}
}

// forgetLocked asks the server to drop a lock nobody waits for; its result
// is ignored (no call is registered for it).
func (s *session) forgetLocked(id string) {
	if s.box == nil {
		return
	}
	s.seq++
	if s.giving == nil {
		s.giving, s.givingSeq = map[string]uint64{}, map[uint64]string{}
	}
	if old, ok := s.giving[id]; ok {
		delete(s.givingSeq, old)
	}
	s.giving[id], s.givingSeq[s.seq] = s.seq, id
	s.queueLocked(s.seq, &protocol.IDArgs{ID: id})
	if !s.answered {
		s.kick()
	}
}

// ---- locks ----

// lockState reads a lock's state.
type lockView struct {
	id        string
	state     lockState
	ttl       time.Duration
	token     uint64
	expiresAt time.Time
	base      time.Duration
	lostErr   *Error
}

func (s *session) view(l *Lock) lockView {
	s.mu.Lock()
	defer s.mu.Unlock()
	return lockView{id: l.id, state: l.state, ttl: l.ttl, token: l.token, expiresAt: l.expiresAt, base: l.base, lostErr: l.lostErr}
}

// lostChan returns l's loss channel, made on first use.
func (s *session) lostChan(l *Lock) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.lost == nil {
		if l.state == lost {
			return closedChan
		}
		l.lost = make(chan struct{})
	}
	return l.lost
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// extend renews l's lease to now + ttl on the server.
func (s *session) extend(ctx context.Context, l *Lock, ttl time.Duration) (time.Time, error) {
	now := s.clk.now() // before the extend is sent
	s.mu.Lock()
	if ttl == 0 {
		ttl = l.ttl
	}
	id, st, lostErr := l.id, l.state, l.lostErr
	sh := s.shortenLocked(l, now, ttl)
	s.mu.Unlock()
	switch st {
	case lost:
		return time.Time{}, lostErr
	case held:
	default:
		return time.Time{}, &Error{Type: TypeRequest, Msg: "lock is not held"}
	}
	r, err := s.retry(ctx, l.c, &protocol.ExtendArgs{ID: id, TTL: ttl.Milliseconds()})
	if err != nil {
		if err.code.Class() == protocol.ClassNotFound {
			lerr := &Error{Type: TypeLost, Msg: "lock expired", Err: ErrExpired}
			s.mu.Lock()
			s.loseLocked(l, lerr)
			lerr = l.lostErr // it may have been lost otherwise meanwhile
			s.mu.Unlock()
			return time.Time{}, lerr
		}
		if !unanswered(err) { // refused: not applied
			s.mu.Lock()
			s.unshortenLocked(l, sh)
			s.mu.Unlock()
		}
		return time.Time{}, err
	}
	exp := time.UnixMilli(r.n)
	s.mu.Lock()
	defer s.mu.Unlock()
	switch l.state {
	case held:
		l.renewedLocked(r.sent, ttl, exp)
	case lost:
		// Lost while the extend was on its way (its Deadline passed, or
		// the server said so): the client gave it up, whatever the
		// server answered.
		return time.Time{}, l.lostErr
	default:
		return time.Time{}, &Error{Type: TypeRequest, Msg: "lock is not held"} // unlocked meanwhile
	}
	return exp, nil
}

// unlock releases l on the server.
func (s *session) unlock(ctx context.Context, l *Lock) error {
	s.mu.Lock()
	id, st, lostErr := l.id, l.state, l.lostErr
	var believed bool // the first unlock is sent while the lock is believed held
	if st == held {
		d, _ := s.deadlineLocked(l)
		believed = s.clk.now() < d
	}
	if st != released && st != failed && st != lost {
		l.unlocking = true // a re-entry answered meanwhile is not this lock (see resultLocked)
	}
	s.mu.Unlock()
	switch st {
	case released, failed:
		return nil
	case lost:
		return lostErr
	}
	unlock := &protocol.IDArgs{ID: id}
	_, err := s.roundTrip(ctx, l.c, nil, unlock)
	retried := false
	for i := 0; i < connRetries && retryable(ctx, err); i++ {
		// Its outcome is unknown: asked again once the connection is back.
		retried = true
		_, err = s.roundTrip(ctx, l.c, nil, unlock)
	}
	gone := err == nil || err.code.Class() == protocol.ClassNotFound // the server holds it no more
	s.mu.Lock()
	notFound := s.notFoundLossLocked(l, err, retried)
	if retried && believed && err != nil && err.code.Class() == protocol.ClassNotFound &&
		(l.state == held || l.state == lost && l.lapsed) {
		// The first unlock, whose answer was lost with the connection, was
		// sent before the Deadline, and no word from the server ended the
		// lock since (at most its Deadline passed while the unlock waited
		// for the connection: a failover). Either that unlock freed the
		// lock, or the lease ended no earlier than the Deadline, after
		// Unlock was called: the holder held it for all its use. Released,
		// then: unlocking it again is no error (Err keeps the lease's end).
		err = nil
		if l.state == lost {
			l.state = released
		}
	}
	l.unlocking = false
	if l.state == held {
		if gone {
			if s.locks[id] == l {
				delete(s.locks, id)
			}
			l.state = released
		} else {
			s.dropLocked(l) // asked again when the connection allows
		}
	}
	s.mu.Unlock()
	if err != nil {
		if notFound != nil {
			return notFound
		}
		return err
	}
	return nil
}

// notFoundLossLocked is what an unlock answered "not found" (err) returns,
// l as the answer found it: the loss the session learned
// meanwhile (a push read before the answer: released, evicted, the session
// lost); else, for an unlock asked once (not retried) and answered while
// the lock was still believed held, a release by another session or an
// administrator (ErrReleased): the server expires a lease only after the
// Deadline the client counts, so it was no expiry; else an expiry. Nil
// when err is not "not found".
func (s *session) notFoundLossLocked(l *Lock, err *Error, retried bool) error {
	if err == nil || err.code.Class() != protocol.ClassNotFound {
		return nil
	}
	if l.state == lost && l.lostErr != nil {
		return l.lostErr
	}
	if !retried && l.state == held {
		if d, _ := s.deadlineLocked(l); s.clk.now() < d {
			return &Error{Type: TypeLost, Msg: "lock ended by the server before its lease (released by its owner elsewhere, or evicted)",
				Err: ErrReleased}
		}
	}
	return &Error{Type: TypeLost, Msg: "lock expired", Err: ErrExpired}
}

// connRetries is how many times an idempotent command whose connection
// failed is asked again, each after the connection is back: a failover may
// take two connections (the stopped node's, then one to a node that is
// still catching up, or is stopped in turn).
const connRetries = 2

// retryable reports whether err, a failed round trip's, is asked again.
func retryable(ctx context.Context, err *Error) bool {
	return err != nil && err.Type == TypeConnection && err.Err != ErrClosed && ctx.Err() == nil
}

// retry is roundTrip for idempotent commands: a connection error is retried
// up to connRetries times, each after the connection is back.
func (s *session) retry(ctx context.Context, c *Client, cmd protocol.Command) (reply, *Error) {
	r, err := s.roundTrip(ctx, c, nil, cmd)
	for i := 0; i < connRetries && retryable(ctx, err); i++ {
		r, err = s.roundTrip(ctx, c, nil, cmd)
	}
	return r, err
}

// dropLocked forgets l here and on the server: it is released.
func (s *session) dropLocked(l *Lock) {
	if l.id != "" && s.locks[l.id] == l {
		delete(s.locks, l.id)
		s.forgetLocked(l.id)
	}
	l.state = released
}

// loseLocked forgets l here and ends it with err if it is held (Lost
// closes). A lock in another state is only forgotten: a waiting one's
// caller must be answered by whoever calls loseLocked.
func (s *session) loseLocked(l *Lock, err *Error) {
	if s.locks[l.id] == l {
		delete(s.locks, l.id)
	}
	l.failLocked(nil, err)
}

// detach ends what client c waits for and holds: its locks are unlocked
// on the server (best effort, without waiting for answers), its held locks
// are lost for their holders (Type lost, ErrClosed: Lost closes, Do's and
// Hold's jobs are cancelled) and its calls and waits fail with ErrClosed
// at once (a lock granted later is given back). Other Clients of the
// session are not disturbed.
func (s *session) detach(c *Client) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c.closed = true
	close(c.done) // its calls waiting for the connection fail
	waitErr := &Error{Type: TypeConnection, Err: ErrClosed}
	lostErr := &Error{Type: TypeLost, Msg: "client closed", Err: ErrClosed}
	for id, l := range s.locks {
		if l.c != c {
			continue
		}
		delete(s.locks, id)
		s.forgetLocked(id)
		l.failLocked(waitErr, lostErr)
	}
	for seq, cl := range s.calls {
		if cl.c != c || cl.probe != nil {
			continue
		}
		if cl.lock != nil {
			// The reader gives the lock back when its id arrives: it
			// answers a stand-in, the caller is answered now.
			s.calls[seq] = &call{ch: make(chan reply, 1), seq: seq, sent: cl.sent, verb: cl.verb,
				lock: cl.lock, abandoned: true, drops: cl.drops, busyRetried: cl.busyRetried}
			cl.lock.state = failed
		} else {
			delete(s.calls, seq) // its answer is ignored
		}
		cl.ch <- reply{err: waitErr}
	}
	s.reasks = slices.DeleteFunc(s.reasks, func(cl *call) bool {
		if cl.lock.c != c {
			return false
		}
		cl.lock.state = failed
		cl.ch <- reply{err: waitErr}
		return true
	})
}
