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
// # Shared locks and semaphores
//
//	r, err := c.Lock(ctx, "catalog", &mlock.LockOptions{Mode: mlock.Shared})       // a read lock
//	p, err := c.Lock(ctx, "psp:calls", &mlock.LockOptions{Mode: mlock.Permits(1, 3)}) // 1 of 3 permits
//	j, err := c.LockAll(ctx, []string{"orders", "catalog"},                          // write one, read one
//		&mlock.LockOptions{Modes: []mlock.Mode{mlock.Exclusive, mlock.Shared}})
//
// Any number of Shared locks hold a resource together; Permits(k, n) locks
// hold it together while their permits add up to at most n. The server
// grants in FIFO order: a waiting exclusive request blocks the shared ones
// behind it (no writer starvation), and when it leaves, every shared
// request up to the next exclusive one is granted at once. A request in
// mixed modes over several resources is granted on all of them at once, as
// any request. Every user of a semaphore must give the same n
// (ErrPermitsConflict otherwise), and an owner cannot change the mode of
// the lock it holds by asking again (ErrModeChange: unlock, then lock).
//
// # Credentials and TLS
//
//	c, err := mlock.New("mlocks://orders:" + token + "@locks.example:12340?tls-ca=/etc/mlock/ca.pem")
//
//	c, err := mlock.NewClient(mlock.Options{Host: "locks.example",
//		Name: "orders", Token: mlock.Secret(token),
//		TLS:  &tls.Config{RootCAs: pool}})
//
// A server with authentication knows each client as a principal, by token
// (Options.Name and Options.Token, or name:token in the URI, percent-encoded
// like any URI userinfo), by TLS client certificate (tls-cert and tls-key,
// or Options.TLS.Certificates), or by its address. The credentials go as
// the fourth word of every connect ("connect <socketId> 1.0
// auth=<name>:<token>"); the token is a Secret: it formats as
// "[REDACTED]" and no error or log of this package contains it. Owners,
// Release, ReleaseAll and Renew act only on the principal's own locks; a
// principal may lock only the resources its prefixes allow (else an Error
// of Type request wrapping ErrForbidden, Resource naming the resource), and
// only an administrator may Evict and list other principals' locks in
// full. The mlocks:// scheme (or ?tls=1, or Options.TLS) speaks TLS 1.2 or
// later, verifying the server's certificate against the system's roots or
// tls-ca, for the host name or tls-server-name. A server refusing the
// connection is not retried in a tight loop: its "error <text>" answer
// (authentication required or failed, protected mode, too many
// connections or sessions), a TLS mismatch (the server requires TLS, or
// does not speak it) and a certificate that does not verify fail the calls
// waiting for the connection and the waiting lock requests at once, with an
// Error of Type connection (errors.Is: ErrAuth, ErrTLS or ErrRefused; Msg
// is the server's text), and the client retries every Options.MaxBackoff
// until the server accepts it.
//
// # Connections and sessions
//
// All Clients of one host:port (or of one set of cluster nodes, in any
// order: see "Several servers") in a process that use the same credentials
// and TLS settings share one session
// (Options.SocketID): a package-level registry hands the same session to
// every NewClient of an address and ends it with the last Client.Close. The
// session alone owns the TCP connection, the calls in flight and the
// waiting and held locks; Client and Lock ask it for every change. The
// connection reconnects by itself, without limit,
// with capped exponential backoff and jitter; the session and its locks
// survive an outage shorter than the server's grace period (15 s by
// default), and waiting locks are still granted. Calls in flight when the
// connection drops fail at once with an Error of Type connection; Ping,
// Status, Locks, Extend and Unlock are retried up to twice, each after a
// reconnect (they are idempotent; a failover may take two connections), Release and ReleaseAll are not. Lock and TryLock
// are asked again on the next connection, with what is left of their
// timeout, when a node takes the session (another node of a cluster, or
// the same server reached again); a Lock keeps waiting across failed rounds
// of dials, to its timeout, a TryLock fails with the connection error when
// a whole round of dials fails; either fails after the third connection
// lost with it in flight. The server may have queued the first request:
// its grant then arrives for no waiting handle and is given back at once,
// so the caller holds only what it was answered. A tolerate limit counts that
// first request while it waits. The same holds for a grant whose caller gave
// up (its context ended): it is given back when it arrives. An owner's
// request answered with a grant the session is giving back (the server
// renewed it by re-entry just before the unlock) would hold nothing once the
// unlock is applied: it is asked again.
// If the server lost the session (it restarted), held locks are reported
// lost, and waiting requests, which held nothing, are asked again on the new
// session with what is left of their timeout: the caller keeps waiting. If
// the session resumed, the client asks the server about every waiting
// request (a grant, expiry or timeout pushed to a connection that died is
// lost with it): one that is gone is asked again in the same way. A server
// shutting down says so ("error server shutting down!"): held locks are lost
// at once, the client confirms with "bye" and closes the connection,
// reconnects with backoff, and waiting requests are asked again of the next
// server. Client.Close loses the Client's held locks for their holders
// (ErrClosed; Do's and Hold's jobs are cancelled) and unlocks them; its
// calls in flight or waiting for the connection fail with ErrClosed at once
// (a grant that arrives later is given back).
//
// # Several servers
//
//	c, err := mlock.New("mlock://h1:12340,h2:12340,h3:12340?ttl=5000")
//
//	c, err := mlock.NewClient(mlock.Options{Addrs: []string{"h1", "h2", "[fd00::3]:12340"}})
//
// The nodes of an mlockd cluster are given as a comma-separated list in the
// URI (each port defaults to 12340; an IPv6 literal goes in brackets) or as
// Options.Addrs. The session is one session of the cluster, whichever node
// carries it: one socketId and one principal on every node, one connection
// at a time. The client connects to the first address; when the connection
// drops, or an attempt fails (unreachable, refused, or the node shutting
// down), it dials the next address, in turn from the one after the node
// that failed, and resumes the session there ("connected 1.0 resumed"). The
// backoff applies between rounds (once every node has failed in turn),
// never between the nodes of a round, and after a connection that dropped
// within a second of its handshake (it grows while connections keep
// dropping that soon); a refusal fails the waiting calls
// only when no node of the round accepted the connection. A resumed session
// is what a reconnect to the same server is: held locks are kept (the node
// announces them again), waiting requests are probed, and the safety rule
// below is unchanged (the belief in a lock is bounded by the last answer of
// any node plus the grace the current node announced). A node answering
// "connected 1.0 new" has lost the session, as a restarted server has: held
// locks are lost, waiting requests are asked again. On a session's first
// connection the client asks the node to name the cluster's leader; when a
// follower that created the session ("new") names one of the session's
// nodes, the session leaves the follower at once, before sending anything,
// and connects to the leader (Options.StayOnNode, or stay-on-node=1 in the
// URI, keeps it on the node it reached; a leader that does not answer sends
// it back to the follower): requests on the leader skip the forwarding hop
// and the follower's wait for the commit index. Later connections stay on
// the node they reach.
// Clients naming the same nodes in any order share one session; Client.Addrs lists them in the
// order the session dials them, Client.Node names the node of the current
// connection and Status.AnsweredBy the node that answered a status. With
// TLS each node is verified for its own host name (or tls-server-name, for
// all). A connection error names the node it concerns (Error.Node); a call
// that finds no node reachable within DialTimeout fails with an Error of
// Type connection naming every node with its last error.
//
// # Safety
//
// What a holder believes, it can justify with its own clock. The client
// records when each request is queued (its send time, on the monotonic
// clock: a lower bound of when the server handled it) and keeps lastAck,
// the latest send time among the requests the server answered on the
// session with success, handshakes included, status and locks not (they
// are answered from the state of the node asked, which in a cluster may
// lag; a cluster node answers a ping once the leader confirmed a read
// index after it arrived and the node applied up to it), nor membership
// changes (a node answers them once the leader committed them, ahead of
// its own log). Anything read after
// an answer was produced after the server handled that request. A held
// lock's lease counts from
// its base: at the grant, the later of its request's send time and the
// latest send time among the requests whose results were read before the
// grant (not the handshake: a grant the server kept for the session while
// it was away, or announces again after a reconnect, is read after the
// handshake but was made before it); then the send time of the last
// successful Extend (or Client.Renew of exactly its owner, resources and
// fencing token, or an owner's re-entry). A renewal to a shorter lease
// (an Extend, Renew or re-entry with a smaller ttl) may be applied although
// its answer never arrives: from its send time until a renewal sent at or
// after it is answered, the lease also ends at its send time plus its ttl.
// The session's end is lastAck plus
// the session grace the server announces in its handshake (a server that
// announces none: only the lease counts). Lock.Deadline is the earlier of
// base + ttl and lastAck + grace, each less the clock-drift margin span/100
// + 5 ms (the two clocks are assumed to run at rates that differ by less
// than 1 %). When the Deadline passes without news the lock is lost: Lost
// closes, Err is an Error of Type lost (ErrExpired for the lease,
// ErrSessionLost for the session), Do's context is cancelled, and an unlock
// is sent if the connection is up. The server never frees a lock earlier:
// its lease ends at least ttl after the extend's send time, and it keeps a
// disconnected session for its grace from its last answer or later. While
// the session holds or waits for locks, the client makes sure something is
// answered at least every third of the shorter of the grace and the
// smallest ttl held, and every quarter of the smallest ttl waited for (an
// idle client with one lock, grace 15 s and ttl 60 s pings every 5 s; one
// that waits for a lock of ttl 1 s pings 4 times a second); otherwise it
// pings every Options.PingInterval.
//
// So every grant is usable, whatever the wait: it reaches the caller with
// at least two thirds of its ttl (less the drift margin) to believe. A
// grant granted after a wait arrives with about three quarters of its ttl,
// its lease counting from the last answer read before it; one that arrives
// with less than two thirds (the answers were slow, the process paused, the
// session resumed on another node of a cluster) is confirmed first by an
// extend sent on arrival, and handed over once that is answered, its lease
// counting from the extend's send time; if the grant is gone by then (its
// lease ran out on the server), the request is asked again with what is
// left of its timeout. A confirmation answered too late to leave two thirds
// is sent again, at most three in all; a grant still short after them is
// given back and its request asked again: it is never handed over short.
// Lock checks it once more in the caller's goroutine, which a busy machine
// may run long after the grant was read, with the same rule.
//
// # The path of a request
//
// Client.Lock checks the names (the one rule, internal/protocol's, which the
// server's engine applies too), and the session appends a "lock" command
// (a protocol.LockArgs) to the connection's outbox (internal/protocol),
// which goes out in one write together with the other callers'
// commands: the session's reader writes those of the callers it has just
// answered (it yields until each has sent again, for at most 20 µs), a
// writer goroutine the rest. The server (package server) applies it to the lock service core
// (internal/core, over the engine internal/locktable, neither of which the
// client links) and answers with a
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
// ErrReleased, ErrSessionLost, ErrClosed, ErrForbidden, ErrRateLimited,
// ErrServerFull, ErrScopeUnsupported (ReleaseIn, ReleaseAllIn on a server
// without scoped releases); and for a refused
// connection ErrAuth, ErrTLS, ErrRefused. A wait given up through its
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
