// Package mlock is the Go client of mlockd, the multi-resource distributed
// lock server, and the types it shares with it.
//
// # Basics
//
//	c, err := mlock.New("mlock://localhost:12340?ttl=5000&prefix=order:")
//	defer c.Close()
//	l, err := c.Lock(ctx, "product:1001|product:1002", nil) // both, atomically
//	defer l.Unlock(ctx)
//
// A lock request names one or more resources separated by '|'. The server
// grants it when it heads the FIFO queue of every one of them, so requests
// for overlapping sets are served in arrival order and never deadlock. A
// granted lock has a lease (Options.TTL, default 60 s) that Extend renews;
// Client.Do runs a function under a lock and renews it while the function
// runs. Every grant carries a fencing token (Lock.Token) that only grows:
// pass it to the storage you protect and refuse writes with an older one.
//
// # Connections and sessions
//
// All Clients of one host:port in a process share one session
// (Options.SocketID): a package-level registry hands the same session to
// every NewClient of an address and ends it with the last Client.Close. The
// session alone owns the TCP connection, the calls in flight and the
// waiting and held locks; Client and Lock ask it for every change. The connection reconnects by itself, without limit,
// with capped exponential backoff and jitter; the session and its locks
// survive an outage shorter than the server's grace period (15 s by
// default), and waiting locks are still granted. Calls in flight when the
// connection drops fail at once with an Error of Type connection; Ping,
// Status, Locks, Extend and Unlock are retried once after the reconnect
// (they are idempotent), Lock, TryLock, Release and ReleaseAll are not.
// If the server lost the session (it restarted), waiting locks fail and held
// locks are reported lost.
//
// # The path of a request
//
// Client.Lock checks the names (the server's own rule), and the session
// appends a "lock" command to the connection's outbox (internal/protocol),
// which goes out in one write together with the other callers'
// commands: the session's reader writes those of the callers it has just
// answered, a writer goroutine the rest. The server (package server) applies it to the lock service core
// (internal/core, over the engine internal/locktable) and answers with a
// result, then a "locked" push once the lock is granted. The session's
// reader parses both (protocol.ParseMessage), answers the caller's call at
// the grant, and maps every failure code to an *Error: no text is compared.
//
// # Errors
//
// Every error is an *Error with a Type: connection, request, tolerate,
// timeout (the types of the original mlock client) or lost. Use
// errors.Is(err, mlock.ErrTimeout) and friends, or errors.As. The cause
// sentinels tell refusals apart: ErrBusy (a try-lock; Error.Resource names
// the busy resource), ErrOwnerConflict, ErrNotHeld (Renew), ErrExpired,
// ErrReleased, ErrSessionLost, ErrClosed. A wait given up through its
// context keeps ctx.Err() in the chain.
//
// # Caveats
//
// A lease is not mutual exclusion under every failure: a process paused
// longer than its lease can wake up believing it holds a lock the server has
// given to someone else. Lock.Lost and Client.Do's context tell the holder as
// soon as the client knows; fencing tokens protect the data even when it is
// too late.
package mlock
