// Package fence makes writes conditional on a lock's fencing token, so that
// a holder that outlived its lease (a long pause, a SIGSTOP, a slow disk)
// cannot write after the lock has passed to someone else.
//
// Every grant of mlockd carries a token from one counter that only grows
// (Lock.Token in the Go client, Lease.Token in the locking module, lock.token
// in the Node.js client). The store keeps, per resource, the highest token it
// has accepted, and refuses a write whose token is lower: the write of a
// holder whose lock was given to another since, once that other holder has
// written. The check and the record happen in the same transaction (or Lua
// script) as the write itself.
//
// This package holds what the stores share: the error of a refused write and
// the check of a token. The stores are in its subpackages, one per
// dependency: fence/postgres (database/sql, any driver), fence/pgx (pgx v5,
// native) and fence/redis (go-redis v9). docs/fencing.md explains the
// schema, the guarantees and what they do not cover.
package fence

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
)

// ErrStale is the kind of a write refused because its token is lower than
// one already recorded for the resource: errors.Is(err, ErrStale) holds for
// every *StaleError. The write was not made (its transaction was rolled
// back, its script wrote nothing).
var ErrStale = errors.New("fence: stale token")

// ErrInvalid is the kind of a call refused before anything was sent: a token
// of 0 (no token: a provider without tokens), a token above
// math.MaxInt64 (PostgreSQL stores it as a bigint), no resource, or an empty
// resource name.
var ErrInvalid = errors.New("fence: invalid call")

// StaleError is a write refused for a stale token.
type StaleError struct {
	// Resource is the resource whose recorded token was higher.
	Resource string
	// Token is the token the write carried.
	Token uint64
	// Highest is the token recorded for Resource when the write was
	// refused (0 if the store did not say).
	Highest uint64
}

func (e *StaleError) Error() string {
	if e.Highest == 0 {
		return fmt.Sprintf("fence: stale token %d for %q: a newer holder has written", e.Token, e.Resource)
	}
	return fmt.Sprintf("fence: stale token %d for %q: token %d has written since", e.Token, e.Resource, e.Highest)
}

// Is reports whether target is ErrStale.
func (e *StaleError) Is(target error) bool { return target == ErrStale }

// Resources checks a call's token and resources and returns the resources
// sorted, without duplicates: the order in which the stores take their
// fence rows, so that two transactions fencing the same resources never
// wait for each other in a cycle. It returns an error of kind ErrInvalid
// for a token of 0 or above math.MaxInt64, no resource, or an empty name.
func Resources(token uint64, resources []string) ([]string, error) {
	if token == 0 {
		return nil, fmt.Errorf("%w: token 0 (the lock has no fencing token)", ErrInvalid)
	}
	if token > math.MaxInt64 {
		return nil, fmt.Errorf("%w: token %d above %d", ErrInvalid, token, int64(math.MaxInt64))
	}
	if len(resources) == 0 {
		return nil, fmt.Errorf("%w: no resource", ErrInvalid)
	}
	out := slices.Clone(resources)
	for _, r := range out {
		if r == "" {
			return nil, fmt.Errorf("%w: empty resource name", ErrInvalid)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// Split splits a lock's resources "a|b|c" (as the Go client and mlock run
// name them) into their names, for Resources.
func Split(resources string) []string { return strings.Split(resources, "|") }
