package server

import (
	"bufio"
	"bytes"
	"context"
	"crypto/subtle"
	"crypto/tls"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
// proposed, the answer is its result), fwdProposeNext (the same, queued
// behind the previous command of the same follower connection, which this
// forwarding connection carried just before: its de-duplication key, the
// sequence number before; if that one was not queued on the leader's
// current leadership, nothing is done: fwdNotLeader), fwdJoin ("<id> <raft
// addr>": add a voter), fwdRemove ("<id>": remove a member), fwdPing (keeps
// the connection past the idle timeout), fwdFormat ("<id> <format>": the
// highest log format the member reads), fwdRead ("<id>": a read index for
// the member's pings, cluster_read.go). A leader of an older build answers
// a kind it does not know fwdFailed "unknown request": nothing was done.
const (
	fwdPropose     byte = 'P'
	fwdProposeNext byte = 'N'
	fwdJoin        byte = 'J'
	fwdRemove      byte = 'R'
	fwdPing        byte = 'K'
	fwdFormat      byte = 'F' // "<id> <format>": the highest log format the member reads (cluster_version.go)
	fwdRead        byte = 'I' // "<id>": a read index for the member's pings (cluster_read.go); the answer is a uvarint
	fwdRollback    byte = 'V' // a rollback request (rollbackReq.String, cluster_rollback.go)
	fwdVersion     byte = 'Q' // (none, or "index"): the cluster version the node's raft handshake says, "<v>" or "<v> rollback" (pinned), asked with "index" "<v> rollback <index of the lowering>" (if known)

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
	s.linkLocked(c) // the cluster's own link: out of the pool, and of the client limits (limits.go)
	return item{}, false
}

// forwardFrames handles the requests of a forwarding connection: a log
// command is queued here, in the order the connection carried it
// (queueForwarded), and answered by a goroutine of its own once applied;
// any other request runs on a goroutine of its own and answers when done.
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
		if hk := s.cl.cfg.testHooks; hk != nil {
			if kind == fwdProposeNext && hk.noProposeNext {
				kind = 0 // unknown to serveForwarded
			}
			if (kind == fwdPropose || kind == fwdProposeNext) && hk.dropForwarded.Load() {
				continue
			}
		}
		if (kind == fwdPropose || kind == fwdProposeNext) && c.queueForwarded(id, kind, req) {
			continue
		}
		if kind == fwdFormat {
			st, res := fwdOK, []byte(nil)
			if fid, f, ok := parseFormatSaid(req); ok {
				s.cl.noteFormat(fid, f, c)
			} else {
				st, res = fwdFailed, []byte("bad format")
			}
			c.answerForwarded(id, st, res)
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			st, res := s.serveForwarded(kind, req)
			c.answerForwarded(id, st, res)
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

// answerForwarded writes the answer to the forwarded request id.
func (c *conn) answerForwarded(id uint64, st byte, res []byte) {
	frame := fwdFrame(id, st, res)
	c.srv.batch(func(*core.Tx) { c.write(frame) })
}

// fwdFrame is a frame of a forwarding connection: the request id, a byte
// (a request's kind, an answer's status) and the rest.
func fwdFrame(id uint64, b byte, rest []byte) []byte {
	frame := make([]byte, 0, 4+9+len(rest)+1)
	frame = binary.BigEndian.AppendUint32(frame, uint32(4+9+len(rest)+1))
	frame = binary.BigEndian.AppendUint64(frame, id)
	frame = append(frame, b)
	frame = append(frame, rest...)
	return append(frame, '\n')
}

// fwdChains is what a forwarding connection's reader on the leader keeps
// so that a follower can pipeline a connection's log commands: the last
// command queued for each of the follower's connections (by
// de-duplication key). A command forwarded as fwdProposeNext is queued
// behind it (cluster.Node.ProposeAsync's after), so that the leader applies
// a prefix of a connection's commands, in order, as it does for its own
// connections' (cluster_pipeline.go).
type fwdChains struct {
	last map[string]fwdChain
	// sweepAt: the size of last at which the chains whose command is
	// answered are dropped (a fwdProposeNext for a dropped one is refused,
	// and its follower proposes it again on its own).
	sweepAt int
}

type fwdChain struct {
	pr  *cluster.Proposal
	seq uint64
}

// minFwdSweep is the least size of fwdChains.last at which it is swept.
const minFwdSweep = 1024

// queueForwarded queues a forwarded command (fwdPropose or fwdProposeNext)
// in the order the forwarding connection carried it, and answers it when it
// is applied. False: a fwdPropose that this node cannot queue now (not the
// ready leader): it is served as any other request (Propose waits for the
// leader entry, or answers that this node does not lead).
func (c *conn) queueForwarded(id uint64, kind byte, cmd []byte) bool {
	cl := c.srv.cl
	ch := &c.fwd
	key, seq, _, err := cluster.ParseDedupCommand(cmd)
	if err != nil {
		c.answerForwarded(id, fwdFailed, []byte("bad command"))
		return true
	}
	if ok, st, res := c.srv.checkForwarded(cmd, c); !ok {
		delete(ch.last, key)
		c.answerForwarded(id, st, res)
		return true
	}
	var after *cluster.Proposal
	if kind == fwdProposeNext {
		prev, ok := ch.last[key]
		if !ok || prev.seq+1 != seq {
			delete(ch.last, key)
			c.answerForwarded(id, fwdNotLeader, []byte(cl.node.LeaderAddr()))
			return true
		}
		after = prev.pr
	}
	pr, err := cl.node.ProposeAsync(cl.ctx, cmd, after)
	if err != nil {
		delete(ch.last, key)
		if kind == fwdPropose {
			return false
		}
		c.answerForwarded(id, fwdNotLeader, []byte(cl.node.LeaderAddr())) // nothing queued
		return true
	}
	if after != nil {
		cl.queuedNext.Add(1)
	}
	if ch.last == nil {
		ch.last = make(map[string]fwdChain)
	}
	ch.last[key] = fwdChain{pr: pr, seq: seq}
	ch.sweep()
	s := c.srv
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		res, err := pr.Wait(cl.ctx)
		st, out := s.forwardedOutcome(res, err)
		c.answerForwarded(id, st, out)
	}()
	return true
}

// sweep drops the answered chains once there are many.
func (ch *fwdChains) sweep() {
	if len(ch.last) < max(ch.sweepAt, minFwdSweep) {
		return
	}
	for k, v := range ch.last {
		select {
		case <-v.pr.Done():
			delete(ch.last, k)
		default:
		}
	}
	ch.sweepAt = 2 * len(ch.last)
}

// forwardedOutcome is the answer to a forwarded command whose proposal
// ended with res and err.
func (s *Server) forwardedOutcome(res []byte, err error) (byte, []byte) {
	cl := s.cl
	switch {
	case err == nil:
		return fwdOK, res
	case errors.Is(err, cluster.ErrNotLeader), errors.Is(err, cluster.ErrSkipped):
		return fwdNotLeader, []byte(cl.node.LeaderAddr()) // nothing was applied
	case errors.Is(err, cluster.ErrUnknownOutcome), errors.Is(err, cluster.ErrClosed), cl.ctx.Err() != nil:
		return fwdUnknown, nil
	default:
		return fwdFailed, []byte(err.Error())
	}
}

// serveForwarded runs one forwarded request on the leader.
func (s *Server) serveForwarded(kind byte, req []byte) (byte, []byte) {
	cl := s.cl
	switch kind {
	case fwdPropose:
		if ok, st, res := s.checkForwarded(req, nil); !ok {
			return st, res
		}
		res, err := cl.node.Propose(cl.ctx, req)
		return s.forwardedOutcome(res, err)
	case fwdRead:
		return s.serveRead(string(req))
	case fwdVersion:
		// Without "index" (a joining node of an earlier build, which
		// reads the pin's two words only), the lowering's index is left out.
		vs := versionState{version: cl.raftVersion(), pinned: cl.pinned.Load()}
		if string(req) == "index" {
			vs.at = cl.pinAt.Load()
		}
		return fwdOK, []byte(vs.String())
	case fwdRollback:
		r, ok := parseRollback(bytes.Fields(req))
		if !ok {
			return fwdFailed, []byte("bad rollback")
		}
		ctx, cancel := context.WithTimeout(cl.ctx, 10*time.Second)
		defer cancel()
		switch err := s.rollbackHere(ctx, r); {
		case err == nil:
			return fwdOK, nil
		case errors.Is(err, cluster.ErrNotLeader):
			return fwdNotLeader, []byte(cl.node.LeaderAddr())
		case errors.Is(err, cluster.ErrUnknownOutcome):
			return fwdUnknown, nil
		default:
			return fwdFailed, []byte(err.Error())
		}
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
	wait map[uint64]*fwdCall // guarded by mu; nil once dead
	dead chan struct{}
	// noNext: the leader does not know fwdProposeNext (an older build):
	// this node's connections forward one command at a time.
	noNext atomic.Bool
}

// fwdCall is one request sent on a forwarding connection, waiting for its
// answer.
type fwdCall struct {
	fc   *fwdConn
	id   uint64
	kind byte
	res  chan fwdResult // cap 1
	// done is closed once the answer is in res, or the connection died
	// first; failed with it when that is not fwdOK.
	done   chan struct{}
	failed chan struct{}
	// changed closes when this node sees another leader (or none): the
	// request is given up then (an unknown outcome).
	changed <-chan struct{}
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
	return proposed(st, res)
}

func (f *forwarder) call(ctx context.Context, addr string, kind byte, req []byte, changed <-chan struct{}) (byte, []byte, error) {
	fc, err := f.get(addr)
	if err != nil {
		f.dialFailed(addr, err)
		return 0, nil, cluster.ErrNotLeader // nothing was sent
	}
	c, err := fc.start(kind, req, changed)
	if err != nil {
		return 0, nil, err
	}
	return c.result(ctx)
}

// start sends a request of kind on fc; its answer is the call's. The
// errors: cluster.ErrNotLeader (the connection is dead, nothing was sent)
// and cluster.ErrUnknownOutcome (the write failed: perhaps sent).
func (fc *fwdConn) start(kind byte, req []byte, changed <-chan struct{}) (*fwdCall, error) {
	f := fc.f
	f.mu.Lock()
	f.nextID++
	id := f.nextID
	f.mu.Unlock()
	c := &fwdCall{fc: fc, id: id, kind: kind, res: make(chan fwdResult, 1), done: make(chan struct{}), failed: make(chan struct{}), changed: changed}
	fc.mu.Lock()
	if fc.wait == nil {
		fc.mu.Unlock()
		return nil, cluster.ErrNotLeader
	}
	fc.wait[id] = c
	fc.mu.Unlock()
	if err := fc.send(fwdFrame(id, kind, req)); err != nil {
		c.forget()
		return nil, cluster.ErrUnknownOutcome
	}
	return c, nil
}

// result waits for the call's answer: its status and result, or
// cluster.ErrUnknownOutcome if the connection died, the leader changed or
// ctx ended first (wrapping ctx's error then).
func (c *fwdCall) result(ctx context.Context) (byte, []byte, error) {
	defer c.forget()
	select {
	case r := <-c.res:
		return r.st, r.res, nil
	case <-c.fc.dead:
	case <-c.changed:
	case <-ctx.Done():
	}
	select {
	case r := <-c.res: // answered as well: the answer counts
		return r.st, r.res, nil
	default:
	}
	if err := ctx.Err(); err != nil {
		return 0, nil, fmt.Errorf("%w: %w", cluster.ErrUnknownOutcome, err)
	}
	return 0, nil, cluster.ErrUnknownOutcome
}

// forget takes the call off its connection's table (it no longer waits).
func (c *fwdCall) forget() {
	c.fc.mu.Lock()
	if c.fc.wait != nil {
		delete(c.fc.wait, c.id)
	}
	c.fc.mu.Unlock()
}

// Wait returns the result of a forwarded log command (fwdPropose or
// fwdProposeNext), with the errors of cluster.Proposal.Wait: ErrNotLeader
// (nothing was done), ErrUnknownOutcome (propose it again), or a refusal.
// Call it once.
func (c *fwdCall) Wait(ctx context.Context) ([]byte, error) {
	st, res, err := c.result(ctx)
	if err != nil {
		return nil, err
	}
	if c.kind == fwdProposeNext && st == fwdFailed && string(res) == "unknown request" {
		c.fc.noNext.Store(true) // a leader of an older build: nothing was done
		return nil, cluster.ErrNotLeader
	}
	return proposed(st, res)
}

// Done is closed once the answer is known, or the connection died (Wait
// then returns at once).
func (c *fwdCall) Done() <-chan struct{} { return c.done }

// Failed is closed once the answer is known to be a failure, or the
// connection died (see cluster.Proposal.Failed); a change of leader is
// told by changed.
func (c *fwdCall) Failed() <-chan struct{} { return c.failed }

// proposed is the result of a forwarded log command answered st, res.
func proposed(st byte, res []byte) ([]byte, error) {
	switch st {
	case fwdOK:
		return res, nil
	case fwdNotLeader:
		return nil, cluster.ErrNotLeader
	case fwdUnknown:
		return nil, cluster.ErrUnknownOutcome
	}
	if why, ok := strings.CutPrefix(string(res), staleRefusal); ok {
		return nil, fmt.Errorf("%w: %s", errStaleNode, why)
	}
	return nil, errors.New("server: forwarded command refused: " + string(res))
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
	fc := &fwdConn{f: f, addr: addr, nc: nc, rw: nc, wait: make(map[uint64]*fwdCall), dead: make(chan struct{})}
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
	// This node's formats go first on the connection, before anything
	// that is forwarded on it (the others' sends wait for wmu): the leader
	// takes a command written in a format below the cluster version only
	// from a connection on which the member said it reads the version
	// (checkForwarded), and this node's applied version lags behind the
	// leader's right after a raise, or a restart. Its answer, to an id
	// nobody waits for, is dropped (a leader of an older build answers
	// "unknown request").
	fc.wmu.Lock()
	f.nextID++
	id := f.nextID
	f.mu.Unlock()
	go fc.readLoop()
	go fc.pingLoop()
	_ = nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := fc.rw.Write(fwdFrame(id, fwdFormat, f.cl.formatSaid())); err != nil {
		nc.Close() // the readLoop ends the connection
	}
	fc.wmu.Unlock()
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
		calls := fc.wait
		fc.wait = nil
		fc.mu.Unlock()
		close(fc.dead)
		for _, c := range calls {
			close(c.done)
			close(c.failed)
		}
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
		c := fc.wait[id]
		delete(fc.wait, id)
		fc.mu.Unlock()
		if c != nil {
			c.res <- res
			close(c.done)
			if res.st != fwdOK {
				close(c.failed)
			}
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

// learnVersion asks the member at addr (a node joining through it) the
// cluster version its raft handshake says, and puts it in force in this
// node's handshake (versionFloor, kept in versionFile) if it is higher, or
// if the member's is pinned by a rollback: so a joining node refuses the
// handshake of a build that cannot read the log (MLRAFT1) from its first
// connection, not only once a leader has caught it up (docs/cluster.md,
// "Stale members"). It reports whether the member answered (a member of a
// build that does not know the request answers "unknown request": there
// is nothing to learn).
func (s *Server) learnVersion(addr string) bool {
	cl := s.cl
	ctx, cancel := context.WithTimeout(cl.ctx, 5*time.Second)
	defer cancel()
	st, res, err := cl.fwd.call(ctx, addr, fwdVersion, []byte("index"), nil)
	if err != nil {
		return false
	}
	if st != fwdOK {
		return true
	}
	vs, ok := parseVersionState(string(res))
	v, pinned := vs.version, vs.pinned
	if !ok || v < logFormat1 || v > logFormat {
		s.log.Warn("cluster: the member joined through says a cluster version this build does not know", "via", addr, "answer", string(res))
		return true
	}
	if !pinned && int64(v) <= cl.versionFloor.Load() {
		return true
	}
	if cl.cfg.Dir != "" {
		if err := writeVersionFile(cl.cfg.Dir, vs); err != nil {
			s.log.Warn("cluster: cannot keep the cluster version for the next start", "err", err)
		}
	}
	// The lowering's index too: a snapshot older than it, which the
	// leader may send, keeps the pin (setVersionLocked).
	cl.pinAt.Store(vs.at)
	cl.pinned.Store(pinned)
	cl.versionFloor.Store(int64(v))
	s.log.Info("cluster: joining a cluster at version "+strconv.Itoa(v)+": the raft handshake says it", "via", addr, "pinned", pinned, "lowering", vs.at)
	return true
}

// joinCluster asks the member at Cluster.Join (or the leader it names) to
// add this node, until it is in (or the server stops).
func (s *Server) joinCluster() {
	cl := s.cl
	defer cl.bg.Done()
	addr := cl.cfg.Join
	req := []byte(cl.id + " " + cl.node.RaftAddr())
	redirects := 0
	learnt := false
	for cl.ctx.Err() == nil {
		for _, p := range cl.node.Status().Peers {
			if p.ID == cl.id {
				return // in the configuration already (a restart, or joined)
			}
		}
		if !learnt {
			// Before it is a member (nobody dials it before): its raft
			// handshake says the cluster's version from the start.
			if learnt = s.learnVersion(addr); !learnt {
				select {
				case <-cl.ctx.Done():
				case <-time.After(time.Second):
				}
				continue
			}
		}
		// A try is bounded: a member that stops answering is asked again.
		ctx, cancel := context.WithTimeout(cl.ctx, 15*time.Second)
		st, res, err := cl.fwd.call(ctx, addr, fwdJoin, req, nil)
		cancel()
		switch {
		case err == nil && st == fwdOK:
			s.log.Info("cluster: joined", "via", addr)
			return
		case err == nil && st == fwdNotLeader && len(res) > 0:
			if redirects < 3 { // the leader it names; views that disagree pause below
				addr = string(res)
				redirects++
				continue
			}
		case err == nil:
			s.log.Warn("cluster: join refused", "via", addr, "answer", string(res))
		}
		redirects = 0
		select {
		case <-cl.ctx.Done():
		case <-time.After(time.Second):
			addr = cl.cfg.Join
		}
	}
}
