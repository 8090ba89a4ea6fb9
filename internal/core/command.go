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
	// OpExtend renews lock ID for TTL → ExpiresAt (the lock's expiry), Err.
	// Session is the caller's session: from the lock's own session the
	// expiry becomes now + TTL; from any other (the empty one included) it
	// never moves earlier: max(expiry, now + TTL). ErrNotFound also when a
	// partial OpRelease took some of the lock's resources, or OpEvict
	// revoked it.
	OpExtend
	// OpUnlock removes lock ID, granted or waiting → Err. Session is the
	// caller's session: a granted lock unlocked from any other session is
	// reported to its own as a Released event.
	OpUnlock
	// OpRenew renews Owner's granted lock on exactly Resources for TTL,
	// burning no token → Grant (the lock's own ID and token; ExpiresAt its
	// expiry), Err (ErrNotFound when Owner holds no such lock). Session is
	// the caller's session, as for OpExtend: from elsewhere the expiry never
	// moves earlier.
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
	// OpEvict revokes, for each of Resources whose queue is headed by a
	// granted lock not revoked yet, that whole lock (all its resources),
	// whoever holds it → N (locks newly revoked), Err (ErrInvalidResource,
	// ErrTooManyResources). A revoked lock is reported to its session as a
	// Released event at once, and keeps its resources until min(its expiry,
	// now + the session grace), when it ends as any lock does (an Expired
	// event) and its waiters are granted. Its holder, slow or disconnected,
	// may believe it holds the lock until it hears of the eviction, and at
	// most until its last answered request (answered no later than now)
	// plus the grace: giving the lock away earlier would let two believe
	// they hold it. A revoked lock is nobody's: OpExtend fails with
	// ErrNotFound, OpRenew does not find it, and its owner asking again
	// queues behind it; OpUnlock, OpRelease and OpReleaseAll still free it
	// at once, reporting nothing more. With a negative session grace an
	// evicted lock is removed at once, and its waiters granted once every
	// named lock is gone.
	OpEvict
	// OpFailover postpones to Until (Unix ns) every deadline that would
	// fall before it → N (deadlines moved). Exactly: every granted lock
	// (a revoked one too) whose expiry is before Until expires at Until;
	// every waiting request whose wait timeout is before Until times out
	// at Until; every detached session whose grace period ends before
	// Until ends it at Until. Later deadlines, the end of a hold on
	// grants, TTLs and tokens do not change, and nothing is reported.
	//
	// A new leader of a replicated log applies it once, after its barrier,
	// with Until = the entry's time + the election window: while there was
	// no leader, holders could not extend their locks, sessions could not
	// come back and waiters could not be granted, so the election itself
	// must not rob a holder of its lock, end a session or time out a
	// waiter. Postponing a deadline never lets two believe they hold one
	// resource. It costs O(n) for n pending deadlines.
	OpFailover
)

var opNames = [...]string{"", "lock", "extend", "unlock", "renew", "release", "releaseall", "attach", "detach", "tick", "holdgrants", "evict", "failover"}

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
	Resources []string      // OpRenew, OpRelease, OpEvict
	Prefix    string        // OpRelease, OpReleaseAll: the scope, only resources starting with it ("": every resource)
	Session   string        // OpAttach, OpDetach; the caller's session for OpExtend, OpUnlock, OpRenew
	Until     int64         // OpHoldGrants: end of the hold; OpFailover: the time deadlines move to; Unix ns
}

// Result is the outcome of one Command.
type Result struct {
	Grant     Grant // OpLock, OpRenew
	ExpiresAt int64 // OpExtend: the new expiry, ns; OpHoldGrants: the end of the hold in force, ns (0: none)
	OK        bool  // OpRelease: every resource was released; OpAttach: the session existed
	N         int   // OpReleaseAll: locks released; OpEvict: locks newly revoked; OpFailover: deadlines moved
	Err       error // the engine's error, unchanged (errors.Is with the Err* sentinels)
}

// ErrUnknownOp is the Result.Err of a Command whose Op is not one of the
// Op constants.
var ErrUnknownOp = errors.New("core: unknown command")
