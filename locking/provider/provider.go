// Package provider is the kit for writing a locking provider: the rules every
// provider applies to its keys and owners, and the module's errors with
// Medusa's texts. Users of package locking do not need it.
//
// A provider implements locking.Provider (Acquire, Renew, Release,
// ReleaseAll, Close); locking.Execute runs jobs over it. It registers a URL
// scheme with locking.RegisterScheme from init, and runs the conformance
// suite of package locking/lockingtest in its tests:
//
//	func (p *P) Acquire(ctx context.Context, keys []string, o locking.AcquireOptions) (locking.Lease, error) {
//		keys, err := provider.Keys(keys)
//		if err != nil {
//			return locking.Lease{}, err
//		}
//		owner := provider.Owner(o.OwnerID)
//		...
//		return locking.Lease{}, provider.ConflictError(busyKey)
//	}
package provider

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/mlock-dev/mlock/locking"
	"github.com/mlock-dev/mlock/locking/internal/keyset"
)

// Keys checks keys with the lock service's one rule for names (non-empty, no
// space, no '|'), removes duplicates and sorts them: what every provider
// does with the keys it is given. The error is of kind locking.ErrInvalidKey.
func Keys(keys []string) ([]string, error) {
	keys, err := keyset.Normalize(keys)
	if err != nil {
		return nil, &locking.Error{Kind: locking.ErrInvalidKey, Msg: err.Error(), Err: err}
	}
	return keys, nil
}

// Owner returns the owner to record: id, or locking.AnonymousOwner ("*")
// for "". Anonymous locks are never re-entrant.
func Owner(id string) string { return keyset.Owner(id) }

// ConflictError is the error for a key held by someone else: kind
// locking.ErrConflict, message Failed to acquire lock for key "<key>".
func ConflictError(key string) error {
	return &locking.Error{Kind: locking.ErrConflict, Keys: []string{key}}
}

// TimeoutError is the error for a wait that ran out: kind
// locking.ErrTimeout, message Timed-out acquiring lock.; cause is kept.
func TimeoutError(cause error) error { return &locking.Error{Kind: locking.ErrTimeout, Err: cause} }

// WaitError turns the end of a wait through ctx into the error to return:
// a deadline is TimeoutError, a cancellation keeps ctx.Err().
func WaitError(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return TimeoutError(ctx.Err())
	}
	return ctx.Err()
}

// ParseDuration reads a duration from a URL query value: a Go duration
// ("1.5s") or a whole number of milliseconds.
func ParseDuration(v string) (time.Duration, error) {
	if d, err := time.ParseDuration(v); err == nil {
		return d, nil
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil || ms < 0 {
		return 0, fmt.Errorf("duration %q: want e.g. 20ms or a number of milliseconds", v)
	}
	return time.Duration(ms) * time.Millisecond, nil
}
