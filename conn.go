package mlock

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"runtime"
	"sync"
	"time"

	"github.com/mlock-dev/mlock/internal/protocol"
)

// The session's transport: the reconnect loop, one TCP connection at a time
// with its writer and pinger, and the reader that turns the server's
// messages into state changes.

// maxPending is the most bytes of commands a session queues for one
// connection; a server that reads nothing is dropped (and reconnected).
const maxPending = 32 << 20

// run is the reconnect loop; it reads frames while connected.
func (s *session) run() {
	defer close(s.done)
	for {
		select {
		case <-s.quit:
			s.shutdown()
			return
		default:
		}
		nc, r, resumed, err := s.dial()
		if err != nil {
			s.backoff = min(max(2*s.backoff, 50*time.Millisecond), s.opts.MaxBackoff)
			wait := time.Duration(float64(s.backoff) * (0.5 + rand.Float64()/2))
			s.log.Warn("mlock: connecting failed; retrying", "err", err, "in", wait)
			select {
			case <-s.quit:
				s.shutdown()
				return
			case <-time.After(wait):
			}
			continue
		}
		s.backoff = 0
		s.serve(nc, r, resumed)
	}
}

// dial connects and identifies the session.
func (s *session) dial() (net.Conn, *bufio.Reader, bool, error) {
	d := net.Dialer{Timeout: s.opts.DialTimeout, KeepAlive: 15 * time.Second}
	ctx, cancel := context.WithTimeout(s.ctx, s.opts.DialTimeout)
	defer cancel()
	nc, err := d.DialContext(ctx, "tcp", s.addr)
	if err != nil {
		return nil, nil, false, err
	}
	_ = nc.SetDeadline(time.Now().Add(s.opts.DialTimeout))
	if _, err := nc.Write(protocol.AppendCommand(nil, protocol.VerbConnect, s.sid, "1.0")); err != nil {
		nc.Close()
		return nil, nil, false, err
	}
	r := bufio.NewReaderSize(nc, 32<<10)
	p, err := protocol.ReadFrame(r, nil, protocol.MaxFrameLimit)
	var m protocol.Message
	if err == nil {
		if m, err = protocol.ParseMessage(p); err == nil && m.Kind != protocol.MsgConnected {
			err = fmt.Errorf("server answered %q", p)
		}
	}
	if err != nil {
		nc.Close()
		return nil, nil, false, err
	}
	_ = nc.SetDeadline(time.Time{})
	return nc, r, m.Resumed, nil
}

// serve runs one TCP connection until it breaks or the session shuts down.
func (s *session) serve(nc net.Conn, r *bufio.Reader, resumed bool) {
	box := protocol.NewOutbox(maxPending)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		nc.Close()
		return
	}
	if s.everUp && !resumed {
		s.sessionLostLocked()
	}
	s.everUp = true
	s.box = box
	close(s.up)
	s.mu.Unlock()
	s.log.Debug("mlock: connected", "resumed", resumed)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go s.writeLoop(nc, box, stop, &wg)
	go s.pingLoop(nc, stop, &wg)
	try, _ := tryWriter(nc)
	var err error
	var buf []byte
	for {
		var p []byte
		if p, err = protocol.ReadFrame(r, buf, protocol.MaxFrameLimit); err != nil {
			break
		}
		s.dispatch(p)
		if cap(p) > cap(buf) && cap(p) <= 1<<20 {
			buf = p[:0] // a large frame's buffer, kept for the next one
		}
		if !frameBuffered(r) {
			s.endBatch(nc, box, try)
		}
	}
	close(stop)
	nc.Close()
	wg.Wait()

	s.mu.Lock()
	s.box = nil
	s.answered = false // the next connection's callers wake its writer
	s.up = make(chan struct{})
	cerr := &Error{Type: TypeConnection, Msg: "connection lost", Err: err}
	if s.closed {
		cerr = &Error{Type: TypeConnection, Err: ErrClosed}
	}
	for seq, cl := range s.calls {
		delete(s.calls, seq)
		cl.ch <- reply{err: cerr}
	}
	// Pushes can be lost with the connection: from now on the client also
	// keeps time itself.
	for _, l := range s.locks {
		l.armBackstopLocked()
	}
	s.mu.Unlock()
	if !errors.Is(err, net.ErrClosed) {
		s.log.Warn("mlock: connection lost; reconnecting", "err", err)
	}
}

// frameBuffered reports whether r holds a whole frame: reading it does not
// block.
func frameBuffered(r *bufio.Reader) bool {
	b, _ := r.Peek(r.Buffered())
	_, n, _, err := protocol.Next(b, protocol.MaxFrameLimit)
	return n > 0 || err != nil
}

// endBatch ends the handling of what one read brought. The callers it
// answered have queued their next commands without waking the writer: once
// they have had the chance to run, the reader writes what they queued
// itself, if the socket takes it without blocking (a reader blocked in a
// write could deadlock with a server blocked writing to it); the writer
// goroutine writes the rest.
func (s *session) endBatch(nc net.Conn, box *protocol.Outbox, try func([]byte) (int, error)) {
	s.mu.Lock()
	answered := s.answered
	s.mu.Unlock()
	if !answered {
		return
	}
	runtime.Gosched()
	s.mu.Lock()
	s.answered = false
	s.mu.Unlock()
	if try == nil {
		s.kick()
		return
	}
	done, err := box.TryFlush(try)
	if err != nil {
		nc.Close()
		return
	}
	if !done {
		s.kick()
	}
}

// shutdown fails whatever is still waiting once the session is closed.
func (s *session) shutdown() {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := &Error{Type: TypeConnection, Err: ErrClosed}
	for seq, cl := range s.calls {
		delete(s.calls, seq)
		cl.ch <- reply{err: e}
	}
	for id, l := range s.locks {
		delete(s.locks, id)
		l.failLocked(e, e)
	}
}

// writeLoop writes the queued commands, gathering those of concurrent
// callers into one write, and flushes on shutdown.
func (s *session) writeLoop(nc net.Conn, box *protocol.Outbox, stop chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	for {
		select {
		case <-s.wake:
			// Let the callers just woken by the reader queue their next
			// commands first: they go out in the same write.
			runtime.Gosched()
			if _, err := box.Flush(nc); err != nil {
				nc.Close()
				return
			}
		case <-stop:
			return
		case <-s.quit:
			_ = nc.SetWriteDeadline(time.Now().Add(time.Second))
			_, _ = box.Flush(nc)
			nc.Close()
			return
		}
	}
}

// pingLoop checks an idle connection every PingInterval and drops it if the
// server does not answer within the interval.
func (s *session) pingLoop(nc net.Conn, stop chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	t := time.NewTicker(s.opts.PingInterval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), s.opts.PingInterval)
			_, err := s.roundTrip(ctx, nil, protocol.VerbPing)
			cancel()
			if err != nil && err.Type == TypeTimeout {
				s.log.Warn("mlock: server does not answer pings; reconnecting")
				nc.Close()
			}
		}
	}
}

// dispatch handles one frame from the server. p is valid only during the
// call.
func (s *session) dispatch(p []byte) {
	m, err := protocol.ParseMessage(p)
	if err != nil {
		s.log.Warn("mlock: unknown message from the server", "msg", string(p))
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.answered = true
	switch m.Kind {
	case protocol.MsgResult:
		s.resultLocked(&m)
	case protocol.MsgLocked:
		l := s.locks[string(m.ID)]
		if l == nil {
			// A grant nobody waits for (its request's answer was lost with a
			// connection): give it back at once.
			s.forgetLocked(string(m.ID))
			return
		}
		l.grantedLocked(m.Token, time.UnixMilli(m.ExpiresAtMs))
	case protocol.MsgTimeout:
		if l := s.locks[string(m.ID)]; l != nil && l.state == waiting {
			delete(s.locks, l.id)
			l.failLocked(&Error{Type: TypeTimeout, Msg: "Lock timeout"}, nil)
		}
	case protocol.MsgExpired:
		if l := s.locks[string(m.ID)]; l != nil {
			e := &Error{Type: TypeLost, Msg: "lock expired, or released by its owner", Err: ErrExpired}
			if m.Released {
				e = &Error{Type: TypeLost, Msg: "lock released by its owner", Err: ErrReleased}
			}
			s.loseLocked(l, e)
		}
	case protocol.MsgError:
		s.log.Warn("mlock: server error", "msg", m.Text)
	}
}

// resultLocked answers the call of a result.
func (s *session) resultLocked(m *protocol.Message) {
	seq, ok := protocol.ParseSeq(m.Req)
	cl := s.calls[seq]
	if !ok || cl == nil {
		return
	}
	delete(s.calls, seq)
	if !m.OK {
		if cl.lock != nil {
			cl.lock.state = failed
		}
		cl.ch <- reply{err: failure(m, cl.verb)}
		return
	}
	var r reply
	switch cl.verb {
	case protocol.VerbLock, protocol.VerbTryLock:
		l := cl.lock
		if cl.abandoned {
			s.forgetLocked(string(m.Payload))
			cl.ch <- reply{err: &Error{Type: TypeConnection, Err: ErrClosed}}
			return
		}
		if old := s.locks[string(m.Payload)]; old != nil && old.state == held {
			// An owner's renewal of a lock it holds: the same lock.
			old.ttl = l.ttl
			old.armLocked(time.Now().Add(l.ttl))
			l.state = released
			cl.ch <- reply{lock: old}
			return
		}
		// Granted or queued: the call is answered by the locked push (or
		// the failure) that follows.
		l.id = string(m.Payload)
		s.locks[l.id] = l
		l.wait = cl
		return
	case protocol.VerbExtend, protocol.VerbReleaseAll:
		r.n, _ = protocol.Int(m.Payload)
	case protocol.VerbRelease:
		if string(m.Payload) == "true" {
			r.n = 1
		}
	case protocol.VerbRenew:
		exp, tok, _ := cutSpace(m.Payload)
		r.n, _ = protocol.Int(exp)
		r.token, _ = protocol.Uint(tok)
	case protocol.VerbStatus, protocol.VerbLocks:
		r.data = append([]byte(nil), m.Payload...)
	}
	cl.ch <- r
}

func cutSpace(b []byte) (before, after []byte, found bool) {
	for i, c := range b {
		if c == ' ' {
			return b[:i], b[i+1:], true
		}
	}
	return b, nil, false
}

// sessionLostLocked handles a reconnect into a new session: every lock of
// the old one is gone.
func (s *session) sessionLostLocked() {
	s.log.Warn("mlock: the server lost this session; its locks are gone")
	waitErr := &Error{Type: TypeConnection, Msg: "session lost", Err: ErrSessionLost}
	lostErr := &Error{Type: TypeLost, Msg: "session lost", Err: ErrSessionLost}
	for id, l := range s.locks {
		delete(s.locks, id)
		l.failLocked(waitErr, lostErr)
	}
}

// ctxError is the error of a call given up through ctx; ctx.Err() (and the
// cause, if one was given) stay in its chain.
func ctxError(ctx context.Context) *Error {
	err := ctx.Err()
	if cause := context.Cause(ctx); cause != nil && cause != err {
		err = fmt.Errorf("%w: %w", err, cause)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return &Error{Type: TypeTimeout, Err: err}
	}
	return &Error{Type: TypeRequest, Msg: "cancelled", Err: err}
}
