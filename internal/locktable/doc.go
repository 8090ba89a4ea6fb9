// Package locktable is mlock's lock engine: per-resource FIFO queues, atomic
// multi-resource grants in exclusive, shared and permits modes, leases, wait
// timeouts, tolerate, owners, sessions and fencing tokens.
//
// # Basics
//
// A [Table] holds every live lock request. A request names 1..N resources. It
// enters the tail of every resource's queue in one step and is granted once it
// is at the head of every one of them. Because every request enters all of its
// queues at once, two requests have the same relative order in every queue they
// share, so no deadlock is possible. A waiting multi-resource request at the
// head of a queue reserves that resource even while nobody holds it: strict
// FIFO, no barging.
//
// # Modes
//
// A request takes each of its resources in a [Mode] (Request.Modes):
// exclusive (the default), shared, or k of a semaphore's n permits. On
// each queue the admitted entries are a prefix: the head, and every next
// entry as long as it and all those ahead of it are compatible (at most one
// entry, or no exclusive one and no more than n permits); the first entry
// that does not fit stops the prefix, so no later entry passes a waiting
// one (no barging, no writer starvation). "At the head of every queue"
// above becomes "admitted on every queue": a request is granted when it is
// admitted on all its resources, and an admitted entry of a request that
// still waits elsewhere reserves its place. When an entry leaves, the
// entries behind it that now fit are admitted, in order, and those whose
// requests become admitted everywhere are granted, each with its own
// token: granting a batch of readers behind a writer costs O(readers ·
// log n), however long the queue behind the next writer.
//
// The shared and permits entries queued on a resource must agree on n
// (shared counts as unbounded): another n is refused with
// [ErrPermitsConflict]. An owner's re-entry must name the same resources
// in the same modes ([ErrModeChange] otherwise: no upgrade). Tolerate
// counts a queue's waiting entries plus one for its admitted ones.
// Release releases every granted lock of the owner on each named resource,
// Evict revokes every holder of each, and try-locks succeed only if the
// request would be admitted everywhere at once.
//
// A granted lock has a lease (ttl). It expires at grant time + ttl unless it is
// extended (extend counts from now). A waiting request may have a wait timeout.
// Every grant receives the next value of one strictly increasing 64-bit fencing
// token counter.
//
// # Owners
//
// A request may name an owner. The same owner asking again (through
// [Table.Lock]) for exactly the set it holds renews that lock and moves it
// into the asking session; a move is reported to the session it leaves as
// Released with Moved set, since only the new session holds it from then
// on (its end drops the lock). [Table.Renew] renews it by owner without moving it
// and without a new token. [Table.Release] and [Table.ReleaseAll] find locks
// by owner. A Release of some resources of a multi-resource lock leaves the
// lock holding the rest and reports it as Released with Partial set, so its
// holder learns that it no longer holds everything it was granted.
//
// No call takes back what it granted: Release, ReleaseAll and the end of a
// session first remove everything they remove, and only then grant the
// waiters that became grantable (none of them in a session being dropped).
//
// # Changes from elsewhere
//
// Extend, Unlock and Renew take the caller's session (Lock has
// Request.Session). A renewal (Extend by id, Renew by owner, re-entry) from a
// session other than the lock's own, the empty session included, never
// shortens the lock: its expiry becomes max(expiry, now + ttl). From its own
// session it becomes now + ttl exactly. The holder computes how long it may
// believe it holds a lock from its own requests; a shorter expiry it does not
// know of would let the lock go to another while it still believes it holds
// it. An Unlock of a granted lock from another session reports Released to
// the lock's session. After a partial Release, Extend by id no longer finds
// the lock, since its holder was told it lost it.
//
// [Table.Evict] takes a lock from whoever holds it, but does not give it
// away at once: it revokes the lock, reports Released to its session, and
// sets its expiry to min(expiry, now + session grace). The holder, slow or
// disconnected, believes it holds the lock until it hears of the eviction,
// and at most until its last answered request plus the grace; the lock goes
// to its waiters, through the normal expiry, only when that belief has
// ended. A revoked lock is nobody's: Extend, Renew and re-entry do not find
// it; its holder may still free it at once by Unlock, Release or
// ReleaseAll.
//
// # Caps
//
// Besides the per-request and per-queue limits, [Config] caps the live
// requests, the queue entries and the name bytes (resource names per queue
// entry, plus owners) of the whole Table ([ErrServerFull]), and the name
// bytes of one session ([ErrSessionLimit]). Only new requests are refused
// by them; [Stats] reports the current totals.
//
// Lock refusals for busy resources, too long queues and owner conflicts are
// [*ResourceError] values naming the resource. [CheckName] is the one rule for
// resource names; the engine applies it, and so should its clients.
//
// # Sessions
//
// Every lock belongs to a session. A detached session keeps its locks for the
// configured grace period; when that ends, its held locks are released and its
// waiting requests removed.
//
// # Holding grants
//
// [Table.HoldGrants] (or [Config.GrantAfter] at creation) holds every grant
// until a given time: requests are accepted and queue as usual, try-locks are
// refused as busy, timeouts and expiries run, but nothing is granted before
// that time. The end of the hold is a deadline like the others; when it is
// processed, everything grantable is granted in arrival order, each with a
// Granted event. A server that restarts after a crash holds grants for its
// session grace period, so that no client of the previous run can still
// believe it holds a lock when something is granted again.
//
// # Determinism
//
// The engine does no I/O, starts no goroutines and never reads the clock: every
// method takes now (nanoseconds on any fixed origin, normally the Unix epoch).
// Before doing anything else, every method first processes the deadlines due at
// now, in deadline order. The owner arms one timer for [Table.NextDeadline] and
// calls [Table.Advance] when it fires.
//
// The same calls with the same times, on Tables made with the same Config
// (Config.Seed included), give the same results, the same events in the same
// order and the same state, byte for byte ([Table.MarshalBinary]): lock ids
// come from a ChaCha8 generator seeded by Config.Seed, and no order depends
// on map iteration or pointer values. The orders are: deadlines due by the
// same call in time order, and at one instant in the order their requests
// arrived (a session's grace end counts from its detach; the end of a hold
// on grants comes first); a session's requests, when it is dropped, newest
// in the session first; an owner's locks, in ReleaseAll, newest first;
// Release in the order of its resources; the waiters a call lets through in
// the order they became grantable, and at the end of a hold in arrival
// order.
//
// Things that happen to requests other than the one being handled (a waiter
// granted because another lock went away, a timeout, an expiry, a session
// drop) are reported synchronously through [Config.OnEvent]. A request that is
// granted at once is reported only by the return value of [Table.Lock], so the
// owner can answer the request before it announces the grant.
//
// # Snapshots
//
// [Table.MarshalBinary] encodes the whole state of a Table in a compact,
// versioned binary form, and [Restore] makes a Table of it that behaves
// exactly like the original from then on: the same calls give the same
// results, events and snapshots. A snapshot is canonical (one state, one
// encoding) and holds the state of the generator of lock ids, so it must be
// kept as secret as the ids it can predict. Restore refuses a truncated or
// corrupt snapshot with an error wrapping [ErrCorruptSnapshot].
//
// [Table.Failover] postpones every expiry, wait timeout and grace end that
// would fall before a given time to that time: what a replicated service
// applies when a new leader takes over, so that the election itself robs no
// holder of its lock, ends no session and times out no waiter.
//
// # Costs
//
// Every operation costs O(k log n) or better, where k is the number of
// resources in the request and n the number of live requests, plus
// O(log n) per request it grants; renewals by owner also fold duplicate
// names pairwise, O(k²) with k <= MaxResources. Finding an owner's lock on
// a resource held shared costs O(min(holders, the owner's locks · k)).
// Nothing scans all locks or queues. Besides a hash map, the listings
// ([Table.QueuesPage], [Table.Busiest]) use an index of the queues ordered
// by name, a B-tree, which is kept off the hot path: the first listing
// builds it (O(Q log Q) for Q queues, once); while listings keep coming, a
// queue created between two of them waits in a small unsorted set (O(1)),
// which the next listing, or the 256th such queue, moves into the tree, so
// that a lock taken and released between two listings never touches the
// tree; and when keeping the index has cost more tree operations since
// the last listing than a rebuild would, it is dropped until the next
// listing. A listing then seeks its first queue and walks on: O(log Q +
// page), plus at most 256 insertions, and its memory is bounded by its
// limits; amortised, the index costs O(log Q) per queue that lives across
// a listing, and nothing at all to a Table that is not listed.
// [Table.Locks] walks a list of the live requests and costs what it
// returns.
//
// The hash map of queues keeps an emptied queue, parked, for the next
// request of its name: up to 1024 of them, the oldest forgotten first, so
// that a resource taken and released over and over costs one map lookup
// per cycle. A parked queue holds nothing: no call, count, listing or
// snapshot sees it. The deadline heap holds 16 bytes per timer; a
// session's grace end is the deadline of a timer struct the session keeps
// from its first detach on.
//
// # Caveats
//
// A Table is not safe for concurrent use; its owner serialises calls (one
// mutex, or one goroutine). OnEvent runs inside Table methods and must not call
// back into the Table.
package locktable
