package server

import (
	"bufio"
	"context"
	"crypto/subtle"
	"crypto/tls"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/mlock-dev/mlock/internal/cluster"
	"github.com/mlock-dev/mlock/internal/core"
	"github.com/mlock-dev/mlock/internal/protocol"
	"github.com/mlock-dev/mlock/internal/rawio"
)

// Forwarding. A follower hands the log commands of its clients to the
// leader over one connection to the leader's client port, opened with the
// frame "forward <hex sha256 of the cluster secret>" and multiplexing any
// number of requests: each frame after it is an 8-byte request id, a kind
// byte and the request; the leader answers each (in any order) with the id,
// a status byte and the result. Kinds: fwdPropose (a cluster.DedupCommand:
// proposed, the answer is its result), fwdJoin ("<id> <raft addr>": add a
// voter), fwdRemove ("<id>": remove a member), fwdPing (keeps the
// connection past the idle timeout), fwdFormat ("<id> <format>": the highest
// log format the member reads; a leader of an older build refuses it).
const (
	fwdPropose byte = 'P'
	fwdJoin    byte = 'J'
	fwdRemove  byte = 'R'
	fwdPing    byte = 'K'
	fwdFormat  byte = 'F' // "<id> <format>": the highest log format the member reads (cluster_version.go)

	fwdOK        byte = 0
	fwdNotLeader byte = 1 // nothing was done: ask the leader (the result is its client address, if known)
	fwdUnknown   byte = 2 // the outcome is unknown: propose the same command again
	fwdFailed    byte = 3 // refused (the result says why)
)

// acceptForward turns c into a forwarding connection if token is the
// cluster's; else it is refused as a failed authentication.
func (c *conn) acceptForward(token []byte) (item, bool) {
	s := c.srv
	want := hex.EncodeToString(s.cl.secret[:])
	if subtle.ConstantTimeCompare(token, []byte(want)) != 1 {
		s.counters.authFailed++
		c.sendError(protocol.CodeAuthFailed)
		return item{local: *c.capture, end: true}, true
	}
	c.forward = true
	c.authed = true
	s.leavePreLocked(c) // done with its handshake: out of the pool and of its address's count
	return item{}, false
}

// forwardFrames handles the requests of a forwarding connection: each runs
// on a goroutine of its own (proposals wait for their entry) and answers
// when done.
func (c *conn) forwardFrames(buf []byte) ([]byte, [][]byte, bool) {
	s := c.srv
	off := 0
	for {
		payload, n, _, err := protocol.Next(buf[off:], protocol.MaxFrameLimit)
		if err != nil {
			s.log.Warn("cluster: malformed forwarded frame: connection closed", "remote", c.remote, "err", err)
			return buf[:0], nil, true
		}
		if n == 0 {
			break
		}
		off += n
		if len(payload) < 9 {
			continue
		}
		id := binary.BigEndian.Uint64(payload)
		kind := payload[8]
		req := append([]byte(nil), payload[9:]...)
		if kind == fwdPing {
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			st, res := s.serveForwarded(kind, req)
			frame := make([]byte, 0, 4+9+len(res)+1)
			frame = binary.BigEndian.AppendUint32(frame, uint32(4+9+len(res)+1))
			frame = binary.BigEndian.AppendUint64(frame, id)
			frame = append(frame, st)
			frame = append(frame, res...)
			frame = append(frame, '\n')
			s.batch(func(*core.Tx) { c.write(frame) })
		}()
	}
	rest := copy(buf, buf[off:])
	if want := rest; want == cap(buf) {
		nb := make([]byte, rest, 2*cap(buf))
		copy(nb, buf[:rest])
		return nb, nil, false
	}
	return buf[:rest], nil, false
}

// serveForwarded runs one forwarded request on the leader.
func (s *Server) serveForwarded(kind byte, req []byte) (byte, []byte) {
	cl := s.cl
	switch kind {
	case fwdPropose:
		res, err := cl.node.Propose(cl.ctx, req)
		switch {
		case err == nil:
			return fwdOK, res
		case errors.Is(err, cluster.ErrNotLeader):
			return fwdNotLeader, []byte(cl.node.LeaderAddr())
		case errors.Is(err, cluster.ErrUnknownOutcome), errors.Is(err, cluster.ErrClosed), cl.ctx.Err() != nil:
			return fwdUnknown, nil
		default:
			return fwdFailed, []byte(err.Error())
		}
	case fwdFormat:
		id, f, ok := parseFormatSaid(req)
		if !ok {
			return fwdFailed, []byte("bad format")
		}
		cl.noteFormat(id, f)
		return fwdOK, nil
	case fwdJoin, fwdRemove:
		ch := &clusterChange{join: kind == fwdJoin, by: "a cluster node"}
		if ch.join {
			var ok bool
			if ch.id, ch.addr, ok = strings.Cut(string(req), " "); !ok {
				return fwdFailed, []byte("bad join")
			}
		} else {
			ch.id = string(req)
		}
		ctx, cancel := context.WithTimeout(cl.ctx, 10*time.Second)
		defer cancel()
		err := s.changeHere(ctx, ch)
		switch {
		case err == nil:
			return fwdOK, nil
		case errors.Is(err, cluster.ErrNotLeader):
			return fwdNotLeader, []byte(cl.node.LeaderAddr())
		default:
			return fwdFailed, []byte(err.Error())
		}
	}
	return fwdFailed, []byte("unknown request")
}

// forwarder keeps one forwarding connection per leader address.
type forwarder struct {
	s  *Server
	cl *clusterState

	mu     sync.Mutex
	conns  map[string]*fwdConn // guarded by mu
	closed bool                // guarded by mu
	nextID uint64              // guarded by mu
	// dialLogged: when a failed dial to each address was last logged.
	dialLogged map[string]time.Time // guarded by mu
	wg         sync.WaitGroup
}

type fwdConn struct {
	f    *forwarder
	addr string
	nc   net.Conn
	// rw reads and writes nc: with raw system calls on a plain TCP
	// connection (rawio), else nc itself.
	rw   io.ReadWriter
	wmu  sync.Mutex // serialises writes
	mu   sync.Mutex
	wait map[uint64]chan fwdResult // guarded by mu; nil once dead
	dead chan struct{}
}

type fwdResult struct {
	st  byte
	res []byte
}

func newForwarder(s *Server, cl *clusterState) *forwarder {
	return &forwarder{s: s, cl: cl, conns: make(map[string]*fwdConn)}
}

// propose forwards cmd to the leader at addr and returns its result; the
// errors are cluster.ErrNotLeader (nothing done) and
// cluster.ErrUnknownOutcome (propose it again). It gives up (unknown
// outcome) when the leader changes (changed closes).
func (f *forwarder) propose(ctx context.Context, addr string, cmd []byte, changed <-chan struct{}) ([]byte, error) {
	st, res, err := f.call(ctx, addr, fwdPropose, cmd, changed)
	if err != nil {
		return nil, err
	}
	switch st {
	case fwdOK:
		return res, nil
	case fwdNotLeader:
		return nil, cluster.ErrNotLeader
	case fwdUnknown:
		return nil, cluster.ErrUnknownOutcome
	}
	return nil, errors.New("server: forwarded command refused: " + string(res))
}

func (f *forwarder) call(ctx context.Context, addr string, kind byte, req []byte, changed <-chan struct{}) (byte, []byte, error) {
	fc, err := f.get(addr)
	if err != nil {
		f.dialFailed(addr, err)
		return 0, nil, cluster.ErrNotLeader // nothing was sent
	}
	ch := make(chan fwdResult, 1)
	f.mu.Lock()
	f.nextID++
	id := f.nextID
	f.mu.Unlock()
	fc.mu.Lock()
	if fc.wait == nil {
		fc.mu.Unlock()
		return 0, nil, cluster.ErrNotLeader
	}
	fc.wait[id] = ch
	fc.mu.Unlock()
	defer func() {
		fc.mu.Lock()
		if fc.wait != nil {
			delete(fc.wait, id)
		}
		fc.mu.Unlock()
	}()
	frame := make([]byte, 0, 4+9+len(req)+1)
	frame = binary.BigEndian.AppendUint32(frame, uint32(4+9+len(req)+1))
	frame = binary.BigEndian.AppendUint64(frame, id)
	frame = append(frame, kind)
	frame = append(frame, req...)
	frame = append(frame, '\n')
	if err := fc.send(frame); err != nil {
		return 0, nil, cluster.ErrUnknownOutcome
	}
	select {
	case r := <-ch:
		return r.st, r.res, nil
	case <-fc.dead:
		return 0, nil, cluster.ErrUnknownOutcome
	case <-changed:
		return 0, nil, cluster.ErrUnknownOutcome
	case <-ctx.Done():
		return 0, nil, cluster.ErrUnknownOutcome
	}
}

// dialFailed logs a failed connection to the leader at addr, at most every
// 10 s per address: requests keep waiting and retrying meanwhile, so a
// misconfiguration (TLS, the secret) must show in the log.
func (f *forwarder) dialFailed(addr string, err error) {
	if errors.Is(err, errClosing) {
		return
	}
	f.mu.Lock()
	now := time.Now()
	due := now.Sub(f.dialLogged[addr]) >= 10*time.Second
	if due {
		if f.dialLogged == nil {
			f.dialLogged = map[string]time.Time{}
		}
		f.dialLogged[addr] = now
	}
	f.mu.Unlock()
	if due {
		f.s.log.Warn("cluster: cannot reach the leader to forward requests; they wait", "leader", addr, "err", err)
	}
}

func (fc *fwdConn) send(frame []byte) error {
	fc.wmu.Lock()
	defer fc.wmu.Unlock()
	_ = fc.nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_, err := fc.rw.Write(frame)
	if err != nil {
		fc.nc.Close()
	}
	return err
}

// get returns the connection to addr, dialling it if needed.
func (f *forwarder) get(addr string) (*fwdConn, error) {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil, errClosing
	}
	if fc := f.conns[addr]; fc != nil {
		f.mu.Unlock()
		return fc, nil
	}
	f.mu.Unlock()
	nc, err := f.dial(addr)
	if err != nil {
		return nil, err
	}
	hello := protocol.Append(nil, "forward", hex.EncodeToString(f.cl.secret[:]))
	_ = nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := nc.Write(hello); err != nil {
		nc.Close()
		return nil, err
	}
	fc := &fwdConn{f: f, addr: addr, nc: nc, rw: nc, wait: make(map[uint64]chan fwdResult), dead: make(chan struct{})}
	if raw, ok := rawio.New(nc); ok {
		fc.rw = raw
	}
	f.mu.Lock()
	if f.closed || f.conns[addr] != nil {
		other := f.conns[addr]
		f.mu.Unlock()
		nc.Close()
		if other == nil {
			return nil, errClosing
		}
		return other, nil
	}
	f.conns[addr] = fc
	f.wg.Add(2)
	f.mu.Unlock()
	go fc.readLoop()
	go fc.pingLoop()
	return fc, nil
}

// dial connects to another node's client port: over TLS, verifying its
// certificate for the host of addr, when this node speaks TLS.
func (f *forwarder) dial(addr string) (net.Conn, error) {
	nc, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil || f.s.tlsConf == nil {
		return nc, err
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		nc.Close()
		return nil, err
	}
	tc := tls.Client(nc, &tls.Config{ServerName: host, RootCAs: f.cl.roots, MinVersion: tls.VersionTLS12})
	ctx, cancel := context.WithTimeout(f.cl.ctx, 5*time.Second)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		nc.Close()
		return nil, fmt.Errorf("TLS to %s: %w", addr, err)
	}
	return tc, nil
}

func (fc *fwdConn) readLoop() {
	f := fc.f
	defer f.wg.Done()
	defer func() {
		fc.nc.Close()
		f.mu.Lock()
		if f.conns[fc.addr] == fc {
			delete(f.conns, fc.addr)
		}
		f.mu.Unlock()
		fc.mu.Lock()
		fc.wait = nil
		fc.mu.Unlock()
		close(fc.dead)
	}()
	r := bufio.NewReaderSize(fc.rw, 64<<10)
	var buf []byte
	for {
		p, err := protocol.ReadFrame(r, buf, protocol.MaxFrameLimit)
		if err != nil {
			return
		}
		if len(p) > 0 && p[0] != 0 {
			// Text (ids are below 2^56): an error frame, the handshake was refused.
			f.s.log.Warn("cluster: forwarding refused", "addr", fc.addr, "answer", string(p))
			return
		}
		if len(p) < 9 {
			continue
		}
		id := binary.BigEndian.Uint64(p)
		res := fwdResult{st: p[8], res: append([]byte(nil), p[9:]...)}
		fc.mu.Lock()
		ch := fc.wait[id]
		fc.mu.Unlock()
		if ch != nil {
			ch <- res
		}
	}
}

// pingLoop keeps the connection past the leader's idle timeout.
func (fc *fwdConn) pingLoop() {
	defer fc.f.wg.Done()
	every := 10 * time.Second
	if it := fc.f.s.cfg.IdleTimeout; it > 0 && it/3 < every {
		every = it / 3
	}
	t := time.NewTicker(every)
	defer t.Stop()
	ping := []byte{0, 0, 0, 4 + 9 + 1, 0, 0, 0, 0, 0, 0, 0, 0, fwdPing, '\n'}
	for {
		select {
		case <-fc.dead:
			return
		case <-t.C:
			if fc.send(ping) != nil {
				return
			}
		}
	}
}

// close closes every forwarding connection and waits for their goroutines.
func (f *forwarder) close() {
	f.mu.Lock()
	f.closed = true
	conns := f.conns
	f.conns = map[string]*fwdConn{}
	f.mu.Unlock()
	for _, fc := range conns {
		fc.nc.Close()
	}
	f.wg.Wait()
}

// joinCluster asks the member at Cluster.Join (or the leader it names) to
// add this node, until it is in (or the server stops).
func (s *Server) joinCluster() {
	cl := s.cl
	defer cl.bg.Done()
	addr := cl.cfg.Join
	req := []byte(cl.id + " " + cl.node.RaftAddr())
	for cl.ctx.Err() == nil {
		for _, p := range cl.node.Status().Peers {
			if p.ID == cl.id {
				return // in the configuration already (a restart, or joined)
			}
		}
		st, res, err := cl.fwd.call(cl.ctx, addr, fwdJoin, req, nil)
		switch {
		case err == nil && st == fwdOK:
			s.log.Info("cluster: joined", "via", addr)
			return
		case err == nil && st == fwdNotLeader && len(res) > 0:
			addr = string(res)
			continue
		case err == nil:
			s.log.Warn("cluster: join refused", "via", addr, "answer", string(res))
		}
		select {
		case <-cl.ctx.Done():
		case <-time.After(time.Second):
			addr = cl.cfg.Join
		}
	}
}
