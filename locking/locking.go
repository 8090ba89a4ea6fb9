package locking

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
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
	AnonymousOwner = "*"
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
)

// Error is the error of the locking calls. Its message keeps Medusa's texts;
// errors.Is(err, ErrConflict) (or ErrTimeout, ErrLost, ...) tells the kind,
// and Err, if set, is the cause.
type Error struct {
	Kind error
	Msg  string
	Err  error
}

func (e *Error) Error() string { return e.Msg }

// Is reports whether target is e's kind.
func (e *Error) Is(target error) bool { return target == e.Kind }

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// ConflictError is the error for a key held by someone else.
func ConflictError(key string) error {
	return &Error{Kind: ErrConflict, Msg: fmt.Sprintf("Failed to acquire lock for key %q", key)}
}

// TimeoutError is the error for a wait that ran out; cause is kept.
func TimeoutError(cause error) error {
	return &Error{Kind: ErrTimeout, Msg: "Timed-out acquiring lock.", Err: cause}
}

// LostError is the error for a lease lost while a job ran.
func LostError(keys []string) error {
	q := make([]string, len(keys))
	for i, k := range keys {
		q[i] = fmt.Sprintf("%q", k)
	}
	return &Error{Kind: ErrLost, Msg: fmt.Sprintf("Lost the lock for key(s) %s while the job was still running: "+
		"the lease expired before it could be renewed. Increase \"expire\" if the job is expected to run this long.",
		strings.Join(q, ", "))}
}

// WaitError turns the end of a wait through ctx into the error to return:
// a deadline is ErrTimeout, a cancellation keeps ctx.Err().
func WaitError(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return TimeoutError(ctx.Err())
	}
	return ctx.Err()
}

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
	// Timeout is the longest wait for the lock. 0: 5 s; negative: as long
	// as ctx allows.
	Timeout time.Duration
	// Expire is the lease, renewed every Expire/3 while the job runs.
	// 0: 60 s.
	Expire time.Duration
	// OwnerID is the owner of the lock; empty: a new random owner per call
	// ("execute:<hex>"), so nothing else can release it.
	OwnerID string
	// NoWait fails at once with ErrConflict if a key is held, instead of
	// waiting (Medusa has no such option).
	NoWait bool
	// Provider routes the call in a Module.
	Provider string
}

// Lease describes an acquisition.
type Lease struct {
	// Token is the fencing token of the grant (strictly increasing per
	// provider), or 0 for a provider without tokens or a renewal.
	Token uint64
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
// Implementations are safe for concurrent use.
type Provider interface {
	// Execute runs job while holding keys (see RunExecute).
	Execute(ctx context.Context, keys []string, job Job, opts ExecuteOptions) error
	// Acquire takes keys for opts.OwnerID.
	Acquire(ctx context.Context, keys []string, opts AcquireOptions) (Lease, error)
	// Renew sets the lease of owner's lock on exactly keys to expire from
	// now; false if owner no longer holds them all.
	Renew(ctx context.Context, keys []string, owner string, expire time.Duration) (bool, error)
	// Release releases owner's lock on each key; true only if every key was
	// held by owner.
	Release(ctx context.Context, keys []string, opts ReleaseOptions) (bool, error)
	// ReleaseAll releases every lock of owner.
	ReleaseAll(ctx context.Context, opts ReleaseOptions) error
	// Close releases the provider's resources.
	Close() error
}

// Keys checks keys, removes duplicates and sorts them. It is what every
// provider does with the keys it is given.
func Keys(keys []string) ([]string, error) {
	if len(keys) == 0 {
		return nil, &Error{Kind: ErrInvalidKey, Msg: "no key given"}
	}
	out := slices.Clone(keys)
	for _, k := range out {
		if k == "" || strings.ContainsAny(k, " |") {
			return nil, &Error{Kind: ErrInvalidKey, Msg: fmt.Sprintf("invalid key %q: keys are non-empty, without spaces or '|'", k)}
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// Owner returns the owner to record: id, or AnonymousOwner.
func Owner(id string) string {
	if id == "" {
		return AnonymousOwner
	}
	return id
}

func randomOwner() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "execute:" + hex.EncodeToString(b[:])
}

// RunExecute is Execute for any provider: it waits at most opts.Timeout for
// keys under a per-call owner, renews the lease every Expire/3 while job
// runs, cancels job's context if the lease is lost, and always releases. A
// grant that lands just as the wait gives up is released too. It returns
// job's error, or an error of kind ErrLost (joined with job's own error) if
// the lease was lost, or ErrTimeout if the wait ran out.
func RunExecute(ctx context.Context, p Provider, keys []string, job Job, opts ExecuteOptions) error {
	keys, err := Keys(keys)
	if err != nil {
		return err
	}
	timeout, expire := opts.Timeout, opts.Expire
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	if expire <= 0 {
		expire = DefaultExpire
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
	release := func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, _ = p.Release(rctx, keys, ReleaseOptions{OwnerID: owner})
	}
	if _, err := p.Acquire(actx, keys, AcquireOptions{OwnerID: owner, Expire: expire, AwaitQueue: !opts.NoWait}); err != nil {
		release() // owner-checked: frees only what this call may have taken
		if ctx.Err() == nil && actx.Err() != nil {
			return TimeoutError(actx.Err())
		}
		return err
	}
	jctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop, kept := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(kept)
		period := max(expire/3, time.Millisecond)
		t := time.NewTicker(period)
		defer t.Stop()
		lastOK := time.Now()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), period)
			ok, err := p.Renew(rctx, keys, owner, expire)
			rcancel()
			switch {
			case err == nil && ok:
				lastOK = time.Now()
			case err == nil || time.Since(lastOK) >= expire:
				// Refused, or unreachable for a whole lease: it is gone.
				cancel(LostError(keys))
				return
			}
		}
	}()
	ferr := job(jctx)
	close(stop)
	<-kept
	release()
	if cause := context.Cause(jctx); errors.Is(cause, ErrLost) {
		if ferr != nil && !errors.Is(ferr, context.Canceled) && !errors.Is(ferr, ErrLost) {
			return errors.Join(cause, ferr)
		}
		return cause
	}
	return ferr
}
