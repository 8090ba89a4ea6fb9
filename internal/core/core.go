package core

import (
	"sync"
	"time"

	"github.com/mlock-dev/mlock/internal/locktable"
)

// Config configures a Core. The zero value is valid.
type Config struct {
	// Engine configures the lock table: limits, session grace, first token,
	// seed. Its OnEvent is ignored: the core collects the events itself and
	// hands them to OnBatch.
	Engine EngineConfig
	// Clock is the source of time and timers. Nil means SystemClock().
	Clock Clock
	// Manual, if set, gives the core no timer and no clock of its own: time
	// advances only through BatchAt, and deadlines are processed only by
	// the commands applied there (OpTick processes what is due and nothing
	// else). Batch and Apply then run at the time of the latest batch, and
	// Clock is not used. It is the mode for a replicated log, whose leader
	// reads NextDeadline and appends tick entries; every replica applies
	// the same entries at the same times and holds the same state. Default
	// false: the core reads Clock and arms its own timer.
	Manual bool
	// OnBatch, if set, runs at the end of every batch (commands or a timer
	// tick), under the core's lock, with the events of that batch in the
	// order they happened. The slice is reused: do not keep it. OnBatch may
	// call tx's read methods, never Apply, and must not call the Core.
	OnBatch func(tx *Tx, events []Event)
}

// Core is the lock service: the engine, the clock, the one deadline timer
// and the fan-out of events. Commands go in through Batch (or Apply); what
// they cause for other requests comes out through Config.OnBatch. It is safe
// for concurrent use: batches run one at a time.
type Core struct {
	clock   Clock
	manual  bool
	onBatch func(*Tx, []Event)

	mu      sync.Mutex
	tab     *locktable.Table // guarded by mu
	tx      Tx               // guarded by mu: the transaction of the running batch
	events  []Event          // guarded by mu: events of the running batch
	now     int64            // guarded by mu: time of the latest batch
	timer   Timer            // guarded by mu: nil until first armed
	timerAt int64            // guarded by mu: when timer fires, 0 if not armed
	closed  bool             // guarded by mu
}

// New returns a Core with an empty lock table. It returns the engine's
// configuration error, if any.
func New(cfg Config) (*Core, error) {
	c := newBare(cfg)
	ecfg := cfg.Engine
	ecfg.OnEvent = c.onEvent
	tab, err := locktable.New(ecfg)
	if err != nil {
		return nil, err
	}
	c.tab = tab
	return c, nil
}

// newBare returns a Core without its table.
func newBare(cfg Config) *Core {
	c := &Core{clock: cfg.Clock, manual: cfg.Manual, onBatch: cfg.OnBatch}
	if c.clock == nil && !c.manual {
		c.clock = SystemClock()
	}
	c.tx.c = c
	return c
}

// onEvent collects the engine's events. It runs under mu.
func (c *Core) onEvent(e Event) { c.events = append(c.events, e) }

// Batch runs fn under the core's lock with a Tx whose time is read once
// from the clock (never earlier than the previous batch's), then calls
// OnBatch with the events of the batch and arms the deadline timer. fn must
// not call the Core (that deadlocks) and must not keep tx. With
// Config.Manual the batch runs at the time of the latest batch.
func (c *Core) Batch(fn func(tx *Tx)) {
	c.mu.Lock()
	c.beginLocked(c.clockLocked())
	fn(&c.tx)
	c.endLocked()
	c.mu.Unlock()
}

// BatchAt is Batch at time now (Unix ns) instead of the clock's: the
// deterministic form for a replicated log, where every replica applies the
// same commands at the same time. A now earlier than the previous batch's is
// raised to it, so time never runs backwards.
func (c *Core) BatchAt(now int64, fn func(tx *Tx)) {
	c.mu.Lock()
	c.beginLocked(now)
	fn(&c.tx)
	c.endLocked()
	c.mu.Unlock()
}

// Apply runs one command in a batch of its own, at the clock's time (with
// Config.Manual: at the latest batch's), and returns its result.
func (c *Core) Apply(cmd *Command) Result {
	c.mu.Lock()
	c.beginLocked(c.clockLocked())
	r := c.tx.Apply(cmd)
	c.endLocked()
	c.mu.Unlock()
	return r
}

// Close stops the deadline timer: expiries, wait timeouts and grace periods
// are then processed only by later batches, which still work. Close is
// idempotent.
func (c *Core) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	c.timerAt = 0
	if c.timer != nil {
		c.timer.Stop()
	}
}

// Armed reports when the deadline timer will fire (Unix ns), or false if it
// is not armed. For inspection and tests.
func (c *Core) Armed() (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.timerAt, c.timerAt != 0
}

// NextDeadline returns the earliest pending deadline of the engine (Unix
// ns: an expiry, a wait timeout, the end of a grace period or of a hold on
// grants), or false if there is none. With Config.Manual it is when the
// next tick is due. It takes the core's lock: call it outside a batch (in
// one, use Tx.NextDeadline).
func (c *Core) NextDeadline() (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tab.NextDeadline()
}

// Now returns the time of the latest batch (Unix ns; for a restored core,
// of the latest batch before the snapshot), or 0 before the first. Batches
// never run earlier.
func (c *Core) Now() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// clockLocked returns the time for a batch that does not give one: the
// clock's, or with Config.Manual the latest batch's.
func (c *Core) clockLocked() int64 {
	if c.manual {
		return c.now
	}
	return c.clock.Now()
}

func (c *Core) beginLocked(now int64) {
	if now < c.now {
		now = c.now
	}
	c.now = now
	c.tx.now = now
}

// endLocked hands the batch's events to OnBatch and arms the timer at the
// next deadline if that is earlier than the one armed.
func (c *Core) endLocked() {
	if c.onBatch != nil {
		c.tx.ending = true
		c.onBatch(&c.tx, c.events)
		c.tx.ending = false
	}
	clear(c.events)
	c.events = c.events[:0]
	c.armLocked()
}

// armLocked arms the timer at the next deadline if that is earlier than the
// one armed. With Config.Manual it does nothing.
func (c *Core) armLocked() {
	at, ok := c.tab.NextDeadline()
	if !ok || c.manual || c.closed || (c.timerAt != 0 && at >= c.timerAt) {
		return
	}
	c.timerAt = at
	d := time.Duration(at - c.clock.Now())
	if c.timer == nil {
		c.timer = c.clock.AfterFunc(d, c.fire)
	} else {
		c.timer.Reset(d)
	}
}

// fire is the deadline timer's function: a batch that processes what is due.
func (c *Core) fire() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.timerAt = 0
	if c.closed {
		return
	}
	c.beginLocked(c.clock.Now())
	c.tab.Advance(c.now)
	c.endLocked()
}

// Tx is a batch in progress: the commands applied through it run at one
// time, Now. It is valid only inside the Batch function or OnBatch that
// received it.
type Tx struct {
	c      *Core
	now    int64
	ending bool // in OnBatch: Apply is not allowed
}

// Now returns the batch's time in Unix nanoseconds.
func (tx *Tx) Now() int64 { return tx.now }

// Apply applies cmd at time tx.Now() and returns its result. Events it causes
// for other requests reach OnBatch at the end of the batch. It panics when
// called from OnBatch.
func (tx *Tx) Apply(cmd *Command) Result {
	if tx.ending {
		panic("core: Tx.Apply called from OnBatch")
	}
	t, now := tx.c.tab, tx.now
	var r Result
	switch cmd.Op {
	case OpLock:
		r.Grant, r.Err = t.Lock(now, &cmd.Request)
	case OpExtend:
		r.ExpiresAt, r.Err = t.Extend(now, cmd.ID, cmd.TTL, cmd.Session)
	case OpUnlock:
		r.Err = t.Unlock(now, cmd.ID, cmd.Session)
	case OpRenew:
		r.Grant, r.Err = t.Renew(now, cmd.Owner, cmd.Resources, cmd.TTL, cmd.Session)
	case OpRelease:
		r.OK = t.ReleaseIn(now, cmd.Owner, cmd.Resources, cmd.Prefix)
	case OpReleaseAll:
		r.N = t.ReleaseAllIn(now, cmd.Owner, cmd.Prefix)
	case OpAttach:
		r.OK = t.Attach(now, cmd.Session)
	case OpDetach:
		t.Detach(now, cmd.Session)
	case OpTick:
		t.Advance(now)
	case OpHoldGrants:
		t.HoldGrants(now, cmd.Until)
		r.ExpiresAt = t.HoldUntil()
	case OpEvict:
		r.N, r.Err = t.Evict(now, cmd.Resources)
	case OpFailover:
		r.N = t.Failover(now, cmd.Until)
	default:
		r.Err = ErrUnknownOp
	}
	return r
}

// SetLimits puts cfg's limits and session grace in force for the commands
// that follow, in this batch and later ones (see locktable.Table.SetLimits:
// what is live is left as it is). Its other fields are ignored. A
// replicated log applies it as a command, at the same point on every
// replica. It returns cfg's error and then changes nothing; it panics when
// called from OnBatch.
func (tx *Tx) SetLimits(cfg EngineConfig) error {
	if tx.ending {
		panic("core: Tx.SetLimits called from OnBatch")
	}
	return tx.c.tab.SetLimits(cfg)
}

// SetTokenLimit bounds the fencing tokens given from now on below limit (0:
// no bound): while none is left below it, a request that becomes grantable
// waits, and with refuse a new lock request is refused with ErrNoTokens,
// until a later call raises the bound;
// the requests then grantable are granted in arrival order, reported to
// OnBatch as Granted events (see locktable.Table.SetTokenLimit). A single
// server keeps it at its token high-water mark on disk. It panics when
// called from OnBatch.
func (tx *Tx) SetTokenLimit(limit uint64, refuse bool) {
	if tx.ending {
		panic("core: Tx.SetTokenLimit called from OnBatch")
	}
	tx.c.tab.SetTokenLimit(tx.now, limit, refuse)
}

// SetLateGrants puts the engine's rule of late grants in force (on: a
// waiter whose queues are freed after its wait deadline is granted) or out
// of it (off, the default: it is timed out) for the commands that follow,
// in this batch and later ones (see locktable.Table.SetLateGrants). A
// replicated log switches it at the same point on every replica. It panics
// when called from OnBatch.
func (tx *Tx) SetLateGrants(on bool) {
	if tx.ending {
		panic("core: Tx.SetLateGrants called from OnBatch")
	}
	tx.c.tab.SetLateGrants(on)
}

// LateGrants reports whether the engine's rule of late grants is in force.
func (tx *Tx) LateGrants() bool { return tx.c.tab.LateGrants() }

// TokenLimit returns the bound of the fencing tokens (0: none).
func (tx *Tx) TokenLimit() uint64 { return tx.c.tab.TokenLimit() }

// Stats returns the engine's counters and sizes.
func (tx *Tx) Stats() Stats { return tx.c.tab.Stats() }

// LastToken returns the last fencing token given.
func (tx *Tx) LastToken() uint64 { return tx.c.tab.LastToken() }

// SessionGrace returns the session grace period in force.
func (tx *Tx) SessionGrace() time.Duration { return tx.c.tab.SessionGrace() }

// HasSession reports whether session id exists (attached or in its grace
// period).
func (tx *Tx) HasSession(id string) bool { return tx.c.tab.HasSession(id) }

// GroupSessions returns the sessions whose id starts with name and a NUL
// byte (a principal's).
func (tx *Tx) GroupSessions(name string) int { return tx.c.tab.GroupSessions(name) }

// GroupRequests returns the live requests of the sessions whose id starts
// with name and a NUL byte (a principal's: see locktable.Table.GroupRequests).
func (tx *Tx) GroupRequests(name string) int { return tx.c.tab.GroupRequests(name) }

// Lookup returns the live request with this id.
func (tx *Tx) Lookup(id ID) (LockInfo, bool) { return tx.c.tab.Lookup(id) }

// QueueLen returns the entries of resource's queue, holder included.
func (tx *Tx) QueueLen(resource string) int { return tx.c.tab.QueueLen(resource) }

// HoldUntil returns the end (Unix ns) of the hold on grants in force
// (OpHoldGrants, or EngineConfig.GrantAfter), or 0 if grants are not held.
func (tx *Tx) HoldUntil() int64 { return tx.c.tab.HoldUntil() }

// NextDeadline returns the earliest pending deadline, or false if none.
func (tx *Tx) NextDeadline() (int64, bool) { return tx.c.tab.NextDeadline() }

// Head returns the request at the head of resource's queue (its holder, or
// the waiting request that reserves it), or false if the queue is empty.
// O(k), k the request's resources.
func (tx *Tx) Head(resource string) (LockInfo, bool) { return tx.c.tab.Head(resource) }

// QueuesPage calls fn, in name order, for the queues whose resource starts
// with prefix and sorts after after ("" for the first page): at most
// maxQueues queues and maxEntries entries in total (the last queue's
// Entries may be cut short; QueueInfo.Len is its full length), until fn
// returns false. It returns the last resource passed to fn when more queues
// match (the after of the next page), else "". Limits below 1 count as 1.
// It seeks in the engine's ordered index of queue names: O(log Q + page)
// time for Q queues, and O(page) memory, however many queues there are.
func (tx *Tx) QueuesPage(prefix, after string, maxQueues, maxEntries int, fn func(QueueInfo) bool) (next string) {
	return tx.c.tab.QueuesPage(prefix, after, maxQueues, maxEntries, fn)
}

// Locks calls fn for up to limit live requests (all if limit <= 0), newest
// first, until fn returns false. O(requests passed to fn).
func (tx *Tx) Locks(limit int, fn func(LockInfo) bool) { tx.c.tab.Locks(limit, fn) }

// SessionLocks calls fn for every live request of session id, newest first.
func (tx *Tx) SessionLocks(id string, fn func(LockInfo)) { tx.c.tab.SessionLocks(id, fn) }
