package locktable

import "fmt"

// EventKind says what happened to a request.
type EventKind uint8

const (
	// Granted: a waiting request now holds all its resources.
	Granted EventKind = iota + 1
	// TimedOut: a waiting request passed its wait timeout and left every
	// queue.
	TimedOut
	// Expired: a granted lock passed its expiry and was removed; a lock
	// revoked by Evict ends this way too, after its Released.
	Expired
	// Released: a granted lock was removed by Release or ReleaseAll, or
	// unlocked from another session; or Evict revoked it (it keeps its
	// resources until it expires, but is nobody's any more); or, with
	// Partial set, a Release took some of its resources and the lock lives
	// on holding the rest.
	Released
	// Dropped: a request was removed because its session's grace period
	// ended. Held is true if it was granted. A dropped session is never
	// granted anything while it is being dropped.
	Dropped
	// SessionClosed: a session's grace period ended; its requests have been
	// reported as Dropped. Only Session is set.
	SessionClosed
)

var kindNames = [...]string{"", "granted", "timeout", "expired", "released", "dropped", "session-closed"}

func (k EventKind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// Event reports a change to one request.
type Event struct {
	Kind      EventKind
	ID        ID
	Session   string
	Owner     string
	Token     uint64 // fencing token of a granted lock (Granted, Expired, Released, Dropped held)
	ExpiresAt int64  // expiry (ns) of a Granted lock
	Held      bool   // Dropped: whether the request was granted
	// Since (ns) is when the request was made (Granted, TimedOut, Dropped
	// waiting: the event's time minus Since is the wait) or granted
	// (Expired, Released, Dropped held: the hold so far). 0 when unknown: a
	// lock restored from a snapshot does not keep its grant time.
	Since int64
	// Partial (Released only): the lock lost some of its resources and is
	// still live, holding the rest under the same ID and token. Its holder
	// no longer holds everything it was granted.
	Partial bool
	// Revoked: Evict revoked the lock. On Released: this is that
	// revocation. On Expired: Evict revoked the lock earlier, and reported
	// it Released then; its holder was told it lost it at that time.
	Revoked bool
	// Moved (Released only): the lock's owner asked for it again from
	// another session (re-entry), and it moved there, live, under the same
	// ID and token. Session is the session it left, which no longer holds
	// it; the session it moved into is answered by Lock's Grant.
	Moved bool
}

func (t *Table) emit(e Event) {
	if t.cfg.OnEvent != nil {
		t.cfg.OnEvent(e)
	}
}
