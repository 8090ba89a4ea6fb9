package server

import (
	"bytes"
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mlock-dev/mlock/internal/wire"
)

// conn is one client connection.
type conn struct {
	srv      *Server
	nc       net.Conn
	remote   string
	accepted time.Time
	lastLive atomic.Int64 // ns of the last frame received

	sess  *session // guarded by srv.mu: set by connect
	dirty bool     // guarded by srv.mu: in srv.dirty

	outMu   sync.Mutex
	out     []byte    // guarded by outMu: bytes waiting to be written
	spare   []byte    // guarded by outMu: the buffer of the last write, for reuse
	writing bool      // guarded by outMu: a write is under way
	wdl     time.Time // guarded by outMu (held by the writing flag): when to refresh the write deadline
	dead    bool      // guarded by outMu: over its output limit, being closed

	wake     chan struct{} // cap 1: output is waiting
	done     chan struct{} // closed when the connection ends
	doneOnce sync.Once
}

// accept registers nc and starts its goroutines, or refuses it when the
// server is full.
func (s *Server) accept(nc net.Conn) {
	c := &conn{srv: s, nc: nc, remote: nc.RemoteAddr().String(), accepted: time.Now(),
		wake: make(chan struct{}, 1), done: make(chan struct{})}
	c.lastLive.Store(time.Now().UnixNano())
	s.mu.Lock()
	if s.closed || len(s.conns) >= s.cfg.MaxConns {
		s.counters.rejected++
		closed := s.closed
		s.mu.Unlock()
		if !closed {
			s.log.Warn("connection refused: too many connections", "remote", c.remote)
			_ = nc.SetWriteDeadline(time.Now().Add(time.Second))
			_, _ = nc.Write(wire.Append(nil, "error", txtTooManyConns))
		}
		nc.Close()
		return
	}
	s.conns[c] = struct{}{}
	s.counters.conns++
	s.wg.Add(2)
	s.mu.Unlock()
	go c.readLoop()
	go c.writeLoop()
}

// write queues frame bytes for the writer. It runs under srv.mu.
func (c *conn) write(b []byte) {
	c.outMu.Lock()
	if c.dead {
		c.outMu.Unlock()
		return
	}
	c.out = append(c.out, b...)
	over := len(c.out) > c.srv.cfg.MaxPendingOutput
	if over {
		c.dead = true
		c.out = nil
	}
	c.outMu.Unlock()
	if over {
		c.srv.log.Warn("client is not reading its replies: disconnected", "remote", c.remote)
		c.nc.Close() // unblocks the writer; the reader ends and detaches the session
		c.finish()
		return
	}
	if !c.dirty {
		c.dirty = true
		c.srv.dirty = append(c.srv.dirty, c)
	}
}

// finish ends the connection: the writer flushes what is queued and closes
// the socket.
func (c *conn) finish() { c.doneOnce.Do(func() { close(c.done) }) }

// closeAfterFlush is finish for callers holding srv.mu.
func (c *conn) closeAfterFlush() { c.finish() }

// sendError queues "error <text>" and ends the connection, as the original
// server does. It runs under srv.mu.
func (c *conn) sendError(text string) {
	s := c.srv
	s.scratch = wire.Append(s.scratch[:0], "error", text)
	c.write(s.scratch)
	c.finish()
}

// flush writes what is queued, unless a write is already under way (its
// writer picks up what was queued meanwhile). The reader calls it for its
// own replies at the end of a batch; the writer goroutine for pushes from
// other connections.
func (c *conn) flush() error {
	for {
		c.outMu.Lock()
		if c.writing || len(c.out) == 0 {
			c.outMu.Unlock()
			return nil
		}
		c.writing = true
		buf := c.out
		c.out, c.spare = c.spare[:0], nil
		c.outMu.Unlock()
		// Refreshing the deadline costs; do it when half of it is used.
		if now := time.Now(); now.After(c.wdl) {
			c.wdl = now.Add(c.srv.cfg.WriteTimeout / 2)
			_ = c.nc.SetWriteDeadline(now.Add(c.srv.cfg.WriteTimeout))
		}
		_, err := c.nc.Write(buf)
		c.srv.writes.Add(1)
		c.outMu.Lock()
		c.writing = false
		if cap(buf) <= 64<<10 {
			c.spare = buf[:0]
		}
		c.outMu.Unlock()
		if err != nil {
			return err
		}
	}
}

func (c *conn) writeLoop() {
	defer c.srv.wg.Done()
	for {
		select {
		case <-c.wake:
			if err := c.flush(); err != nil {
				c.nc.Close()
				c.finish()
				return
			}
		case <-c.done:
			c.srv.cfg.Logger.Debug("connection closing", "remote", c.remote)
			_ = c.nc.SetWriteDeadline(time.Now().Add(time.Second))
			c.outMu.Lock()
			c.writing = false // a blocked inline write has failed or will
			c.wdl = time.Now().Add(time.Hour)
			c.outMu.Unlock()
			_ = c.flush()
			c.nc.Close()
			return
		}
	}
}

func (c *conn) readLoop() {
	s := c.srv
	defer s.wg.Done()
	defer c.cleanup()
	_ = c.nc.SetReadDeadline(time.Now().Add(s.cfg.AuthTimeout))
	buf := make([]byte, 0, 4096)
	first := true
	var fields [][]byte
	for {
		if len(buf) == cap(buf) {
			nb := make([]byte, len(buf), 2*cap(buf))
			copy(nb, buf)
			buf = nb
		}
		n, err := c.nc.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if first && len(buf) > 0 {
			first = false
			if buf[0] != 0 {
				c.plainStatus(buf)
				return
			}
		}
		if n > 0 {
			s.reads.Add(1)
			c.lastLive.Store(time.Now().UnixNano())
			var stop bool
			buf, fields, stop = c.handleFrames(buf, fields)
			if stop {
				return
			}
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				s.mu.Lock()
				if c.sess == nil {
					c.sendError(txtAuthTimeout)
					s.afterBatchLocked(nil)
				}
				s.mu.Unlock()
			}
			return
		}
	}
}

// handleFrames handles every complete frame at the start of buf, under one
// acquisition of srv.mu, and returns the unconsumed bytes moved to the
// front. stop reports that the connection is ending.
func (c *conn) handleFrames(buf []byte, fields [][]byte) ([]byte, [][]byte, bool) {
	s := c.srv
	off := 0
	stop := false
	locked := false
	for !stop {
		payload, n, want, err := wire.Next(buf[off:], s.cfg.MaxFrame)
		if err != nil || n == 0 {
			if err != nil {
				if !locked {
					s.mu.Lock()
					locked = true
				}
				txt := txtBadFrame
				if errors.Is(err, wire.ErrLongFrame) {
					txt = txtLongFrame
				}
				s.log.Warn("malformed frame: connection closed", "remote", c.remote, "err", err)
				c.sendError(txt)
				stop = true
			} else if want > cap(buf) {
				// Make room for the whole frame (want <= MaxFrame+5).
				nb := make([]byte, len(buf)-off, want)
				copy(nb, buf[off:])
				buf, off = nb, 0
			}
			break
		}
		if !locked {
			s.mu.Lock()
			locked = true
		}
		fields = wire.Split(fields[:0], payload)
		s.framesIn.Add(1)
		stop = c.handle(fields)
		s.deliverPushesLocked() // after the command's own answer
		off += n
	}
	if locked {
		s.afterBatchLocked(c) // our own output is flushed below, not by the writer
		s.mu.Unlock()
		if !stop && c.flush() != nil {
			stop = true
		}
	}
	rest := copy(buf, buf[off:])
	return buf[:rest], fields, stop
}

// plainStatus answers the unframed "status\n" request of bin/mlock-status.
func (c *conn) plainStatus(buf []byte) {
	for len(buf) < 64 && bytes.IndexByte(buf, '\n') < 0 {
		n, err := c.nc.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err != nil {
			break
		}
	}
	if string(bytes.TrimSpace(buf)) == "status" {
		s := c.srv
		s.mu.Lock()
		text := s.statusText()
		s.mu.Unlock()
		_ = c.nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
		_, _ = c.nc.Write(text)
	}
	c.finish()
}

// cleanup runs when the reader ends: the session, if any, starts its grace
// period.
func (c *conn) cleanup() {
	s := c.srv
	s.mu.Lock()
	delete(s.conns, c)
	if sess := c.sess; sess != nil && sess.c == c {
		sess.c = nil
		c.sess = nil
		s.tab.Detach(s.now(), sess.id)
		s.afterBatchLocked(nil)
		s.log.Debug("session detached", "session", sess.hash, "remote", c.remote)
	}
	s.mu.Unlock()
	c.finish()
}
