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
)

var opNames = [...]string{"", "lock", "extend", "unlock", "renew", "release", "releaseall", "attach", "detach", "tick"}

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
}

// Result is the outcome of one Command.
type Result struct {
	Grant     Grant // OpLock, OpRenew
	ExpiresAt int64 // OpExtend: the new expiry, ns
	OK        bool  // OpRelease: every resource was released; OpAttach: the session existed
	N         int   // OpReleaseAll: locks released
	Err       error // the engine's error, unchanged (errors.Is with the Err* sentinels)
}

// ErrUnknownOp is the Result.Err of a Command whose Op is not one of the
// Op constants.
var ErrUnknownOp = errors.New("core: unknown command")
