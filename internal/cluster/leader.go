package cluster

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// proposal states.
const (
	propQueued    int32 = iota // in the leader's queue
	propTaken                  // put into an entry (the outcome is raft's now)
	propAbandoned              // its Propose gave up before it was taken: skip it
)

// proposal is one Propose call waiting for its result.
type proposal struct {
	cmd   []byte
	state atomic.Int32
	done  chan proposalResult // cap 1
	fin   chan struct{}       // closed once done holds the result
	// failed is closed with fin when the result is an error (see Proposal.Failed).
	failed chan struct{}
	// prev is the proposal this one was queued behind (ProposeAsync's after), nil if none: if prev
	// was abandoned, this one is skipped too, so that a chain is applied as a prefix.
	prev *proposal
	// answered is set by the first answer.
	answered atomic.Bool
}

// answer gives p its result, once: a later answer is dropped (see leadership.awaitCompleter).
func (p *proposal) answer(r proposalResult) {
	if !p.answered.CompareAndSwap(false, true) {
		return
	}
	p.done <- r
	if r.err != nil && p.failed != nil {
		close(p.failed)
	}
	close(p.fin)
}

// ErrSkipped: a proposal queued behind another (ProposeAsync's after) that was abandoned before it was
// taken is skipped too; nothing of it was applied.
var ErrSkipped = errors.New("cluster: not proposed: the proposal it was queued behind was abandoned")

type proposalResult struct {
	val []byte
	err error
}

// pending is one entry handed to raft, with the proposals it carries (in command order).
type pending struct {
	f      raft.ApplyFuture
	props  []*proposal
	notice bool // an empty entry proposed to tell the followers the commit index (see settle)
	// quiet: a notice at a time before the state machine's next deadline (or with none): its apply
	// runs no deadline, it changes nothing but the state's time (see answeredIndex).
	quiet bool
}

// answeredIndex is what the completer answered last: the index of the last entry it answered
// (last), and of the last one among them that is not a quiet notice (work). The entries after work
// up to last are quiet notices (and raft's own entries between them): nothing a read sees.
type answeredIndex struct{ last, work uint64 }

// leadership is one term of this node as leader: a barrier, the leader entry, then the batcher
// (group commit and ticks) and the completer (results back to the proposers).
type leadership struct {
	n      *Node
	ctx    context.Context
	cancel context.CancelFunc
	queue  chan *proposal
	ready  chan struct{} // closed once the leader entry is applied
	exited chan struct{} // closed once every taken proposal is answered and the batcher stopped
	// stopping is closed when the batcher stops, before it answers what is left in the queue.
	stopping chan struct{}

	// proposedNow is the time of the last entry handed to raft; submitted counts the entries handed
	// to raft. Both owned by the batcher goroutine.
	proposedNow int64
	submitted   atomic.Uint64
	// outstanding counts entries handed to raft and not yet answered; notices, the notices among them.
	outstanding atomic.Int64
	notices     atomic.Int64
	// notice is the timer of a notice (see settle): the completer sets it when an entry other than a
	// notice was answered and none is outstanding (no goroutine is woken for it then), the batcher
	// proposes the notice when it fires and nothing was submitted since noticeFrom.
	notice     *time.Timer
	noticeFrom atomic.Uint64
	// current is the entry whose future the completer waits for (nil between two).
	current atomic.Pointer[pending]
	// answered is the completer's answeredIndex (the leader entry's index before the first entry).
	answered atomic.Pointer[answeredIndex]

	// since is when raft made this node leader (the leadership was started).
	since time.Time
	// readers wait for the next confirmation of the leadership (ReadIndex); reading is set while
	// confirmReads runs; rmin is the shortest window of the readers. Guarded by rmu. rwake tells
	// confirmReads that a reader came with a shorter window than those it waits for.
	rmu     sync.Mutex
	readers []reader
	reading bool
	rmin    time.Duration
	rwake   chan struct{}
	// lastRound: when the last round for reads began (confirmReads, one at a time); rounds counts
	// them.
	lastRound time.Time
	rounds    atomic.Uint64
	// completed counts the entries the completer answered (in the order they were submitted);
	// completedCh is closed, and replaced, each time it moves (guarded by cmu).
	completed   atomic.Uint64
	cmu         sync.Mutex
	completedCh chan struct{}
}

func newLeadership(n *Node) *leadership {
	ctx, cancel := context.WithCancel(context.Background())
	return &leadership{
		n:        n,
		ctx:      ctx,
		cancel:   cancel,
		queue:    make(chan *proposal, 4*n.cfg.MaxBatch),
		ready:    make(chan struct{}),
		rwake:    make(chan struct{}, 1),
		exited:   make(chan struct{}),
		stopping: make(chan struct{}),
		notice:   stoppedTimer(),
		since:    time.Now(),

		completedCh: make(chan struct{}),
	}
}

// run is the leadership goroutine.
func (l *leadership) run() {
	defer close(l.exited)
	n := l.n
	// Every entry of earlier terms is applied after a barrier, so lastNow is final.
	for l.futureError(n.raft.Barrier(0)) != nil {
		if !l.pause() {
			return
		}
	}
	lastNow, _, _ := n.fsm.state()
	now := max(lastNow, n.cfg.Clock())
	var cmds [][]byte
	if n.cfg.OnLeader != nil {
		if c := n.cfg.OnLeader(now); c != nil {
			cmds = [][]byte{c}
		}
	}
	e := entry{kind: entryLeader, now: now, leaderID: n.cfg.ID, client: n.cfg.ClientAddr, cmds: cmds}
	data := appendEntry(nil, &e)
	for {
		f := n.raft.ApplyLog(raft.Log{Data: data}, 0)
		if err := l.futureError(f); err != nil {
			// Usually leadership is lost and ctx ends; if not, the entry was not appended or its
			// outcome is unknown: proposing it again is harmless (the failover rule extends to the
			// same time at most).
			if !l.pause() {
				return
			}
			continue
		}
		if r, _ := f.Response().(*applyResult); r == nil || r.err != nil {
			n.raft.LeadershipTransfer() // cannot happen unless the log is corrupt: let another node lead
			<-l.ctx.Done()
			return
		}
		l.answered.Store(&answeredIndex{last: f.Index(), work: f.Index()})
		break
	}
	l.proposedNow = now
	close(l.ready)
	n.notifyChanged()
	l.loop()
}

// pause waits a little before a retry; false if leadership ended.
func (l *leadership) pause() bool {
	t := time.NewTimer(10 * time.Millisecond)
	defer t.Stop()
	select {
	case <-l.ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// loop batches proposals into entries and proposes ticks, until leadership ends.
func (l *leadership) loop() {
	n := l.n
	inflight := make(chan *pending, 1024)
	completerDone := make(chan struct{})
	go l.complete(inflight, completerDone)
	defer func() {
		n.fsm.armed.Store(math.MinInt64) // no tick timer any more
		close(inflight)
		l.awaitCompleter(inflight, completerDone)
		close(l.stopping) // a proposal queued from now on is answered by its enqueue
		for {
			select {
			case p := <-l.queue:
				if p.state.CompareAndSwap(propQueued, propTaken) {
					p.answer(proposalResult{err: n.notLeader()})
				}
			default:
				return
			}
		}
	}()

	tick := time.NewTimer(time.Hour)
	tick.Stop()
	window := time.NewTimer(time.Hour)
	window.Stop()
	batch := make([]*proposal, 0, n.cfg.MaxBatch)
	l.armTick(tick)
	l.armNotice() // the followers learn soon that the leader entry is committed
	for {
		select {
		case <-l.ctx.Done():
			return
		case p := <-l.queue:
			batch = l.collect(batch[:0], p, window)
			if len(batch) > 0 {
				l.submit(batch, false, inflight)
				batch = make([]*proposal, 0, n.cfg.MaxBatch)
			}
		case <-n.fsm.applied:
			l.armTick(tick)
		case <-tick.C:
			if d, ok := l.deadline(); ok && n.cfg.Clock() >= d {
				l.submit(nil, false, inflight)
			}
			l.armTick(tick)
		case <-l.notice.C:
			// An entry proposed within the window carried the commit index itself.
			if l.submitted.Load() == l.noticeFrom.Load() {
				l.settle(inflight)
			}
		}
	}
}

// armNotice sets the notice timer: a batch window from now, the batcher proposes a notice if nothing
// was submitted meanwhile (see settle).
func (l *leadership) armNotice() {
	l.noticeFrom.Store(l.submitted.Load())
	l.notice.Reset(max(l.n.cfg.BatchWindow, 0))
}

// settle proposes a notice (an empty entry, a tick) when the leader has gone idle after an entry:
// nothing was proposed for a batch window (Config.BatchWindow) after it was answered, nothing is
// outstanding or queued, and there are followers. A follower learns that entries are committed only
// from the leader's next AppendEntries, which raft sends for new entries or after CommitTimeout
// (50 to 100 ms with the default); until then it cannot apply them, and a client connected to it waits
// for its answer (a follower answers from its own apply, in log order) and for the pushes they cause.
// The notice carries the commit index; its own commit needs no notice. Under a steady load there is
// always a next entry within the window and no notice is proposed (a notice at once would put a disk
// write on the leader ahead of that next entry); after a burst, one.
func (l *leadership) settle(inflight chan<- *pending) {
	if l.outstanding.Load() != 0 || len(l.queue) != 0 {
		return
	}
	if d, ok := l.deadline(); ok && l.n.cfg.Clock() >= d {
		// A tick is due (its timer not yet taken): this entry is that tick, and its answer brings
		// a notice after it, for the grants and expiries it applies.
		l.submit(nil, false, inflight)
		return
	}
	f := l.n.raft.GetConfiguration()
	if f.Error() != nil || len(f.Configuration().Servers) < 2 {
		return
	}
	l.submit(nil, true, inflight)
}

// collect fills a batch starting with first: whatever is queued, and while an earlier entry is still
// on its way, whatever arrives within the batch window, up to MaxBatch.
func (l *leadership) collect(batch []*proposal, first *proposal, window *time.Timer) []*proposal {
	n := l.n
	take := func(p *proposal) {
		prev := p.prev
		p.prev = nil // the chain is read here only: it must not hold every command it ever had
		if prev != nil && prev.state.Load() == propAbandoned {
			// Its chain's earlier proposal was skipped (taken in queue order before this one, its
			// state is final): skip this one too.
			if p.state.CompareAndSwap(propQueued, propAbandoned) {
				p.answer(proposalResult{err: ErrSkipped})
			}
			return
		}
		if p.state.CompareAndSwap(propQueued, propTaken) {
			batch = append(batch, p)
		}
	}
	take(first)
	waiting := false
	defer func() {
		if waiting {
			window.Stop()
		}
	}()
	for len(batch) < n.cfg.MaxBatch {
		select {
		case p := <-l.queue:
			take(p)
			continue
		default:
		}
		// Nothing but notices on their way counts as idle: they carry no commands to wait for.
		if n.cfg.BatchWindow < 0 || l.outstanding.Load() == l.notices.Load() || len(batch) == 0 {
			return batch
		}
		if !waiting {
			waiting = true
			window.Reset(n.cfg.BatchWindow)
		}
		select {
		case p := <-l.queue:
			take(p)
		case <-window.C:
			waiting = false
			return batch
		case <-l.ctx.Done():
			return batch
		}
	}
	return batch
}

// submit hands one entry to raft: the batch's commands (nil: a tick or, if notice, a notice) at
// max(last entry's time, clock).
func (l *leadership) submit(batch []*proposal, notice bool, inflight chan<- *pending) {
	n := l.n
	// Counted before its time is read: a read that does not count it began after that time, and
	// one that does waits for it (see ReadIndex).
	l.outstanding.Add(1)
	l.submitted.Add(1)
	now := max(l.proposedNow, n.cfg.Clock())
	l.proposedNow = now
	e := entry{kind: entryBatch, now: now}
	if len(batch) > 0 {
		e.cmds = make([][]byte, len(batch))
		for i, p := range batch {
			e.cmds[i] = p.cmd
		}
	}
	data := appendEntry(make([]byte, 0, entrySize(e.cmds)), &e)
	for _, p := range batch {
		p.cmd = nil // in data now: a Proposal kept by its caller (for ProposeAsync's after) does not keep it
	}
	quiet := false
	if notice {
		l.notices.Add(1)
		// Nothing is outstanding (settle): the state is final before this entry, and its next
		// deadline is the one this entry's apply would run, if it is at or before now.
		quiet = true
		if n.cfg.NextDeadline != nil {
			if d, ok := n.cfg.NextDeadline(); ok && d <= now {
				quiet = false
			}
		}
	}
	inflight <- &pending{f: n.raft.ApplyLog(raft.Log{Data: data}, 0), props: batch, notice: notice, quiet: quiet}
}

// awaitCompleter waits, once the leadership ended and inflight is closed, until the completer has
// answered every entry. raft leaves the future of an entry it finds already applied unanswered
// (raft.go processLogs, "skipping application of old log"), which would hold the completer, and so
// the leadership's end and the node's Close, forever: unansweredWait after the end, the proposals
// of the entry it waits for and of those after it count as ErrUnknownOutcome (proposed again with
// the same key), and the completer is left to its future.
func (l *leadership) awaitCompleter(inflight <-chan *pending, done <-chan struct{}) {
	t := time.NewTimer(unansweredWait)
	defer t.Stop()
	select {
	case <-done:
		return
	case <-t.C:
	}
	if lg := l.n.cfg.Logger; lg != nil {
		lg.Warn("cluster: raft left an entry unanswered after the leadership ended; its outcome is unknown")
	}
	unknown := func(pe *pending) {
		for _, p := range pe.props {
			p.answer(proposalResult{err: ErrUnknownOutcome})
		}
	}
	if pe := l.current.Load(); pe != nil {
		unknown(pe)
	}
	for pe := range inflight { // the completer may take some of them too: the first answer counts
		unknown(pe)
	}
}

func stoppedTimer() *time.Timer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}

// unansweredWait is how long a future may stay unanswered once the leadership ended.
const unansweredWait = 5 * time.Second

// futureError is f.Error(), bounded once the leadership ends: raft leaves the future of an entry it
// finds already applied unanswered (raft.go processLogs, "skipping application of old log"), which
// would hold the leadership's end (and the node's Close) forever. unansweredWait after the end, an
// unanswered future counts as ErrUnknownOutcome: its proposals are proposed again with the same key.
func (l *leadership) futureError(f raft.Future) error {
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		return err
	case <-l.ctx.Done():
	}
	t := time.NewTimer(unansweredWait)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		if lg := l.n.cfg.Logger; lg != nil {
			lg.Warn("cluster: raft left an entry unanswered after the leadership ended; its outcome is unknown")
		}
		return ErrUnknownOutcome
	}
}

// complete answers the proposals of each entry once raft resolved it, in order. An entry that failed
// while the leadership went on would break the prefix rule of ProposeAsync's chains (a later entry may
// carry the next proposal of a chain); raft fails an entry only when the leadership is lost or the
// node stops (LeadershipTransfer is called only before the leadership is ready), or if the apply
// found the leader's own entry corrupt, which would be a bug here, not a condition to recover from.
//
// It waits for each future itself (a goroutine per entry to bound the wait cost a wake-up per entry);
// the wait is bounded by awaitCompleter once the leadership ends.
func (l *leadership) complete(inflight <-chan *pending, done chan<- struct{}) {
	defer close(done)
	for pe := range inflight {
		l.current.Store(pe)
		err := pe.f.Error()
		l.current.Store(nil)
		var r *applyResult
		if err == nil {
			r, _ = pe.f.Response().(*applyResult)
			if r == nil {
				err = fmt.Errorf("cluster: no result for entry %d", pe.f.Index())
			} else if r.err != nil {
				err = r.err
			}
		}
		if err != nil {
			err = l.n.mapRaftErr(err)
		} else if a := l.answered.Load(); a != nil {
			next := &answeredIndex{last: pe.f.Index(), work: a.work}
			if !pe.quiet {
				next.work = next.last
			}
			l.answered.Store(next)
		}
		for i, p := range pe.props {
			if err != nil {
				p.answer(proposalResult{err: err})
			} else {
				p.answer(proposalResult{val: r.results[i]})
			}
		}
		if pe.notice {
			l.notices.Add(-1)
		}
		if l.outstanding.Add(-1) == 0 && !pe.notice {
			l.armNotice()
		}
		l.cmu.Lock()
		l.completed.Add(1)
		close(l.completedCh)
		l.completedCh = make(chan struct{})
		l.cmu.Unlock()
	}
}

// awaitCompleted waits until the completer has answered the first n entries submitted (committed
// and applied here, or failed); false if the leadership ended first.
func (l *leadership) awaitCompleted(n uint64) bool {
	for {
		l.cmu.Lock()
		done, ch := l.completed.Load() >= n, l.completedCh
		l.cmu.Unlock()
		if done {
			return true
		}
		select {
		case <-ch:
		case <-l.ctx.Done():
			return false
		}
	}
}

// deadline returns the state machine's next deadline if a tick may be due for it: no entry at least
// that late has been handed to raft yet.
func (l *leadership) deadline() (int64, bool) {
	if l.n.cfg.NextDeadline == nil {
		return 0, false
	}
	d, ok := l.n.cfg.NextDeadline()
	if !ok || d <= l.proposedNow {
		return 0, false
	}
	return d, true
}

// armTick sets the tick timer to the next deadline (or stops it), and tells the FSM which deadline
// it is set for: the FSM pokes fsm.applied only when an applied entry brings an earlier one.
//
// An entry applied while this runs may have read the value stored before: the deadline is read
// again after the store, until it did not change.
func (l *leadership) armTick(t *time.Timer) {
	d, ok := l.deadline()
	for {
		armed := int64(math.MaxInt64)
		if ok {
			armed = d
		}
		l.n.fsm.armed.Store(armed)
		d2, ok2 := l.deadline()
		if d2 == d && ok2 == ok {
			break
		}
		d, ok = d2, ok2
	}
	if !ok {
		t.Stop()
		return
	}
	t.Reset(max(time.Duration(d-l.n.cfg.Clock()), 0))
}

// Propose replicates cmd and returns its result: the StateMachine's result for it, once the entry that
// carries it is applied on this node. Leader only: on a follower, a candidate, or a leader whose
// leader entry is not yet applied (it waits for that, bounded by ctx) it returns a *NotLeaderError
// (errors.Is ErrNotLeader: nothing proposed, retry on the leader). Concurrent calls are grouped into one
// entry (see Config.BatchWindow). Once cmd is handed to raft, losing leadership, closing the node or
// ctx ending returns an error matching ErrUnknownOutcome (and ctx.Err() for the latter): cmd may be
// applied, now or later, so a retry must carry the same de-duplication key (see Dedup). ctx ending
// before that returns ctx.Err() alone: cmd will not be applied. cmd must not be modified afterwards.
func (n *Node) Propose(ctx context.Context, cmd []byte) ([]byte, error) {
	n.mu.Lock()
	l, closed := n.lead, n.closed
	n.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	if l == nil {
		return nil, n.notLeader()
	}
	select {
	case <-l.ready:
	case <-l.exited:
		return nil, n.notLeader()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	pr, err := n.enqueue(ctx, l, cmd, nil)
	if err != nil {
		return nil, err
	}
	return pr.Wait(ctx)
}

// Proposal is a command queued by ProposeAsync.
type Proposal struct {
	n *Node
	l *leadership
	p *proposal
}

// ErrNotSameTerm: ProposeAsync was asked to queue a command behind a Proposal of a leadership that is
// no longer this node's current one. Nothing was queued.
var ErrNotSameTerm = errors.New("cluster: not the leadership of the earlier proposal")

// ProposeAsync queues cmd on this node's ready leadership and returns at once; Wait returns the result
// (as Propose would). Commands queued on one leadership go into the log in the order of the calls that
// queued them, and raft commits a prefix of them: if one is applied, so is every command queued before
// it on the same leadership. To keep that order for a sequence of commands, pass the previous Proposal
// as after: if this node's leadership is no longer after's, nothing is queued and ErrNotSameTerm is
// returned; if after is abandoned (its Wait's ctx ended) before it is taken into an entry, this one is
// skipped too (Wait returns ErrSkipped), so what is applied of a chain is always a prefix of it. Not the ready leader: *NotLeaderError, nothing queued (ProposeAsync does not wait for a
// leader entry). ctx bounds only the wait for room in the queue.
func (n *Node) ProposeAsync(ctx context.Context, cmd []byte, after *Proposal) (*Proposal, error) {
	n.mu.Lock()
	l, closed := n.lead, n.closed
	n.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	if after != nil && after.l != l {
		return nil, ErrNotSameTerm
	}
	if l == nil {
		return nil, n.notLeader()
	}
	select {
	case <-l.ready:
	default:
		return nil, n.notLeader()
	}
	return n.enqueue(ctx, l, cmd, after)
}

// enqueue puts cmd on l's queue.
func (n *Node) enqueue(ctx context.Context, l *leadership, cmd []byte, after *Proposal) (*Proposal, error) {
	p := &proposal{cmd: cmd, done: make(chan proposalResult, 1), fin: make(chan struct{}), failed: make(chan struct{})}
	if after != nil {
		p.prev = after.p
	}
	select {
	case l.queue <- p:
	case <-l.exited:
		return nil, n.notLeader()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case <-l.stopping:
		// Queued as the batcher stopped, perhaps after it emptied the queue: whichever of this and
		// its drain takes it first answers it, so Done closes whatever happened.
		if p.state.CompareAndSwap(propQueued, propTaken) {
			p.answer(proposalResult{err: n.notLeader()})
		}
	default:
	}
	return &Proposal{n: n, l: l, p: p}, nil
}

// Done is closed once the proposal's result is known (Wait then returns at once): applied, failed,
// skipped, or not proposed because the leadership ended. Never for one abandoned by its Wait's ctx.
func (pr *Proposal) Done() <-chan struct{} { return pr.p.fin }

// Failed is closed when Done is and the result is an error: a caller that needs to act only on a
// failure (propose again) waits for it without being woken for every success.
func (pr *Proposal) Failed() <-chan struct{} { return pr.p.failed }

// Wait returns the proposal's result, with Propose's errors: once its command was taken into an entry,
// losing leadership, closing the node or ctx ending give an error matching ErrUnknownOutcome; before
// that, a *NotLeaderError or ctx.Err() (the command will not be applied, and is skipped). Call it once.
func (pr *Proposal) Wait(ctx context.Context) ([]byte, error) {
	n, l, p := pr.n, pr.l, pr.p
	select {
	case r := <-p.done:
		return r.val, r.err
	case <-l.exited:
		// Every taken proposal was answered before exited closed.
		select {
		case r := <-p.done:
			return r.val, r.err
		default:
		}
		if p.state.CompareAndSwap(propQueued, propAbandoned) {
			return nil, n.notLeader()
		}
		return nil, ErrUnknownOutcome
	case <-ctx.Done():
		select {
		case r := <-p.done: // answered as well: the answer counts
			return r.val, r.err
		default:
		}
		if p.state.CompareAndSwap(propQueued, propAbandoned) {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("%w: %w", ErrUnknownOutcome, ctx.Err())
	}
}

// readWindow is the least time between two confirmations of the leadership for reads (ReadIndex): a
// read that comes after a quiet period is confirmed at once, the reads that come meanwhile wait for the
// next round and share it, so a steady stream of reads costs at most one round of heartbeats per
// window (and a follower's read waits up to a window more). ReadIndexWithin lets a read wait longer.
const readWindow = 20 * time.Millisecond

// readResult is a read's answer (ReadIndex).
type readResult struct {
	index uint64
	err   error
}

// reader is a read waiting for a round: its answer's channel, its window (ReadIndexWithin), and the
// entries submitted when it began (its index covers them).
type reader struct {
	ch        chan readResult
	window    time.Duration
	submitted uint64
}

// ReadIndex returns a read index: the leader's commit index, read after the call began and after
// every entry the leader had proposed when it began was committed, once this node confirmed after
// reading it that it still led (a round of heartbeats that a quorum answered in its term). Every
// entry committed before the call, and every entry proposed before it (whose time, the entry's now,
// is before the call), is at or below it: a node that applies up to it has applied every entry of a
// time before the call, whatever the entry's commit waited for (a follower's ping answered from it
// is ordered after the grants of those entries, whose leases count from their time). No other leader
// was elected before the confirmation: a quorum answered this term's leader after the call began. It
// is served only by a ready leader (its leader entry applied: every entry of earlier terms is below
// the index); else a *NotLeaderError (errors.Is ErrNotLeader). The reads that come within readWindow
// (20 ms) of a round share the next one. No log entry is written. ctx bounds the wait.
//
// One exception, invisible to a read: when the entries committed last are the leader's quiet notices
// (empty entries proposed to tell the followers the commit index, at a time before the state
// machine's next deadline, so that their apply changes nothing but the state's time; see
// StateMachine), the index is the entry before them. A follower learns that a notice is committed
// only from raft's commit timeout (Config.CommitTimeout), and its read need not wait for that.
func (n *Node) ReadIndex(ctx context.Context) (uint64, error) {
	return n.ReadIndexWithin(ctx, readWindow)
}

// ReadIndexWithin is ReadIndex for a read that may wait up to window after the previous round for
// its own (at least 20 ms, the default of ReadIndex): the reads that come meanwhile share that round,
// so reads that can wait longer cost fewer rounds of heartbeats. A round is held for the shortest
// window of the reads waiting for it; a read after a quiet period of window is confirmed at once. The
// answer's promise is ReadIndex's: only its time differs.
func (n *Node) ReadIndexWithin(ctx context.Context, window time.Duration) (uint64, error) {
	window = max(window, readWindow)
	n.mu.Lock()
	l, closed := n.lead, n.closed
	n.mu.Unlock()
	if closed {
		return 0, ErrClosed
	}
	if l == nil {
		return 0, n.notLeader()
	}
	select {
	case <-l.ready:
	default:
		return 0, n.notLeader()
	}
	ch := make(chan readResult, 1)
	l.rmu.Lock()
	if len(l.readers) == 0 || window < l.rmin {
		if len(l.readers) != 0 {
			select {
			case l.rwake <- struct{}{}:
			default:
			}
		}
		l.rmin = window
	}
	l.readers = append(l.readers, reader{ch: ch, window: window, submitted: l.submitted.Load()})
	start := !l.reading
	l.reading = true
	l.rmu.Unlock()
	if start {
		go l.confirmReads()
	}
	select {
	case r := <-ch:
		return r.index, r.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// confirmReads answers the reads gathered (ReadIndex), a round at most every readWindow (or the
// shortest window of the reads waiting, ReadIndexWithin), until none is waiting.
func (l *leadership) confirmReads() {
	n := l.n
	t := stoppedTimer()
	defer t.Stop()
	for {
		l.rmu.Lock()
		if len(l.readers) == 0 {
			l.reading = false
			l.rmu.Unlock()
			return
		}
		w := l.rmin
		l.rmu.Unlock()
		if wait := time.Until(l.lastRound.Add(w)); wait > 0 {
			t.Reset(wait)
			select {
			case <-t.C:
			case <-l.rwake:
				// A read with a shorter window came: wait for that one instead.
				t.Stop()
				continue
			case <-l.ctx.Done():
			}
		}
		l.rmu.Lock()
		batch := l.readers
		l.readers = nil
		select {
		case <-l.rwake: // sent for a read of this batch (under rmu)
		default:
		}
		l.rmu.Unlock()
		var proposed uint64
		for _, rd := range batch {
			proposed = max(proposed, rd.submitted)
		}
		l.lastRound = time.Now()
		l.rounds.Add(1)
		var r readResult
		if !l.awaitCompleted(proposed) || l.ctx.Err() != nil {
			r.err = n.notLeader()
		} else {
			// Read after every call of the batch began, confirmed after it was read. If the
			// entries committed last are quiet notices (answered: nothing else came after them),
			// the index is the entry before them: a notice's own commit is told to the followers
			// only by raft's commit timeout, and a follower's read need not wait for it.
			r.index = n.raft.CommitIndex()
			if a := l.answered.Load(); a != nil && a.last == r.index {
				r.index = a.work
			}
			if err := l.futureError(n.raft.VerifyLeader()); err != nil {
				r = readResult{err: n.mapRaftErr(err)}
			} else if l.ctx.Err() != nil {
				r = readResult{err: n.notLeader()}
			}
		}
		for _, rd := range batch {
			rd.ch <- r
		}
	}
}

// AppliedIndex returns the index of the last entry this node applied (0 until its first command
// entry since it started: raft's own entries and a snapshot's index are not counted).
func (n *Node) AppliedIndex() uint64 {
	i, _ := n.fsm.appliedIndex()
	return i
}

// WaitApplied waits until this node has applied the entry at index (and every one before it), or
// ctx ends (its error).
func (n *Node) WaitApplied(ctx context.Context, index uint64) error {
	for {
		i, ch := n.fsm.appliedIndex()
		if i >= index {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-n.closing:
			return ErrClosed
		}
	}
}

// LeadingSince returns when this node's current leadership began (raft elected it), false if it does
// not lead.
func (n *Node) LeadingSince() (time.Time, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.lead == nil {
		return time.Time{}, false
	}
	return n.lead.since, true
}

// PeerFailing reports whether this node, leading, sees its heartbeats to peer id fail (see
// Status's Peer.Failing).
func (n *Node) PeerFailing(id string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	_, ok := n.failing[id]
	return ok && n.lead != nil
}
