package server

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"errors"
	"sync"
	"time"

	"github.com/mlock-dev/mlock/internal/auth"
	"github.com/mlock-dev/mlock/internal/cluster"
	"github.com/mlock-dev/mlock/internal/core"
	"github.com/mlock-dev/mlock/internal/protocol"
)

// pipeline is a connection's commands in cluster mode, in arrival order:
// the reader decides each frame (and queues it); one goroutine proposes the
// replicated ones (all that are queued, in one log command) and writes the
// local answers in between, once every earlier log command is answered, so
// answers keep the order of the requests. A log command is queued behind
// the connection's earlier ones without waiting for them (at most
// maxInflight on their way): on the leader's own queue, or, on a follower,
// forwarded to the leader, which queues it behind the previous one
// (forward.go); where neither can be done (no leader, a leader of an older
// build, the first after a change of leader) it is proposed once every
// earlier one is answered.
type pipeline struct {
	mu     sync.Mutex
	items  []item // guarded by mu
	closed bool   // guarded by mu: the reader ended
	// idle: the goroutine waits for items with nothing on its way, every
	// request before them decided and proposed; idleSeq is then its last
	// proposal (answered once conn.answered reaches it). Guarded by mu: the
	// reader answers a ping itself while it holds (pingIdle).
	idle    bool
	idleSeq uint64
	// ctx is the pipeline goroutine's context (pipeLoop), which ends with
	// the connection or the node: a ping answered on the reader waits for
	// its read under it. Guarded by mu; set before the first idle.
	ctx  context.Context
	wake chan struct{}
	// applied (cap 1) is poked when this node's apply writes an answer to
	// one of the connection's proposals (conn.answered moves).
	applied chan struct{}
	done    chan struct{} // closed when the pipeline goroutine ends
	seq     uint64        // pipeline goroutine only: the last proposal
	// attached: an attach of this connection was applied (its detach is
	// due when it ends). Pipeline goroutine, then cleanup.
	attached bool
}

// item is one decided request.
type item struct {
	frame  []byte   // a replicated request: a copy of its payload (format 1)
	req    *request // ... and the same, parsed (format 2)
	ping   bool     // the request is a ping: answered from a read index (pingHere, runPing), else through the log
	local  []byte   // else: frames to write (already answered here)
	end    bool     // the connection ends after local
	attach *logCmd
	bye    bool
	change *clusterChange // a membership change, run by the pipeline in its turn
}

func newPipeline() *pipeline {
	return &pipeline{wake: make(chan struct{}, 1), applied: make(chan struct{}, 1), done: make(chan struct{})}
}

func (p *pipeline) push(items []item) {
	p.mu.Lock()
	p.items = append(p.items, items...)
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// setIdle marks the pipeline idle (its goroutine waits with nothing on its
// way) unless items came meanwhile. Pipeline goroutine only.
func (p *pipeline) setIdle() {
	p.mu.Lock()
	if len(p.items) == 0 {
		p.idle, p.idleSeq = true, p.seq
	}
	p.mu.Unlock()
}

// setBusy clears idle (setIdle).
func (p *pipeline) setBusy() {
	p.mu.Lock()
	p.idle = false
	p.mu.Unlock()
}

// pingIdle reports whether a ping of c may be answered by its reader now
// (pingHere) rather than in its turn on the pipeline: nothing is queued or
// on its way, and this node's apply wrote the answer of the connection's
// last proposal, so no earlier answer is left to write. The reader decides
// nothing more until the ping is answered. It runs in a core batch (which
// guards conn.answered), on the reader.
func (p *pipeline) pingIdle(c *conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.idle && !p.closed && len(p.items) == 0 && c.answered >= p.idleSeq
}

func (p *pipeline) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// maxGroupBytes bounds the frames of one proposal.
const maxGroupBytes = 256 << 10

// maxInflight bounds a connection's log commands on their way at once
// (pipelining: the next is queued, or forwarded, while the earlier ones
// commit).
const maxInflight = 8

// noLeaderWait bounds how long a request without a wait timeout of its own
// (extend, unlock, trylock, ping, release..., and the connect's attach)
// waits for the log, through an election or while the node reaches no
// quorum; then its connection is closed without a word and the client
// connects again, to this node or another (see docs/cluster.md, "Bounded
// waits"). A test's cluster may set a shorter one (clusterTestHooks).
const noLeaderWait = 5 * time.Second

// noLeaderWait is the node's bound (see the constant).
func (cl *clusterState) noLeaderWait() time.Duration {
	if hk := cl.cfg.testHooks; hk != nil && hk.noLeaderWait > 0 {
		return hk.noLeaderWait
	}
	return noLeaderWait
}

// A lock with a deadline (format 3) whose proposal is not applied by
// deadline + giveUpMargin, and at least minLockWait after it was proposed,
// is answered here as timed out: applied after its deadline it would be
// refused anyway (on every node), so the answer cannot turn out wrong. The
// margin covers the leader's clock being behind this node's (the nodes'
// clocks must agree far better than that, see docs/cluster.md); the least
// wait keeps a short timeout from closing a connection over a commit of a
// few ms.
const (
	giveUpMargin = 200 * time.Millisecond
	minLockWait  = time.Second
)

// flight is one of a connection's log commands on its way: queued on this
// node's leadership, or forwarded to the leader.
type flight struct {
	cmd []byte // the DedupCommand, to propose again after a failure
	pr  onTheWay
	// changed: for a forwarded one, closed when this node sees another
	// leader (the flight is given up: see fwdCall).
	changed <-chan struct{}
	seq     uint64
	// at: when it was proposed; reqs: its requests (their answers if it
	// is not committed in time); bound: when the wait for its answer ends
	// (see boundOf).
	at    time.Time
	reqs  []request
	bound time.Time
}

// onTheWay is a log command on its way: a *cluster.Proposal (queued on this
// node's leadership) or a *fwdCall (forwarded to the leader, which queues
// it behind the connection's previous one: forward.go). Either way, if one
// is applied, so is every earlier one of the connection on the same way,
// and if an earlier one fails, so does the newest.
type onTheWay interface {
	Wait(ctx context.Context) ([]byte, error)
	Done() <-chan struct{}
	Failed() <-chan struct{}
}

// maxDeadlineMs bounds the wait timeouts that get a deadline (about 139
// years: now plus it fits an int64 of ns).
const maxDeadlineMs = 1 << 42

// boundOf returns when a proposal of reqs made at at stops waiting for
// the log: at the earliest give-up time of its locks with a deadline (see
// lockGiveUp), at wait (the node's noLeaderWait) otherwise.
func boundOf(at time.Time, reqs []request, wait time.Duration) time.Time {
	b := at.Add(wait)
	for i := range reqs {
		if g, ok := lockGiveUp(at, &reqs[i]); ok {
			b = minTime(b, g)
		}
	}
	return b
}

// lockGiveUp is when the lock request r, proposed at at, is answered here
// as timed out if its proposal was not applied; false if it has no
// deadline.
func lockGiveUp(at time.Time, r *request) (time.Time, bool) {
	if r.kind != reqLock || r.deadline == 0 {
		return time.Time{}, false
	}
	g := time.Unix(0, r.deadline).Add(giveUpMargin)
	if m := at.Add(minLockWait); g.Before(m) {
		g = m
	}
	return g, true
}

// appendTimedOut appends the answer of a lock (request id req) whose wait
// ended before it was queued: as a lock that timed out in its queue is
// answered, a result with a lock id, then "timeout" with it. The id is
// random and names no lock.
func appendTimedOut(dst, req []byte) []byte {
	var id protocol.ID
	_, _ = crand.Read(id[:])
	dst = protocol.AppendOKID(dst, req, id)
	return protocol.AppendPush(dst, protocol.PushTimeout, id)
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// pipeRun is the state of a connection's pipeline goroutine (pipeLoop).
type pipeRun struct {
	c   *conn
	s   *Server
	p   *pipeline
	ctx context.Context // ends with the connection or the node
	// group: the replicated requests read since the last proposal, as
	// frames (format 1) and parsed (format 2), and their size in bytes.
	group [][]byte
	reqs  []request
	size  int
	// boundT fires at boundAt: next's wait for the oldest flight's bound.
	boundAt time.Time
	boundT  *time.Timer
	// fl: log commands on their way and not yet answered, oldest first,
	// all queued on this node's leadership or all forwarded to one leader
	// (they are applied in order: raft commits a prefix of what one
	// leadership queued).
	fl []flight
}

// pipeLoop is the pipeline goroutine of c: it takes the decided items in
// arrival order, groups the replicated ones into one log command and runs
// the others in their turn.
func (c *conn) pipeLoop() {
	s := c.srv
	defer s.wg.Done()
	defer close(c.pipe.done)
	defer c.pipe.setBusy() // no ping is answered on the reader once it ended
	ctx, cancel := context.WithCancel(s.cl.ctx)
	defer cancel()
	go func() {
		select {
		case <-c.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	c.pipe.mu.Lock()
	c.pipe.ctx = ctx // a ping's read on the reader ends with the connection (pingHere)
	c.pipe.mu.Unlock()
	r := &pipeRun{c: c, s: s, p: c.pipe, ctx: ctx}
	for {
		items, ok := r.next()
		if !ok {
			return
		}
		for i := range items {
			if !r.run(&items[i]) {
				return
			}
		}
		if !r.flush() {
			return
		}
	}
}

// next returns the items queued since the last call, waiting for some.
// While it waits, a failure of a proposal on its way is still seen at
// once, so a failed one is proposed again without waiting for the client's
// next request. False: the pipeline ends (the reader ended,
// or the connection or node did).
func (r *pipeRun) next() ([]item, bool) {
	p := r.p
	for {
		p.mu.Lock()
		items, closed := p.items, p.closed
		p.items = nil
		p.idle = false
		p.mu.Unlock()
		if len(items) > 0 {
			return items, true
		}
		if closed {
			return nil, false
		}
		// The newest proposal on its way fails whenever an older one
		// does (raft commits a prefix of what one leadership queued):
		// waiting for its failure only, the goroutine is not woken for
		// every answer (the answered ones are taken off here and at the
		// next flush).
		// And the bound (boundOf) of the oldest one not answered is kept
		// while no request comes: a lock's wait timeout is answered at its
		// deadline, and a log that does not answer ends the connection
		// (giveUp).
		if !r.dropAnswered() {
			return nil, false
		}
		var failed, changed <-chan struct{}
		var bound <-chan time.Time
		if n := len(r.fl); n > 0 {
			failed, changed = r.fl[n-1].pr.Failed(), r.fl[n-1].changed
			bound = r.boundTimer(r.fl[0].bound)
		} else {
			p.setIdle()
		}
		select {
		case <-p.wake:
		case <-failed:
			if !r.settle(0) {
				return nil, false
			}
		case <-changed:
			if !r.settle(0) {
				return nil, false
			}
		case <-bound:
			r.boundAt = time.Time{}       // received: set again for the next wait
			if !r.settle(len(r.fl) - 1) { // the oldest: answered by now, or given up
				return nil, false
			}
		case <-r.ctx.Done():
			return nil, false
		}
	}
}

// dropAnswered takes the answered flights off the front (as settle does,
// without waiting). False: the connection ends.
func (r *pipeRun) dropAnswered() bool {
	for len(r.fl) > 0 {
		select {
		case <-r.fl[0].pr.Done():
		default:
			return true
		}
		if !r.settle(len(r.fl) - 1) {
			return false
		}
	}
	return true
}

// boundTimer returns a channel that receives at t (the oldest flight's
// bound): one timer per pipeline, reset when t changes (Go's timers drop a
// value not received by then).
func (r *pipeRun) boundTimer(t time.Time) <-chan time.Time {
	switch {
	case r.boundT == nil:
		r.boundT = time.NewTimer(time.Until(t))
	case !r.boundAt.Equal(t):
		r.boundT.Reset(time.Until(t))
	}
	r.boundAt = t
	return r.boundT.C
}

// run handles one item in its turn: a replicated request joins the group
// (proposed when it is full); anything else is run once every earlier
// request is answered. False: the connection ends.
func (r *pipeRun) run(it *item) bool {
	if it.ping {
		ok, viaLog := r.runPing(it)
		if !ok || !viaLog {
			return ok
		}
	}
	if it.frame != nil {
		r.group = append(r.group, it.frame)
		r.reqs = append(r.reqs, *it.req)
		r.size += len(it.frame)
		if r.size < maxGroupBytes {
			return true
		}
	}
	if !r.flush() {
		return false
	}
	if it.frame != nil {
		return true
	}
	if !r.settle(0) {
		return false // what follows is answered here, after every earlier answer
	}
	if it.attach == nil && !r.applied() {
		return false // ... and after this node's apply wrote them
	}
	return r.runLocal(it)
}

// runLocal runs an item that is not a replicated request: an attach (through
// the log, on its own), a membership change, a bye, or answers decided here.
func (r *pipeRun) runLocal(it *item) bool {
	c, s, p := r.c, r.s, r.p
	switch {
	case it.attach != nil:
		p.seq++
		it.attach.seq = p.seq
		// Not cut short by the connection's end: whether the session was
		// attached here must be known, or its detach (clusterCleanup) would
		// be skipped and the session stay attached to a dead connection,
		// its grace never starting.
		// Bounded by noLeaderWait: a node without a leader closes the
		// connection without a word, and its client tries another node.
		// The attach may still be applied later: it is then detached as
		// when the connection ends (attached is set).
		ctx, cancel := context.WithTimeout(s.cl.ctx, s.cl.noLeaderWait())
		res, err := s.replicate(ctx, c.dedupCmd(p.seq, s.cl.encode(it.attach)))
		cancel()
		if err != nil {
			if errors.Is(err, errStaleNode) {
				s.log.Warn("cluster: a connect refused by the leader: this node's build cannot read the cluster's log",
					"remote", c.remote, "err", err)
				s.batch(func(*core.Tx) {
					c.sendError(protocol.CodeStaleNode)
					c.finish()
				})
				return false
			}
			if errors.Is(err, context.DeadlineExceeded) {
				p.attached = true
				s.log.Warn("cluster: a connect was not committed in time (no leader, or no quorum): connection closed",
					"remote", c.remote, "waited", s.cl.noLeaderWait())
				s.batch(func(*core.Tx) { c.finish() })
			}
			return false
		}
		if len(res) > 0 && res[0]&ansAttached != 0 {
			p.attached = true
		}
		return c.goesOn(res)
	case it.change != nil:
		ans := s.changeMembers(r.ctx, it.change)
		s.batch(func(*core.Tx) { c.write(ans) })
	case it.bye:
		s.batch(func(*core.Tx) { c.bye() })
		return false
	case it.local != nil || it.end:
		s.batch(func(*core.Tx) {
			c.write(it.local)
			if it.end {
				c.finish()
			}
		})
		return !it.end
	}
	return true
}

// settle waits for the oldest in-flight proposals until at most keep
// remain. After a failure (not applied, or outcome unknown: leadership
// lost) it waits for every later one, then proposes the failed one and
// every later one again, in order, each once applied (those already
// applied are answered by the de-duplication window). False: the
// connection ends.
func (r *pipeRun) settle(keep int) bool {
	for len(r.fl) > keep {
		ctx, cancel := context.WithDeadline(r.ctx, r.fl[0].bound)
		res, err := r.fl[0].pr.Wait(ctx)
		cancel()
		if err == nil {
			r.fl = r.fl[1:]
			if !r.c.goesOn(res) {
				return false
			}
			continue
		}
		if r.ctx.Err() != nil || errors.Is(err, cluster.ErrClosed) {
			return false
		}
		if errors.Is(err, context.DeadlineExceeded) {
			if r.giveUp(&r.fl[0]) {
				return false
			}
			r.fl = r.fl[1:] // applied here meanwhile: answered by this node's apply
			continue
		}
		if !r.proposeAgain() {
			return false
		}
	}
	return true
}

// proposeAgain proposes every in-flight proposal again, in order, once the
// first failed: each after the previous one is applied.
func (r *pipeRun) proposeAgain() bool {
	again := r.fl
	r.fl = nil
	for _, f := range again[1:] {
		ctx, cancel := context.WithDeadline(r.ctx, f.bound)
		_, _ = f.pr.Wait(ctx)
		cancel()
	}
	for i := range again {
		r.fl = again[i:] // what is still unanswered, if the wait ends
		res, err := r.replicate(&again[i])
		if err != nil || !r.c.goesOn(res) {
			return false
		}
	}
	r.fl = nil
	return true
}

// replicate proposes f (Server.replicate) until it is applied or its
// bound passes: then its requests are answered here (giveUp) and the
// connection ends (an error), unless this node has applied f meanwhile
// (its apply wrote the answers: no result, no error).
func (r *pipeRun) replicate(f *flight) ([]byte, error) {
	ctx, cancel := context.WithDeadline(r.ctx, f.bound)
	defer cancel()
	res, err := r.s.replicate(ctx, f.cmd)
	if err != nil && r.ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) && !r.giveUp(f) {
		return nil, nil
	}
	return res, err
}

// giveUp ends the connection when its oldest unanswered proposal f was not
// applied by its bound (no leader, or no quorum: see docs/cluster.md,
// "Bounded waits"). The locks at the head of f whose own wait timeout has
// passed are answered as a lock that timed out in its queue is (a result
// with a lock id, then "timeout" with it: the id is new and names nothing),
// in order, if every earlier answer was written; then the connection is
// closed without a word, and its client connects again (the requests it
// still waits for are asked again there). Nothing this node applies later
// is written to the connection. A lock applied later is refused if its
// entry's time is past its deadline; an entry stamped before the deadline
// (by a leader that then lost its quorum) may still be committed later and
// grant it: its pushes go to the session (the clients of this repository
// give a grant nobody waits for back at once; see docs/cluster.md,
// "Bounded waits"). False, and nothing done: this node has applied f
// meanwhile (the proposal's own answer, from the leader, is what is late),
// and its apply wrote f's answers.
func (r *pipeRun) giveUp(f *flight) bool {
	c, s := r.c, r.s
	now := time.Now()
	last := f.seq
	if n := len(r.fl); n > 0 {
		last = max(last, r.fl[n-1].seq)
	}
	answered := 0
	given := true
	s.batch(func(*core.Tx) {
		if c.answered >= f.seq {
			given = false
			return
		}
		if c.answered+1 == f.seq { // every earlier answer is written: these may follow
			var out []byte
			for i := range f.reqs {
				q := &f.reqs[i]
				g, ok := lockGiveUp(f.at, q)
				if !ok || now.Before(g) {
					break
				}
				out = appendTimedOut(out, q.req)
				answered++
			}
			c.write(out)
		}
		s.giveUpLocked(c)
		if c.answered < last {
			c.setAnswered(last)
		}
		c.finish()
	})
	if !given {
		return false
	}
	s.log.Warn("cluster: a request was not committed in time (no leader, or no quorum): connection closed",
		"remote", c.remote, "waited", now.Sub(f.at).Round(time.Millisecond), "requests", len(f.reqs),
		"answered-timeout", answered)
	return true
}

// applied waits until this node has applied the connection's last
// proposal, which writes its answer: the leader answers a follower's
// forwarded command before the follower applies it, and an answer written
// here (status, locks, a refusal, bye, a membership change) must not
// overtake it. On the leader it is so already. False: the connection ends
// (its proposal found the session gone, or a snapshot replaced the entries:
// the connection was closed).
func (r *pipeRun) applied() bool {
	c, p := r.c, r.p
	// A follower that lost the leader may never learn that the entry was
	// committed: bounded as a request is.
	t := time.NewTimer(r.s.cl.noLeaderWait())
	defer t.Stop()
	for {
		done := false
		r.s.batch(func(*core.Tx) { done = c.answered >= p.seq })
		if done {
			return true
		}
		select {
		case <-p.applied:
		case <-r.ctx.Done():
			return false
		case <-t.C:
			r.s.batch(func(*core.Tx) {
				if done = c.answered >= p.seq; !done { // (applied as the timer fired)
					r.s.giveUpLocked(c)
					c.finish()
				}
			})
			return done
		}
	}
}

// flush proposes the group, if any, as the connection's next log command.
// On the leader it is queued behind the earlier ones of the same leadership
// without waiting for them; on a follower it is forwarded behind the
// earlier ones forwarded to the same leader (which queues it behind them);
// else (no leader; a leader of an older build; the first after a change of
// leader) it is proposed after everything on its way, one at a time.
func (r *pipeRun) flush() bool {
	if len(r.group) == 0 {
		return true
	}
	c, s, p := r.c, r.s, r.p
	p.seq++
	m := &logCmd{op: opFrames, node: s.cl.id, conn: c.key, seq: p.seq, session: c.sid, frames: r.group}
	now := time.Now()
	if f := s.cl.writeFormat(); f >= logFormat2 {
		m.op, m.frames, m.reqs = opRequests, nil, r.reqs // typed: every member reads them
		if f >= logFormat3 {
			for i := range r.reqs {
				// (A timeout past --max-timeout is refused where it is applied.)
				if q := &r.reqs[i]; q.kind == reqLock && q.lock.Timeout > 0 && q.lock.Timeout <= maxDeadlineMs {
					// Its wait counts from its arrival here (this proposal).
					q.deadline = now.Add(time.Duration(q.lock.Timeout) * time.Millisecond).UnixNano()
				}
			}
		}
	}
	body := s.cl.encode(m)
	f := flight{cmd: c.dedupCmd(p.seq, body), seq: p.seq, at: now, reqs: r.reqs, bound: boundOf(now, r.reqs, s.cl.noLeaderWait())}
	r.group, r.reqs, r.size = nil, nil, 0
	if r.queueHere(&f) || r.forward(&f) {
		r.fl = append(r.fl, f)
		return r.settle(maxInflight)
	}
	if !r.settle(0) {
		return false
	}
	res, err := r.replicate(&f)
	if err != nil {
		return false
	}
	return c.goesOn(res)
}

// queueHere queues f on this node's leadership, behind the connection's
// proposals on their way; false if this node is not the ready leader, the
// leadership of those is over, or they were forwarded (then f waits for
// them: flush).
func (r *pipeRun) queueHere(f *flight) bool {
	var after *cluster.Proposal
	if n := len(r.fl); n > 0 {
		var ok bool
		if after, ok = r.fl[n-1].pr.(*cluster.Proposal); !ok {
			return false
		}
	}
	pr, err := r.s.cl.node.ProposeAsync(r.ctx, f.cmd, after)
	if err != nil {
		return false
	}
	f.pr = pr
	return true
}

// forward forwards f to the leader, behind the connection's commands on
// their way if they were forwarded to the same leader since this node last
// saw a change of leader; false if this node knows no other leader, the
// leader does not pipeline (an older build), or the commands on their way
// went another way (then f waits for them: flush).
func (r *pipeRun) forward(f *flight) bool {
	cl := r.s.cl
	info, changed := cl.node.Leader()
	if info.ID == cl.id || info.ClientAddr == "" {
		return false
	}
	fc, err := cl.fwd.get(info.ClientAddr)
	if err != nil || fc.noNext.Load() {
		return false // (a failed dial is logged by the proposal that follows)
	}
	kind := fwdPropose
	if n := len(r.fl); n > 0 {
		last, ok := r.fl[n-1].pr.(*fwdCall)
		if !ok || last.fc != fc || r.fl[n-1].changed != changed {
			return false
		}
		kind = fwdProposeNext
	}
	c, err := fc.start(kind, f.cmd, changed)
	if err != nil {
		return false // perhaps sent: proposed again with the same key
	}
	f.pr, f.changed = c, changed
	return true
}

// goesOn reports, from the result res of a proposal the leader applied,
// whether the connection goes on. It writes nothing: the answer (and the
// pushes of the entries before it) are written by this node's own apply of
// the entry, in log order. Writing the leader's result at once would let an
// answer overtake a grant pushed by an earlier entry this node has not
// applied yet, and a client counts a grant's lease from the send time of
// the last request answered before it (see the root package's safety rule).
func (c *conn) goesOn(res []byte) bool {
	return len(res) == 0 || res[0]&ansEnd == 0
}

// decideFrames is handleFrames in cluster mode: every complete frame is
// decided (parsed, checked against this node's rights) and queued on the
// pipeline in one local batch. A ping that comes while the pipeline is idle
// is answered here, on the reader (pingHere), before the frames after it are
// decided: one wake-up of the reader and its own write, as on a single node,
// instead of a hand-off to the pipeline goroutine and its writer.
func (c *conn) decideFrames(buf []byte, fields [][]byte) ([]byte, [][]byte, bool) {
	for {
		var ping *item
		var stop bool
		buf, fields, stop, ping = c.decideSome(buf, fields)
		if stop || ping == nil {
			return buf, fields, stop
		}
		if !c.pingHere(ping) {
			return buf, fields, true
		}
	}
}

// decideSome decides the complete frames at the start of buf, in one local
// batch, up to a ping it returns to be answered on the reader (pingHere).
func (c *conn) decideSome(buf []byte, fields [][]byte) ([]byte, [][]byte, bool, *item) {
	s := c.srv
	if c.forward {
		buf, fields, stop := c.forwardFrames(buf)
		return buf, fields, stop, nil
	}
	off := 0
	stop := false
	var items []item
	var ping *item
	start := false
	s.batch(func(tx *core.Tx) {
		for !stop {
			payload, n, want, err := protocol.Next(buf[off:], c.maxFrame())
			if err != nil {
				items = append(items, item{local: protocol.AppendError(nil, c.badFrame(err)), end: true})
				stop = true
				break
			}
			if n == 0 {
				buf, off = roomFor(buf, off, want)
				break
			}
			fields = protocol.Split(fields[:0], payload)
			s.framesIn.Add(1)
			var it item
			it, stop = c.observeDecide(tx, fields, payload)
			if it.ping && !stop && len(items) == 0 && c.pipe != nil && c.pipe.pingIdle(c) {
				ping = &it
				off += n
				break
			}
			if c.pipe == nil && len(items) == 0 && !it.needsPipe() {
				// Nothing is queued before it (the connect is not
				// decided yet): answered here, as on a single node.
				c.runHere(&it)
			} else {
				items = append(items, it)
			}
			off += n
			if c.forward {
				stop = false
				break
			}
		}
		if c.pipe == nil && len(items) > 0 {
			c.newPipeLocked()
			start = true
		}
	})
	if start {
		go c.pipeLoop()
	}
	if len(items) > 0 {
		c.pipe.push(items)
	}
	rest := copy(buf, buf[off:])
	buf = buf[:rest]
	if c.forward && !stop {
		buf, fields, stop = c.forwardFrames(buf)
	}
	return buf, fields, stop, ping
}

// needsPipe reports whether it must run on the connection's pipeline, in
// its turn: anything but answers decided here.
func (it *item) needsPipe() bool {
	return it.frame != nil || it.attach != nil || it.bye || it.change != nil
}

// runHere writes the answers decided here of an item that needs no
// pipeline (needsPipe), while nothing is queued on one: as the pipeline
// would (runLocal), in the decide's batch. It runs in a core batch.
func (c *conn) runHere(it *item) {
	if it.local != nil {
		c.write(it.local)
	}
	if it.end {
		c.finish()
	}
}

// newPipeLocked gives c its pipeline, whose goroutine the reader starts
// once the batch is over (pipeLoop): at its first item that needs one (the
// attach of its connect). A connection before its connect, or one that
// never gets one (refused, evicted, a forwarding link), has no pipeline
// goroutine, context or watcher: its reader and writer, as on a single
// node. It runs in a core batch, on the reader.
func (c *conn) newPipeLocked() {
	c.pipe = newPipeline()
	c.srv.wg.Add(1) // (the reader holds one: the count is not at zero)
}

// decide handles one frame on the connection's node: what needs only this
// node (the connect's credentials, rights, ping, status, listings) is
// answered here, in order; the rest is queued for the log. The answers
// written meanwhile are captured into the item.
func (c *conn) decide(tx *core.Tx, f [][]byte, payload []byte) (item, bool) {
	var buf []byte
	c.capture, c.ended = &buf, false
	defer func() { c.capture = nil }()
	var (
		it   item
		stop bool
		done bool
	)
	if c.p == nil {
		it, stop, done = c.decideHandshake(tx, f)
	} else {
		it, stop, done = c.decideRequest(tx, f, payload)
	}
	if done {
		return it, stop
	}
	return item{local: buf, end: c.ended}, c.ended
}

// decideHandshake decides a frame before the connect is accepted: a
// forwarding connection's hello, or the connect itself (checked here, then
// attached through the log). done false: the answers written are the item.
func (c *conn) decideHandshake(tx *core.Tx, f [][]byte) (it item, stop, done bool) {
	s := c.srv
	verb, _ := protocol.ParseVerb(f[0])
	if c.evicted {
		return item{end: true}, true, true // evicted before its handshake: told, and closing
	}
	if string(f[0]) == "forward" && len(f) >= 2 {
		it, stop = c.acceptForward(f[1])
		return it, stop, true
	}
	if s.overCapLocked(tx.Now(), c) {
		return item{}, false, false // past a limit of established connections (limits.go)
	}
	if verb != protocol.VerbConnect {
		c.sendError(protocol.CodeConnectFirst)
		return item{}, false, false
	}
	a, code := s.parseConnect(f)
	switch {
	case code != protocol.CodeUnknown:
		c.sendError(code)
	case s.closing:
		c.sendError(protocol.CodeShuttingDown)
	case s.cl.removed.Load() || s.cl.halted.Load() != "":
		// Not a member, or stopped applying the log: its client goes to
		// another node (see watchRemoved, halt).
		c.finish()
	}
	if c.ended {
		return item{}, false, false
	}
	cred, hasCred := authField(a.fields)
	p, code := s.principalFor(c, cred, hasCred)
	if p == nil {
		s.counters.authFailed++
		s.logRefusal(tx.Now(), "connect refused: "+code.Text(), "remote", c.remote, "tls", s.tlsConf != nil)
		c.park = s.crowdedLocked(c) // limits.go: the tarpit
		s.leavePreLocked(c)         // done with its handshake: its slot is free now
		c.sendError(code)
		return item{}, false, false
	}
	sid := scope(p, string(a.socketID))
	old := s.sessions[sid]
	if !s.connQuotaLocked(tx, c, p, old == nil, old != nil && old.c != nil && old.c.counted == p.Name) {
		return item{}, false, false
	}
	c.p, c.sid = p, sid
	s.leavePreLocked(c)
	c.authed = true
	c.wantLeader = hasField(a.fields, "want=leader")
	return item{attach: &logCmd{op: opAttach, node: s.cl.id, conn: c.key, session: c.sid, principal: p.Name}}, false, true
}

// decideRequest decides a request of a connected client: ping and the
// commands that change the lock table go to the log, after the checks that
// need this node's configuration (rights, quotas); status, listings and
// refusals are answered here. done false: the answers written are the
// item.
func (c *conn) decideRequest(tx *core.Tx, f [][]byte, payload []byte) (it item, stop, done bool) {
	s := c.srv
	verb, _ := protocol.ParseVerb(f[0])
	req := requestID(f)
	p := c.p
	if c.sess != nil && c.sess.c == c {
		p = c.sess.p // the rights in force (the auth file may have been reloaded)
	}
	switch verb {
	case protocol.VerbStatus:
		if p.Admin && !s.allowListing(tx, p.Name) {
			c.failed(req, protocol.CodeRateLimited)
		} else {
			c.ok(req, s.statusJSON(tx, p.Admin))
		}
	case protocol.VerbLocks:
		sess := c.sess
		c.sess = &session{p: p}
		c.locks(tx, req, f)
		c.sess = sess
	case protocol.VerbBye:
		return item{bye: true}, true, true
	case protocol.VerbConnect:
		c.sendError(protocol.CodeDuplicateConnect)
	case protocol.VerbCluster:
		if ch := c.decideChange(req, p, f); ch != nil {
			return item{change: ch}, false, true
		}
	case protocol.VerbEvict:
		if !p.Admin {
			s.counters.forbidden++
			c.failed(req, protocol.CodeForbidden)
			break
		}
		return c.decideReplicated(tx, p, verb, f, payload)
	case protocol.VerbPing:
		// Answered without a log entry once the leader confirmed a read
		// index after it arrived and this node applied up to it (pingHere on
		// the reader while the pipeline is idle, else runPing in its turn);
		// through the log if the leader serves no reads (an older build).
		it, stop, done = c.decideReplicated(tx, p, verb, f, payload)
		it.ping = done
		return it, stop, done
	case protocol.VerbLock, protocol.VerbTryLock, protocol.VerbExtend, protocol.VerbRenew, protocol.VerbUnlock,
		protocol.VerbRelease, protocol.VerbReleaseAll, protocol.VerbReleaseIn, protocol.VerbReleaseAllIn:
		return c.decideReplicated(tx, p, verb, f, payload)
	default:
		c.failed(req, protocol.CodeInvalidMessage)
	}
	return item{}, false, false
}

// decideReplicated decides a request that goes through the log: the
// single dispatcher's parse step (parseRequest) runs here, once, then the
// checks that need this node's configuration (the principal's rights, its
// quota of locks), as on a single node after the parse. A refusal by them
// is answered here (done false); a request whose arguments do not parse
// goes to the log as a refusal, answered in its turn on every node.
func (c *conn) decideReplicated(tx *core.Tx, p *auth.Principal, verb protocol.Verb, f [][]byte, payload []byte) (it item, stop, done bool) {
	var r request
	parseRequest(verb, f, &r)
	switch r.kind {
	case reqLock, reqTryLock:
		if !c.mayLockHere(tx, r.req, p, r.lock.Resources) {
			return item{}, false, false
		}
	case reqExtend, reqRenew:
		// The rights in force on this node now, as on a single node: a
		// reload may have taken the lock's resources away from the
		// principal. Giving a lock up (unlock, release) stays allowed.
		if res, ok := c.revoked(tx, p, &r); ok {
			c.srv.counters.forbidden++
			c.write(protocol.AppendFailed(nil, r.req, protocol.CodeForbidden, res))
			return item{}, false, false
		}
	}
	r.req = bytes.Clone(r.req) // it aliases the reader's buffer
	return item{frame: bytes.Clone(payload), req: &r}, false, true
}

// decideChange checks a membership change (administrators only) and
// returns it, or nil when it was refused (answered).
func (c *conn) decideChange(req []byte, p *auth.Principal, f [][]byte) *clusterChange {
	s := c.srv
	if !p.Admin {
		s.counters.forbidden++
		c.failed(req, protocol.CodeForbidden)
		return nil
	}
	ch, ok := parseClusterChange(f)
	if !ok {
		c.failed(req, protocol.CodeMissingArguments)
		return nil
	}
	ch.req, ch.by = string(req), p.Name
	return ch
}

// mayLockHere makes the checks of a lock or trylock that need this node's
// configuration: the principal's rights and its quota of locks. A refusal
// is answered.
func (c *conn) mayLockHere(tx *core.Tx, req []byte, p *auth.Principal, resources string) bool {
	s := c.srv
	if !p.Admin {
		for _, r := range s.splitResources(resources) {
			if !p.May(r) {
				s.counters.forbidden++
				c.write(protocol.AppendFailed(nil, req, protocol.CodeForbidden, r))
				return false
			}
		}
	}
	if !s.lockQuotaLocked(tx, p) {
		// Against the replicated state this node has applied: requests
		// of the principal on their way through the log are not in it
		// yet (see docs/security.md).
		s.counters.quotaRefused++
		c.failed(req, protocol.CodeQuotaLocks)
		return false
	}
	return true
}

// revoked returns the first resource of an extend's lock (known to this
// node and p's own: another's is answered lock not exist! by the apply) or
// of a renew that p, not an administrator, may no longer lock.
func (c *conn) revoked(tx *core.Tx, p *auth.Principal, r *request) (string, bool) {
	if p.Admin {
		return "", false
	}
	var resources []string
	switch r.kind {
	case reqRenew:
		resources = c.srv.splitResources(r.renew.Resources)
	case reqExtend:
		id, ok := protocol.ParseID([]byte(r.extend.ID))
		if !ok {
			return "", false
		}
		li, found := tx.Lookup(id)
		if !found {
			return "", false
		}
		if owner, _ := unscope(li.Session); owner != p.Name {
			return "", false
		}
		resources = li.Resources
	}
	for _, res := range resources {
		if !p.May(res) {
			return res, true
		}
	}
	return "", false
}

// clusterCleanup is cleanup's cluster part, before the local one: the
// pipeline finishes what was read, then the session (if this connection
// attached it) is detached in the log, after every answer it was given.
func (c *conn) clusterCleanup() {
	s := c.srv
	p := c.pipe
	p.close()
	<-p.done
	if !p.attached {
		return
	}
	p.seq++
	cmd := c.dedupCmd(p.seq, s.cl.encode(&logCmd{op: opDetach, node: s.cl.id, conn: c.key, session: c.sid}))
	if _, err := s.replicate(s.cl.ctx, cmd); err != nil {
		s.log.Debug("cluster: detach not proposed (shutting down)", "remote", c.remote)
	}
}
