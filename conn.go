package mlock

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/mlock-dev/mlock/internal/lease"
	"github.com/mlock-dev/mlock/internal/protocol"
	"github.com/mlock-dev/mlock/internal/rawio"
)

// The session's transport: the reconnect loop, one TCP connection at a time
// with its writer and pinger, and the reader that turns the server's
// messages into state changes.

// maxPending is the most bytes of commands a session queues for one
// connection; a server that reads nothing is dropped (and reconnected: see
// queueLocked). A variable for tests.
var maxPending = 32 << 20

// run is the reconnect loop; it reads frames while connected. It dials the
// nodes in turn: after a connection to a node drops, or an attempt fails,
// the next one; the backoff applies only once every node has failed in
// turn since the last connection (a round), never between the nodes of a
// round, and after a connection that dropped within stableConn of its
// handshake. A node shutting down counts as a failed attempt.
func (s *session) run() {
	defer close(s.done)
	tried := 0         // failed attempts in this round
	var refusal *Error // one of them, if the server refused the connection
	moveFrom := -1     // the follower whose connection was left for the leader it named
	mayMove := true    // false once the leader named did not answer
	for {
		select {
		case <-s.quit:
			s.shutdown()
			return
		default:
		}
		i := s.next
		s.next = (i + 1) % len(s.nodes)
		// Only a session's first connection moves, and only from a node
		// that created it ("new"): nothing of the session is held, waited
		// for or kept offline yet, so leaving that connection unread loses
		// nothing (see leaderNode).
		s.mu.Lock()
		ask := !s.everUp && mayMove && moveFrom < 0 && len(s.nodes) > 1 && !s.opts.StayOnNode
		s.mu.Unlock()
		c, err := s.dial(i, ask)
		if err == nil && ask && !c.h.resumed {
			if j := s.leaderNode(c.h.leader, i); j >= 0 {
				c.tcp.Close()
				s.log.Debug("mlock: moving to the cluster's leader", "node", s.nodes[i].addr, "leader", s.nodes[j].addr)
				s.next, moveFrom = j, i
				continue
			}
		}
		if moveFrom >= 0 && err != nil {
			// The leader did not answer: back to the follower, to stay.
			s.dialFailed(i, err, nil)
			s.log.Warn("mlock: the cluster's leader did not answer; staying on a follower", "leader", s.nodes[i].addr, "err", err)
			s.next, moveFrom, mayMove = moveFrom, -1, false
			continue
		}
		moveFrom = -1
		if err == nil {
			tried, refusal = 0, nil
			start := monoNow()
			if !s.serve(c, i) {
				if monoNow()-start >= stableConn {
					s.backoff = 0
					continue
				}
				// Dropped soon after the handshake (a server that closes
				// every connection at once): reconnecting at once would
				// hammer it; the backoff grows as after a failed round.
				s.backoff = min(max(2*s.backoff, 50*time.Millisecond), s.opts.MaxBackoff)
				if !s.sleep(time.Duration(float64(s.backoff) * (0.5 + rand.Float64()/2))) {
					s.shutdown()
					return
				}
				continue
			}
			// The server said it is shutting down: another node, or later.
			err = errShuttingDown
		}
		tried++
		if e, ok := permanent(err); ok {
			refusal = e
		}
		if tried < len(s.nodes) {
			s.dialFailed(i, err, nil)
			s.log.Warn("mlock: connecting failed; trying the next node", "node", s.nodes[i].addr, "err", err)
			continue
		}
		s.backoff = min(max(2*s.backoff, 50*time.Millisecond), s.opts.MaxBackoff)
		if refusal != nil {
			// Refused: retrying soon will not help, but the server's
			// configuration may change.
			s.backoff = s.opts.MaxBackoff
		}
		s.dialFailed(i, err, refusal)
		s.roundFailed(err, refusal)
		tried, refusal = 0, nil
		wait := time.Duration(float64(s.backoff) * (0.5 + rand.Float64()/2))
		s.log.Warn("mlock: connecting failed; retrying", "node", s.nodes[i].addr, "err", err, "in", wait)
		if !s.sleep(wait) {
			s.shutdown()
			return
		}
	}
}

// stableConn is how long a connection must last for the next one to be
// made at once when it drops; one that drops sooner is followed by the
// backoff, which grows while connections keep dropping that soon.
const stableConn = time.Second

// sleep waits for d, or until the session closes: then it reports false.
func (s *session) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-s.quit:
		return false
	case <-t.C:
		return true
	}
}

var errShuttingDown = errors.New("server shutting down")

// leaderNode returns the index of the node whose address is leader (the
// client address a follower named in its handshake, asked with
// "want=leader"), or -1: none named, it is node i itself, it is not one of
// the session's nodes, or Options.StayOnNode. The session moves there only
// on its first connection and only from a "new" answer: a resumed session
// may have offline pushes (a "released" among them) and held locks that
// the follower's answer carries, and the session's state after a "new"
// answer is settled by serve; the follower's detach when the connection
// closes is a no-op once the leader's connect took the session over.
func (s *session) leaderNode(leader string, i int) int {
	if leader == "" || s.opts.StayOnNode {
		return -1
	}
	for j, n := range s.nodes {
		if j != i && strings.EqualFold(n.addr, leader) {
			return j
		}
	}
	return -1
}

// maxDrops is how many connections a lock request may lose before its result
// (it is asked again after each but the last): a node that drops every
// connection fails the request with the connection error instead of keeping
// it forever.
const maxDrops = 3

// hello is what the handshake told.
type hello struct {
	resumed bool          // the server kept the session
	graceMs int64         // the session grace it announced; -1: none
	sent    time.Duration // when connect was sent
	leader  string        // the cluster leader's client address a follower named
}

// link is one connection to the server, handshake done.
type link struct {
	nc  net.Conn // reads and writes: the TLS connection over tcp, or tcp
	tcp net.Conn // closing it breaks nc at once, whatever blocks on it
	r   *bufio.Reader
	w   io.Writer // writes nc: raw system calls on plain TCP
	h   hello
}

// dial connects to node i, speaks TLS if configured, and identifies the
// session (and its principal, with credentials), all within DialTimeout. A
// refusal by the server (its "error <text>" answer to connect) is an Error
// (see refusal); so are TLS failures (see handshakeError). Both name the
// node.
func (s *session) dial(i int, askLeader bool) (link, error) {
	addr, tcfg := s.nodes[i].addr, s.tls[i]
	d := net.Dialer{Timeout: s.opts.DialTimeout, KeepAlive: 15 * time.Second}
	ctx, cancel := context.WithTimeout(s.ctx, s.opts.DialTimeout)
	defer cancel()
	tcp, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return link{}, err
	}
	_ = tcp.SetDeadline(time.Now().Add(s.opts.DialTimeout))
	// The last Client's Close ends a handshake under way at once.
	unhook := context.AfterFunc(s.ctx, func() { _ = tcp.SetDeadline(time.Now()) })
	defer unhook()
	nc := tcp
	if tcfg != nil {
		tc := tls.Client(tcp, tcfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			tcp.Close()
			if s.ctx.Err() != nil {
				return link{}, s.ctx.Err()
			}
			return link{}, handshakeError(addr, err)
		}
		nc = tc
	}
	sent := s.clk.now()
	args := [3]string{"1.0"}
	n := 1
	if s.opts.Name != "" {
		args[n] = "auth=" + s.opts.Name + ":" + string(s.opts.Token)
		n++
	}
	if askLeader {
		args[n] = "want=leader" // a cluster follower names the leader
		n++
	}
	if _, err := nc.Write(protocol.AppendCommand(nil, protocol.VerbConnect, s.sid, args[:n]...)); err != nil {
		tcp.Close()
		return link{}, err
	}
	// Plain TCP is read and written with raw system calls (see
	// internal/rawio): no wake-up of the runtime's monitor per round trip.
	var rd io.Reader = nc
	var w io.Writer = nc
	if tcfg == nil {
		if raw, ok := rawio.New(tcp); ok {
			rd, w = raw, raw
		}
	}
	r := bufio.NewReaderSize(rd, 32<<10)
	var m protocol.Message
	if tcfg == nil && looksLikeTLS(r) {
		err = &Error{Type: TypeConnection, Msg: "the server " + addr + " speaks TLS: use mlocks:// or Options.TLS", Node: addr, Err: ErrTLS, fatal: true}
	} else {
		var p []byte
		p, err = protocol.ReadFrame(r, nil, protocol.MaxFrameLimit)
		if err == nil {
			m, err = protocol.ParseMessage(p)
			switch {
			case err != nil:
			case m.Kind == protocol.MsgError && m.Code != protocol.CodeShuttingDown:
				e := refusal(&m, addr)
				if m.Code == protocol.CodeAuthRequired && tcfg != nil && (len(tcfg.Certificates) > 0 || tcfg.GetClientCertificate != nil) {
					// The server got no certificate it could verify: Go's TLS
					// client sends none whose issuer is not among the CAs the
					// server asks for.
					e.Msg += " (the client certificate was not accepted: is its issuer among the server's client CAs, --tls-client-ca?)"
				}
				err = e
			case m.Kind != protocol.MsgConnected:
				err = fmt.Errorf("server answered %q", p)
			}
		} else if tcfg != nil {
			var oe *net.OpError
			if errors.As(err, &oe) && oe.Op == "remote error" {
				// TLS 1.3: the server checks the client's certificate
				// after the client's side of the handshake is done.
				err = handshakeError(addr, err)
			}
		}
	}
	if err != nil {
		tcp.Close()
		return link{}, err
	}
	if !unhook() {
		tcp.Close() // closing: the deadline may have been set
		return link{}, s.ctx.Err()
	}
	_ = tcp.SetDeadline(time.Time{})
	return link{nc: nc, tcp: tcp, r: r, w: w, h: hello{resumed: m.Resumed, graceMs: m.GraceMs, sent: sent, leader: m.Leader}}, nil
}

// looksLikeTLS reports whether the server's first bytes are a TLS record
// (an alert or a handshake, version 3.x) rather than a frame, whose first
// byte is 0: a TLS server that does not answer plain clients in clear text.
func looksLikeTLS(r *bufio.Reader) bool {
	b, err := r.Peek(3)
	return err == nil && (b[0] == 0x15 || b[0] == 0x16) && b[1] == 3 && b[2] <= 4
}

// serve runs one TCP connection, to node i, until it breaks or the session
// shuts down. It reports whether the server said it is shutting down.
func (s *session) serve(c link, i int) (bye bool) {
	addr := s.nodes[i].addr
	nc := c.nc
	box := protocol.NewOutbox(maxPending)
	// The last Client's Close bounds a write blocked on a server that reads
	// nothing (the writer notices the session's end only between writes):
	// it gets a second to flush what is queued.
	unhook := context.AfterFunc(s.ctx, func() { _ = nc.SetWriteDeadline(time.Now().Add(time.Second)) })
	defer unhook()
	if !s.attach(c, addr, box) {
		nc.Close()
		return false
	}
	s.log.Debug("mlock: connected", "node", addr, "resumed", c.h.resumed, "graceMs", c.h.graceMs)

	stop := make(chan struct{})
	cctx, ccancel := context.WithCancel(s.ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	go s.writeLoop(c, box, stop, &wg)
	go s.pingLoop(cctx, c.tcp, stop, &wg)
	s.kick() // requests asked again on this session
	bye, err := s.readLoop(c, box)
	if bye {
		// Every held lock is marked lost: confirm it to the server, which
		// counts only bye (not a closed connection) as heard.
		s.mu.Lock()
		s.seq++
		s.queueLocked(s.seq, &protocol.Words{V: protocol.VerbBye})
		s.mu.Unlock()
		_ = nc.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = box.Flush(c.w) // or the flush under way writes it
	}
	close(stop)
	ccancel() // a ping in flight
	if bye {
		wg.Wait() // a flush under way ends (at the write deadline at worst)
	}
	// The raw connection: a TLS close_notify could block on a full socket.
	c.tcp.Close()
	wg.Wait()
	s.detachConn(addr, err)
	if !errors.Is(err, net.ErrClosed) && !bye {
		s.log.Warn("mlock: connection lost; reconnecting", "node", addr, "err", err)
	}
	return bye
}

// attach makes c, to node addr, the session's connection: the handshake's
// grace and send time, the waits probed or asked again. It reports false if
// the session is closed.
func (s *session) attach(c link, addr string, box *protocol.Outbox) bool {
	h := c.h
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.graceKnown = h.graceMs >= 0
	s.grace = time.Duration(max(h.graceMs, 0)) * time.Millisecond
	s.graceMargin = lease.Margin(s.grace)
	// The handshake is an answer on the session: its send time is a lower
	// bound of when the session was (re)attached, so the session's end
	// counts from it. Grants do not (resultAck): a grant kept for the
	// session while it was away, or announced again on this connection, is
	// read after the handshake although the server made it before.
	if !s.everUp || !h.resumed {
		s.lastAck = h.sent
	} else {
		s.lastAck = max(s.lastAck, h.sent)
	}
	s.box, s.nc, s.node = box, c.tcp, addr
	s.refused = nil
	clear(s.nodeErrs)
	switch {
	case s.everUp && !h.resumed:
		s.newSessionLocked(s.clk.now())
	case s.everUp:
		s.probeWaitsLocked(s.clk.now())
	}
	s.reaskCallsLocked(s.clk.now())
	s.everUp = true
	close(s.up)
	s.rearmLocked() // the grace may have changed
	s.pingEvery = 0 // the pinger computes it
	return true
}

// readLoop reads and dispatches c's frames until the connection breaks or
// the server says it is shutting down (bye). At the end of what a read
// brought, it writes the commands of the callers it answered (endBatch).
func (s *session) readLoop(c link, box *protocol.Outbox) (bye bool, err error) {
	try, _ := tryWriter(c.nc)
	var buf []byte
	for {
		var p []byte
		if p, err = protocol.ReadFrame(c.r, buf, protocol.MaxFrameLimit); err != nil {
			return false, err
		}
		if s.dispatch(p) {
			return true, errShuttingDown
		}
		if cap(p) > cap(buf) && cap(p) <= 1<<20 {
			buf = p[:0] // a large frame's buffer, kept for the next one
		}
		if !frameBuffered(c.r) {
			s.endBatch(c.tcp, box, try)
		}
	}
}

// detachConn ends the session's connection to addr, which broke with err:
// the calls in flight fail, or are asked again on the next connection when
// their outcome is unknown.
func (s *session) detachConn(addr string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.box, s.nc, s.node = nil, nil, ""
	s.answered = false // the next connection's callers wake its writer
	s.woken = 0        // a read cut short (bye, a bad frame) left it
	s.up = make(chan struct{})
	cerr := &Error{Type: TypeConnection, Msg: "connection lost", Node: addr, Err: err}
	if s.closed {
		cerr = &Error{Type: TypeConnection, Err: ErrClosed}
	}
	for seq, cl := range s.calls {
		delete(s.calls, seq)
		switch {
		case cl.probe != nil:
		case cl.lock != nil && !cl.abandoned && !s.closed && cl.drops < maxDrops-1:
			// Its outcome is unknown: asked again on the next connection.
			cl.drops++
			s.reasks = append(s.reasks, cl)
		default:
			cl.ch <- reply{err: cerr}
		}
	}
	clear(s.giving)
	clear(s.givingSeq)
	// A timeout push can be lost with the connection: the waits' backstops
	// join the session's timer (held locks are on it already).
	s.rearmLocked()
}

// block.
func frameBuffered(r *bufio.Reader) bool {
	b, _ := r.Peek(r.Buffered())
	_, n, _, err := protocol.Next(b, protocol.MaxFrameLimit)
	return n > 0 || err != nil
}

// wokenWait bounds the reader's wait for the callers it answered to queue
// their next commands (see endBatch), for the sessions started afterwards.
var wokenWait = 20 * time.Microsecond

// Coalescing the callers' next commands (see endBatch).
const (
	// After a wait that ran out, the next wokenSkips reads end without
	// waiting, twice as many after each further one in a row, up to
	// wokenSkips<<wokenMaxShift: callers that do not send at once (they
	// hold their locks a while) cost the reader little.
	wokenSkips    = 8
	wokenMaxShift = 5
)

// endBatch ends the handling of what one read brought. The callers it
// answered queue their next commands without waking the writer: once they
// have had the chance to run (the reader yields until as many commands as
// callers it answered have been queued, for at most s.wokenWait), the
// reader writes what they queued itself, in one write, if the socket takes
// it without blocking (a reader blocked in a write could deadlock with a
// server blocked writing to it); the writer goroutine writes the rest.
// Reads that answered no waiting caller neither wait nor count in the
// back-off (skipWaits, misses).
func (s *session) endBatch(nc net.Conn, box *protocol.Outbox, try func([]byte) (int, error)) {
	s.mu.Lock()
	answered, woken := s.answered, s.woken > 0
	wait := woken && s.skipWaits == 0
	if woken && !wait {
		s.skipWaits--
	}
	s.mu.Unlock()
	if !answered {
		return
	}
	runtime.Gosched()
	if wait {
		start := monoNow()
		for {
			s.mu.Lock()
			left := s.woken
			switch {
			case left == 0:
				s.misses = 0
			case monoNow()-start > s.wokenWait:
				s.skipWaits = wokenSkips << min(s.misses, wokenMaxShift)
				s.misses++
				left = 0
			}
			s.mu.Unlock()
			if left == 0 {
				break
			}
			runtime.Gosched()
		}
	}
	s.mu.Lock()
	s.answered = false
	s.woken = 0
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
		if cl.probe == nil {
			cl.ch <- reply{err: e}
		}
	}
	for _, cl := range s.reasks {
		cl.lock.state = failed
		cl.ch <- reply{err: e}
	}
	s.reasks = nil
	lostErr := &Error{Type: TypeLost, Msg: "client closed", Err: ErrClosed}
	for id, l := range s.locks {
		delete(s.locks, id)
		l.failLocked(e, lostErr)
	}
	if s.clock != nil {
		s.clock.Stop()
	}
	s.clockOn = false
}

// writeLoop writes the queued commands, gathering those of concurrent
// callers into one write, and flushes on shutdown.
func (s *session) writeLoop(c link, box *protocol.Outbox, stop chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	nc, w := c.nc, c.w
	for {
		select {
		case <-s.wake:
			// Let other callers queue their commands first: they go out
			// in the same write.
			runtime.Gosched()
			s.mu.Lock()
			gathering := s.answered
			s.mu.Unlock()
			if gathering {
				// The reader is handing out the answers of a read: it
				// writes what is queued once their callers have sent
				// again (see endBatch), in one write.
				continue
			}
			if _, err := box.Flush(w); err != nil {
				c.tcp.Close()
				return
			}
		case <-stop:
			return
		case <-s.quit:
			_ = nc.SetWriteDeadline(time.Now().Add(time.Second))
			_, _ = box.Flush(w)
			nc.Close()
			return
		}
	}
}

// pingLoop keeps the session answered: it pings when nothing was answered
// for a keep-alive period (see pingPeriodLocked: a third of the shortest of
// the grace and the held locks' ttls while the session holds or waits for
// locks, else PingInterval), and drops the connection if the server does
// not answer a ping within that period (at least a second). ctx ends with
// the connection.
func (s *session) pingLoop(ctx context.Context, nc net.Conn, stop chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	t := s.clk.newTimer(time.Hour)
	defer t.Stop()
	kicked := false
	for {
		s.mu.Lock()
		if !kicked || s.pingEvery == 0 {
			// Recomputed when the period passes, not when a grant made it
			// shorter: a lock taken and released at once does not make the
			// pinger run each time.
			s.pingEvery = s.pingPeriodLocked()
		}
		every := s.pingEvery
		wait := s.lastAck + every - s.clk.now()
		s.mu.Unlock()
		kicked = false
		if wait > 0 {
			t.Reset(wait)
			select {
			case <-stop:
				return
			case <-s.pingKick:
				kicked = true
			case <-t.C():
			}
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, max(every, time.Second))
		_, err := s.roundTrip(pctx, nil, nil, &protocol.Words{V: protocol.VerbPing})
		cancel()
		if err != nil && err.Type == TypeTimeout {
			s.log.Warn("mlock: server does not answer pings; reconnecting")
			nc.Close()
		}
		select {
		case <-stop:
			return
		default:
		}
		if err != nil {
			// Do not spin while the connection is going down.
			t.Reset(every)
			select {
			case <-stop:
				return
			case <-t.C():
			}
		}
	}
}

// dispatch handles one frame from the server. p is valid only during the
// call. It reports whether the server said it is shutting down.
func (s *session) dispatch(p []byte) (bye bool) {
	m, err := protocol.ParseMessage(p)
	if err != nil {
		s.log.Warn("mlock: unknown message from the server", "msg", string(p))
		return false
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
			return false
		}
		l.grantedLocked(m.Token, time.UnixMilli(m.ExpiresAtMs))
	case protocol.MsgTimeout:
		if l := s.locks[string(m.ID)]; l != nil && l.state == waiting {
			delete(s.locks, l.id)
			l.failLocked(&Error{Type: TypeTimeout, Msg: "Lock timeout"}, nil)
		}
	case protocol.MsgExpired:
		l := s.locks[string(m.ID)]
		if l == nil {
			break
		}
		if l.state == waiting {
			// Its grant was lost with a connection, and it is gone
			// already: it held nothing here. Ask again.
			delete(s.locks, l.id)
			s.reaskLocked(l, s.clk.now())
			break
		}
		e := &Error{Type: TypeLost, Msg: "lock expired, or released by its owner", Err: ErrExpired}
		switch {
		case m.Released:
			e = &Error{Type: TypeLost, Msg: "lock released by its owner", Err: ErrReleased}
		case m.Shutdown:
			e = errShutdownLost()
		case m.Evicted:
			e = &Error{Type: TypeLost, Msg: "lock evicted by an administrator", Err: ErrReleased}
		}
		s.loseLocked(l, e)
	case protocol.MsgError:
		if m.Code == protocol.CodeShuttingDown {
			s.shuttingDownLocked()
			return true
		}
		s.log.Warn("mlock: server error", "msg", m.Text)
	}
	return false
}

// resultLocked answers the call of a result.
func (s *session) resultLocked(m *protocol.Message) {
	seq, ok := protocol.ParseSeq(m.Req)
	cl := s.calls[seq]
	if !ok || cl == nil {
		if id, ok := s.givingSeq[seq]; ok { // a grant given back
			delete(s.givingSeq, seq)
			if s.giving[id] == seq {
				delete(s.giving, id)
			}
		}
		return
	}
	delete(s.calls, seq)
	if m.OK && cl.verb != protocol.VerbStatus && cl.verb != protocol.VerbLocks && cl.verb != protocol.VerbCluster {
		// Status and locks are answered from the state of the node asked
		// (in a cluster, one that may lag), a membership change once the
		// leader committed it (before the node asked applied the entries
		// ahead of it, whose grants it pushes later), and a refusal may be
		// answered before the request reaches the lock table: none bounds
		// when the session was alive or when a later grant was made.
		s.lastAck = max(s.lastAck, cl.sent)
		s.resultAck = max(s.resultAck, cl.sent)
	}
	if cl.probe != nil {
		s.probedLocked(cl.probe, m, cl.sent)
		return
	}
	if !m.OK && cl.verb == protocol.VerbTryLock && cl.drops > 0 && !cl.busyRetried &&
		m.Code == protocol.CodeBusy && len(s.giving) > 0 && !cl.abandoned {
		// A try-lock asked again after a connection loss, refused by its
		// own first grant, which this session is giving back: once more.
		cl.busyRetried = true
		s.resendLocked(cl, s.clk.now())
		return
	}
	if !m.OK {
		if cl.lock != nil {
			cl.lock.state = failed
		}
		s.answerLocked(cl, reply{err: failure(m, cl.verb)})
		return
	}
	r := reply{sent: cl.sent, node: s.node}
	switch cl.verb {
	case protocol.VerbLock, protocol.VerbTryLock:
		s.lockAnsweredLocked(cl, string(m.Payload))
		return
	case protocol.VerbExtend, protocol.VerbReleaseAll, protocol.VerbReleaseAllIn, protocol.VerbEvict:
		r.n, _ = protocol.Int(m.Payload)
	case protocol.VerbRelease, protocol.VerbReleaseIn:
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
	s.answerLocked(cl, r)
}

// lockAnsweredLocked handles the successful answer to a lock or try-lock
// call: the lock id, granted or queued. The call is answered by the locked
// push (or the failure) that follows, unless the answer is an owner's
// re-entry onto a lock this session holds, gives back or waits for.
func (s *session) lockAnsweredLocked(cl *call, id string) {
	l := cl.lock
	if cl.abandoned {
		// Nobody waits for it: give it back, unless the answer names a
		// lock another handle of the session holds or waits for (an
		// owner's re-entry): that lock stays theirs.
		switch old := s.locks[id]; {
		case old == nil:
			s.forgetLocked(id)
		case old.state == held:
			old.renewedLocked(cl.sent, l.ttl, time.Time{}) // renewed by the re-entry
		}
		cl.ch <- reply{err: &Error{Type: TypeConnection, Err: ErrClosed}}
		return
	}
	if _, gone := s.giving[id]; gone {
		// An owner's request that renewed, by re-entry, a grant this
		// session is giving back: the unlock that follows frees it.
		s.resendLocked(cl, s.clk.now())
		return
	}
	old := s.locks[id]
	if old != nil && old != l && (old.unlocking || old.state == waiting) {
		// An owner's re-entry onto a lock being unlocked here (the
		// unlock that follows frees it), or onto a waiting request
		// whose grant has not arrived yet (it comes with the answer of
		// the request asked again, which then renews the held lock).
		s.resendLocked(cl, s.clk.now())
		return
	}
	if old != nil && old.state == held {
		// An owner's renewal of a lock it holds: the same lock.
		old.renewedLocked(cl.sent, l.ttl, time.Time{})
		l.state = released
		s.answerLocked(cl, reply{lock: old})
		return
	}
	// Granted or queued: the call is answered by the locked push (or
	// the failure) that follows.
	l.id = id
	s.locks[l.id] = l
	l.wait = cl
	s.keepAliveLocked(s.keepSpanLocked(l)) // the session must stay up for it
}

// answerLocked gives the reader's answer to the caller waiting on cl, who
// counts among the callers the reader waits for (see endBatch).
func (s *session) answerLocked(cl *call, r reply) {
	if !cl.abandoned { // read first: once answered, the call may be reused
		s.woken++
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
	return &Error{Type: TypeCanceled, Err: err}
}
