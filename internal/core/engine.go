package core

import (
	"github.com/mlock-dev/mlock/internal/locktable"
)

// The engine's types, so that upper layers need not import the engine.
type (
	// ID identifies one lock request; see locktable.ID.
	ID = locktable.ID
	// Request is one lock request; see locktable.Request.
	Request = locktable.Request
	// Grant is the answer to an accepted lock request; see locktable.Grant.
	Grant = locktable.Grant
	// Event reports a change to one request; see locktable.Event.
	Event = locktable.Event
	// EventKind says what happened to a request.
	EventKind = locktable.EventKind
	// LockInfo describes one live request.
	LockInfo = locktable.LockInfo
	// QueueInfo is one resource's queue, head first.
	QueueInfo = locktable.QueueInfo
	// QueueEntry is one request in a resource's queue.
	QueueEntry = locktable.QueueEntry
	// Stats counts what the engine has done.
	Stats = locktable.Stats
	// EngineConfig configures the engine: limits, grace, first token, seed.
	EngineConfig = locktable.Config
	// ResourceError is a lock refusal (ErrBusy, ErrTolerate,
	// ErrOwnerConflict, ErrPermitsConflict, ErrModeChange) that names the
	// resource it was refused for; find it with errors.As.
	ResourceError = locktable.ResourceError
	// Mode is how a request takes one resource: exclusive, shared or k of
	// n permits; see locktable.Mode.
	Mode = locktable.Mode
)

// The modes; see locktable.Mode.
var (
	Exclusive = locktable.Exclusive
	Shared    = locktable.Shared
)

// MaxPermits is the largest permit count of a semaphore.
const MaxPermits = locktable.MaxPermits

// ParseMode parses the wire form of a mode: x, s or k/n.
var ParseMode = locktable.ParseMode

// Event kinds; see locktable.EventKind.
const (
	Granted       = locktable.Granted
	TimedOut      = locktable.TimedOut
	Expired       = locktable.Expired
	Released      = locktable.Released
	Dropped       = locktable.Dropped
	SessionClosed = locktable.SessionClosed
)

// Defaults of the engine's limits, applied to the zero fields of
// EngineConfig.
const (
	DefaultMaxResources       = locktable.DefaultMaxResources       // resources in one request
	DefaultMaxNameLen         = locktable.DefaultMaxNameLen         // bytes of a resource or owner name
	DefaultMaxLocksPerSession = locktable.DefaultMaxLocksPerSession // live requests of one session
	DefaultMaxQueueLen        = locktable.DefaultMaxQueueLen        // entries of one resource's queue
	DefaultSessionGrace       = locktable.DefaultSessionGrace       // how long a detached session lives
	DefaultMaxTTL             = locktable.DefaultMaxTTL             // longest lease
	DefaultMaxTimeout         = locktable.DefaultMaxTimeout         // longest wait
	DefaultMaxLocks           = locktable.DefaultMaxLocks           // live requests of the whole engine
	DefaultMaxEntries         = locktable.DefaultMaxEntries         // queue entries of the whole engine
	DefaultMaxNameBytes       = locktable.DefaultMaxNameBytes       // name bytes of the whole engine
	DefaultMaxSessionBytes    = locktable.DefaultMaxSessionBytes    // name bytes of one session
)

// The engine's errors, the same values: compare with errors.Is. A refusal
// that names a resource (busy, owner conflict, tolerate) wraps its sentinel
// in a *ResourceError.
var (
	ErrInvalidResource  = locktable.ErrInvalidResource
	ErrTooManyResources = locktable.ErrTooManyResources
	ErrInvalidTTL       = locktable.ErrInvalidTTL
	ErrInvalidTimeout   = locktable.ErrInvalidTimeout
	ErrInvalidTolerate  = locktable.ErrInvalidTolerate
	ErrInvalidOwner     = locktable.ErrInvalidOwner
	ErrTolerate         = locktable.ErrTolerate
	ErrBusy             = locktable.ErrBusy
	ErrQueueFull        = locktable.ErrQueueFull
	ErrSessionLimit     = locktable.ErrSessionLimit
	ErrServerFull       = locktable.ErrServerFull
	ErrNoTokens         = locktable.ErrNoTokens
	ErrUnknownSession   = locktable.ErrUnknownSession
	ErrNotFound         = locktable.ErrNotFound
	ErrNotGranted       = locktable.ErrNotGranted
	ErrOwnerConflict    = locktable.ErrOwnerConflict
	ErrInvalidMode      = locktable.ErrInvalidMode
	ErrPermitsConflict  = locktable.ErrPermitsConflict
	ErrModeChange       = locktable.ErrModeChange
)

// NoID is the ID no lock has: OpExtend of it fails with ErrNotFound and
// counts as a failed extend (for an extend that names no lock).
var NoID = locktable.NoID

// ParseID parses the 32-hex-digit form of an ID.
var ParseID = locktable.ParseID

// CheckName is the one rule for resource names: not empty, no space, no '|',
// at most maxLen bytes (no length limit if maxLen <= 0). It returns
// ErrInvalidResource for a name that breaks it, nil otherwise.
func CheckName(name string, maxLen int) error { return locktable.CheckName(name, maxLen) }

// Limit applies mlock's convention for integer limits: 0 means def, a
// negative value means no limit, anything else is the limit.
func Limit(v, def int) int { return locktable.Limit(v, def) }
