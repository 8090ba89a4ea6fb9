package mlock

import (
	"strconv"

	"github.com/mlock-dev/mlock/internal/protocol"
)

// Mode is how a lock takes a resource: Exclusive (the zero value), Shared,
// or Permits(k, n). Compare modes with ==.
//
// On each resource the server grants, in FIFO order, every request that is
// compatible with all the requests ahead of it: one exclusive request
// alone; any number of shared ones together; permits requests of one
// semaphore together while their permits add up to at most n. A waiting
// request blocks every later one it is not compatible with, so a waiting
// writer is never starved by a stream of readers. A request that names
// several resources, in any mix of modes, is granted on all of them at
// once. See the server's docs/lock-kinds.md.
type Mode struct {
	permits, of uint32
}

var (
	// Exclusive takes the resource alone: the default, and what every
	// request of the original protocol does.
	Exclusive = Mode{}
	// Shared takes the resource together with any number of other shared
	// requests (a read lock).
	Shared = Mode{permits: 1}
)

// MaxPermits is the largest n of Permits.
const MaxPermits = protocol.MaxPermits

// Permits returns the mode that takes k of the n permits of a semaphore,
// 1 <= k <= n <= MaxPermits. Every request that takes a resource in a
// permits or shared mode must agree on n while any of them is queued;
// otherwise the server refuses the newcomer (an Error of Type request
// wrapping ErrPermitsConflict). A lock with an invalid k or n fails with an
// Error of Type request.
func Permits(k, n int) Mode {
	if k < 1 || n < 1 || k > n || n > MaxPermits {
		return Mode{permits: 1<<32 - 1} // invalid: refused by the lock
	}
	return Mode{permits: uint32(k), of: uint32(n)}
}

// String returns the wire form of m: "x" (exclusive), "s" (shared), "k/n"
// (permits), or "invalid".
func (m Mode) String() string {
	if !m.wire().Valid() {
		return "invalid"
	}
	return m.wire().String()
}

func (m Mode) wire() protocol.Mode { return protocol.Mode{Permits: m.permits, Of: m.of} }

// modeArg returns the modes argument of a lock request for nres resources:
// "" when every resource is exclusive.
func modeArg(mode Mode, modes []Mode, nres int) (string, error) {
	bad := func(msg string) error { return &Error{Type: TypeRequest, Msg: msg} }
	if modes == nil {
		if !mode.wire().Valid() {
			return "", bad("invalid mode: want 1 <= k <= n <= " + strconv.Itoa(MaxPermits) + " permits")
		}
		if mode == Exclusive {
			return "", nil
		}
		return mode.String(), nil
	}
	if len(modes) != nres {
		return "", bad("LockOptions.Modes has " + strconv.Itoa(len(modes)) + " modes for " + strconv.Itoa(nres) + " resources")
	}
	b := make([]byte, 0, 2*nres)
	all := true // exclusive
	for i, m := range modes {
		if !m.wire().Valid() {
			return "", bad("invalid mode of resource " + strconv.Itoa(i+1) + ": want 1 <= k <= n <= " + strconv.Itoa(MaxPermits) + " permits")
		}
		all = all && m == Exclusive
		if i > 0 {
			b = append(b, '|')
		}
		b = m.wire().AppendText(b)
	}
	if all {
		return "", nil
	}
	return string(b), nil
}
