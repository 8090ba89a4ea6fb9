package server

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mlock-dev/mlock/internal/auth"
	"github.com/mlock-dev/mlock/internal/core"
	"github.com/mlock-dev/mlock/internal/datadir"
	"github.com/mlock-dev/mlock/internal/protocol"
)

// ErrServerClosed is returned by Serve and ListenAndServe after Shutdown.
var ErrServerClosed = errors.New("mlock: server closed")

// Server is an mlock server. Create one with New; it is safe for concurrent
// use.
//
// Threading: one goroutine accepts, and each connection has one reader and
// one writer goroutine. The lock table lives in a core.Core (internal/core),
// which owns the clock and the deadline timer; every command, and all
// session and connection state, is handled inside a core batch, under the
// core's lock ("guarded by the core" below). A connection's output queue
// is a protocol.Outbox, with its own mutex; mu guards the listeners. Lock
// order: the core's lock, then an Outbox's; mu is never held with another.
type Server struct {
	cfg     Config
	log     *slog.Logger
	start   time.Time
	startNs int64 // start in Unix ns, on the core's clock
	hashKey [16]byte
	corep   atomic.Pointer[core.Core] // the core; replaced only by a cluster's snapshot restore (see batch)
	cl      *clusterState             // nil: a single node
	dir     *datadir.Dir              // nil: no data directory
	// set: guarded by the core: the settings commands are applied with
	// (limits, session grace): the node's own (Config's); in a cluster the
	// replicated ones, the leader's (see settings).
	set settings

	sessions   map[string]*session // guarded by the core
	conns      map[*conn]struct{}  // guarded by the core
	dirty      []*conn             // guarded by the core: conns with output to signal
	self       *conn               // guarded by the core: the conn whose reader runs the batch
	scratch    []byte              // guarded by the core: frame being built
	payload    []byte              // guarded by the core: result payload being built
	pushes     []byte              // guarded by the core: push frames not delivered yet
	pending    []pendingPush       // guarded by the core: where they go, in order
	resBuf     []string            // guarded by the core: resources of the request being handled
	modeBuf    []core.Mode         // guarded by the core: modes of the request being handled
	counters   counters            // guarded by the core
	perIP      map[netip.Addr]int  // guarded by the core: open connections by remote IP
	online     int                 // guarded by the core: sessions with a connection
	buckets    map[string]*bucket  // guarded by the core: the listing rate, per principal
	refusalLog struct {            // guarded by the core: the throttle of refusal logs
		last    int64
		dropped int
	}
	unauthed int                     // guarded by the core: connections that have not connected yet (pre-handshake)
	pre      preList                 // guarded by the core: the pre-handshake connections, oldest first (limits.go)
	preByIP  map[netip.Addr]*preList // guarded by the core: the same, by address
	adm      admission               // guarded by the core: the addresses holding the most of the pool, the cluster's links (limits.go)
	evicting int                     // guarded by the core: evicted connections whose reader has not ended
	tarpit   tarpit                  // refused sockets held open a while (limits.go)
	pconns   map[string]int          // guarded by the core: authenticated connections by principal
	defQuota auth.Quota              // the default quota of a principal
	obs      obsState                // metrics and story logs (observe.go)
	// ended: guarded by the core: sessions whose grace ended in the running
	// batch and that a connect replaced by a new one of the same id, until
	// their SessionClosed event (eventLocked)
	ended map[string]*session

	auth    atomic.Pointer[auth.Table] // nil: no auth file
	tlsConf *tls.Config                // nil: plain TCP
	certs   *auth.CertReloader         // with tlsConf

	quietUntil int64         // guarded by the core: end of the quiet start (Unix ns; 0: none)
	quietOver  bool          // guarded by the core: its end was logged
	closing    bool          // guarded by the core: Shutdown began; grants are held, connects refused
	awaiting   int           // guarded by the core: told holders' connections Shutdown waits for
	awaitDone  chan struct{} // guarded by the core: closed when awaiting drops to 0

	mu        sync.Mutex
	listeners map[net.Listener]struct{} // guarded by mu
	closed    atomic.Bool               // set under mu

	reads, writes, framesIn atomic.Uint64 // I/O counters for status

	// The token mark's writer (disk.go).
	lastToken atomic.Uint64 // the last token given, as the last batch saw it
	markKick  chan struct{} // cap 1: the mark must move
	markStop  chan struct{} // closed by stop: the writer ends
	diskMu    sync.Mutex
	disk      diskHealth // guarded by diskMu
	// failed is closed, once (failOnce), when the server must be restarted
	// (Failed); failErr says why.
	failed   chan struct{}
	failOnce sync.Once
	failErr  error

	wg sync.WaitGroup // every goroutine the server started
}

// counters are the server's own counts, shown by status.
type counters struct {
	intolerance, conns, rejected uint64
	rejectedPerIP                uint64 // connections refused by MaxConnsPerIP
	authFailed                   uint64 // connects refused: credentials missing, wrong or not allowed (protected mode included)
	sessionsRefused              uint64 // connects refused by MaxSessions
	idleClosed                   uint64 // connections closed by IdleTimeout
	cancelled                    uint64 // cluster: locks unlocked by opCancel (made by given-up requests)
	forbidden                    uint64 // commands refused: permission denied
	serverFull                   uint64 // requests refused by a server-wide engine limit
	rateLimited                  uint64 // status and locks refused by StatusRate
	evicted                      uint64 // pre-handshake connections evicted for a newcomer
	poolRefused                  uint64 // newcomers refused by a full pre-handshake pool, their address holding the most of it
	quotaRefused                 uint64 // connects and lock requests refused by a principal's quota
}

type session struct {
	id string          // the engine's session id (scoped to the principal)
	p  *auth.Principal // who it belongs to (cluster: its rights only while attached here)
	c  *conn           // nil while disconnected (cluster: while not attached to a connection of this node)
	// Cluster mode, replicated: the principal's name, and the node and
	// connection key the session is attached to ("" while detached).
	pname, node, key string
	offline          []byte // frames kept for a disconnected session, oldest first
	hash             string // short public name
	// pruned: the offline buffer went over its limit and gave up its
	// locked pushes; reset on delivery.
	pruned bool
	// confirmed: during Shutdown, the session's connection was told that
	// its locks are gone and the client then sent bye.
	confirmed bool
}

// New returns a Server; it does not listen yet. With Config.DataDir it
// opens and locks the data directory (an error wrapping datadir.ErrInUse if
// another server holds it) and records that a server runs on it; the
// directory stays locked until Shutdown (or the process's exit). If this
// start may follow a crash (see Config.QuietPeriod), the server grants
// nothing until the quiet period ends, and logs it.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	clock := core.SystemClock()
	s := &Server{
		cfg:       cfg,
		log:       cfg.Logger,
		startNs:   clock.Now(),
		set:       settingsOf(&cfg),
		sessions:  make(map[string]*session),
		conns:     make(map[*conn]struct{}),
		perIP:     make(map[netip.Addr]int),
		preByIP:   make(map[netip.Addr]*preList),
		pconns:    make(map[string]int),
		defQuota:  defaultQuota(&cfg),
		buckets:   make(map[string]*bucket),
		listeners: make(map[net.Listener]struct{}),
		failed:    make(chan struct{}),
	}
	s.start = time.Unix(0, s.startNs)
	s.initObs()
	_, _ = crand.Read(s.hashKey[:])
	s.warnUnsafe()
	if err := s.setupSecurity(); err != nil {
		return nil, err
	}
	if cfg.Cluster != nil {
		// The log keeps the state, the tokens and the sessions: no data
		// directory, no quiet period (a new leader's failover entry
		// covers an election, a full restart included).
		if err := s.openCluster(); err != nil {
			return nil, err
		}
		return s, nil
	}
	if cfg.DataDir != "" {
		d, err := datadir.Open(cfg.DataDir)
		if err != nil {
			return nil, fmt.Errorf("server: %w", err)
		}
		d.SetTokenBlock(uint64(cfg.TokenBlock))
		s.dir = d
		s.log.Info("data directory", "path", d.Path(), "previous-run", d.Previous().Ending.String())
	}
	if err := s.open(clock); err != nil {
		s.dir.Close()
		return nil, err
	}
	return s, nil
}

// warnUnsafe logs the settings that let a client that follows the
// safety rule lose, or a restarted server grant, more than one expects. It
// runs in New, before the server is shared.
func (s *Server) warnUnsafe() {
	cfg := &s.cfg
	if cfg.SessionGrace < 0 {
		s.log.Warn("session grace is negative: a disconnected session's locks are dropped at once and the handshake announces grace 0, so a client that follows the safety rule cannot hold a lock across any silence; use a positive grace",
			"session-grace", cfg.SessionGrace)
	}
	if cfg.QuietPeriod < 0 {
		s.log.Warn("quiet period off: a start that may follow a crash grants at once, although a client of the crashed run may still believe it holds a lock (unsafe, for tests)")
	}
	if safe := datadir.QuietPeriod(max(cfg.SessionGrace, 0)); cfg.QuietPeriod > 0 && cfg.QuietPeriod < safe {
		s.log.Warn("quiet period is shorter than the session grace plus its margin: after a crash the server may grant a lock a client of the crashed run still believes it holds (unsafe)",
			"quiet-period", cfg.QuietPeriod, "safe", safe)
	}
}

// open starts the core on the data directory: the first token, the quiet
// period.
func (s *Server) open(clock core.Clock) error {
	cfg := &s.cfg
	first, err := s.dir.FirstToken(uint64(s.start.UnixMicro()))
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	ecfg := cfg.engineConfig()
	ecfg.FirstToken = first
	// No token at or above the mark on disk (0 without a directory: no
	// bound); the marker raises it as it writes the mark (disk.go).
	ecfg.TokenLimit = s.dir.TokenMark()
	c, err := core.New(core.Config{
		Engine:  ecfg,
		Clock:   clock,
		OnBatch: s.onBatch,
	})
	if err != nil {
		return err
	}
	// Start records "running": from here on a crash makes the next start
	// quiet.
	until, err := s.dir.Start(s.start, max(cfg.QuietPeriod, 0))
	if err != nil {
		c.Close()
		return fmt.Errorf("server: %w", err)
	}
	s.corep.Store(c)
	if s.dir != nil {
		s.lastToken.Store(first - 1)
		s.markKick, s.markStop = make(chan struct{}, 1), make(chan struct{})
		s.wg.Add(1)
		go s.markLoop()
	}
	if cfg.QuietPeriod < 0 {
		// Off: the start is told whenever it may follow a crash, whether or
		// not a quiet period was recorded (with period 0 none is).
		prev := s.dir.Previous()
		if s.dir == nil || !until.IsZero() || (prev.Ending != datadir.EndingNone && prev.Ending != datadir.EndingClean) {
			attrs := []any{"reason", s.quietReason()}
			if !until.IsZero() {
				attrs = append(attrs, "would-wait-until", until.Format(time.RFC3339Nano))
			}
			s.log.Warn("quiet period off: granting at once although a client of an earlier run may still believe it holds a lock (unsafe)", attrs...)
		}
		return nil
	}
	if until.IsZero() {
		return nil
	}
	why := s.quietReason()
	// The start time is read from the core's clock, so until is on it too.
	// Set in the batch: quietUntil is guarded by the core, whose timer may
	// already run a batch that reads it.
	c.Batch(func(tx *core.Tx) {
		s.quietUntil = tx.Apply(&core.Command{Op: core.OpHoldGrants, Until: until.UnixNano()}).ExpiresAt
	})
	attrs := []any{"until", until.Format(time.RFC3339Nano), "for", until.Sub(s.start).Round(time.Millisecond),
		"data-dir", s.dir.Path()}
	if prev := s.dir.Previous(); (prev.Ending == datadir.EndingUnclean || prev.Ending == datadir.EndingUnknown) &&
		prev.QuietPeriod > cfg.QuietPeriod {
		// The crashed run's clients may believe for as long as its
		// settings allowed.
		attrs = append(attrs, "previous-run-quiet-period", prev.QuietPeriod)
	}
	s.log.Warn(fmt.Sprintf("granting nothing until %s (%s)", until.Format("15:04:05.000"), why), attrs...)
	return nil
}

// quietReason says why a start is quiet, for the log.
func (s *Server) quietReason() string {
	if s.dir == nil {
		return "no data directory: whether the previous run stopped cleanly is unknown"
	}
	switch st := s.dir.Previous(); st.Ending {
	case datadir.EndingUnclean:
		return "the previous run did not stop cleanly"
	case datadir.EndingUnconfirmed:
		return "the previous run stopped while a client may still believe it holds a lock"
	default:
		if st.Err != nil {
			return "the previous run is unknown: " + st.Err.Error()
		}
		return "the previous run is unknown"
	}
}

// ListenAndServe listens on Config.Addr and serves until Shutdown. Without
// credentials it refuses an address beyond loopback unless Config.Insecure.
func (s *Server) ListenAndServe() error {
	if ta, err := net.ResolveTCPAddr("tcp", s.cfg.Addr); err == nil {
		if err := s.checkListener(ta); err != nil {
			return err
		}
	}
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return err
	}
	return s.Serve(ln)
}

// Serve accepts connections on ln until Shutdown, and then returns
// ErrServerClosed. A failed accept is logged and retried, with a backoff of
// 5 ms doubling up to 1 s; Serve returns it only when ln was closed by
// another than Shutdown (net.ErrClosed). It closes ln. With
// Config.TLSCertFile every connection
// speaks TLS. Without credentials it refuses a TCP listener beyond loopback
// unless Config.Insecure.
func (s *Server) Serve(ln net.Listener) error {
	if err := s.checkListener(ln.Addr()); err != nil {
		ln.Close()
		return err
	}
	s.mu.Lock()
	if s.closed.Load() {
		s.mu.Unlock()
		ln.Close()
		return ErrServerClosed
	}
	s.listeners[ln] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()
	s.log.Info("mlockd listening", "addr", ln.Addr().String(), "tls", s.tlsConf != nil)
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if s.closed.Load() {
				return ErrServerClosed
			}
			if errors.Is(err, net.ErrClosed) {
				return err // closed by its owner, not by Shutdown
			}
			// Any other failure (EMFILE, ENOBUFS, ENOMEM, a connection
			// aborted before its accept...) is retried: returning would
			// end mlockd and every lock it holds, for the lack of one
			// newcomer.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.log.Warn("accept failed; retrying", "err", err, "in", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		s.accept(nc)
		// Established clients before newcomers: a flood of connections
		// (every one refused or evicted at once) must not keep this
		// goroutine on a processor while the connections' readers wait
		// for one.
		runtime.Gosched()
	}
}

// core returns the core. Take its lock through batch when the core may be
// replaced (cluster mode).
func (s *Server) core() *core.Core { return s.corep.Load() }

// batch runs fn in a batch of the current core. In cluster mode a snapshot
// restore replaces the core (under the old one's lock): a batch that got
// the old core runs again on the new one.
func (s *Server) batch(fn func(tx *core.Tx)) {
	if s.cl == nil {
		s.corep.Load().Batch(fn)
		return
	}
	for {
		c := s.corep.Load()
		stale := false
		c.Batch(func(tx *core.Tx) {
			if s.corep.Load() != c {
				stale = true
				return
			}
			fn(tx)
		})
		if !stale {
			return
		}
	}
}

// Addr returns the address of one listener, or nil until Serve (or
// ListenAndServe) has taken its listener in, which it does before it
// accepts: a caller that runs Serve in a goroutine and needs the address
// at once takes it from its own listener (ln.Addr()), or waits for Addr to
// be non-nil.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ln := range s.listeners {
		return ln.Addr()
	}
	return nil
}

// Shutdown stops the server cleanly. It stops accepting and granting; it
// pushes "expired <id> shutdown" for every held lock to its session's connection, then
// "error server shutting down!" to every connection. With a data directory
// and a quiet period it then waits, at most Config.ShutdownWait and never
// past ctx, for the connection of every holder to end (the Go client sends
// "bye <req>" once it has marked its locks lost, and the server then closes
// the connection). It records in the data directory how the shutdown
// ended: "clean" if every holder confirmed with bye, else "unconfirmed"
// (a connection that just closed does not confirm: its client may not
// have read the error) with the time until which a holder may still
// believe it holds a lock, now + QuietPeriod: a quiet start for the next
// run. The log's "shutdown recorded" line says the same word. Then it
// closes every connection after writing what was queued for it, releases
// the data directory, and waits for the server's goroutines until ctx is
// done (then it closes the connections at once and returns ctx.Err()).
// Lock state is in memory and is lost.
// Calling it again waits for the goroutines only.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	first := !s.closed.Load()
	if first {
		s.closed.Store(true)
		for ln := range s.listeners {
			ln.Close()
		}
	}
	s.mu.Unlock()
	if first {
		if s.cl != nil {
			s.clusterStop(ctx)
		} else {
			s.stop(ctx)
		}
	}
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		// Closed outside the core's lock: a TLS close writes close_notify.
		var conns []*conn
		s.batch(func(*core.Tx) {
			for c := range s.conns {
				conns = append(conns, c)
			}
		})
		for _, c := range conns {
			c.nc.Close()
		}
		<-done
		return ctx.Err()
	}
}

// stop is Shutdown's work once: tell, wait, record, close.
func (s *Server) stop(ctx context.Context) {
	wait := s.dir != nil && s.cfg.QuietPeriod > 0 && s.cfg.ShutdownWait > 0
	var awaited chan struct{}
	s.batch(func(tx *core.Tx) {
		s.closing = true
		tx.Apply(&core.Command{Op: core.OpHoldGrants, Until: math.MaxInt64})
		for c := range s.conns {
			s.tellShutdownLocked(tx, c, wait)
		}
		if s.awaiting > 0 {
			s.awaitDone = make(chan struct{})
			awaited = s.awaitDone
		}
	})
	if awaited != nil {
		t := time.NewTimer(s.cfg.ShutdownWait)
		select {
		case <-awaited:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	s.core().Close()
	unconfirmed, sessions := 0, 0
	var last uint64
	s.batch(func(tx *core.Tx) {
		seen := map[string]bool{}
		tx.Locks(0, func(li core.LockInfo) bool {
			if sess := s.sessions[li.Session]; li.Granted && (sess == nil || !sess.confirmed) {
				unconfirmed++
				if !seen[li.Session] {
					seen[li.Session] = true
					sessions++
				}
			}
			return true
		})
		last = tx.LastToken()
		for c := range s.conns {
			c.finish()
		}
	})
	if s.dir == nil {
		return
	}
	close(s.markStop)
	// Every token given is below the engine's limit, the mark on disk: this
	// write only saves the next start a move of the mark.
	if err := s.dir.ReserveTokens(last); err != nil {
		s.log.Error("saving the token high-water mark", "err", err)
	}
	var quiet time.Time
	now := time.Now()
	if unconfirmed > 0 {
		quiet = now.Add(max(s.cfg.QuietPeriod, 0))
		s.log.Warn("shutdown: holders did not confirm; the next start grants nothing until the time recorded",
			"locks", unconfirmed, "sessions", sessions, "until", quiet.Format(time.RFC3339Nano))
	}
	// The log says what the state file says: clean, or unconfirmed until a
	// time (which may also be the end of this run's own quiet period).
	if st, err := s.dir.CleanShutdown(now, quiet); err != nil {
		// The state still says "running": the next start is quiet.
		s.log.Error("recording the clean shutdown", "err", err)
	} else if st.Ending == datadir.EndingClean {
		s.log.Info("shutdown recorded", "data-dir", s.dir.Path(), "status", st.Ending.String())
	} else {
		s.log.Info("shutdown recorded", "data-dir", s.dir.Path(), "status", st.Ending.String(),
			"quiet-until", st.QuietUntil.Format(time.RFC3339Nano))
	}
	if err := s.dir.Close(); err != nil {
		s.log.Error("closing the data directory", "err", err)
	}
}

// tellShutdownLocked tells c's client that the server is stopping:
// "expired <id> shutdown" for every lock its session holds, then "error
// server shutting down!". A connection whose session holds locks is left open for
// its client to confirm with bye, if wait; any other is closed after the
// error.
func (s *Server) tellShutdownLocked(tx *core.Tx, c *conn, wait bool) {
	if c.plain {
		c.finish() // it writes its status text itself
		return
	}
	holds := false
	if sess := c.sess; sess != nil {
		tx.SessionLocks(sess.id, func(li core.LockInfo) {
			if li.Granted {
				holds = true
				s.push(sess, protocol.PushShutdown, li.ID)
			}
		})
		s.deliverPushesLocked()
	}
	s.scratch = protocol.AppendError(s.scratch[:0], protocol.CodeShuttingDown)
	c.write(s.scratch)
	if !holds || !wait {
		c.finish()
		return
	}
	c.told = true
	s.awaiting++
}

// ---- guarded by the core ----

// onBatch ends every core batch: it turns the batch's events into pushes,
// delivers the pushes (after the answers of the batch's commands), signals
// the writers of connections with output (except the reader's own, which
// writes its replies itself) and keeps the token high-water mark ahead of
// the tokens given (and logs the end of the quiet period).
func (s *Server) onBatch(tx *core.Tx, events []core.Event) {
	s.observeEvents(tx, events)
	for i := range events {
		s.eventLocked(&events[i])
	}
	// An ended session's SessionClosed comes in the batch that ended it;
	// whatever is left would steer the new session's events to the old.
	clear(s.ended)
	s.deliverPushesLocked()
	for _, c := range s.dirty {
		c.dirty = false
		if c == s.self {
			continue
		}
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
	clear(s.dirty)
	s.dirty = s.dirty[:0]
	s.self = nil
	// Tokens given stay below the mark on disk (the engine's token limit);
	// the marker moves the mark ahead of them, outside the core's lock.
	if s.dir != nil {
		s.kickMarkLocked(tx)
	}
	if s.quietUntil != 0 && !s.quietOver && tx.Now() >= s.quietUntil && !s.closing {
		s.quietOver = true
		s.log.Info("quiet period over: granting")
	}
}

// eventLocked turns an engine event into a push. A partial release (some of
// a lock's resources released by owner) is pushed as expired, like a whole
// one: the holder no longer holds what it was granted. So is a move (the
// owner asked for the lock again from another session): the session it
// left no longer holds it, and the end of the session it moved into drops
// it.
func (s *Server) eventLocked(e *core.Event) {
	sess := s.sessions[e.Session]
	if old := s.ended[e.Session]; old != nil {
		// The events up to its end are the old session's.
		if e.Kind == core.SessionClosed {
			delete(s.ended, e.Session)
			s.log.Debug("session closed after its grace period", "session", old.hash)
			return
		}
		sess = old
	}
	if sess == nil {
		return
	}
	switch e.Kind {
	case core.Granted:
		s.pushLocked(sess, e.ID, e.ExpiresAt, e.Token)
	case core.TimedOut:
		s.push(sess, protocol.PushTimeout, e.ID)
	case core.Expired:
		s.push(sess, protocol.PushExpired, e.ID)
	case core.Released:
		if e.Revoked {
			s.push(sess, protocol.PushEvicted, e.ID)
		} else {
			s.push(sess, protocol.PushReleased, e.ID)
		}
	case core.SessionClosed:
		delete(s.sessions, e.Session)
		s.log.Debug("session closed after its grace period", "session", sess.hash)
	}
}

func (s *Server) pushLocked(sess *session, id core.ID, expiresAt int64, token uint64) {
	st := len(s.pushes)
	s.pushes = protocol.AppendLocked(s.pushes, id, expiresAt/int64(time.Millisecond), token)
	s.pending = append(s.pending, pendingPush{sess, st, len(s.pushes)})
}

func (s *Server) push(sess *session, kind protocol.PushKind, id core.ID) {
	st := len(s.pushes)
	s.pushes = protocol.AppendPush(s.pushes, kind, id)
	s.pending = append(s.pending, pendingPush{sess, st, len(s.pushes)})
}

// pendingPush is a push frame s.pushes[start:end] waiting for the answer of
// the command being handled to be written first: the connection's own
// caller is then woken before whoever the push wakes, which in a client
// that shares its connection puts the pushed waiter first in line.
type pendingPush struct {
	sess       *session
	start, end int
}

// deliverPushesLocked sends the pending pushes in order.
func (s *Server) deliverPushesLocked() {
	for _, p := range s.pending {
		s.deliver(p.sess, s.pushes[p.start:p.end])
	}
	clear(s.pending)
	s.pending = s.pending[:0]
	s.pushes = s.pushes[:0]
}

// deliver sends a frame to a session: to its connection, or into its
// offline buffer. Past MaxOfflineBytes the buffer gives up its locked
// pushes (once, then every new one): resume announces every lock the session
// still holds again. It never drops the others (expired, released,
// timeout): a client that missed one could believe in a lock it lost. They
// are bounded by the session's requests (at most two pushes each).
func (s *Server) deliver(sess *session, frame []byte) {
	if sess.c != nil {
		sess.c.write(frame)
		return
	}
	if sess.node != "" {
		return // cluster: attached to a connection elsewhere, whose node delivers it
	}
	if len(sess.offline)+len(frame) > s.set.MaxOfflineBytes {
		if isLocked(frame) {
			return
		}
		if !sess.pruned {
			sess.pruned = true
			sess.offline = pruneLocked(sess.offline)
			s.log.Warn("offline pushes over the limit: grants dropped, announced again on resume", "session", sess.hash)
		}
	}
	sess.offline = append(sess.offline, frame...)
}

// isLocked reports whether frame is a locked push.
func isLocked(frame []byte) bool {
	p, n, _, err := protocol.Next(frame, protocol.MaxFrameLimit)
	return err == nil && n > 0 && bytes.HasPrefix(p, []byte("locked "))
}

// pruneLocked removes the locked pushes from buf, in place.
func pruneLocked(buf []byte) []byte {
	out := buf[:0]
	for rest := buf; len(rest) > 0; {
		_, n, _, err := protocol.Next(rest, protocol.MaxFrameLimit)
		if err != nil || n == 0 {
			break
		}
		if !isLocked(rest[:n]) {
			out = append(out, rest[:n]...) // never ahead of rest: a safe in-place copy
		}
		rest = rest[n:]
	}
	return out
}
