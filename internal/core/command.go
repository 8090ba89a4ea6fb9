package core

import (
	"errors"
	"strconv"
	"time"
)

// Op is the kind of a Command.
type Op uint8

// The commands. Each names the Command fields it reads and the Result
// fields it sets.
const (
	// OpLock enqueues Request (Request.Try for a try-lock) → Grant, Err.
	OpLock Op = iota + 1
	// OpExtend sets the expiry of lock ID to now + TTL → ExpiresAt, Err.
	OpExtend
	// OpUnlock removes lock ID, granted or waiting → Err.
	OpUnlock
	// OpRenew renews Owner's granted lock on exactly Resources to now + TTL,
	// burning no token → Grant (the lock's own ID and token), Err
	// (ErrNotFound when Owner holds no such lock).
	OpRenew
	// OpRelease releases Owner's lock on each of Resources → OK (all were
	// held by Owner).
	OpRelease
	// OpReleaseAll releases every granted lock of Owner → N (how many).
	OpReleaseAll
	// OpAttach attaches Session, creating it if new → OK (it existed).
	OpAttach
	// OpDetach starts Session's grace period.
	OpDetach
	// OpTick processes every deadline due at the batch's time.
	OpTick
	// OpHoldGrants holds every grant until Until (Unix ns): nothing is
	// granted before then; requests queue, try-locks are refused with
	// ErrBusy, timeouts and expiries run. At Until the core's timer grants
	// everything grantable, in arrival order, reported to OnBatch as
	// Granted events. A hold only grows: an Until before the hold in force
	// or not after the batch's time changes nothing. → ExpiresAt (the end
	// of the hold in force, 0 if none). A server that starts after a crash
	// applies it first, with Until = its start + the session grace + a
	// margin; in a replicated log it is an entry like the others (a new
	// leader appends one for the time its predecessor's holders may still
	// believe they hold their locks).
	OpHoldGrants
)

var opNames = [...]string{"", "lock", "extend", "unlock", "renew", "release", "releaseall", "attach", "detach", "tick", "holdgrants"}

func (o Op) String() string {
	if int(o) < len(opNames) && o != 0 {
		return opNames[o]
	}
	return "Op(" + strconv.Itoa(int(o)) + ")"
}

// Command is one change to the lock table. Which fields count depends on Op.
type Command struct {
	Op        Op
	Request   Request       // OpLock
	ID        ID            // OpExtend, OpUnlock
	TTL       time.Duration // OpExtend, OpRenew
	Owner     string        // OpRenew, OpRelease, OpReleaseAll
	Resources []string      // OpRenew, OpRelease
	Session   string        // OpAttach, OpDetach
	Until     int64         // OpHoldGrants: end of the hold, Unix ns
}

// Result is the outcome of one Command.
type Result struct {
	Grant     Grant // OpLock, OpRenew
	ExpiresAt int64 // OpExtend: the new expiry, ns; OpHoldGrants: the end of the hold in force, ns (0: none)
	OK        bool  // OpRelease: every resource was released; OpAttach: the session existed
	N         int   // OpReleaseAll: locks released
	Err       error // the engine's error, unchanged (errors.Is with the Err* sentinels)
}

// ErrUnknownOp is the Result.Err of a Command whose Op is not one of the
// Op constants.
var ErrUnknownOp = errors.New("core: unknown command")
