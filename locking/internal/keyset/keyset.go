// Package keyset holds the rules every locking provider applies to the keys
// and the owner of a call, shared by package locking (its memory provider
// and Execute) and package locking/provider (for other providers).
package keyset

import (
	"errors"
	"fmt"
	"slices"

	"github.com/mlock-dev/mlock/internal/core"
)

// Anonymous is the owner recorded for a call without an owner id.
const Anonymous = "*"

// ErrNoKeys: a call named no key.
var ErrNoKeys = errors.New("no key given")

// Normalize checks every key with the lock service's one rule for names
// (core.CheckName: non-empty, no space, no '|'), then returns a sorted copy
// without duplicates. A bad key gives an *InvalidError; no key gives
// ErrNoKeys.
func Normalize(keys []string) ([]string, error) {
	if len(keys) == 0 {
		return nil, ErrNoKeys
	}
	for _, k := range keys {
		if err := core.CheckName(k, 0); err != nil {
			return nil, &InvalidError{Key: k, Err: err}
		}
	}
	out := slices.Clone(keys)
	slices.Sort(out)
	return slices.Compact(out), nil
}

// InvalidError is the error for a key that breaks the rule for names.
type InvalidError struct {
	Key string
	Err error // core.ErrInvalidResource
}

func (e *InvalidError) Error() string {
	return fmt.Sprintf("invalid key %q: keys are non-empty, without spaces or '|'", e.Key)
}

func (e *InvalidError) Unwrap() error { return e.Err }

// Owner returns the owner to record: id, or Anonymous for "".
func Owner(id string) string {
	if id == "" {
		return Anonymous
	}
	return id
}
