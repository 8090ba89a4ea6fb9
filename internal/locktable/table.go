package locktable

import (
	"cmp"
	crand "crypto/rand"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/google/btree"
)

// Defaults for the zero fields of Config.
const (
	DefaultMaxResources       = 64
	DefaultMaxNameLen         = 512
	DefaultMaxLocksPerSession = 100_000
	DefaultMaxQueueLen        = 100_000
	DefaultSessionGrace       = 15 * time.Second
	DefaultMaxTTL             = 24 * time.Hour
	DefaultMaxTimeout         = 24 * time.Hour
	DefaultMaxLocks           = 1_000_000
	DefaultMaxEntries         = 4_000_000
	DefaultMaxNameBytes       = 256 << 20
	DefaultMaxSessionBytes    = 8 << 20
)

// Config configures a Table. The zero value is valid: every zero field takes
// its default. For the integer limits a negative value means "no limit".
type Config struct {
	// MaxResources is the most resources one request may name (duplicates
	// included). Default 64.
	MaxResources int
	// MaxNameLen is the longest resource or owner name in bytes. Default 512.
	MaxNameLen int
	// MaxLocksPerSession caps the live requests (held and waiting) of one
	// session. Default 100 000.
	MaxLocksPerSession int
	// MaxQueueLen caps the entries (holder included) of one resource's queue.
	// Default 100 000.
	MaxQueueLen int
	// MaxLocks caps the live requests (held and waiting) of the whole
	// Table. Default 1 000 000. A new request beyond it is refused with
	// ErrServerFull.
	MaxLocks int
	// MaxEntries caps the queue entries of the whole Table: the sum, over
	// live requests, of their distinct resources. Default 4 000 000. A new
	// request beyond it is refused with ErrServerFull.
	MaxEntries int
	// MaxNameBytes caps the name bytes of the whole Table: the sum, over
	// queue entries, of the length of the resource's name, plus the length
	// of the owner of each live request. Default 256 MiB. A new request
	// beyond it is refused with ErrServerFull.
	MaxNameBytes int
	// MaxSessionBytes caps the same sum as MaxNameBytes over the requests of
	// one session. Default 8 MiB. A new request (or a re-entry that moves a
	// lock into the session) beyond it is refused with ErrSessionLimit.
	MaxSessionBytes int
	// SessionGrace is how long a detached session keeps its locks. Default
	// 15 s. A negative value drops a session as soon as it detaches.
	SessionGrace time.Duration
	// MaxTTL is the longest lease. Default 24 h.
	MaxTTL time.Duration
	// MaxTimeout is the longest wait timeout. Default 24 h.
	MaxTimeout time.Duration
	// FirstToken is the fencing token of the first grant; later grants count
	// up from it. Default 1. A server sets it above every token it ever gave.
	FirstToken uint64
	// GrantAfter, if > 0, starts the Table with its grants held until that
	// time (ns, on the clock of the now arguments), as by HoldGrants: a
	// server that restarts after a crash sets it so that nothing is granted
	// while a holder of the previous run may still believe it holds a lock.
	// 0 (the default) or a negative value: no hold.
	GrantAfter int64
	// Seed seeds the generator of lock ids. Nil means 32 bytes from
	// crypto/rand; tests set it to be reproducible.
	Seed *[32]byte
	// OnEvent, if set, is called for everything that happens to a request
	// other than the one a method was called for. It runs inside Table
	// methods and must not call back into the Table.
	OnEvent func(Event)
}

// Validate reports the first field of c that is out of range.
func (c *Config) Validate() error {
	if c.SessionGrace > 0 && c.SessionGrace < time.Millisecond {
		return fmt.Errorf("locktable: Config.SessionGrace %v is below 1ms", c.SessionGrace)
	}
	if c.MaxTTL < 0 {
		return fmt.Errorf("locktable: Config.MaxTTL %v is negative", c.MaxTTL)
	}
	if c.MaxTimeout < 0 {
		return fmt.Errorf("locktable: Config.MaxTimeout %v is negative", c.MaxTimeout)
	}
	return nil
}

// Limit applies mlock's convention for integer limits: 0 means def, a
// negative value means no limit, anything else is the limit.
func Limit(v, def int) int {
	switch {
	case v == 0:
		return def
	case v < 0:
		return int(^uint(0) >> 1)
	}
	return v
}

// EventKind says what happened to a request.
type EventKind uint8

const (
	// Granted: a waiting request now holds all its resources.
	Granted EventKind = iota + 1
	// TimedOut: a waiting request passed its wait timeout and left every
	// queue.
	TimedOut
	// Expired: a granted lock passed its expiry and was removed; a lock
	// revoked by Evict ends this way too, after its Released.
	Expired
	// Released: a granted lock was removed by Release or ReleaseAll, or
	// unlocked from another session; or Evict revoked it (it keeps its
	// resources until it expires, but is nobody's any more); or, with
	// Partial set, a Release took some of its resources and the lock lives
	// on holding the rest.
	Released
	// Dropped: a request was removed because its session's grace period
	// ended. Held is true if it was granted. A dropped session is never
	// granted anything while it is being dropped.
	Dropped
	// SessionClosed: a session's grace period ended; its requests have been
	// reported as Dropped. Only Session is set.
	SessionClosed
)

var kindNames = [...]string{"", "granted", "timeout", "expired", "released", "dropped", "session-closed"}

func (k EventKind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// Event reports a change to one request.
type Event struct {
	Kind      EventKind
	ID        ID
	Session   string
	Owner     string
	Token     uint64 // fencing token of a granted lock (Granted, Expired, Released, Dropped held)
	ExpiresAt int64  // expiry (ns) of a Granted lock
	Held      bool   // Dropped: whether the request was granted
	// Since (ns) is when the request was made (Granted, TimedOut, Dropped
	// waiting: the event's time minus Since is the wait) or granted
	// (Expired, Released, Dropped held: the hold so far). 0 when unknown: a
	// lock restored from a snapshot does not keep its grant time.
	Since int64
	// Partial (Released only): the lock lost some of its resources and is
	// still live, holding the rest under the same ID and token. Its holder
	// no longer holds everything it was granted.
	Partial bool
	// Revoked: Evict revoked the lock. On Released: this is that
	// revocation. On Expired: Evict revoked the lock earlier, and reported
	// it Released then; its holder was told it lost it at that time.
	Revoked bool
	// Moved (Released only): the lock's owner asked for it again from
	// another session (re-entry), and it moved there, live, under the same
	// ID and token. Session is the session it left, which no longer holds
	// it; the session it moved into is answered by Lock's Grant.
	Moved bool
}

// Request is one lock request.
type Request struct {
	// Session the request belongs to; it must be attached. For a re-entry
	// it is also the caller's session (see Table.Lock).
	Session string
	// Resources to lock, 1..MaxResources names. Duplicates are folded.
	// Lock does not keep or modify the slice.
	Resources []string
	// Modes are the modes the resources are taken in: none (every resource
	// exclusive, the default), one for every resource, or one per resource
	// in the order of Resources. A name given twice must have one mode.
	// Lock does not keep or modify the slice.
	Modes []Mode
	// TTL is the lease, > 0 and <= MaxTTL.
	TTL time.Duration
	// Timeout is the longest wait; 0 waits without limit.
	Timeout time.Duration
	// Tolerate > 0 refuses the request at once if any of its queues already
	// holds more than Tolerate entries. 0 means no limit.
	Tolerate int
	// Try refuses the request unless it can be granted at once.
	Try bool
	// Owner, if set, makes the request re-entrant: the same owner asking for
	// exactly the resources it holds renews that lock. Release and
	// ReleaseAll find locks by owner.
	Owner string
	// NoReentry records Owner for Release and ReleaseAll but turns re-entry
	// off: asking again queues (or, with Try, is refused) like anyone else,
	// and Renew does not find the lock.
	NoReentry bool
}

// Grant is the answer to an accepted Lock request.
type Grant struct {
	ID        ID
	Granted   bool   // granted at once (otherwise waiting)
	Renewed   bool   // an owner's existing lock was renewed (re-entry or Renew); ID is that lock's
	Token     uint64 // fencing token, when Granted
	ExpiresAt int64  // expiry in ns, when Granted
	// Ahead is the most entries ahead of the request in one of the queues
	// it joined (0 when granted at once or renewed; it counts the holder).
	Ahead int
}

// Stats counts what the Table has done since it was created.
type Stats struct {
	Requests    uint64 // accepted lock requests (including renewals)
	Refused     uint64 // requests refused by tolerate or try
	Granted     uint64 // grants
	TimedOut    uint64
	Expired     uint64
	Unlocked    uint64 // successful unlocks and releases
	Extended    uint64 // successful Extend and Renew calls
	ExtendFails uint64 // failed Extend and Renew calls
	Dropped     uint64 // requests removed with their session
	Evicted     uint64 // locks revoked by Evict
	ServerFull  uint64 // requests refused by MaxLocks, MaxEntries or MaxNameBytes
	Live        int    // live requests (held and waiting)
	Entries     int    // queue entries (sum over live requests of their distinct resources)
	NameBytes   int64  // name bytes held: over queue entries, len(resource); plus len(owner) per live request
	Held        int    // granted locks
	Queues      int    // resources with a non-empty queue
	Sessions    int
	LastToken   uint64 // the last token given, or FirstToken-1
	HoldUntil   int64  // grants are held until this time (ns); 0: not held
}

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
)

type node struct {
	l          *lock
	q          *queue // nil when this node is not queued
	prev, next *node
	permits    uint32 // the mode: 0 exclusive, else permits of q.of
	adm        bool   // admitted: compatible with every entry ahead of it
}

// A queue's admitted entries are a prefix of it: the head, and each next
// entry while it is compatible with all of them (see Mode). gate is the
// first entry not admitted; no entry behind it is admitted either.
type queue struct {
	name       string
	head, tail *node
	n          int
	gate       *node  // the first entry not admitted, nil if none
	nadm       int    // admitted entries
	used       uint64 // permits of the admitted entries
	nshared    int    // entries in a shared or permits mode
	of         uint32 // their permit count (0: unbounded); valid while nshared > 0
	// list is the Table's list of the queues with two entries or more
	// (contended), which cprev and cnext link while q is on it.
	list         *queueList
	cprev, cnext *queue
}

// queueList is a list of queues.
type queueList struct {
	head *queue
	n    int
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
	owner    string
	oprev    *lock // owner list
	onext    *lock
	aprev    *lock // list of every live request, newest first
	anext    *lock
	nodes    []node
	one      [1]node
}

// A group is the sessions whose ids share the part before their first NUL
// byte (the server's principals: see GroupRequests).
type group struct {
	requests int // live requests of its sessions
	sessions int
}

type session struct {
	id       string
	grp      *group // nil: the id has no NUL byte
	attached bool
	hidx     int32
	seq      uint64 // the Table's seq at its detach: orders its grace end among deadlines due at once
	head     *lock
	n        int
	bytes    int64 // name bytes of its requests (see Config.MaxNameBytes)
}

type ownerList struct {
	head *lock
	n    int
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
	busy     queueList              // the queues with two entries or more (see Busiest)
	names    *btree.BTreeG[nameKey] // the keys of queues, in order
	all      *lock                  // every live request, newest first
	sessions map[string]*session
	groups   map[string]*group // by the part of a session id before its first NUL byte
	owners   map[string]*ownerList
	heap     deadlines
	rng      *rand.ChaCha8
	next     uint64
	held     int
	free     []*queue
	stats    Stats
	now      int64 // the latest time seen; time never runs backwards

	// While deferring is set, a request that becomes grantable is put in
	// ready instead of being granted; flushGrants grants the ones still
	// live. Release, ReleaseAll and dropSession defer so that nothing they
	// grant is taken back, or dropped, by the same call.
	deferring bool
	ready     []readyLock
	cut       []*node // Release's scratch list

	// While grants are held (hold.hidx >= 0: the end of the hold is in the
	// deadline heap), every request that becomes grantable is put in ready
	// as well, and endHold grants them, in arrival order, when the hold
	// ends. hold is a sentinel session, never in sessions, that only marks
	// that deadline; holdUntil is its time.
	hold      session
	holdUntil int64
	seq       uint64 // arrival number of the last accepted request or detach

	// plant is a bug that the model test plants to show that its checker
	// catches it (plantBarge, plantLeak); always 0 outside that test.
	plant uint8
}

// The bugs a test may plant (Table.plant).
const (
	plantBarge uint8 = 1 + iota // a shared entry passes a waiting writer when it fits the holders
	plantLeak                   // a semaphore entry does not return its permits
)

// readyLock is a request that became grantable while grants were deferred.
// id tells whether l is still the same live request when the grants run.
type readyLock struct {
	l  *lock
	id ID
}

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
		names:    btree.NewG(nameDegree, nameLess),
		sessions: make(map[string]*session),
		groups:   make(map[string]*group),
		owners:   make(map[string]*ownerList),
		next:     cfg.FirstToken,
	}
	t.setLimits(&cfg)
	if t.next == 0 {
		t.next = 1
	}
	t.hold.hidx = -1
	return t, nil
}

// setLimits puts cfg's limits and session grace in force (cfg is valid).
func (t *Table) setLimits(cfg *Config) {
	t.maxRes = Limit(cfg.MaxResources, DefaultMaxResources)
	t.maxName = Limit(cfg.MaxNameLen, DefaultMaxNameLen)
	t.maxPerSess = Limit(cfg.MaxLocksPerSession, DefaultMaxLocksPerSession)
	t.maxQueue = Limit(cfg.MaxQueueLen, DefaultMaxQueueLen)
	t.maxLocks = Limit(cfg.MaxLocks, DefaultMaxLocks)
	t.maxEntries = Limit(cfg.MaxEntries, DefaultMaxEntries)
	t.maxBytes = int64(Limit(cfg.MaxNameBytes, DefaultMaxNameBytes))
	t.maxSessB = int64(Limit(cfg.MaxSessionBytes, DefaultMaxSessionBytes))
	t.maxTTL = cmp.Or(cfg.MaxTTL, DefaultMaxTTL)
	t.maxTimeout = cmp.Or(cfg.MaxTimeout, DefaultMaxTimeout)
	t.cfg.MaxResources, t.cfg.MaxNameLen, t.cfg.MaxLocksPerSession = cfg.MaxResources, cfg.MaxNameLen, cfg.MaxLocksPerSession
	t.cfg.MaxQueueLen, t.cfg.MaxLocks, t.cfg.MaxEntries = cfg.MaxQueueLen, cfg.MaxLocks, cfg.MaxEntries
	t.cfg.MaxNameBytes, t.cfg.MaxSessionBytes = cfg.MaxNameBytes, cfg.MaxSessionBytes
	t.cfg.MaxTTL, t.cfg.MaxTimeout = cfg.MaxTTL, cfg.MaxTimeout
	t.cfg.SessionGrace = cmp.Or(cfg.SessionGrace, DefaultSessionGrace)
}

// SetLimits puts in force, from the next call on, the limits (MaxResources
// to MaxTimeout) and the session grace of cfg; its other fields are
// ignored. What is live stays as it is: a request above a lowered cap
// stays, a grace period already running keeps its end, an expiry its time;
// the new limits count for the requests, detaches and evictions that come
// next. A replicated log changes them at the same point on every replica.
// It returns cfg's error (see Config.Validate) and then changes nothing.
func (t *Table) SetLimits(cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	t.setLimits(&cfg)
	return nil
}

// SessionGrace returns the grace period in force.
func (t *Table) SessionGrace() time.Duration { return t.cfg.SessionGrace }

func (t *Table) emit(e Event) {
	if t.cfg.OnEvent != nil {
		t.cfg.OnEvent(e)
	}
}

// ---- sessions ----

// Attach attaches session id, creating it if it is new, and stops its grace
// clock if it was detached. It reports whether the session already existed.
func (t *Table) Attach(now int64, id string) (existed bool) {
	t.advance(now)
	if s, ok := t.sessions[id]; ok {
		if s.hidx >= 0 {
			t.heap.remove(int(s.hidx))
		}
		s.attached = true
		return true
	}
	t.sessions[id] = t.newSession(id)
	return false
}

// newSession returns a new attached session, counted in its group.
func (t *Table) newSession(id string) *session {
	s := &session{id: id, attached: true, hidx: -1}
	if name, _, ok := strings.Cut(id, "\x00"); ok {
		g := t.groups[name]
		if g == nil {
			g = &group{}
			t.groups[name] = g
		}
		g.sessions++
		s.grp = g
	}
	return s
}

// GroupSessions returns the sessions (attached or in their grace period)
// whose id starts with name and a NUL byte. O(1).
func (t *Table) GroupSessions(name string) int {
	if g := t.groups[name]; g != nil {
		return g.sessions
	}
	return 0
}

// GroupRequests returns the live requests (held and waiting) of the
// sessions whose id starts with name and a NUL byte: the server scopes the
// sessions of a principal so, and caps the principal's requests with it.
// O(1).
func (t *Table) GroupRequests(name string) int {
	if g := t.groups[name]; g != nil {
		return g.requests
	}
	return 0
}

// Detach starts session id's grace clock. At now + SessionGrace, unless it is
// attached again, all of its requests are dropped (each reported as Dropped,
// then SessionClosed); none of them is granted on the way out, and only then
// are other sessions' waiters granted. Detaching an unknown or detached
// session does nothing.
func (t *Table) Detach(now int64, id string) {
	now = t.advance(now)
	s, ok := t.sessions[id]
	if !ok || !s.attached {
		return
	}
	s.attached = false
	if t.cfg.SessionGrace < 0 {
		t.dropSession(s)
		return
	}
	t.seq++
	s.seq = t.seq
	t.heap.push(deadline{at: now + int64(t.cfg.SessionGrace), s: s})
}

// HasSession reports whether session id exists (attached or in its grace
// period).
func (t *Table) HasSession(id string) bool {
	_, ok := t.sessions[id]
	return ok
}

// dropSession removes every request of s, then grants what became grantable,
// so that none of s's own waiters is granted on the way out.
func (t *Table) dropSession(s *session) {
	t.deferring = true
	for s.head != nil {
		l := s.head
		t.stats.Dropped++
		t.emit(Event{Kind: Dropped, ID: l.id, Session: s.id, Owner: l.owner, Token: l.token, Held: l.state == stateGranted, Since: l.since()})
		t.remove(l)
	}
	if s.hidx >= 0 {
		t.heap.remove(int(s.hidx))
	}
	delete(t.sessions, s.id)
	if g := s.grp; g != nil {
		if g.sessions--; g.sessions == 0 {
			name, _, _ := strings.Cut(s.id, "\x00")
			delete(t.groups, name)
		}
	}
	t.flushGrants()
	t.emit(Event{Kind: SessionClosed, Session: s.id})
}

func (s *session) add(l *lock) {
	l.sess = s
	l.sprev = nil
	l.snext = s.head
	if s.head != nil {
		s.head.sprev = l
	}
	s.head = l
	s.n++
	if s.grp != nil {
		s.grp.requests++
	}
}

func (s *session) del(l *lock) {
	if l.sprev != nil {
		l.sprev.snext = l.snext
	} else {
		s.head = l.snext
	}
	if l.snext != nil {
		l.snext.sprev = l.sprev
	}
	l.sprev, l.snext, l.sess = nil, nil, nil
	s.n--
	if s.grp != nil {
		s.grp.requests--
	}
}

// ---- validation ----

// CheckName is the rule for resource names: not empty, no space, no '|', and
// at most maxLen bytes (no length limit if maxLen <= 0). It returns
// ErrInvalidResource, unwrapped, for a name that breaks the rule, and nil
// otherwise. It does not allocate.
func CheckName(name string, maxLen int) error {
	if name == "" || (maxLen > 0 && len(name) > maxLen) ||
		strings.IndexByte(name, ' ') >= 0 || strings.IndexByte(name, '|') >= 0 {
		return ErrInvalidResource
	}
	return nil
}

// checkOwner reports whether owner is a valid owner name (the empty owner
// included).
func (t *Table) checkOwner(owner string) bool {
	return len(owner) <= t.maxName && strings.IndexByte(owner, ' ') < 0
}

// distinct returns the number of distinct names in res. It costs O(k²),
// k <= MaxResources, and does not allocate.
func distinct(res []string) int {
	n := 0
	for i, r := range res {
		dup := false
		for _, p := range res[:i] {
			if p == r {
				dup = true
				break
			}
		}
		if !dup {
			n++
		}
	}
	return n
}

// ---- lock ----

// Lock enqueues req. It returns ErrTolerate or ErrBusy when the request is
// refused for its queues, ErrOwnerConflict when req.Owner already holds an
// overlapping but different set, and one of the validation errors when it is
// malformed; in every case nothing changes. ErrBusy, ErrTolerate and
// ErrOwnerConflict come as a *ResourceError that names the first resource of
// req (in request order) that is busy, whose queue is too long, or that the
// owner already holds; errors.Is matches the sentinel. A request granted at
// once is reported in the returned Grant only, not through OnEvent.
//
// A new request is refused with ErrSessionLimit when its session already
// has Config.MaxLocksPerSession requests or would go above
// Config.MaxSessionBytes, and with ErrServerFull when the Table would go
// above Config.MaxLocks, MaxEntries or MaxNameBytes. A re-entry adds
// nothing to the Table and is not refused by its caps; one that moves the
// lock into another session is refused with ErrSessionLimit when that
// session cannot take it.
//
// Re-entry from a session other than the lock's (req.Session is the
// caller) never shortens the lock: see Extend. A lock revoked by Evict is
// not the owner's any more: asking for it again queues behind it (or, with
// Try, is refused with ErrBusy) like any request.
func (t *Table) Lock(now int64, req *Request) (Grant, error) {
	now = t.advance(now)
	s, ok := t.sessions[req.Session]
	if !ok {
		return Grant{}, ErrUnknownSession
	}
	k := len(req.Resources)
	if k == 0 {
		return Grant{}, ErrInvalidResource
	}
	if k > t.maxRes {
		return Grant{}, ErrTooManyResources
	}
	if req.TTL <= 0 || req.TTL > t.maxTTL {
		return Grant{}, ErrInvalidTTL
	}
	if req.Timeout < 0 || req.Timeout > t.maxTimeout {
		return Grant{}, ErrInvalidTimeout
	}
	if req.Tolerate < 0 {
		return Grant{}, ErrInvalidTolerate
	}
	if !t.checkOwner(req.Owner) {
		return Grant{}, ErrInvalidOwner
	}
	if err := req.checkModes(); err != nil {
		return Grant{}, err
	}
	var mine *lock   // the owner's lock found holding a queue
	var mineRes int  // index in req.Resources of the first resource mine holds
	foreign := false // some resource is not held by mine
	size := int64(len(req.Owner))
	for i, r := range req.Resources {
		if err := CheckName(r, t.maxName); err != nil {
			return Grant{}, err
		}
		size += int64(len(r))
		q := t.queues[r]
		if q == nil {
			foreign = true
			continue
		}
		m := req.modeAt(i)
		if m.Permits > 0 && q.nshared > 0 && q.of != m.Of {
			return Grant{}, &ResourceError{Err: ErrPermitsConflict, Resource: r}
		}
		if req.Owner != "" && !req.NoReentry {
			if h := t.heldBy(q, req.Owner); h != nil {
				if mine != nil && mine != h {
					return Grant{}, &ResourceError{Err: ErrOwnerConflict, Resource: r}
				}
				if mine == nil {
					mine, mineRes = h, i
				}
				continue
			}
		}
		foreign = true
		if req.Try && (q.gate != nil || !q.fits(m.Permits)) {
			t.stats.Refused++
			return Grant{}, &ResourceError{Err: ErrBusy, Resource: r}
		}
		if req.Tolerate > 0 && q.tolerateLen() > req.Tolerate {
			t.stats.Refused++
			return Grant{}, &ResourceError{Err: ErrTolerate, Resource: r}
		}
		if q.n >= t.maxQueue {
			return Grant{}, ErrQueueFull
		}
	}
	if mine != nil && foreign {
		return Grant{}, &ResourceError{Err: ErrOwnerConflict, Resource: req.Resources[mineRes]}
	}
	if mine != nil {
		return t.reenter(now, s, mine, req)
	}
	if req.Try && t.holding() {
		t.stats.Refused++
		return Grant{}, &ResourceError{Err: ErrBusy, Resource: req.Resources[0]}
	}
	if s.n >= t.maxPerSess {
		return Grant{}, ErrSessionLimit
	}
	if t.fits(s, k, size) != nil {
		if err := t.checkCaps(s, req, k, size); err != nil {
			return Grant{}, err
		}
	}

	l := t.newLock(k)
	l.ttl, l.created, l.owner = req.TTL, now, req.Owner
	if req.NoReentry {
		l.flags = flagNoReentry
	}
	b := int64(len(req.Owner))
	ahead := 0
	for i, r := range req.Resources {
		q := t.queues[r]
		if q == nil {
			q = t.newQueue(r)
		} else if q.tail.l == l {
			continue // duplicate resource
		}
		n := &l.nodes[i]
		n.l = l
		ahead = max(ahead, q.n)
		t.enqueue(q, n, req.modeAt(i))
		b += int64(len(r))
	}
	t.entries += int(l.live)
	t.bytes += b
	s.bytes += b
	s.add(l)
	if l.owner != "" {
		t.ownerAdd(l)
	}
	t.stats.Requests++
	t.seq++
	l.seq = t.seq
	if l.waiting == 0 {
		if !t.holding() {
			t.grant(now, l)
			return Grant{ID: l.id, Granted: true, Token: l.token, ExpiresAt: l.deadline}, nil
		}
		t.addReady(l)
	}
	if req.Timeout > 0 {
		l.deadline = now + int64(req.Timeout)
		t.heap.push(deadline{at: l.deadline, l: l})
	}
	return Grant{ID: l.id, Ahead: ahead}, nil
}

// enqueue puts n, a node of a new request, at the tail of q in mode m,
// and admits it if it is compatible with everything ahead of it.
func (t *Table) enqueue(q *queue, n *node, m Mode) {
	l := n.l
	n.permits = m.Permits
	if m.Permits > 0 {
		if q.nshared == 0 {
			q.of = m.Of
		}
		q.nshared++
	}
	if t.plant != 0 && t.barge(q, n) {
		return
	}
	q.pushBack(n)
	l.live++
	if q.gate == nil && q.fits(n.permits) {
		q.admit(n)
		return
	}
	if q.gate == nil {
		q.gate = n
	}
	l.waiting++
}

// checkCaps reports whether a new request of session s, naming k resources
// whose names and owner add up to size bytes (duplicates included), fits
// the session's bytes cap and the Table's caps, and counts a refusal.
// Duplicates are folded, at O(k²), only when the sums with duplicates do
// not fit.
func (t *Table) checkCaps(s *session, req *Request, k int, size int64) error {
	err := t.fits(s, k, size)
	if err != nil && k > 1 {
		k, size = distinctSize(req.Resources)
		err = t.fits(s, k, size+int64(len(req.Owner)))
	}
	if err == ErrServerFull {
		t.stats.ServerFull++
	}
	return err
}

// fits reports whether a new request of session s with k entries and size
// name bytes fits the caps.
func (t *Table) fits(s *session, k int, size int64) error {
	switch {
	case s.bytes+size > t.maxSessB:
		return ErrSessionLimit
	case t.live >= t.maxLocks || t.entries+k > t.maxEntries || t.bytes+size > t.maxBytes:
		return ErrServerFull
	}
	return nil
}

// distinctSize returns the number of distinct names in res and the sum of
// their lengths, at O(k²).
func distinctSize(res []string) (int, int64) {
	n, size := 0, int64(0)
	for i, r := range res {
		if !slices.Contains(res[:i], r) {
			n++
			size += int64(len(r))
		}
	}
	return n, size
}

// sizeOf returns l's name bytes: the names of the queues it is in and its
// owner. It costs O(k).
func (t *Table) sizeOf(l *lock) int64 {
	b := int64(len(l.owner))
	for i := range l.nodes {
		if q := l.nodes[i].q; q != nil {
			b += int64(len(q.name))
		}
	}
	return b
}

// reenter handles an owner asking again, through Lock, for a lock it holds:
// the lock is renewed and moves into req's session. A move is reported to
// the session the lock leaves (Released with Moved): from then on only the
// new session holds it, and that session's end drops it, so the old one
// must stop believing it holds it. A re-entry from another session never
// shortens the lock (see setExpiry): the session it leaves may still
// believe it holds the lock until the Released event reaches it.
func (t *Table) reenter(now int64, s *session, l *lock, req *Request) (Grant, error) {
	// Every resource of req is held by l; the request must name all of them.
	if distinct(req.Resources) != int(l.live) {
		return Grant{}, &ResourceError{Err: ErrOwnerConflict, Resource: req.Resources[0]}
	}
	// In the same modes: no upgrade, no downgrade.
	for i, r := range req.Resources {
		q := t.queues[r]
		if q.mode(l.nodeIn(q)) != req.modeAt(i) {
			return Grant{}, &ResourceError{Err: ErrModeChange, Resource: r}
		}
	}
	from := l.sess
	own := from == s && s.id != ""
	if from != s {
		b := t.sizeOf(l)
		if s.n >= t.maxPerSess || s.bytes+b > t.maxSessB {
			return Grant{}, ErrSessionLimit
		}
		from.del(l)
		from.bytes -= b
		s.add(l)
		s.bytes += b
		t.emit(Event{Kind: Released, ID: l.id, Session: from.id, Owner: l.owner, Token: l.token, Moved: true, Since: l.since()})
	}
	t.setExpiry(now, l, req.TTL, own)
	// The answer tells the caller it holds the lock, as it is now, under
	// this ID: Extend finds it again after a partial Release.
	l.flags &^= flagPartial
	t.stats.Requests++
	return Grant{ID: l.id, Granted: true, Renewed: true, Token: l.token, ExpiresAt: l.deadline}, nil
}

// setExpiry sets the granted lock l's expiry for a renewal of ttl at now.
// From the lock's own session (own) the expiry becomes now + ttl exactly, and
// the lock's TTL becomes ttl. From anywhere else it never moves earlier: it
// becomes max(expiry, now + ttl), and the TTL changes only if the expiry
// moves. The holder computes how long it may believe it holds the lock from
// its own requests; an expiry shortened by someone else would let the lock
// go to another while the holder still believes it holds it.
func (t *Table) setExpiry(now int64, l *lock, ttl time.Duration, own bool) {
	at := now + int64(ttl)
	if !own && at <= l.deadline {
		return
	}
	l.ttl = ttl
	l.deadline = at
	t.heap[l.hidx].at = at
	t.heap.fix(int(l.hidx))
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
	switch {
	case k == 1:
		l.nodes = l.one[:]
	case cap(l.nodes) >= k && &l.nodes[:1][0] != &l.one[0]:
		l.nodes = l.nodes[:k]
	default:
		l.nodes = make([]node, k)
	}
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
	for i := 0; i < 4; i++ {
		l.id[i] = byte(idx >> (8 * i))
	}
	for i := 0; i < 8; i++ {
		l.id[4+i] = byte(a >> (8 * i))
	}
	for i := 0; i < 4; i++ {
		l.id[12+i] = byte(b >> (8 * i))
	}
	t.live++
	return l
}

// lookup returns the live request with this id, or nil.
func (t *Table) lookup(id ID) *lock {
	idx := uint32(id[0]) | uint32(id[1])<<8 | uint32(id[2])<<16 | uint32(id[3])<<24
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
	idx := uint32(l.id[0]) | uint32(l.id[1])<<8 | uint32(l.id[2])<<16 | uint32(l.id[3])<<24
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
	nodes := l.nodes
	clear(nodes)
	*l = lock{hidx: -1}
	if &nodes[0] != &l.one[0] {
		l.nodes = nodes[:0]
	}
	if len(t.spare) < maxSpare {
		t.spare = append(t.spare, l)
	}
}

// since is when l was granted, or made if it is waiting.
func (l *lock) since() int64 {
	if l.state == stateGranted {
		return l.granted
	}
	return l.created
}

func (t *Table) grant(now int64, l *lock) {
	if l.hidx >= 0 {
		t.heap.remove(int(l.hidx))
	}
	l.state = stateGranted
	l.granted = now
	l.token = t.next
	t.next++
	l.deadline = now + int64(l.ttl)
	t.heap.push(deadline{at: l.deadline, l: l})
	t.held++
	t.stats.Granted++
}

// ---- extend, unlock, release ----

// Extend renews a granted lock by id for ttl and returns its expiry (ns).
// from is the caller's session. From the lock's own session the expiry
// becomes now + ttl. From any other session, the empty one included, it
// never moves earlier: it becomes max(expiry, now + ttl), and the lock's TTL
// changes only if the expiry moves; the returned expiry is the lock's. It
// returns ErrNotFound for an unknown id, for a lock revoked by Evict, and
// for a lock that a partial Release took resources from (its holder was
// told it no longer holds it; Renew by owner on exactly the rest still
// finds it), ErrNotGranted for a waiting request and ErrInvalidTTL for a
// ttl not in (0, MaxTTL].
func (t *Table) Extend(now int64, id ID, ttl time.Duration, from string) (int64, error) {
	now = t.advance(now)
	l := t.lookup(id)
	switch {
	case l == nil || l.flags&(flagPartial|flagRevoked) != 0:
		t.stats.ExtendFails++
		return 0, ErrNotFound
	case l.state != stateGranted:
		t.stats.ExtendFails++
		return 0, ErrNotGranted
	case ttl <= 0 || ttl > t.maxTTL:
		t.stats.ExtendFails++
		return 0, ErrInvalidTTL
	}
	t.setExpiry(now, l, ttl, t.own(l, from))
	t.stats.Extended++
	return l.deadline, nil
}

// own reports whether from, a caller's session, is l's session. The empty
// session is never a lock's own.
func (t *Table) own(l *lock, from string) bool { return from != "" && l.sess.id == from }

// Unlock removes a granted or waiting lock from every queue and grants what
// becomes grantable. from is the caller's session: a granted lock unlocked
// from any other session (the empty one included) is reported to its own
// session as Released, so that its holder learns at once that it no longer
// holds it. Unlocking a waiting request reports nothing to its session,
// whoever unlocks it, nor unlocking a lock revoked by Evict (its session
// was told at the eviction). It returns ErrNotFound for an unknown id; a
// lock that a partial Release took resources from, or that Evict revoked,
// is still found.
func (t *Table) Unlock(now int64, id ID, from string) error {
	t.advance(now)
	l := t.lookup(id)
	if l == nil {
		return ErrNotFound
	}
	t.stats.Unlocked++
	if l.state == stateGranted && !t.own(l, from) && l.flags&flagRevoked == 0 {
		t.emit(Event{Kind: Released, ID: l.id, Session: l.sess.id, Owner: l.owner, Token: l.token, Since: l.since()})
	}
	t.remove(l)
	return nil
}

// Renew renews, by owner, the granted lock of owner whose resources are
// exactly resources (duplicates folded, in any order) for ttl. from is the
// caller's session: from the lock's own session its expiry becomes
// now + ttl; from any other it never moves earlier, as with Extend. The
// lock keeps its ID and token and stays in its session; no token is used.
// A lock that a partial Release took resources from stays unknown to
// Extend. It returns ErrInvalidOwner (empty owner too),
// ErrInvalidResource, ErrTooManyResources or ErrInvalidTTL for a malformed
// call, and ErrNotFound if owner holds no such lock: also when its lock holds
// more or fewer resources (after a partial Release it holds only the rest,
// and only exactly the rest is found), when the lock is still waiting,
// when it was taken with Request.NoReentry, and when Evict revoked it. It
// costs O(k² + log n), k the number of resources.
func (t *Table) Renew(now int64, owner string, resources []string, ttl time.Duration, from string) (Grant, error) {
	now = t.advance(now)
	switch {
	case owner == "" || !t.checkOwner(owner):
		return Grant{}, ErrInvalidOwner
	case len(resources) == 0:
		return Grant{}, ErrInvalidResource
	case len(resources) > t.maxRes:
		return Grant{}, ErrTooManyResources
	case ttl <= 0 || ttl > t.maxTTL:
		return Grant{}, ErrInvalidTTL
	}
	for _, r := range resources {
		if err := CheckName(r, t.maxName); err != nil {
			return Grant{}, err
		}
	}
	l := t.ownerLock(owner, resources)
	if l == nil {
		t.stats.ExtendFails++
		return Grant{}, ErrNotFound
	}
	t.setExpiry(now, l, ttl, t.own(l, from))
	t.stats.Extended++
	return Grant{ID: l.id, Granted: true, Renewed: true, Token: l.token, ExpiresAt: l.deadline}, nil
}

// ownerLock returns owner's granted, re-entrant lock that holds exactly
// resources, or nil. An owner may hold several shared locks on one
// resource: each of them is tried.
func (t *Table) ownerLock(owner string, resources []string) *lock {
	q := t.queues[resources[0]]
	if q == nil {
		return nil
	}
	k := distinct(resources)
	var found *lock
	t.ownerOn(q, owner, func(n *node) bool {
		l := n.l
		if l.flags&(flagNoReentry|flagRevoked) != 0 || int(l.live) != k {
			return true
		}
		for _, r := range resources[1:] {
			if q := t.queues[r]; q == nil || l.nodeIn(q) == nil {
				return true
			}
		}
		found = l
		return false
	})
	return found
}

// Release releases, for each named resource, the owner's granted lock on it.
// It reports true only if every resource was held by owner when it was
// called. Resources held by another owner, or only waited for, are left
// alone; a name given twice counts once. Releasing some resources of a
// multi-resource lock leaves it holding the rest and reports it as Released
// with Partial set; a lock left with none is removed and reported as
// Released. From then on Extend by id no longer finds a partially released
// lock (its holder was told it is gone); Renew by owner on exactly the rest
// and Unlock by id still do, and a re-entry on exactly the rest, which
// answers with the lock's ID, makes Extend find it again. Waiters are
// granted only after everything named has been released, so no lock
// granted by this call is released by it. A lock revoked by Evict is still
// its owner's to release, at once, and nothing more is reported for it.
func (t *Table) Release(now int64, owner string, resources []string) bool {
	return t.ReleaseIn(now, owner, resources, "")
}

// ReleaseIn is Release confined to the resources whose name starts with
// prefix (the scope; "" is every resource): a named resource outside the
// scope is left alone, as one the owner does not hold, and makes the answer
// false. It costs what Release costs.
func (t *Table) ReleaseIn(now int64, owner string, resources []string, prefix string) bool {
	t.advance(now)
	if owner == "" || len(resources) == 0 {
		return false
	}
	all := true
	cut := t.cut[:0]
	for _, r := range resources {
		q := t.queues[r]
		if q == nil || !strings.HasPrefix(r, prefix) {
			all = false
			continue
		}
		n := len(cut)
		t.ownerOn(q, owner, func(nd *node) bool {
			cut = append(cut, nd)
			return true
		})
		if len(cut) == n {
			all = false
		}
	}
	t.releaseCut(cut)
	return all
}

// releaseCut unqueues the nodes of cut (granted locks' entries; a node may
// appear twice), reports each lock they belong to as Released (Partial if
// it keeps other resources), removes the locks left with none, and then
// grants what became grantable.
func (t *Table) releaseCut(cut []*node) {
	t.deferring = true
	for _, n := range cut {
		if n.q == nil {
			continue // named twice
		}
		l := n.l
		b := int64(len(n.q.name))
		t.unqueue(n)
		l.live--
		l.flags |= flagCut
		t.entries--
		t.bytes -= b
		l.sess.bytes -= b
	}
	for _, n := range cut {
		l := n.l
		if l == nil || l.flags&flagCut == 0 {
			continue // removed, or reported already
		}
		l.flags &^= flagCut
		if l.live > 0 {
			l.flags |= flagPartial
		}
		if l.flags&flagRevoked == 0 {
			t.emit(Event{Kind: Released, ID: l.id, Session: l.sess.id, Owner: l.owner, Token: l.token, Partial: l.live > 0, Since: l.since()})
		}
		if l.live == 0 {
			t.stats.Unlocked++
			t.remove(l)
		}
	}
	clear(cut)
	t.cut = cut[:0]
	t.flushGrants()
}

// ReleaseAll releases every granted lock of owner, reporting each as Released
// (except locks revoked by Evict, whose sessions were told already), and
// returns how many it released. Waiting requests of owner stay queued,
// even those that the release lets through: they are granted after the
// releases, and stay granted.
func (t *Table) ReleaseAll(now int64, owner string) int {
	t.advance(now)
	ol := t.owners[owner]
	if ol == nil || owner == "" {
		return 0
	}
	t.deferring = true
	n := 0
	for l := ol.head; l != nil; {
		next := l.onext
		if l.state == stateGranted {
			n++
			t.stats.Unlocked++
			if l.flags&flagRevoked == 0 {
				t.emit(Event{Kind: Released, ID: l.id, Session: l.sess.id, Owner: l.owner, Token: l.token, Since: l.since()})
			}
			t.remove(l)
		}
		l = next
	}
	t.flushGrants()
	return n
}

// ReleaseAllIn is ReleaseAll confined to the resources whose name starts
// with prefix (the scope; "" is ReleaseAll): it releases, of each granted
// lock of owner, the resources in the scope, and returns how many locks it
// released wholly or in part. A lock with no resource in the scope is not
// touched; one with resources on both sides keeps those outside, and is
// reported as Released with Partial set, as Release does. It costs
// O(locks of owner · k).
func (t *Table) ReleaseAllIn(now int64, owner, prefix string) int {
	if prefix == "" {
		return t.ReleaseAll(now, owner)
	}
	t.advance(now)
	ol := t.owners[owner]
	if ol == nil || owner == "" {
		return 0
	}
	cut := t.cut[:0]
	n := 0
	for l := ol.head; l != nil; l = l.onext {
		if l.state != stateGranted {
			continue
		}
		k := len(cut)
		for i := range l.nodes {
			if nd := &l.nodes[i]; nd.q != nil && strings.HasPrefix(nd.q.name, prefix) {
				cut = append(cut, nd)
			}
		}
		if len(cut) > k {
			n++
		}
	}
	t.releaseCut(cut)
	return n
}

// Evict revokes, for each named resource, every granted lock among its
// queue's admitted entries (the holder, or all the shared holders), each
// whole (all its resources), whoever holds it: it reports the lock to its
// session as Released at once, and sets its expiry to min(expiry, now +
// SessionGrace). It returns how many locks it newly revoked. Admitted
// entries whose request still waits for another resource, and locks already
// revoked, are left alone, as is a free resource; a lock named through
// several of its resources counts once. It returns ErrInvalidResource or
// ErrTooManyResources for a malformed call, and then changes nothing. It
// costs O(a log n) for a admitted entries on the named resources.
//
// A revoked lock keeps its resources until that expiry, and then ends as
// any lock does, reported as Expired; nothing is granted by Evict itself.
// Its holder may be slow, or disconnected and in its grace period, and
// believes it holds the lock until it hears of the eviction, and at most
// until its last answered request (answered no later than now) plus the
// session grace: the waiters get the lock only when that belief has ended.
// A revoked lock is nobody's any more: Extend by id returns ErrNotFound,
// Renew does not find it, and a re-entry by its owner does not renew it but
// queues behind it like any request. Its holder can still end it at once,
// as its own act: Unlock by id, Release and ReleaseAll free it (reporting
// nothing more to its session). With SessionGrace < 0 a session's locks go
// as soon as it detaches, and evicted locks go at once too: they are
// removed (no Expired follows), and their waiters granted only after every
// named lock is gone, so no lock granted by this call is evicted by it.
func (t *Table) Evict(now int64, resources []string) (int, error) {
	now = t.advance(now)
	switch {
	case len(resources) == 0:
		return 0, ErrInvalidResource
	case len(resources) > t.maxRes:
		return 0, ErrTooManyResources
	}
	for _, r := range resources {
		if err := CheckName(r, t.maxName); err != nil {
			return 0, err
		}
	}
	if t.cfg.SessionGrace < 0 {
		return t.evictNow(resources), nil
	}
	at := now + int64(t.cfg.SessionGrace)
	n := 0
	for _, r := range resources {
		q := t.queues[r]
		if q == nil {
			continue
		}
		nd := q.head
		for range q.nadm {
			l := nd.l
			nd = nd.next
			if l.state != stateGranted || l.flags&flagRevoked != 0 {
				continue
			}
			l.flags |= flagRevoked
			n++
			t.stats.Evicted++
			t.emit(Event{Kind: Released, ID: l.id, Session: l.sess.id, Owner: l.owner, Token: l.token, Since: l.since(), Revoked: true})
			if at < l.deadline {
				l.deadline = at
				t.heap[l.hidx].at = at
				t.heap.fix(int(l.hidx))
			}
		}
	}
	return n, nil
}

// evictNow is Evict with no session grace: it removes each evicted lock at
// once, and grants waiters only after all of them are gone.
func (t *Table) evictNow(resources []string) int {
	cut := t.cut[:0]
	for _, r := range resources {
		q := t.queues[r]
		if q == nil {
			continue
		}
		nd := q.head
		for range q.nadm {
			if nd.l.state == stateGranted {
				cut = append(cut, nd)
			}
			nd = nd.next
		}
	}
	t.deferring = true
	n := 0
	for _, nd := range cut {
		l := nd.l
		if l == nil {
			continue // removed through another of its resources
		}
		n++
		t.stats.Evicted++
		t.emit(Event{Kind: Released, ID: l.id, Session: l.sess.id, Owner: l.owner, Token: l.token, Since: l.since(), Revoked: true})
		t.remove(l)
	}
	clear(cut)
	t.cut = cut[:0]
	t.flushGrants()
	return n
}

// flushGrants ends deferring and grants, in the order they became
// grantable, the deferred requests that are still live and waiting. While
// grants are held it leaves them in ready for endHold.
func (t *Table) flushGrants() {
	t.deferring = false
	if t.holding() {
		return
	}
	for i, r := range t.ready {
		t.ready[i] = readyLock{}
		if r.grantable(t) {
			t.grantEmit(r.l)
		}
	}
	t.ready = t.ready[:0]
}

// grantable reports whether r is still the same live request, waiting, at
// the head of all its queues.
func (r *readyLock) grantable(t *Table) bool {
	l := r.l
	return t.lookup(r.id) == l && l.state == stateWaiting && l.waiting == 0
}

// addReady puts l, which just became grantable, in ready. While grants are
// held, ready can collect many requests that went away since; it is
// compacted when it outgrows the live requests, so its size stays O(n) and
// the cost amortised O(1).
func (t *Table) addReady(l *lock) {
	if len(t.ready) >= 2*t.live+64 {
		t.ready = slices.DeleteFunc(t.ready, func(r readyLock) bool { return !r.grantable(t) })
	}
	t.ready = append(t.ready, readyLock{l: l, id: l.id})
}

// ---- holding grants ----

// HoldGrants holds every grant until until (ns): from now on nothing is
// granted before that time. Requests are still accepted and queued as
// usual; Tolerate, queue limits, wait timeouts, expiries, Extend, Renew,
// re-entry (an owner renewing a lock it already holds), Unlock, Release and
// sessions all work as usual, but a request that would be granted waits
// instead, and a try-lock (Request.Try) is refused with ErrBusy (naming its
// first resource, or the first busy one). The end of the hold is a deadline
// like the others (NextDeadline reports it): at until, the first call that
// processes deadlines grants, in arrival order and with a Granted event
// each, every request that is then at the head of all its queues; that
// costs O(m log m) for m such requests. HoldGrants itself costs O(log n).
//
// A hold only ever grows: an until earlier than the hold in force, or not
// after now, changes nothing. A server that starts after a crash holds
// grants for its session grace period, so that no holder of the previous
// run can still believe it holds a lock when something is granted again.
func (t *Table) HoldGrants(now, until int64) {
	now = t.advance(now)
	if until <= now || until <= t.holdUntil && t.holding() {
		return
	}
	t.holdUntil = until
	if t.holding() {
		t.heap[t.hold.hidx].at = until
		t.heap.fix(int(t.hold.hidx))
		return
	}
	t.heap.push(deadline{at: until, s: &t.hold})
}

// HoldUntil returns the end (ns) of the hold on grants in force, or 0 if
// grants are not held.
func (t *Table) HoldUntil() int64 {
	if t.holding() {
		return t.holdUntil
	}
	return 0
}

// holding reports whether grants are held.
func (t *Table) holding() bool { return t.hold.hidx >= 0 }

// endHold ends the hold on grants, whose deadline has just been removed from
// the heap, and grants in arrival order every request that became
// grantable during it and still is.
func (t *Table) endHold() {
	t.holdUntil = 0
	rs := slices.DeleteFunc(t.ready, func(r readyLock) bool { return !r.grantable(t) })
	slices.SortFunc(rs, func(a, b readyLock) int { return cmp.Compare(a.l.seq, b.l.seq) })
	for i, r := range rs {
		rs[i] = readyLock{}
		t.grantEmit(r.l)
	}
	t.ready = rs[:0]
}

// remove deletes l everywhere and grants what becomes grantable.
func (t *Table) remove(l *lock) {
	if l.hidx >= 0 {
		t.heap.remove(int(l.hidx))
	}
	if l.state == stateGranted {
		t.held--
	}
	s := l.sess
	s.del(l)
	if l.owner != "" {
		t.ownerDel(l)
	}
	t.entries -= int(l.live)
	b := int64(len(l.owner))
	// Unlink every node first, then grant, so a grant never sees l.
	for i := range l.nodes {
		if n := &l.nodes[i]; n.q != nil {
			b += int64(len(n.q.name))
			t.unqueue(n)
		}
	}
	t.bytes -= b
	s.bytes -= b
	t.freeLock(l)
}

// unqueue unlinks n from its queue and admits the entries behind it that
// now fit; each whose request is then admitted in all its queues is
// granted (or, while deferring, put in ready), in queue order.
func (t *Table) unqueue(n *node) {
	q := n.q
	switch {
	case n.adm:
		q.nadm--
		if t.plant != plantLeak || q.of == 0 {
			q.used -= uint64(n.permits)
		}
		n.adm = false
	case q.gate == n:
		q.gate = n.next
	}
	if n.permits > 0 {
		q.nshared--
	}
	q.unlink(n)
	if q.n == 0 {
		delete(t.queues, q.name)
		t.names.Delete(keyOf(q.name))
		*q = queue{}
		t.free = append(t.free, q)
		return
	}
	// Admit what now fits: O(entries admitted).
	for g := q.gate; g != nil && q.fits(g.permits); g = q.gate {
		q.admit(g)
		q.gate = g.next
		h := g.l
		h.waiting--
		if h.waiting == 0 {
			if t.deferring || t.holding() {
				t.addReady(h)
				continue
			}
			t.grantEmit(h)
		}
	}
}

// grantEmit grants the waiting request l at t.now and reports it.
func (t *Table) grantEmit(l *lock) {
	t.grant(t.now, l)
	t.emit(Event{Kind: Granted, ID: l.id, Session: l.sess.id, Owner: l.owner, Token: l.token, ExpiresAt: l.deadline, Since: l.created})
}

// ---- time ----

// Advance processes, in deadline order, every expiry, wait timeout and
// session grace period due at or before now.
func (t *Table) Advance(now int64) { t.advance(now) }

func (t *Table) advance(now int64) int64 {
	if now > t.now {
		t.now = now
	}
	now = t.now
	for len(t.heap) > 0 && t.heap[0].at <= now {
		d := t.heap[0]
		if d.s != nil {
			t.heap.remove(0)
			if d.s == &t.hold {
				t.endHold()
			} else {
				t.dropSession(d.s)
			}
			continue
		}
		l := d.l
		if l.state == stateGranted {
			t.stats.Expired++
			t.emit(Event{Kind: Expired, ID: l.id, Session: l.sess.id, Owner: l.owner, Token: l.token, Since: l.since(),
				Revoked: l.flags&flagRevoked != 0})
		} else {
			t.stats.TimedOut++
			t.emit(Event{Kind: TimedOut, ID: l.id, Session: l.sess.id, Owner: l.owner, Since: l.created})
		}
		t.remove(l)
	}
	return now
}

// Now returns the latest time (ns) the Table has seen: time never runs
// backwards, so a call with an earlier now runs at this time.
func (t *Table) Now() int64 { return t.now }

// Failover postpones to until every pending deadline that would fall before
// it: the expiry of every granted lock (revoked ones included), the wait
// timeout of every waiting request and the end of every detached session's
// grace period that is due before until is set to until exactly; later
// ones, and the end of a hold on grants, are left alone. It first processes
// what is due at now, like every method, and returns how many deadlines it
// moved. Nothing is reported: a lock keeps its TTL, and its expiry, as
// Lookup shows it, is until.
//
// It is what a replicated service applies when a new leader takes over,
// with until = the end of the election window: while no leader was there to
// hear them, holders could not extend their locks, detached sessions could
// not come back and waiters could not be granted; the election itself must
// not rob a holder of its lock, end a session or time a waiter out. Moving a
// deadline later never lets two believe they hold one resource. It costs
// O(n) for n pending deadlines.
func (t *Table) Failover(now, until int64) int {
	t.advance(now)
	n := 0
	for i := range t.heap {
		d := &t.heap[i]
		if d.at >= until || d.s == &t.hold {
			continue
		}
		d.at = until
		if d.l != nil {
			d.l.deadline = until
		}
		n++
	}
	if n > 0 {
		t.heap.init()
	}
	return n
}

// NextDeadline returns the earliest pending deadline (expiry, wait timeout,
// end of a grace period or of a hold on grants), or false if there is none.
func (t *Table) NextDeadline() (int64, bool) {
	if len(t.heap) == 0 {
		return 0, false
	}
	return t.heap[0].at, true
}

// ---- owners ----

func (t *Table) ownerAdd(l *lock) {
	ol := t.owners[l.owner]
	if ol == nil {
		ol = &ownerList{}
		t.owners[l.owner] = ol
	}
	l.oprev = nil
	l.onext = ol.head
	if ol.head != nil {
		ol.head.oprev = l
	}
	ol.head = l
	ol.n++
}

func (t *Table) ownerDel(l *lock) {
	ol := t.owners[l.owner]
	if l.oprev != nil {
		l.oprev.onext = l.onext
	} else {
		ol.head = l.onext
	}
	if l.onext != nil {
		l.onext.oprev = l.oprev
	}
	l.oprev, l.onext = nil, nil
	if ol.n--; ol.n == 0 {
		delete(t.owners, l.owner)
	}
}

// ---- queues ----

// nameDegree is the degree of the B-tree of queue names: each node holds
// up to 2*nameDegree-1 names. Chosen by the engine benchmarks.
const nameDegree = 16

// nameKey is a queue name in the B-tree. pre, its first 8 bytes, orders
// most pairs of names without reading them: a comparison that reads the
// names costs a cache miss each in a large tree.
type nameKey struct {
	pre  uint64 // the first 8 bytes of name, big-endian, zero-padded
	name string
}

func keyOf(name string) nameKey {
	var b [8]byte
	copy(b[:], name)
	return nameKey{pre: binary.BigEndian.Uint64(b[:]), name: name}
}

// nameLess orders queue names by bytes, as <. Names that differ in their
// padded first 8 bytes are ordered by pre; if they differ at byte i there,
// either both have a byte at i, or the shorter one ends at i and is a
// prefix of the other (a padding 0 differs only from a non-zero byte). It
// is a variable so that tests can count the comparisons of a listing.
var nameLess btree.LessFunc[nameKey] = func(a, b nameKey) bool {
	if a.pre != b.pre {
		return a.pre < b.pre
	}
	return a.name < b.name
}

func (t *Table) newQueue(name string) *queue {
	var q *queue
	if n := len(t.free); n > 0 {
		q = t.free[n-1]
		t.free = t.free[:n-1]
	} else {
		q = new(queue)
	}
	q.name, q.list = name, &t.busy
	t.queues[name] = q
	t.names.ReplaceOrInsert(keyOf(name))
	return q
}

func (q *queue) pushBack(n *node) {
	n.q = q
	n.prev = q.tail
	n.next = nil
	if q.tail != nil {
		q.tail.next = n
	} else {
		q.head = n
	}
	q.tail = n
	q.n++
	if q.n == 2 {
		l := q.list
		q.cprev, q.cnext = nil, l.head
		if l.head != nil {
			l.head.cprev = q
		}
		l.head = q
		l.n++
	}
}

func (q *queue) unlink(n *node) {
	if n.prev != nil {
		n.prev.next = n.next
	} else {
		q.head = n.next
	}
	if n.next != nil {
		n.next.prev = n.prev
	} else {
		q.tail = n.prev
	}
	n.prev, n.next, n.q = nil, nil, nil
	q.n--
	if q.n == 1 {
		l := q.list
		if q.cprev != nil {
			q.cprev.cnext = q.cnext
		} else {
			l.head = q.cnext
		}
		if q.cnext != nil {
			q.cnext.cprev = q.cprev
		}
		q.cprev, q.cnext = nil, nil
		l.n--
	}
}

// ---- inspection ----

// Stats returns the counters and sizes.
func (t *Table) Stats() Stats {
	s := t.stats
	s.Live = t.live
	s.Entries = t.entries
	s.NameBytes = t.bytes
	s.Held = t.held
	s.Queues = len(t.queues)
	s.Sessions = len(t.sessions)
	s.LastToken = t.next - 1
	s.HoldUntil = t.HoldUntil()
	return s
}

// LastToken returns the last fencing token given (FirstToken-1 before the
// first grant).
func (t *Table) LastToken() uint64 { return t.next - 1 }

// LockInfo describes one live request.
type LockInfo struct {
	ID        ID
	Session   string
	Owner     string
	Resources []string
	Modes     []Mode // the modes of Resources, in their order; nil: all exclusive
	Granted   bool
	Revoked   bool // evicted: nobody's any more, ends at Deadline (see Evict)
	Token     uint64
	TTL       time.Duration
	Created   int64
	GrantedAt int64 // when it was granted (ns); 0 while waiting, and for a lock restored from a snapshot
	Deadline  int64 // expiry if granted, wait deadline if waiting (0: none)
}

func (t *Table) info(l *lock) LockInfo {
	li := LockInfo{ID: l.id, Session: l.sess.id, Owner: l.owner, Granted: l.state == stateGranted,
		Revoked: l.flags&flagRevoked != 0, Token: l.token, TTL: l.ttl, Created: l.created, GrantedAt: l.granted, Deadline: l.deadline}
	for i := range l.nodes {
		if q := l.nodes[i].q; q != nil {
			li.Resources = append(li.Resources, q.name)
			if l.nodes[i].permits != 0 && li.Modes == nil {
				li.Modes = make([]Mode, len(li.Resources)-1, cap(li.Resources))
			}
			if li.Modes != nil {
				li.Modes = append(li.Modes, q.mode(&l.nodes[i]))
			}
		}
	}
	return li
}

// Lookup returns the request with this id.
func (t *Table) Lookup(id ID) (LockInfo, bool) {
	l := t.lookup(id)
	if l == nil {
		return LockInfo{}, false
	}
	return t.info(l), true
}

// Locks calls fn for up to limit live requests (all if limit <= 0), newest
// first, until fn returns false. It costs O(requests passed to fn).
func (t *Table) Locks(limit int, fn func(LockInfo) bool) {
	i := 0
	for l := t.all; l != nil; l = l.anext {
		if limit > 0 && i >= limit {
			return
		}
		i++
		if !fn(t.info(l)) {
			return
		}
	}
}

// SessionLocks calls fn for every live request of session id, newest first.
// It costs O(requests of the session).
func (t *Table) SessionLocks(id string, fn func(LockInfo)) {
	s := t.sessions[id]
	if s == nil {
		return
	}
	for l := s.head; l != nil; l = l.snext {
		fn(t.info(l))
	}
}

// QueueEntry is one request in a resource's queue.
type QueueEntry struct {
	ID        ID
	Session   string
	Owner     string
	Mode      Mode // how it takes the resource
	Granted   bool
	Revoked   bool // evicted: nobody's any more, ends at Deadline (see Evict)
	Token     uint64
	Created   int64
	GrantedAt int64 // when it was granted (ns); 0 while waiting, and for a lock restored from a snapshot
	Deadline  int64
}

// QueueInfo is one resource's queue, head (the holder or the reserving
// waiter) first; the shared holders of a resource, or its permit holders,
// come first in arrival order.
type QueueInfo struct {
	Resource string
	Entries  []QueueEntry // the queue, head first; QueuesPage may cut it short
	Len      int          // the queue's full number of entries
}

func queueEntry(q *queue, n *node) QueueEntry {
	l := n.l
	return QueueEntry{ID: l.id, Session: l.sess.id, Owner: l.owner, Mode: q.mode(n), Granted: l.state == stateGranted,
		Revoked: l.flags&flagRevoked != 0, Token: l.token, Created: l.created, GrantedAt: l.granted, Deadline: l.deadline}
}

// Head returns the request at the head of resource's queue: its holder
// (the oldest of its holders, for a resource held shared), or the waiting
// request that reserves it. False if nobody holds or waits for resource. It
// costs O(k), k the request's resources.
func (t *Table) Head(resource string) (LockInfo, bool) {
	q := t.queues[resource]
	if q == nil {
		return LockInfo{}, false
	}
	return t.info(q.head.l), true
}

// QueuesPage calls fn, in name order, for the queues whose resource starts
// with prefix and sorts after after (all of them if after is ""), at most
// maxQueues of them and at most maxEntries entries in total: the last
// queue's Entries may be cut short (Len is always its full length), and no
// queue follows one that exhausted the entries. It stops early when fn
// returns false. It returns the last resource passed to fn when more
// queues match after it (pass it as after for the next page), and ""
// otherwise. Limits below 1 count as 1. It seeks the first name in the
// ordered index of queue names and walks on from there, so it costs
// O(log Q + m + e) time, for Q queues, m queues passed to fn and e entries,
// and O(m + e) memory, whatever the number of queues; the Entries slices of
// different calls of fn do not overlap, so fn may keep them.
func (t *Table) QueuesPage(prefix, after string, maxQueues, maxEntries int, fn func(QueueInfo) bool) (next string) {
	maxQueues, maxEntries = max(maxQueues, 1), max(maxEntries, 1)
	// page: the first maxQueues matching queues, and one more if there is.
	page := make([]*queue, 0, min(maxQueues, t.names.Len(), 1024)+1)
	total := 0
	t.names.AscendGreaterOrEqual(keyOf(max(prefix, after)), func(k nameKey) bool {
		name := k.name
		// Names with the prefix are contiguous in the order, from prefix
		// on: the first one without it ends them.
		switch {
		case name == after:
			return true
		case !strings.HasPrefix(name, prefix):
			return false
		}
		q := t.queues[name]
		page = append(page, q)
		if len(page) <= maxQueues {
			total += q.n
		}
		return len(page) <= maxQueues
	})
	buf := make([]QueueEntry, 0, min(total, maxEntries))
	for i, q := range page[:min(len(page), maxQueues)] {
		start := len(buf)
		for n := q.head; n != nil && len(buf) < cap(buf); n = n.next {
			buf = append(buf, queueEntry(q, n))
		}
		more := i+1 < len(page)
		if !fn(QueueInfo{Resource: q.name, Entries: buf[start:len(buf):len(buf)], Len: q.n}) || len(buf) == cap(buf) {
			if more {
				return q.name
			}
			return ""
		}
	}
	return ""
}

// QueueLen returns the number of entries in resource's queue, holder
// included.
func (t *Table) QueueLen(resource string) int {
	if q := t.queues[resource]; q != nil {
		return q.n
	}
	return 0
}
