package server

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mlock-dev/mlock/internal/auth"
	"github.com/mlock-dev/mlock/internal/core"
	"github.com/mlock-dev/mlock/internal/protocol"
	"github.com/mlock-dev/mlock/internal/rawio"
)

// conn is one client connection.
type conn struct {
	srv      *Server
	nc       net.Conn
	remote   string
	ip       netip.Addr // the peer's address (zero if not TCP)
	accepted time.Time
	lastLive atomic.Int64 // ns of the last frame received
	certName string       // the name of the client's verified certificate (TLS), set before the first read

	// Used by the reader goroutine only.
	authed    bool      // connect succeeded: frames up to MaxFrame, idle timeout
	refreshAt time.Time // when to push the idle read deadline forward

	sess  *session // guarded by the core: set by connect
	dirty bool     // guarded by the core: in srv.dirty
	told  bool     // guarded by the core: Shutdown told its holder and waits for bye or the end of the connection
	// unauthed: guarded by the core: counted in srv.unauthed and in the
	// pre-handshake pool, pre (accepted, no successful connect yet).
	unauthed bool
	pre      preLinks
	evicted  bool // guarded by the core: evicted from the pre-handshake pool; it handles nothing more
	// stopped: set by an eviction before it stops the reader (stopRead).
	stopped atomic.Bool
	// overCap: guarded by the core: let in past a limit of established
	// connections (MaxConnsPerIP, MaxConns), whose text its first frame is
	// refused with unless it is a cluster's forwarding hello (limits.go).
	overCap protocol.Code
	link    bool // guarded by the core: a cluster forwarding link, counted neither per address nor in MaxConns
	// park: set before finish, read by the writer after done: the socket
	// goes to the tarpit instead of being closed (a connect refused; the
	// reader has stopped).
	park    bool
	counted string // guarded by the core: the principal whose connections count it ("": none)
	plain   bool   // guarded by the core: an unframed status request, not a protocol client

	// out queues the frames for the client (at most MaxPendingOutput
	// bytes); the reader flushes its own replies at the end of a read
	// batch, the writer goroutine everything else. Its Flush writes through
	// sock. flushing counts the flushes under way.
	out      *protocol.Outbox
	sock     sock
	flushing atomic.Int32
	// aborted: the output went over its limit (set in a core batch, by
	// abort): the writer closes the socket without a last flush, and over
	// TLS without close_notify.
	aborted atomic.Bool

	// Cluster mode (see cluster.go).
	key     string          // the connection's key, unique in the cluster: "<node>/<run>/<n>"
	p       *auth.Principal // reader: the principal of its connect, once decided
	sid     string          // reader: its session id, once decided
	capture *[]byte         // guarded by the core: while set, write appends here (decide, apply)
	ended   bool            // guarded by the core: finish was called while capture was set
	// made: while set (a cluster node applies a command it gave up, see
	// cluster_cancel.go), applyLock appends the id of each lock it makes.
	made     *[]protocol.ID
	trusted  bool   // apply: the proposing node checked the rights
	answered uint64 // guarded by the core: the last proposal whose answer was written
	// pipe: the connection's commands, in order; nil on a single node, and
	// on a cluster node until the reader decides its first item that needs
	// it (newPipeLocked: set in a core batch, read by the reader and the apply).
	pipe    *pipeline
	forward bool // reader only: a follower's forwarding connection
	// saidFormat: on a forwarding connection, the highest log format a
	// member said it reads on it, its latest word (0: none); guarded by
	// the cluster's formats.mu (cluster_version.go).
	saidFormat int
	// fwd: a forwarding connection's queued commands by the follower's
	// connection (reader only; forward.go).
	fwd fwdChains
	// wantLeader: the connect asked a cluster follower to name the leader
	// (set before the attach is queued, read by its apply).
	wantLeader bool

	// rw reads and writes the connection: nc, or on plain TCP its raw
	// system calls (internal/rawio).
	rw io.ReadWriter

	wake     chan struct{} // cap 1: output is waiting
	done     chan struct{} // closed when the connection ends
	doneOnce sync.Once
}

// sock is the writer an Outbox flushes into: the connection, with its write
// deadline refreshed as writes go on.
type sock struct {
	c   *conn
	wdl time.Time // used by one flush at a time (the Outbox's): when to refresh the write deadline
}

// Write writes b to the connection. Refreshing the deadline costs, so it is
// done when half of it is used, and no longer once the connection is
// ending (the writer has set a short deadline for the last flush).
func (w *sock) Write(b []byte) (int, error) {
	c := w.c
	if now := time.Now(); now.After(w.wdl) {
		select {
		case <-c.done:
		default:
			w.wdl = now.Add(c.srv.cfg.WriteTimeout / 2)
			_ = c.nc.SetWriteDeadline(now.Add(c.srv.cfg.WriteTimeout))
			if c.aborted.Load() {
				// abort's deadline may have come before this one.
				_ = c.nc.SetWriteDeadline(pastDeadline)
			}
		}
	}
	c.srv.writes.Add(1)
	n, err := c.rw.Write(b)
	c.srv.obs.bytesOut.Add(uint64(n))
	return n, err
}

// newConn returns the conn of nc, not registered yet.
func (s *Server) newConn(nc net.Conn, remote string) *conn {
	c := &conn{srv: s, nc: nc, rw: nc, remote: remote, accepted: time.Now(),
		out:  protocol.NewOutbox(s.cfg.MaxPendingOutput),
		wake: make(chan struct{}, 1), done: make(chan struct{})}
	c.sock.c = c
	c.lastLive.Store(time.Now().UnixNano())
	return c
}

// accept registers nc and starts its goroutines, or refuses it when
// protected mode does not accept its address, or the pre-handshake pool is
// full and its address holds the most of it. Else a full pool makes room
// by an eviction (limits.go); a connection past MaxConnsPerIP,
// or past MaxConns when no pre-handshake connection can make room, is let
// in and refused at its first frame unless that proves it a cluster's own
// link (overCapLocked).
func (s *Server) accept(nc net.Conn) {
	ip := remoteIP(nc)
	refuse := protocol.CodeUnknown
	if s.tlsConf == nil && s.protectedRefuses(ip) {
		// Refused before anything is read. (Over TLS the error is sent
		// after the handshake, by connect.)
		refuse = protocol.CodeProtectedMode
	}
	// The conn is made only for a connection that is let in: a refusal
	// costs the accept, one write and the close.
	var c *conn
	key := ipKey(ip)
	closed, park := false, false
	s.batch(func(tx *core.Tx) {
		// Shutdown sets closed before its batch closes every conn.
		closed = s.closed.Load()
		full := len(s.conns)-s.evicting-s.adm.links >= s.cfg.MaxConns
		switch {
		case closed:
			return
		case refuse != protocol.CodeUnknown:
			s.counters.authFailed++
			s.logRefusal(tx.Now(), "connection refused: "+refuse.Text(), "remote", nc.RemoteAddr())
			return
		}
		if v, own := s.victimLocked(ip, full); own {
			refuse, park = s.refuseNewcomerLocked(tx.Now(), nc.RemoteAddr()), true
			return
		} else if v != nil {
			s.evictLocked(tx.Now(), v)
			full = false
		}
		c = s.newConn(nc, nc.RemoteAddr().String())
		c.ip = ip
		switch {
		case full:
			c.overCap = protocol.CodeTooManyConnections
		case key.IsValid() && s.perIP[key] >= s.cfg.MaxConnsPerIP:
			c.overCap = protocol.CodeTooManyFromAddr
		}
		if s.tlsConf != nil {
			c.nc = tls.Server(nc, s.tlsConf)
			c.rw = c.nc
		} else if raw, ok := rawio.New(nc); ok {
			c.rw = raw
		}
		s.conns[c] = struct{}{}
		if key.IsValid() {
			s.perIP[key]++
		}
		s.enterPreLocked(c)
		s.counters.conns++
		s.wg.Add(2)
		if s.cl != nil {
			// Its pipeline starts with its first item for the log (its
			// connect: newPipeLocked), not here: a connection before its
			// connect costs what it costs on a single node.
			c.key = s.cl.run + strconv.FormatUint(s.cl.nconn.Add(1), 10)
			s.cl.conns[c.key] = c
		}
	})
	if closed || refuse != protocol.CodeUnknown {
		if !closed && s.tlsConf == nil { // a TLS client could not read it
			_ = nc.SetWriteDeadline(time.Now().Add(time.Second))
			_, _ = nc.Write(protocol.AppendError(nil, refuse))
		}
		if park {
			s.park(nc, ip, s.cfg.AuthTimeout) // limits.go: the tarpit
			return
		}
		nc.Close()
		return
	}
	go c.readLoop()
	go c.writeLoop()
}

// stopRead stops c's reader, which is waiting for its connect: an eviction.
func (c *conn) stopRead() {
	c.stopped.Store(true)
	_ = c.nc.SetReadDeadline(time.Now())
}

// write queues frame bytes for the writer. It runs in a core batch.
func (c *conn) write(b []byte) {
	if c.capture != nil {
		*c.capture = append(*c.capture, b...)
		return
	}
	if c.out.Write(b) {
		c.srv.log.Warn("client is not reading its replies: disconnected", "remote", c.remote)
		// The writer closes the socket; the reader then ends and cleanup
		// detaches the session, which starts its grace only then: after
		// every answer the server gave on it.
		c.abort()
		c.finish()
		return
	}
	c.srv.obs.framesOut++
	if !c.dirty {
		c.dirty = true
		c.srv.dirty = append(c.srv.dirty, c)
	}
}

// pastDeadline is a deadline that has passed: set, it ends a blocked write
// at once.
var pastDeadline = time.Unix(1, 0)

// abort marks the connection, whose client does not read, for a close
// without a last flush, and ends any write under way to it. It runs in a
// core batch, so it neither writes to the network nor closes the socket
// (over TLS a Close sends close_notify, under its own 5 s deadline, to a
// client that does not read, and every other client would wait): a past
// write deadline unblocks the write, and the writer goroutine closes the
// socket (closeSocket).
func (c *conn) abort() {
	c.aborted.Store(true)
	_ = c.nc.SetWriteDeadline(pastDeadline)
}

// closeSocket closes the connection's socket; an aborted TLS connection's
// underlying one first, so that no close_notify is written to a client that
// does not read. It is never called in a core batch.
func (c *conn) closeSocket() {
	if tc, ok := c.nc.(*tls.Conn); ok && c.aborted.Load() {
		_ = tc.NetConn().Close()
	}
	c.nc.Close()
}

// finish ends the connection: the writer flushes what is queued and closes
// the socket.
func (c *conn) finish() {
	if c.capture != nil {
		c.ended = true
		return
	}
	c.doneOnce.Do(func() { close(c.done) })
}

// sendError queues "error <text of code>" and ends the connection, as the
// original server does. It runs in a core batch.
func (c *conn) sendError(code protocol.Code) {
	s := c.srv
	s.scratch = protocol.AppendError(s.scratch[:0], code)
	c.write(s.scratch)
	c.finish()
}

// flush writes what is queued, unless a flush is already under way (it
// writes what was queued meanwhile). The reader calls it for its own replies
// at the end of a batch; the writer goroutine for pushes from other
// connections.
func (c *conn) flush() error {
	c.flushing.Add(1)
	defer c.flushing.Add(-1)
	_, err := c.out.Flush(&c.sock)
	return err
}

func (c *conn) writeLoop() {
	defer c.srv.wg.Done()
	for {
		select {
		case <-c.wake:
			if err := c.flush(); err != nil {
				// A write timeout or error: as for a slow reader, the
				// session's grace starts when the reader has ended.
				c.closeSocket()
				c.finish()
				return
			}
		case <-c.done:
			c.srv.cfg.Logger.Debug("connection closing", "remote", c.remote)
			if c.aborted.Load() {
				c.closeSocket() // its output is gone (the Outbox dropped it)
				return
			}
			c.lastFlush()
			if c.park {
				c.srv.park(c.nc, c.ip, time.Until(c.accepted.Add(c.srv.cfg.AuthTimeout)))
				return
			}
			c.nc.Close()
			return
		}
	}
}

// lastFlush writes what is queued before the connection closes, within
// about a second. A reader's flush may be under way (blocked on a client
// that does not read): the short deadline ends it, and what it leaves is
// written here.
func (c *conn) lastFlush() {
	stop := time.Now().Add(time.Second)
	_ = c.nc.SetWriteDeadline(stop)
	for {
		if c.flush() != nil {
			return
		}
		if (c.flushing.Load() == 0 && c.out.Len() == 0) || time.Now().After(stop) {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

func (c *conn) readLoop() {
	s := c.srv
	defer s.wg.Done()
	defer c.cleanup()
	// One deadline from the accept for the TLS handshake and the connect.
	authBy := c.accepted.Add(s.cfg.AuthTimeout)
	if tc, ok := c.nc.(*tls.Conn); ok {
		if c.handshake(tc, authBy) != nil {
			return
		}
	}
	_ = c.nc.SetReadDeadline(authBy)
	if c.stopped.Load() {
		// Evicted before this reader set its deadline: stopRead's
		// deadline may have come first.
		return
	}
	// A small buffer until the handshake: the pre-handshake pool holds up
	// to MaxUnauthenticated of them (a longer frame grows it).
	buf := make([]byte, 0, preReadBuf)
	first := true
	probed := false // the idle deadline's read once more (below) is done
	var fields [][]byte
	for {
		if len(buf) == cap(buf) {
			buf = grown(buf, 2*cap(buf))
		}
		n, err := c.rw.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if first && len(buf) > 0 {
			first = false
			if buf[0] != 0 {
				c.plainStatus(buf)
				return
			}
		}
		if n > 0 {
			probed = false
			s.reads.Add(1)
			s.obs.bytesIn.Add(uint64(n))
			now := time.Now()
			c.lastLive.Store(now.UnixNano())
			authed := c.authed
			var stop bool
			buf, fields, stop = c.handleFrames(buf, fields)
			if stop {
				return
			}
			if c.authed {
				buf = grown(buf, readBuf)
			}
			if c.authed && s.cfg.IdleTimeout > 0 && (!authed || now.After(c.refreshAt)) {
				// From the handshake on, the idle timeout; the deadline
				// is moved when half of it is used.
				_ = c.nc.SetReadDeadline(now.Add(s.cfg.IdleTimeout))
				c.refreshAt = now.Add(s.cfg.IdleTimeout / 2)
			} else if c.authed && !authed {
				_ = c.nc.SetReadDeadline(time.Time{})
			}
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) && c.authed && s.cfg.IdleTimeout > 0 {
				// The deadline moves only every half timeout: it may
				// fire before a whole one has passed without a frame.
				if last := time.Unix(0, c.lastLive.Load()); time.Since(last) < s.cfg.IdleTimeout {
					_ = c.nc.SetReadDeadline(last.Add(s.cfg.IdleTimeout))
					c.refreshAt = last.Add(s.cfg.IdleTimeout / 2)
					continue
				}
				if !probed {
					// A deadline that passed while this reader was held up
					// (the core's lock, a slow write) is reported before
					// the bytes already received are read: read once more,
					// with a deadline just ahead, before calling it idle.
					probed = true
					_ = c.nc.SetReadDeadline(time.Now().Add(idleProbe))
					c.refreshAt = time.Time{} // a frame read sets the idle deadline again
					continue
				}
			}
			if errors.Is(err, os.ErrDeadlineExceeded) {
				s.batch(func(*core.Tx) {
					switch {
					case c.evicted:
						// Stopped by its eviction (stopRead): told already.
					case c.sess == nil && !c.authed:
						c.sendError(protocol.CodeAuthTimeout)
					case c.authed:
						s.counters.idleClosed++
						s.log.Info("connection idle: closed", "remote", c.remote, "idle-timeout", s.cfg.IdleTimeout)
						c.sendError(protocol.CodeIdleTimeout)
					}
				})
			}
			return
		}
	}
}

// grown returns buf with a capacity of at least n, its bytes kept.
func grown(buf []byte, n int) []byte {
	if cap(buf) >= n {
		return buf
	}
	nb := make([]byte, len(buf), n)
	copy(nb, buf)
	return nb
}

// The reader's buffer: preReadBuf bytes before the handshake, readBuf
// after it (a frame longer than the buffer grows it).
const (
	preReadBuf = 512
	readBuf    = 4096
)

// idleProbe is how long a connection whose idle deadline passed is read
// once more for bytes that were already received.
const idleProbe = 5 * time.Millisecond

// handleFrames handles every complete frame at the start of buf in one
// core batch (one acquisition of the core's lock) and returns the
// unconsumed bytes moved to the front. stop reports that the connection is
// ending.
func (c *conn) handleFrames(buf []byte, fields [][]byte) ([]byte, [][]byte, bool) {
	s := c.srv
	off := 0
	stop := false
	if c.forward {
		return c.forwardFrames(buf)
	}
	if _, n, want, err := protocol.Next(buf, c.maxFrame()); n == 0 && err == nil {
		if want > cap(buf) {
			// Make room for the whole frame (want <= MaxFrame+5).
			nb := make([]byte, len(buf), want)
			copy(nb, buf)
			buf = nb
		}
		return buf, fields, false
	}
	if s.cl != nil {
		return c.decideFrames(buf, fields)
	}
	s.batch(func(tx *core.Tx) {
		s.self = c // our own output is flushed below, not by the writer
		for !stop {
			payload, n, want, err := protocol.Next(buf[off:], c.maxFrame())
			if err != nil {
				c.sendError(c.badFrame(err))
				stop = true
				break
			}
			if n == 0 {
				buf, off = roomFor(buf, off, want)
				break
			}
			fields = protocol.Split(fields[:0], payload)
			s.framesIn.Add(1)
			stop = c.observeCommand(tx, fields)
			s.deliverPushesLocked() // after the command's own answer
			off += n
		}
	})
	if !stop && c.flush() != nil {
		stop = true
	}
	rest := copy(buf, buf[off:])
	return buf[:rest], fields, stop
}

// badFrame logs a malformed frame and returns the code of the error that
// ends the connection.
func (c *conn) badFrame(err error) protocol.Code {
	c.srv.log.Warn("malformed frame: connection closed", "remote", c.remote, "err", err)
	if errors.Is(err, protocol.ErrLongFrame) {
		return protocol.CodeFrameTooLarge
	}
	return protocol.CodeInvalidFrame
}

// maxFrame is the largest frame the reader accepts now: MaxFrame once the
// connection is authenticated, MaxHandshakeFrame before. Reader only.
func (c *conn) maxFrame() int {
	if c.authed {
		return c.srv.cfg.MaxFrame
	}
	return min(c.srv.cfg.MaxFrame, MaxHandshakeFrame)
}

// plainStatus answers the unframed "status\n" request of bin/mlock-status,
// and the unframed "cluster\n" probe of mlock cluster status.
// It lists sessions, locks and queues only on a server without credentials
// (whose every client may see them), within the listing rate; otherwise it
// shows the counters only.
func (c *conn) plainStatus(buf []byte) {
	for len(buf) < 64 && bytes.IndexByte(buf, '\n') < 0 {
		n, err := c.nc.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err != nil {
			break
		}
	}
	if string(bytes.TrimSpace(buf)) == "cluster" {
		// The node's own view of its cluster, at once: it needs no
		// session, no leader and no log (clusterProbe).
		_ = c.nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
		_, _ = c.nc.Write(c.srv.clusterProbe())
	} else if string(bytes.TrimSpace(buf)) == "status" {
		s := c.srv
		var text []byte
		s.batch(func(tx *core.Tx) {
			c.plain = true
			detail := !s.credentialed() && !s.protectedRefuses(c.ip) && s.allowListing(tx, "")
			text = s.statusText(tx, detail)
		})
		_ = c.nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
		_, _ = c.nc.Write(text)
	} else {
		// Neither frames nor a status request (a TLS client on a plain
		// port, say): one error frame tells a client at once that it
		// speaks the wrong protocol.
		_ = c.nc.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = c.nc.Write(protocol.AppendError(nil, protocol.CodeInvalidFrame))
		// Read what it sent on (a little, briefly): closing with unread
		// data resets the connection, which can discard the error
		// before the client reads it.
		_ = c.nc.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		var sink [4096]byte
		for range 4 {
			if _, err := c.nc.Read(sink[:]); err != nil {
				break
			}
		}
	}
	c.finish()
}

// cleanup runs when the reader ends: the session, if any, starts its grace
// period.
//
// Safety: a client may believe it holds its locks until the send time of
// the last request answered on its session plus the grace it was announced.
// The grace must therefore start no earlier than the server's last answer
// on the session. It starts here, in a batch after every batch that ran a
// command of this connection (the reader has ended), and nowhere else: a
// connection closed for a slow reader or a failed write gets here too,
// once its reader ends; a takeover moves the session to the new connection
// without a detach (connect); the idle timeout ends the reader too, so the
// grace of an idle session also starts after its last answer.
func (c *conn) cleanup() {
	s := c.srv
	if c.pipe != nil { // (set by this reader: newPipeLocked)
		// Its slots are free at once: the detach may wait long for a
		// leader (a node without a quorum), and meanwhile the connection,
		// closed, must not count against the limits.
		s.batch(func(*core.Tx) { c.freeSlotsLocked() })
		c.clusterCleanup()
	}
	s.batch(func(tx *core.Tx) {
		c.freeSlotsLocked()
		if s.cl != nil {
			delete(s.cl.conns, c.key)
		}
		if c.evicted {
			c.evicted = false
			s.evicting--
		}
		if c.told {
			// Shutdown was waiting for this connection to end. Only a bye
			// (handled before this) confirmed the holder; a close by the
			// client or by the server does not, but leaves nothing more to
			// wait for.
			c.told = false
			if s.awaiting--; s.awaiting == 0 && s.awaitDone != nil {
				close(s.awaitDone)
			}
		}
		if sess := c.sess; sess != nil && sess.c == c && s.cl != nil {
			sess.c = nil // detached in the log by clusterCleanup
			s.online--
			c.sess = nil
		} else if sess != nil && sess.c == c {
			sess.c = nil
			s.online--
			c.sess = nil
			tx.Apply(&core.Command{Op: core.OpDetach, Session: sess.id})
			s.log.Debug("session detached", "session", sess.hash, "remote", c.remote)
		}
	})
	c.finish()
}

// freeSlotsLocked takes the closed connection out of the server's counts
// (all connections, per address, before the handshake, per principal),
// once: it is counted while it is in s.conns.
func (c *conn) freeSlotsLocked() {
	s := c.srv
	if _, counted := s.conns[c]; !counted {
		return
	}
	delete(s.conns, c)
	if c.link {
		s.adm.links-- // not counted per address
	} else if key := ipKey(c.ip); key.IsValid() {
		if s.perIP[key]--; s.perIP[key] <= 0 {
			delete(s.perIP, key)
		}
	}
	s.leavePreLocked(c)
	s.uncountLocked(c)
}

// roomFor returns buf and off, or, when a frame of want bytes (want <=
// MaxFrame+5) does not fit in buf's capacity, a new buffer that holds
// buf[off:] at its start and offset 0.
func roomFor(buf []byte, off, want int) ([]byte, int) {
	if want <= cap(buf) {
		return buf, off
	}
	nb := make([]byte, len(buf)-off, want)
	copy(nb, buf[off:])
	return nb, 0
}
