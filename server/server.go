package server

import (
	"context"
	crand "crypto/rand"
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mlock-dev/mlock/internal/locktable"
	"github.com/mlock-dev/mlock/internal/wire"
)

// ErrServerClosed is returned by Serve and ListenAndServe after Shutdown.
var ErrServerClosed = errors.New("mlock: server closed")

// Server is an mlock server. Create one with New; it is safe for concurrent
// use.
//
// Threading: one goroutine accepts, and each connection has one reader and
// one writer goroutine. The lock table and all session state are guarded by
// mu; a connection's output buffer by its own outMu. Lock order: mu, then
// outMu.
type Server struct {
	cfg     Config
	log     *slog.Logger
	start   time.Time
	startNs int64 // start in Unix ns; now() = startNs + monotonic elapsed
	hashKey [16]byte

	mu        sync.Mutex
	tab       *locktable.Table                              // guarded by mu
	sessions  map[string]*session                           // guarded by mu
	conns     map[*conn]struct{}                            // guarded by mu
	dirty     []*conn                                       // guarded by mu: conns with output to signal
	scratch   []byte                                        // guarded by mu: frame being built
	payload   []byte                                        // guarded by mu: result payload being built
	pushes    []byte                                        // guarded by mu: push frames not delivered yet
	pending   []pendingPush                                 // guarded by mu: where they go, in order
	resBuf    []string                                      // guarded by mu: resources of the request being handled
	cur       *session                                      // guarded by mu: session of the request being handled
	listeners map[net.Listener]struct{}                     // guarded by mu
	closed    bool                                          // guarded by mu
	timer     *time.Timer                                   // guarded by mu
	timerAt   int64                                         // guarded by mu: when timer fires, 0 if stopped
	tokens    *tokenStore                                   // guarded by mu
	counters  struct{ intolerance, conns, rejected uint64 } // guarded by mu

	reads, writes, framesIn atomic.Uint64 // I/O counters for status

	wg sync.WaitGroup // every goroutine the server started
}

type session struct {
	id      string
	c       *conn  // nil while disconnected
	offline []byte // frames kept for a disconnected session, oldest first
	hash    string // short public name
}

// New returns a Server; it does not listen yet.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &Server{
		cfg:       cfg,
		log:       cfg.Logger,
		start:     time.Now(),
		sessions:  make(map[string]*session),
		conns:     make(map[*conn]struct{}),
		listeners: make(map[net.Listener]struct{}),
	}
	s.startNs = s.start.UnixNano()
	_, _ = crand.Read(s.hashKey[:])
	ts, err := openTokens(cfg.DataDir, uint64(s.start.UnixMicro()))
	if err != nil {
		return nil, err
	}
	s.tokens = ts
	tab, err := locktable.New(locktable.Config{
		MaxResources:       cfg.MaxResources,
		MaxNameLen:         cfg.MaxNameLen,
		MaxLocksPerSession: cfg.MaxLocksPerSession,
		MaxQueueLen:        cfg.MaxQueueLen,
		SessionGrace:       cfg.SessionGrace,
		MaxTTL:             cfg.MaxTTL,
		MaxTimeout:         cfg.MaxTimeout,
		FirstToken:         ts.first,
		OnEvent:            s.onEvent,
	})
	if err != nil {
		return nil, err
	}
	s.tab = tab
	s.timer = time.AfterFunc(time.Hour, s.onTimer)
	s.timer.Stop()
	return s, nil
}

// now returns the server clock in Unix nanoseconds. It is monotonic: a wall
// clock step does not move it.
func (s *Server) now() int64 { return s.startNs + int64(time.Since(s.start)) }

// ListenAndServe listens on Config.Addr and serves until Shutdown.
func (s *Server) ListenAndServe() error {
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return err
	}
	return s.Serve(ln)
}

// Serve accepts connections on ln until Shutdown, and then returns
// ErrServerClosed. It closes ln.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ln.Close()
		return ErrServerClosed
	}
	s.listeners[ln] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()
	s.log.Info("mlockd listening", "addr", ln.Addr().String())
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return ErrServerClosed
			}
			// Resource exhaustion (EMFILE and the like) is temporary: retry.
			if te, ok := err.(interface{ Temporary() bool }); ok && te.Temporary() {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.log.Warn("accept failed; retrying", "err", err, "in", backoff)
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		s.accept(nc)
	}
}

// Addr returns the address of one listener, or nil before Serve.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ln := range s.listeners {
		return ln.Addr()
	}
	return nil
}

// Shutdown stops accepting, closes every connection after writing what was
// queued for it, and waits for the server's goroutines until ctx is done.
// Lock state is in memory and is lost; the token high-water mark is saved.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		for ln := range s.listeners {
			ln.Close()
		}
		for c := range s.conns {
			c.closeAfterFlush()
		}
		s.timer.Stop()
		if err := s.tokens.save(s.tab.LastToken() + 1); err != nil {
			s.log.Error("saving the token high-water mark", "err", err)
		}
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		s.mu.Lock()
		for c := range s.conns {
			c.nc.Close()
		}
		s.mu.Unlock()
		<-done
		return ctx.Err()
	}
}

// ---- under mu ----

// afterBatchLocked signals the writers of connections with output (except
// self, whose reader writes its own), arms the deadline timer and keeps the
// token high-water mark ahead of the tokens given.
func (s *Server) afterBatchLocked(self *conn) {
	s.deliverPushesLocked()
	for _, c := range s.dirty {
		c.dirty = false
		if c == self {
			continue
		}
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
	clear(s.dirty)
	s.dirty = s.dirty[:0]
	if at, ok := s.tab.NextDeadline(); ok && !s.closed && (s.timerAt == 0 || at < s.timerAt) {
		s.timerAt = at
		s.timer.Reset(time.Duration(at - s.now()))
	}
	if err := s.tokens.reserve(s.tab.LastToken()); err != nil {
		s.log.Error("saving the token high-water mark", "err", err)
	}
}

func (s *Server) onTimer() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.timerAt = 0
	if s.closed {
		return
	}
	s.tab.Advance(s.now())
	s.afterBatchLocked(nil)
}

// onEvent turns engine events into pushes. It runs under mu.
func (s *Server) onEvent(e locktable.Event) {
	sess := s.sessions[e.Session]
	if sess == nil {
		return
	}
	switch e.Kind {
	case locktable.Granted:
		s.pushLocked(sess, e.ID, e.ExpiresAt, e.Token)
	case locktable.TimedOut:
		s.push(sess, "timeout", e.ID)
	case locktable.Expired, locktable.Released:
		s.push(sess, "expired", e.ID)
	case locktable.SessionClosed:
		delete(s.sessions, e.Session)
		s.log.Debug("session closed after its grace period", "session", sess.hash)
	}
}

func (s *Server) pushLocked(sess *session, id locktable.ID, expiresAt int64, token uint64) {
	b, st := wire.Begin(s.pushes)
	b = append(b, "locked "...)
	b = id.AppendText(b)
	b = append(b, ' ')
	b = wire.AppendInt(b, expiresAt/int64(time.Millisecond))
	b = append(b, ' ')
	b = wire.AppendUint(b, token)
	s.pushes = wire.End(b, st)
	s.pending = append(s.pending, pendingPush{sess, st, len(s.pushes)})
}

func (s *Server) push(sess *session, kind string, id locktable.ID) {
	b, st := wire.Begin(s.pushes)
	b = append(b, kind...)
	b = append(b, ' ')
	b = id.AppendText(b)
	s.pushes = wire.End(b, st)
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
// offline buffer.
func (s *Server) deliver(sess *session, frame []byte) {
	if sess.c != nil {
		sess.c.write(frame)
		return
	}
	sess.offline = append(sess.offline, frame...)
	for len(sess.offline) > s.cfg.MaxOfflineBytes {
		_, n, _, err := wire.Next(sess.offline, wire.MaxFrameLimit)
		if err != nil || n == 0 {
			sess.offline = sess.offline[:0]
			break
		}
		sess.offline = sess.offline[n:]
		s.log.Warn("offline push dropped: buffer full", "session", sess.hash)
	}
}
