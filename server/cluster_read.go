package server

import (
	"context"
	"encoding/binary"
	"errors"
	"sync"
	"time"

	"github.com/mlock-dev/mlock/internal/cluster"
	"github.com/mlock-dev/mlock/internal/core"
)

// Session liveness off the log (see docs/cluster.md, "Liveness"). A ping is
// answered by the node that holds its connection without a log entry: once
// every earlier request of the connection is answered, the node gets a read
// index (the leader's commit index, read after the ping arrived and after
// every entry the leader had proposed by then was committed, and confirmed
// by a round of heartbeats of the leader's term after it was read), applies
// the log up to it, and answers pong if the session is still
// attached to the connection there. A follower asks the leader for the read
// index over its forwarding connection (fwdRead, batched: one request on its
// way at a time), and the leader counts it as word from the follower: it
// detaches the sessions of a node only the failover window after the later
// of raft's last contact with it, its last read and its own election.

// pingReadWindow is how long after the leader's previous round of
// heartbeats for reads a ping's read may wait for its own
// (cluster.Node.ReadIndexWithin): the pings that come meanwhile share one
// round. A pong promises order and liveness from the ping's send time, not
// promptness: 100 ms more on a ping every few seconds costs its client
// nothing, and 2 000 idle sessions cost 10 rounds a second instead of 50.
const pingReadWindow = 100 * time.Millisecond

// errNoReads: the leader serves no reads (a build before them); the ping
// goes through the log.
var errNoReads = errors.New("cluster: the leader serves no reads")

// runPing answers the ping it in its turn (every earlier request answered,
// by this node's apply), from a read index. ok false: the connection ends
// (the ping was not confirmed within noLeaderWait: closed without a word,
// as for a request through the log; or the session is no longer attached
// to the connection). viaLog: the leader serves no reads, the ping goes
// through the log as before.
func (r *pipeRun) runPing(it *item) (ok, viaLog bool) {
	if !r.flush() || !r.settle(0) || !r.applied() {
		return false, false
	}
	ok, viaLog = r.c.pingRead(r.ctx)
	if !ok || viaLog {
		return ok, viaLog
	}
	return r.c.pong(it, false), false
}

// pingHere answers the ping it on the connection's reader, which decides
// nothing more meanwhile: its pipeline was idle (pipeline.pingIdle), so
// every earlier request is answered, and a later one is decided only once
// the pong is written. The pong is flushed here, not by the writer. False:
// the connection ends. If the leader serves no reads, the ping is queued on
// the pipeline, which sends it through the log. The read waits under the
// pipeline's context, which ends with the connection (as runPing's does): a
// connection ended meanwhile (taken over, a failed write, a client that
// does not read) is not held by its reader for the rest of a read that
// waits for a leader, and its detach is not put off by as much.
func (c *conn) pingHere(it *item) bool {
	p := c.pipe
	p.mu.Lock()
	ctx := p.ctx
	p.mu.Unlock()
	ok, viaLog := c.pingRead(ctx)
	if viaLog {
		c.pipe.push([]item{*it})
		return true
	}
	if !ok || !c.pong(it, true) {
		return false
	}
	return c.flush() == nil
}

// pingRead waits for a read index confirmed after the call began and for
// this node's apply up to it (which writes the pushes of those entries),
// within noLeaderWait; past it, the connection is closed without a word
// (finish), as for a request through the log. ok false: the connection
// ends. viaLog: the leader serves no reads (an older build).
func (c *conn) pingRead(parent context.Context) (ok, viaLog bool) {
	s := c.srv
	ctx, cancel := context.WithTimeout(parent, s.cl.noLeaderWait())
	defer cancel()
	at := time.Now()
	idx, err := s.readIndex(ctx)
	if errors.Is(err, errNoReads) {
		return true, true
	}
	if err == nil {
		err = s.cl.node.WaitApplied(ctx, idx)
	}
	if err != nil {
		if parent.Err() != nil || errors.Is(err, cluster.ErrClosed) {
			return false, false
		}
		s.log.Warn("cluster: a ping was not confirmed in time (no leader, or no quorum): connection closed",
			"remote", c.remote, "waited", time.Since(at).Round(time.Millisecond))
		s.batch(func(*core.Tx) { c.finish() })
		return false, false
	}
	return true, false
}

// pong answers the ping it (read and applied: pingRead) if the session is
// still attached to the connection on this node; else it closes the
// connection, as the ping's log command would have (false). self: the
// caller is the connection's reader, which flushes the answer itself.
func (c *conn) pong(it *item, self bool) bool {
	s := c.srv
	ok := true
	s.batch(func(tx *core.Tx) {
		select {
		case <-c.done:
			// Ended meanwhile (given up, evicted, a failed write): nothing
			// more is written to it.
			ok = false
			return
		default:
		}
		sess := s.sessions[c.sid]
		if sess == nil || sess.node != s.cl.id || sess.key != c.key || c.ended {
			// Taken over or detached meanwhile: as its log command would.
			c.finish()
			ok = false
			return
		}
		if s.closing {
			// Shutting down (clusterStop): the detach of this node's
			// sessions is proposed once closing is set, so it comes after
			// every pong of the node (its time after their reads),
			// whatever a read index covers of an entry on its way. Closed
			// without a word, as clusterStop closes every connection: its
			// client moves to another node.
			c.finish()
			ok = false
			return
		}
		if self {
			s.self = c // flushed by the reader (pingHere), not its writer
		}
		c.observeRequest(tx, it.req)
	})
	return ok
}

// readIndex returns a read index confirmed by the leader after the call
// began (cluster.Node.ReadIndex): this node's own if it leads, else the
// leader's, asked over the forwarding connection. It tries again through
// elections until ctx ends; errNoReads if the leader serves none.
func (s *Server) readIndex(ctx context.Context) (uint64, error) {
	cl := s.cl
	for {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if cl.ctx.Err() != nil {
			return 0, errClosing
		}
		info, changed := cl.node.Leader()
		var (
			idx uint64
			err error
		)
		switch {
		case info.ID == cl.id:
			idx, err = cl.node.ReadIndexWithin(ctx, pingReadWindow)
		case info.ClientAddr != "":
			idx, err = cl.reads.read(ctx, s)
		default:
			err = cluster.ErrNotLeader
		}
		if err == nil || errors.Is(err, errNoReads) || errors.Is(err, cluster.ErrClosed) {
			return idx, err
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		t := time.NewTimer(20 * time.Millisecond)
		if errors.Is(err, cluster.ErrNotLeader) && info.ClientAddr == "" {
			t.Reset(200 * time.Millisecond)
		}
		select {
		case <-changed:
		case <-t.C:
		case <-ctx.Done():
		case <-cl.ctx.Done():
		}
		t.Stop()
	}
}

// fwdReads batches a follower's reads: one fwdRead on its way to the leader
// at a time, for every read that began before it was sent.
type fwdReads struct {
	mu      sync.Mutex
	pending *readRound // the next request's readers (not sent yet); guarded by mu
	sending bool       // guarded by mu
}

// readRound is one fwdRead and its readers.
type readRound struct {
	done chan struct{}
	idx  uint64
	err  error
}

// read joins the next fwdRead (sending it if none is on its way) and
// returns its read index.
func (f *fwdReads) read(ctx context.Context, s *Server) (uint64, error) {
	f.mu.Lock()
	if f.pending == nil {
		f.pending = &readRound{done: make(chan struct{})}
	}
	rd := f.pending
	start := !f.sending
	f.sending = true
	f.mu.Unlock()
	if start {
		go f.send(s)
	}
	select {
	case <-rd.done:
		return rd.idx, rd.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// send sends the pending rounds one at a time until none is left.
func (f *fwdReads) send(s *Server) {
	cl := s.cl
	for {
		f.mu.Lock()
		rd := f.pending
		f.pending = nil
		if rd == nil {
			f.sending = false
			f.mu.Unlock()
			return
		}
		f.mu.Unlock()
		rd.idx, rd.err = s.askRead()
		if cl.ctx.Err() != nil && rd.err == nil {
			rd.err = errClosing
		}
		close(rd.done)
	}
}

// askRead asks the leader for a read index (fwdRead, "<this node's id>").
func (s *Server) askRead() (uint64, error) {
	cl := s.cl
	info, changed := cl.node.Leader()
	if info.ID == cl.id || info.ClientAddr == "" {
		return 0, cluster.ErrNotLeader
	}
	ctx, cancel := context.WithTimeout(cl.ctx, cl.noLeaderWait())
	defer cancel()
	st, res, err := cl.fwd.call(ctx, info.ClientAddr, fwdRead, []byte(cl.id), changed)
	if err != nil {
		return 0, err
	}
	switch st {
	case fwdOK:
		idx, n := binary.Uvarint(res)
		if n <= 0 || n != len(res) {
			return 0, errors.New("cluster: malformed read index")
		}
		return idx, nil
	case fwdNotLeader:
		return 0, cluster.ErrNotLeader
	case fwdFailed:
		if string(res) == "unknown request" {
			return 0, errNoReads
		}
		return 0, errors.New("cluster: read refused: " + string(res))
	}
	return 0, errors.New("cluster: read not confirmed")
}

// serveRead serves a follower's fwdRead on the leader: the follower (node,
// the request's body) counts as heard from now, unless the leader's
// heartbeats to it fail or its sessions are being detached (refused: its
// pings wait), then a read index confirmed after now.
func (s *Server) serveRead(node string) (byte, []byte) {
	cl := s.cl
	if node == "" {
		return fwdFailed, []byte("bad read")
	}
	if hk := cl.cfg.testHooks; hk != nil && hk.noReads {
		return fwdFailed, []byte("unknown request")
	}
	if cl.node.PeerFailing(node) {
		// Its log does not reach it: it answers its clients nothing, they
		// move to another node, and its sessions are detached after the
		// failover window (watchPeers).
		return fwdFailed, []byte("the leader's heartbeats to this node fail")
	}
	if !cl.live.heard(cl.node, node) {
		return fwdFailed, []byte("its sessions are being detached")
	}
	ctx, cancel := context.WithTimeout(cl.ctx, cl.noLeaderWait())
	defer cancel()
	idx, err := cl.node.ReadIndexWithin(ctx, pingReadWindow)
	switch {
	case err == nil:
		return fwdOK, binary.AppendUvarint(nil, idx)
	case errors.Is(err, cluster.ErrNotLeader):
		return fwdNotLeader, []byte(cl.node.LeaderAddr())
	default:
		return fwdUnknown, nil
	}
}

// liveness is the leader's memory of the followers it heard from through
// their reads, and of the nodes whose sessions it is detaching.
type liveness struct {
	mu sync.Mutex
	// seen: when this node, leading, last served a read of each node;
	// detaching: the nodes whose detach a leadership (its start) proposed
	// and has not seen applied. Guarded by mu.
	seen      map[string]time.Time
	detaching map[string]time.Time
}

// heard records a read of node at now; false if this leadership is
// detaching node's sessions (the read is refused: once the detach is
// applied, a read index covers it).
func (lv *liveness) heard(n *cluster.Node, node string) bool {
	since, _ := n.LeadingSince()
	lv.mu.Lock()
	defer lv.mu.Unlock()
	if d, ok := lv.detaching[node]; ok && d.Equal(since) {
		return false
	}
	if lv.seen == nil {
		lv.seen = map[string]time.Time{}
	}
	lv.seen[node] = time.Now()
	return true
}

// startDetach decides whether node's sessions may be detached now, since
// is when the leader last heard from it otherwise (raft's last contact, or
// when it learned the node is no longer a member): the failover window
// must have passed since the latest of since, node's last read and this
// leadership's start. If so, node's reads are refused from now until
// endDetach.
func (lv *liveness) startDetach(n *cluster.Node, node string, since time.Time, window time.Duration) bool {
	lead, ok := n.LeadingSince()
	if !ok {
		return false
	}
	lv.mu.Lock()
	defer lv.mu.Unlock()
	last := since
	if lead.After(last) {
		last = lead
	}
	if t := lv.seen[node]; t.After(last) {
		last = t
	}
	if time.Since(last) < window {
		return false
	}
	if lv.detaching == nil {
		lv.detaching = map[string]time.Time{}
	}
	lv.detaching[node] = lead
	return true
}

// endDetach: node's detach was applied; its reads are served again (their
// read index is past the detach).
func (lv *liveness) endDetach(node string) {
	lv.mu.Lock()
	delete(lv.detaching, node)
	lv.mu.Unlock()
}
