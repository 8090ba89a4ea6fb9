package locktable

import (
	crand "crypto/rand"
	"encoding/binary"
	"math/rand/v2"
	"time"
)

const (
	stateWaiting uint8 = iota
	stateGranted
)

// lock.flags bits.
const (
	flagNoReentry uint8 = 1 << iota // Request.NoReentry: Renew does not find the lock
	flagCut                         // Release: the lock already lost resources in this call
	flagPartial                     // a Release took some of its resources: Extend by id no longer finds it
	flagRevoked                     // Evict revoked it: it is nobody's any more and ends at its expiry
	flagTimer                       // not a request: a session's timer in the deadline heap (session.tm)
)

type node struct {
	l          *lock
	q          *queue // nil when this node is not queued
	prev, next *node
	permits    uint32 // the mode: 0 exclusive, else permits of q.of
	adm        bool   // admitted: compatible with every entry ahead of it
}

type lock struct {
	id       ID
	token    uint64
	ttl      time.Duration
	created  int64
	granted  int64 // when it was granted (ns); 0 while waiting, and after a snapshot restore
	deadline int64 // expiry when granted; wait deadline when waiting (0: none)
	hidx     int32 // index in the deadline heap, -1 if absent
	waiting  int32 // queues where this request is not at the head yet
	live     int32 // nodes still queued
	state    uint8
	flags    uint8
	sess     *session
	sprev    *lock // session list
	snext    *lock
	seq      uint64 // arrival order: the grants at the end of a hold, deadlines due at once
	own      *owned // nil or an empty name: no owner
	aprev    *lock  // list of every live request, newest first
	anext    *lock
	// The request's nodes, one per resource (a duplicate's stays unqueued):
	// one for a single resource, *more for more (see nodes).
	more *[]node
	one  [1]node
}

// Table is the lock engine. Create one with New.
type Table struct {
	cfg        Config
	maxRes     int
	maxName    int
	maxPerSess int
	maxQueue   int
	maxLocks   int
	maxEntries int
	maxBytes   int64
	maxSessB   int64
	maxTTL     time.Duration
	maxTimeout time.Duration

	slots    []*lock  // live requests by slot; the slot is in the ID
	freeIdx  []uint32 // unused slots
	live     int
	entries  int     // queue entries of live requests
	bytes    int64   // name bytes of live requests
	spare    []*lock // removed lock structs kept for reuse
	queues   map[string]*queue
	busy     []*queue  // the queues with two entries or more, in no order (see Busiest)
	idx      nameIndex // the queues' names, in order, while listings use them
	all      *lock     // every live request, newest first
	sessions map[string]*session
	lastSess *session          // the session Lock found last, nil if it was dropped
	groups   map[string]*group // by the part of a session id before its first NUL byte
	owners   map[string]*ownerList
	heap     deadlines
	rng      *rand.ChaCha8
	next     uint64
	held     int
	free     []*queue
	parked   parkRing // empty queues kept for their next request (see parkRing)
	stats    Stats
	now      int64 // the latest time seen; time never runs backwards

	// While deferring is set, a request that becomes grantable is put in
	// ready instead of being granted; flushGrants grants the ones still
	// live. Release, ReleaseAll and dropSession defer so that nothing they
	// grant is taken back, or dropped, by the same call.
	deferring bool
	ready     []readyLock
	cut       []*node  // Release's scratch list
	found     []*queue // Lock's scratch list: the queues of a request's resources, nil for none

	// While grants are held (hold.tm.hidx >= 0: the end of the hold is in the
	// deadline heap), every request that becomes grantable is put in ready
	// as well, and endHold grants them, in arrival order, when the hold
	// ends. hold is a sentinel session, never in sessions, that only marks
	// that deadline; holdUntil is its time.
	hold      session
	holdUntil int64
	// tlimit bounds the tokens (0: no bound): while next >= tlimit, every
	// request that becomes grantable goes to ready as well, and
	// SetTokenLimit grants them when it raises the bound.
	tlimit  uint64
	trefuse bool // at the limit, a new request is refused (ErrNoTokens) rather than queued
	// lateOK: Config.LateGrants (a waiter freed late is granted, see late).
	lateOK bool
	seq    uint64 // arrival number of the last accepted request or detach

	// plant is a bug that the model test plants to show that its checker
	// catches it (plantBarge, plantLeak); always 0 outside that test.
	plant uint8
}

// The bugs a test may plant (Table.plant).
const (
	plantBarge uint8 = 1 + iota // a shared entry passes a waiting writer when it fits the holders
	plantLeak                   // a semaphore entry does not return its permits
)

// New returns an empty Table.
func New(cfg Config) (*Table, error) {
	t, err := newTable(cfg)
	if err != nil {
		return nil, err
	}
	var seed [32]byte
	if cfg.Seed != nil {
		seed = *cfg.Seed
	} else {
		_, _ = crand.Read(seed[:]) // never fails since Go 1.24
	}
	t.rng = rand.NewChaCha8(seed)
	if cfg.GrantAfter > 0 {
		t.HoldGrants(0, cfg.GrantAfter)
	}
	return t, nil
}

// newTable returns an empty Table with cfg's limits, without its generator
// of lock ids.
func newTable(cfg Config) (*Table, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	t := &Table{
		cfg:      cfg,
		queues:   make(map[string]*queue),
		idx:      nameIndex{max: youngMax, slack: dropSlack},
		parked:   parkRing{max: maxParked},
		sessions: make(map[string]*session),
		groups:   make(map[string]*group),
		owners:   make(map[string]*ownerList),
		next:     cfg.FirstToken,
		tlimit:   cfg.TokenLimit,
		lateOK:   cfg.LateGrants,
	}
	t.setLimits(&cfg)
	if t.next == 0 {
		t.next = 1
	}
	t.hold.timer()
	return t, nil
}

// maxSpare bounds the removed lock structs kept for reuse.
const maxSpare = 4096

// newLock returns a cleared lock with room for k nodes, registered in a slot
// under a fresh ID: 4 bytes of slot index and 96 random bits.
func (t *Table) newLock(k int) *lock {
	var l *lock
	if n := len(t.spare); n > 0 {
		l = t.spare[n-1]
		t.spare = t.spare[:n-1]
	} else {
		l = &lock{hidx: -1}
	}
	l.setNodes(k)
	var idx uint32
	if n := len(t.freeIdx); n > 0 {
		idx = t.freeIdx[n-1]
		t.freeIdx = t.freeIdx[:n-1]
	} else {
		idx = uint32(len(t.slots))
		t.slots = append(t.slots, nil)
	}
	t.slots[idx] = l
	l.aprev, l.anext = nil, t.all
	if t.all != nil {
		t.all.aprev = l
	}
	t.all = l
	a, b := t.rng.Uint64(), t.rng.Uint64()
	if a == 0 && uint32(b) == 0 {
		a = 1 // never NoID
	}
	binary.LittleEndian.PutUint32(l.id[0:4], idx)
	binary.LittleEndian.PutUint64(l.id[4:12], a)
	binary.LittleEndian.PutUint32(l.id[12:16], uint32(b))
	t.live++
	return l
}

// setNodes gives l, a cleared lock, k nodes.
func (l *lock) setNodes(k int) {
	if k == 1 {
		return
	}
	if l.more == nil {
		l.more = new([]node)
	}
	if cap(*l.more) >= k {
		*l.more = (*l.more)[:k]
	} else {
		*l.more = make([]node, k)
	}
}

// nodes returns l's nodes.
func (l *lock) nodes() []node {
	if m := l.more; m != nil && len(*m) > 0 {
		return *m
	}
	return l.one[:]
}

// lookup returns the live request with this id, or nil.
func (t *Table) lookup(id ID) *lock {
	idx := binary.LittleEndian.Uint32(id[0:4])
	if idx >= uint32(len(t.slots)) {
		return nil
	}
	if l := t.slots[idx]; l != nil && l.id == id {
		return l
	}
	return nil
}

// freeLock releases l's slot and keeps the struct for reuse.
func (t *Table) freeLock(l *lock) {
	idx := binary.LittleEndian.Uint32(l.id[0:4])
	t.slots[idx] = nil
	t.freeIdx = append(t.freeIdx, idx)
	if l.aprev != nil {
		l.aprev.anext = l.anext
	} else {
		t.all = l.anext
	}
	if l.anext != nil {
		l.anext.aprev = l.aprev
	}
	t.live--
	if m := l.more; m != nil && len(*m) > 0 {
		clear(*m) // l.one is cleared with l
	}
	more, own := l.more, l.own
	*l = lock{hidx: -1}
	if more != nil {
		*more = (*more)[:0]
		l.more = more // its array is kept for the next request of several resources
	}
	if own != nil {
		*own = owned{}
		l.own = own // kept for the next owned request
	}
	if len(t.spare) < maxSpare {
		t.spare = append(t.spare, l)
	}
}
