package locktable

import "errors"

// ResourceError is a refusal of Lock that names the resource it was refused
// for. Err is ErrBusy, ErrTolerate, ErrOwnerConflict, ErrPermitsConflict or
// ErrModeChange; errors.Is(err, ErrBusy) and the like see through it.
type ResourceError struct {
	Err      error  // the sentinel
	Resource string // the first busy, too long or conflicting resource
}

// Error returns the sentinel's text, ": " and the resource.
func (e *ResourceError) Error() string { return e.Err.Error() + ": " + e.Resource }

// Unwrap returns the sentinel.
func (e *ResourceError) Unwrap() error { return e.Err }

// Errors returned by Table methods. None of them changes any state: a refused
// request leaves every queue as it was. Lock returns ErrTolerate, ErrBusy and
// ErrOwnerConflict inside a *ResourceError; match them with errors.Is.
var (
	// ErrInvalidResource: a resource name is empty, longer than
	// Config.MaxNameLen, or contains a space or '|'; or the request names no
	// resource.
	ErrInvalidResource = errors.New("locktable: invalid resource name")
	// ErrTooManyResources: the request names more than Config.MaxResources
	// resources.
	ErrTooManyResources = errors.New("locktable: too many resources in one request")
	// ErrInvalidTTL: the ttl is not > 0 or above Config.MaxTTL.
	ErrInvalidTTL = errors.New("locktable: ttl out of range")
	// ErrInvalidTimeout: the wait timeout is negative or above Config.MaxTimeout.
	ErrInvalidTimeout = errors.New("locktable: timeout out of range")
	// ErrInvalidTolerate: tolerate is negative.
	ErrInvalidTolerate = errors.New("locktable: tolerate is negative")
	// ErrInvalidOwner: the owner is longer than Config.MaxNameLen or contains
	// a space.
	ErrInvalidOwner = errors.New("locktable: invalid owner")
	// ErrTolerate: a queue of the request already holds more than Tolerate
	// entries.
	ErrTolerate = errors.New("locktable: can not tolerate")
	// ErrBusy: a try-lock could not be granted at once.
	ErrBusy = errors.New("locktable: resource is locked")
	// ErrQueueFull: a queue already holds Config.MaxQueueLen entries.
	ErrQueueFull = errors.New("locktable: queue is full")
	// ErrSessionLimit: the session already has Config.MaxLocksPerSession live
	// requests, or the request would take the session's name bytes above
	// Config.MaxSessionBytes.
	ErrSessionLimit = errors.New("locktable: too many locks in this session")
	// ErrServerFull: the request would take the Table above
	// Config.MaxLocks live requests, Config.MaxEntries queue entries or
	// Config.MaxNameBytes name bytes.
	ErrServerFull = errors.New("locktable: server is full")
	// ErrNoTokens: a new request while no token below the token limit is
	// left and the limit refuses (SetTokenLimit): it would need a token
	// the server cannot cover.
	ErrNoTokens = errors.New("locktable: no fencing token left below the limit")
	// ErrUnknownSession: the session was never attached or has been dropped.
	ErrUnknownSession = errors.New("locktable: unknown session")
	// ErrNotFound: no live lock has this id (Extend: or a partial Release
	// took some of its resources, or Evict revoked it); or (Renew) the owner
	// holds no lock on exactly those resources.
	ErrNotFound = errors.New("locktable: lock does not exist")
	// ErrNotGranted: the lock is still waiting.
	ErrNotGranted = errors.New("locktable: lock is not granted yet")
	// ErrOwnerConflict: the owner already holds a lock that overlaps the
	// request without being exactly the same set of resources; queueing would
	// wait behind itself.
	ErrOwnerConflict = errors.New("locktable: owner holds an overlapping lock")
)

// Errors of the modes (see Mode).
var (
	// ErrInvalidMode: a mode is not exclusive, shared or 1 <= k <= n <=
	// MaxPermits permits; Request.Modes has neither one mode nor one per
	// resource; or a resource is named twice with two modes.
	ErrInvalidMode = errors.New("locktable: invalid mode")
	// ErrPermitsConflict: the request takes a resource in a shared or
	// permits mode whose count of permits differs from the one of the
	// shared or permits entries queued on it (shared counts as unbounded).
	ErrPermitsConflict = errors.New("locktable: permits do not match")
	// ErrModeChange: the owner holds exactly these resources, but in other
	// modes. An upgrade from shared to exclusive would wait for the other
	// readers, and two readers upgrading at once would wait for each other
	// forever: release the lock and ask again.
	ErrModeChange = errors.New("locktable: lock mode can not change")
)
