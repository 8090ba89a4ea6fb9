package locking

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/mlock-dev/mlock/internal/lease"
	"github.com/mlock-dev/mlock/locking/internal/keyset"
)

// Defaults.
const (
	// DefaultTimeout is Execute's wait for the lock (Medusa's
	// waitLockingTimeout).
	DefaultTimeout = 5 * time.Second
	// DefaultExpire is Execute's lease, renewed every third of it while the
	// job runs.
	DefaultExpire = 60 * time.Second
	// AnonymousOwner is the owner of locks acquired without an owner id, as
	// in Medusa's Redis provider. Anonymous locks are never re-entrant.
	AnonymousOwner = keyset.Anonymous
)

// Kinds of error, for errors.Is.
var (
	// ErrConflict: a key is held by another owner (Acquire without
	// AwaitQueue), or an owner asked for keys that only overlap what it
	// holds. Message: Failed to acquire lock for key "<key>".
	ErrConflict = errors.New("locking: conflict")
	// ErrTimeout: Execute's wait passed its timeout, or Acquire's context
	// its deadline. Message: Timed-out acquiring lock.
	ErrTimeout = errors.New("locking: timeout")
	// ErrLost: Execute's lease was lost while the job ran.
	ErrLost = errors.New("locking: lease lost")
	// ErrInvalidKey: a key is empty or contains a space or '|'.
	ErrInvalidKey = errors.New("locking: invalid key")
	// ErrNoProvider: no provider is registered under the id.
	ErrNoProvider = errors.New("locking: no such provider")
	// ErrClosed: the provider was closed.
	ErrClosed = errors.New("locking: provider closed")
	// ErrInvalidOptions: Execute's options cannot be honoured (a Lead not
	// below half of Expire).
	ErrInvalidOptions = errors.New("locking: invalid options")
)

// Error is the error of the locking calls. Its message keeps Medusa's texts;
// errors.Is(err, ErrConflict) (or ErrTimeout, ErrLost, ...) tells the kind,
// Keys names the keys concerned, and Err, if set, is the cause.
type Error struct {
	// Kind is one of the Err* kinds above.
	Kind error
	// Keys are the keys concerned: the held key (ErrConflict), the lost
	// keys (ErrLost); may be empty.
	Keys []string
	// Msg, if set, replaces the standard message of Kind.
	Msg string
	// Err is the cause, if any.
	Err error
}

// Error returns Msg, or the standard message of the kind: Failed to acquire
// lock for key "<key>" (ErrConflict), Timed-out acquiring lock. (ErrTimeout),
// Lost the lock for key(s) ... (ErrLost).
func (e *Error) Error() string {
	if e.Msg != "" {
		return e.Msg
	}
	switch e.Kind {
	case ErrConflict:
		key := ""
		if len(e.Keys) > 0 {
			key = e.Keys[0]
		}
		return fmt.Sprintf("Failed to acquire lock for key %q", key)
	case ErrTimeout:
		return "Timed-out acquiring lock."
	case ErrLost:
		q := make([]string, len(e.Keys))
		for i, k := range e.Keys {
			q[i] = strconv.Quote(k)
		}
		return fmt.Sprintf("Lost the lock for key(s) %s while the job was still running: "+
			"the lease expired before it could be renewed. Increase \"expire\" if the job is expected to run this long.",
			strings.Join(q, ", "))
	}
	if e.Err != nil {
		return e.Err.Error()
	}
	if e.Kind != nil {
		return e.Kind.Error()
	}
	return "locking: error"
}

// Is reports whether target is e's kind.
func (e *Error) Is(target error) bool { return target == e.Kind }

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// AcquireOptions tunes Acquire.
type AcquireOptions struct {
	// OwnerID owns the lock: only it can release it, and asking again for
	// the same keys renews the lease. Empty: the anonymous owner "*" (not
	// re-entrant; released by a Release without owner).
	OwnerID string
	// Expire is the lease. 0: no expiry (see each provider for its
	// longest lease).
	Expire time.Duration
	// AwaitQueue waits for the keys (as long as ctx allows) instead of
	// failing at once with ErrConflict.
	AwaitQueue bool
	// Provider routes the call in a Module; empty: the default provider.
	Provider string
}

// ReleaseOptions tunes Release and ReleaseAll.
type ReleaseOptions struct {
	// OwnerID whose locks are released; empty: the anonymous owner.
	OwnerID string
	// Provider routes the call in a Module.
	Provider string
}

// ExecuteOptions tunes Execute.
type ExecuteOptions struct {
	// Timeout is the longest wait for the lock. 0: the provider's default
	// (see TimeoutDefaulter), else 5 s, as in Medusa; negative: as long as
	// ctx allows. Note the difference with the Go client, whose
	// mlock.Options.Timeout 0 means no limit: this module mirrors Medusa's
	// API, and Medusa waits 5 s by default. A cancelled ctx ends the wait
	// with an error for which errors.Is(err, context.Canceled) holds.
	Timeout time.Duration
	// Expire is the lease, renewed every Expire/3 while the job runs.
	// 0: 60 s.
	Expire time.Duration
	// OwnerID is the owner of the lock; empty: a new random owner per call
	// ("execute:<hex>"), so nothing else can release it. Under OwnerID a
	// refusal (ErrConflict) releases nothing afterwards: the owner may hold
	// some of the keys from before (so a provider that keeps part of a
	// refused multi-key acquisition, the Redis provider's Medusa mode,
	// keeps it until its expiry, as Medusa does). Give every Execute that
	// may run at the same time its own OwnerID: two under one owner share
	// the lock (re-entry), and the first to end releases it while the
	// other's job still runs (on mlockd that job is cancelled at once; on
	// the other providers at its next renewal at the latest).
	OwnerID string
	// NoWait fails at once with ErrConflict if a key is held, instead of
	// waiting (Medusa has no such option).
	NoWait bool
	// Lead declares the lease lost this long before the holder's believed
	// end of it (see Execute), so that the job has time to stop before
	// anyone else may get the keys: for example the time a command needs to
	// die once told to. Default 0; it must be below Expire/2.
	Lead time.Duration
	// Provider routes the call in a Module.
	Provider string
}

// Lease describes an acquisition.
type Lease struct {
	// Token is the fencing token of the lock: it grows with every new
	// acquisition on a provider. A renewal (the same owner acquiring
	// exactly the keys it holds) is the same lock and returns its original
	// token. 0 for a provider without tokens.
	Token uint64
	// Lost, if not nil, is closed when the provider learns that the lock
	// is gone (the server said so, or the Redis server restarted): Execute
	// then aborts the job at once. Nil when the provider cannot tell.
	Lost <-chan struct{}
	// Why, if not nil, returns why the lock is gone once Lost is closed
	// (its message names the cause: the lease ended, released by its
	// owner, the server shut down, the session lost). Execute reports it
	// in its loss error, as the cause (Error.Err). It must not block.
	Why func() error
	// Deadline, if not nil, returns the provider's own estimate of the end
	// of the lock (clock-drift margin applied; the zero time: none), when
	// it knows one tighter than the lease counted from the renewals (for
	// example the end of the client session that holds it). It must be
	// cheap and must not block.
	Deadline func() time.Time
	// ExpiresAt is the end of the lease as the provider reported it at
	// acquisition (on the server's clock for mlockd; the send time plus
	// Expire on the local clock for Redis); zero if unknown or none.
	ExpiresAt time.Time
	// TTL, if not zero, is the length of the lease the provider keeps on
	// each renewal when it is not the Expire asked for (etcd: an owner's
	// acquisitions share the lease of its first one, and its TTL). Execute
	// then renews every third of the shorter of the two and counts the
	// lock's end from it.
	TTL time.Duration
	// Sent, if not zero, is when the request that took the lock was sent,
	// on the local clock: the lease runs from no earlier than this.
	// Execute counts the first lease from it (zero: from when Acquire
	// returned).
	Sent time.Time
}

// Job is the work Execute runs under the lock. Its context is cancelled if
// the lease is lost; context.Cause then returns an error of kind ErrLost.
type Job func(ctx context.Context) error

// Provider is a lock backend. Every provider gives the same semantics, which
// lockingtest.Run checks:
//
//   - Acquire takes every key or none (no partial holds), and two callers
//     asking for the same keys in any order never deadlock.
//   - The owner that holds exactly the asked keys renews instead of
//     conflicting; another owner conflicts (or waits, with AwaitQueue).
//   - Release by another owner changes nothing and reports false.
//
// Execute runs jobs over any Provider (Acquire, Renew, Release); a provider
// with a default wait of its own also implements TimeoutDefaulter. Package
// locking/provider has the helpers for writing a provider, and
// locking/lockingtest the conformance suite. Implementations are safe for
// concurrent use.
type Provider interface {
	// Acquire takes keys for opts.OwnerID.
	Acquire(ctx context.Context, keys []string, opts AcquireOptions) (Lease, error)
	// Renew sets the lease of owner's lock on exactly keys to expire from
	// now; false (and a nil error) if owner no longer holds them all, also
	// after a Release of some of them. It never takes a key. An error means
	// the outcome is unknown.
	Renew(ctx context.Context, keys []string, owner string, expire time.Duration) (bool, error)
	// Release releases owner's lock on each key; true only if every key was
	// held by owner.
	Release(ctx context.Context, keys []string, opts ReleaseOptions) (bool, error)
	// ReleaseAll releases every lock of owner.
	ReleaseAll(ctx context.Context, opts ReleaseOptions) error
	// Close releases the provider's resources.
	Close() error
}

// TimeoutDefaulter is implemented by a provider with a default wait of its
// own for Execute (the Redis provider: Medusa's waitLockingTimeout).
type TimeoutDefaulter interface {
	// DefaultTimeout is Execute's wait when ExecuteOptions.Timeout is 0;
	// 0 means DefaultTimeout.
	DefaultTimeout() time.Duration
}

// normalizeKeys is keyset.Normalize with the module's error.
func normalizeKeys(keys []string) ([]string, error) {
	keys, err := keyset.Normalize(keys)
	if err != nil {
		return nil, invalidKeyError(err)
	}
	return keys, nil
}

// invalidKeyError is the ErrInvalidKey error for a keyset error.
func invalidKeyError(err error) error { return &Error{Kind: ErrInvalidKey, Msg: err.Error(), Err: err} }

// ownerOf returns the owner to record: id, or AnonymousOwner.
func ownerOf(id string) string { return keyset.Owner(id) }

// conflictError is the error for a key held by someone else.
func conflictError(key string) error { return &Error{Kind: ErrConflict, Keys: []string{key}} }

// timeoutError is the error for a wait that ran out; cause is kept.
func timeoutError(cause error) error { return &Error{Kind: ErrTimeout, Err: cause} }

// waitError turns the end of a wait through ctx into the error to return: a
// deadline is ErrTimeout, a cancellation keeps ctx.Err().
func waitError(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return timeoutError(ctx.Err())
	}
	return ctx.Err()
}

func randomOwner() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "execute:" + hex.EncodeToString(b[:])
}

// releaseTimeout bounds the release at the end of Execute.
const releaseTimeout = 5 * time.Second

// Execute runs job while holding keys on p, as Medusa's execute: it waits at
// most opts.Timeout for every key under a per-call owner, renews the lease
// every Expire/3 while job runs (the one lease watchdog of mlock), cancels
// job's context with an ErrLost cause when the lease is lost, and always
// releases, also a grant that lands just as the wait gives up.
//
// The lease is lost when a renewal is refused, when the provider reports the
// loss (Lease.Lost), or when no renewal succeeded in time: at base + Expire -
// margin - Lead, base being the send time of the last successful renewal
// (or the start of the job) and margin Expire/100 + 5 ms for the drift
// between the clocks (assumed to differ in rate by less than 1 %); earlier
// if the provider's own Lease.Deadline (less Lead) comes first.
//
// It returns job's error; an error of kind ErrLost (joined with job's own
// error, unless that is only the cancellation) if the lease was lost, also
// when nothing said so while the job ran but the release at the end found
// the keys no longer the owner's (the job did not end under the lock); an
// error of kind ErrTimeout if the wait ran out; ErrConflict with NoWait;
// ErrInvalidKey for bad keys; ErrInvalidOptions, before acquiring anything,
// for a Lead not below Expire/2 (or an Expire too short for its margin). It
// is safe for concurrent use if p is.
func Execute(ctx context.Context, p Provider, keys []string, job Job, opts ExecuteOptions) error {
	return ExecuteLease(ctx, p, keys, func(ctx context.Context, _ Lease) error { return job(ctx) }, opts)
}

// ExecuteLease is Execute for a job that wants the Lease it runs under (its
// fencing token, its reported expiry).
func ExecuteLease(ctx context.Context, p Provider, keys []string, job func(ctx context.Context, l Lease) error, opts ExecuteOptions) error {
	keys, err := normalizeKeys(keys)
	if err != nil {
		return err
	}
	timeout, expire := opts.Timeout, opts.Expire
	if timeout == 0 {
		if d, ok := p.(TimeoutDefaulter); ok {
			timeout = d.DefaultTimeout()
		}
		if timeout == 0 {
			timeout = DefaultTimeout
		}
	}
	if expire <= 0 {
		expire = DefaultExpire
	}
	lo := lease.Options{TTL: expire, Lead: opts.Lead}
	if err := lo.Check(); err != nil {
		return &Error{Kind: ErrInvalidOptions, Msg: "locking: " + strings.TrimPrefix(err.Error(), "lease: "), Err: err}
	}
	owner := opts.OwnerID
	if owner == "" {
		owner = randomOwner()
	}
	actx := ctx
	if timeout > 0 {
		var cancel context.CancelFunc
		actx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	// release reports false when the provider said the keys were no longer
	// all the owner's: the lock was lost before the job ended.
	release := func() bool {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
		held, err := p.Release(rctx, keys, ReleaseOptions{OwnerID: owner})
		return held || err != nil
	}
	l, err := p.Acquire(actx, keys, AcquireOptions{OwnerID: owner, Expire: expire, AwaitQueue: !opts.NoWait})
	if err != nil {
		// Owner-checked: frees only what this call may have taken (a grant
		// landing as the wait gives up, or what a non-atomic provider took
		// before a conflict). A refusal under the caller's own owner took
		// nothing, and that owner may hold some of the keys from before
		// (the overlap is the refusal): those are not this call's to free.
		if opts.OwnerID == "" || !errors.Is(err, ErrConflict) {
			release()
		}
		if ctx.Err() == nil && actx.Err() != nil && !errors.Is(err, ErrTimeout) {
			return timeoutError(actx.Err())
		}
		return err
	}
	if l.TTL > 0 && l.TTL < expire {
		// The lease in force is shorter than asked: the watchdog keeps to
		// it. A Lead that is not below its half is dropped.
		lo.TTL = l.TTL
		if lo.Check() != nil {
			lo.Lead = 0
		}
	}
	lo.Renew = func(rctx context.Context) (bool, error) { return p.Renew(rctx, keys, owner, expire) }
	lo.Lost, lo.Deadline, lo.Start = l.Lost, l.Deadline, l.Sent
	lo.CauseOf = func(how lease.Loss, lastErr error) error { return lostError(keys, how, lastErr, l.Why) }
	returned := false
	defer func() {
		if !returned {
			release() // job panicked: the lock goes as when it returns, and the panic goes on up
		}
	}()
	ferr, lost := lease.Run(ctx, lo, func(jctx context.Context) error { return job(jctx, l) })
	returned = true
	if !release() && lost == nil {
		// Nobody said so while the job ran (a Redis that lost its data
		// between two checks, say), but the job did not end under the lock:
		// report the loss rather than a success.
		lost = &Error{Kind: ErrLost, Keys: keys}
	}
	if lost != nil {
		if ferr != nil && !errors.Is(ferr, context.Canceled) && !errors.Is(ferr, ErrLost) {
			return errors.Join(lost, ferr)
		}
		return lost
	}
	return ferr
}

// lostError is Execute's error for a lease lost how: a message that names
// the cause (Medusa's own text when a renewal found the lock gone).
func lostError(keys []string, how lease.Loss, lastErr error, why func() error) error {
	e := &Error{Kind: ErrLost, Keys: keys}
	var because string
	switch how {
	case lease.LossRefused:
		return e // Medusa's text: the lease expired before it could be renewed
	case lease.LossTimedOut:
		if lastErr != nil {
			because, e.Err = "no renewal succeeded before the lease ran out (the lock server could not be reached: "+lastErr.Error()+").", lastErr
		} else {
			because = "no renewal was answered before the lease ran out (the lock server did not answer)."
		}
	case lease.LossHolder:
		because = "the connection to the lock server was lost for longer than the server keeps a silent session's locks."
	case lease.LossReported:
		if why != nil {
			e.Err = why()
		}
		if e.Err == nil {
			because = "the lock provider reported it gone."
		} else {
			because = e.Err.Error()
		}
	}
	q := make([]string, len(keys))
	for i, k := range keys {
		q[i] = strconv.Quote(k)
	}
	e.Msg = fmt.Sprintf("Lost the lock for key(s) %s while the job was still running: %s", strings.Join(q, ", "), because)
	return e
}
