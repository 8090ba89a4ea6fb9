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

	"github.com/mlock-dev/mlock/internal/core"
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
	core    *core.Core

	sessions map[string]*session                           // guarded by the core
	conns    map[*conn]struct{}                            // guarded by the core
	dirty    []*conn                                       // guarded by the core: conns with output to signal
	self     *conn                                         // guarded by the core: the conn whose reader runs the batch
	scratch  []byte                                        // guarded by the core: frame being built
	payload  []byte                                        // guarded by the core: result payload being built
	pushes   []byte                                        // guarded by the core: push frames not delivered yet
	pending  []pendingPush                                 // guarded by the core: where they go, in order
	resBuf   []string                                      // guarded by the core: resources of the request being handled
	tokens   *tokenStore                                   // guarded by the core
	counters struct{ intolerance, conns, rejected uint64 } // guarded by the core

	mu        sync.Mutex
	listeners map[net.Listener]struct{} // guarded by mu
	closed    atomic.Bool               // set under mu

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
	clock := core.SystemClock()
	s := &Server{
		cfg:       cfg,
		log:       cfg.Logger,
		startNs:   clock.Now(),
		sessions:  make(map[string]*session),
		conns:     make(map[*conn]struct{}),
		listeners: make(map[net.Listener]struct{}),
	}
	s.start = time.Unix(0, s.startNs)
	_, _ = crand.Read(s.hashKey[:])
	ts, err := openTokens(cfg.DataDir, uint64(s.start.UnixMicro()))
	if err != nil {
		return nil, err
	}
	s.tokens = ts
	c, err := core.New(core.Config{
		Engine: core.EngineConfig{
			MaxResources:       cfg.MaxResources,
			MaxNameLen:         cfg.MaxNameLen,
			MaxLocksPerSession: cfg.MaxLocksPerSession,
			MaxQueueLen:        cfg.MaxQueueLen,
			SessionGrace:       cfg.SessionGrace,
			MaxTTL:             cfg.MaxTTL,
			MaxTimeout:         cfg.MaxTimeout,
			FirstToken:         ts.first,
		},
		Clock:   clock,
		OnBatch: s.onBatch,
	})
	if err != nil {
		return nil, err
	}
	s.core = c
	return s, nil
}

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
	if s.closed.Load() {
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
			if s.closed.Load() {
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
	first := !s.closed.Load()
	if first {
		s.closed.Store(true)
		for ln := range s.listeners {
			ln.Close()
		}
	}
	s.mu.Unlock()
	if first {
		s.core.Close()
		s.core.Batch(func(tx *core.Tx) {
			for c := range s.conns {
				c.closeAfterFlush()
			}
			if err := s.tokens.save(tx.LastToken() + 1); err != nil {
				s.log.Error("saving the token high-water mark", "err", err)
			}
		})
	}
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		s.core.Batch(func(*core.Tx) {
			for c := range s.conns {
				c.nc.Close()
			}
		})
		<-done
		return ctx.Err()
	}
}

// ---- guarded by the core ----

// onBatch ends every core batch: it turns the batch's events into pushes,
// delivers the pushes (after the answers of the batch's commands), signals
// the writers of connections with output (except the reader's own, which
// writes its replies itself) and keeps the token high-water mark ahead of
// the tokens given.
func (s *Server) onBatch(tx *core.Tx, events []core.Event) {
	for i := range events {
		s.eventLocked(&events[i])
	}
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
	if err := s.tokens.reserve(tx.LastToken()); err != nil {
		s.log.Error("saving the token high-water mark", "err", err)
	}
}

// eventLocked turns an engine event into a push. A partial release (some of
// a lock's resources released by owner) is pushed as expired, like a whole
// one: the holder no longer holds what it was granted.
func (s *Server) eventLocked(e *core.Event) {
	sess := s.sessions[e.Session]
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
		s.push(sess, protocol.PushReleased, e.ID)
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
// offline buffer.
func (s *Server) deliver(sess *session, frame []byte) {
	if sess.c != nil {
		sess.c.write(frame)
		return
	}
	sess.offline = append(sess.offline, frame...)
	for len(sess.offline) > s.cfg.MaxOfflineBytes {
		_, n, _, err := protocol.Next(sess.offline, protocol.MaxFrameLimit)
		if err != nil || n == 0 {
			sess.offline = sess.offline[:0]
			break
		}
		sess.offline = sess.offline[n:]
		s.log.Warn("offline push dropped: buffer full", "session", sess.hash)
	}
}
