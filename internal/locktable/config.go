package locktable

import (
	"cmp"
	"fmt"
	"time"

	"github.com/mlock-dev/mlock/internal/protocol"
)

// Defaults for the zero fields of Config.
const (
	DefaultMaxResources       = 64
	DefaultMaxNameLen         = 512
	DefaultMaxLocksPerSession = 100_000
	DefaultMaxQueueLen        = 100_000
	DefaultSessionGrace       = 15 * time.Second
	DefaultMaxTTL             = protocol.DefaultMaxTTL
	DefaultMaxTimeout         = protocol.DefaultMaxTTL
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
	// TokenLimit, if not 0, bounds the tokens given: every token is below
	// it, and grants wait while the next token would not be (see
	// SetTokenLimit). 0 (the default): no bound. A server sets it to the
	// token high-water mark on disk.
	TokenLimit uint64
	// LateGrants keeps the rule of earlier builds for a waiter whose wait
	// deadline passed before the deadline processing (Advance, or the start
	// of any call) that frees its queues: it is granted at the time of the
	// processing. False (the default): it is timed out (its client gave up
	// at its deadline). A replicated log whose replicas may run earlier
	// builds sets it, so that every replica applies the log alike (see
	// SetLateGrants).
	LateGrants bool
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

// SetLateGrants puts the rule of Config.LateGrants in force (on) or out of
// it (off) for the deadline processing that follows: with it, a waiter
// whose queues are freed after its wait deadline is granted at the time of
// the processing; without it (the default), it is timed out. What is live
// stays as it is. A replicated log switches it at the same point on every
// replica (the log format in force), so that every replica applies the log
// alike.
func (t *Table) SetLateGrants(on bool) { t.lateOK = on }

// LateGrants reports whether the rule of Config.LateGrants is in force.
func (t *Table) LateGrants() bool { return t.lateOK }

// SessionGrace returns the grace period in force.
func (t *Table) SessionGrace() time.Duration { return t.cfg.SessionGrace }
