// Package server is mlockd, the mlock lock server, as a library: Go programs
// and tests can run one in-process.
//
// # Basics
//
//	srv, err := server.New(server.Config{})        // zero Config: defaults
//	ln, _ := net.Listen("tcp", "127.0.0.1:0")
//	go srv.Serve(ln)
//	defer srv.Shutdown(context.Background())
//
// The server speaks the original mlock 1.0 protocol (docs/protocol.md), so the
// original Node.js client works against it unchanged, plus additive
// extensions: the fencing token on locked, owners, release by owner,
// renew by owner, try-lock, the busy resource named in a conflict, and a
// listing of holders and waiters.
//
// A request's path: a connection's reader (conn.go) parses the frames of one
// read and runs them in one batch of the lock service core (internal/core),
// which owns the lock engine (internal/locktable), the clock and the deadline
// timer. Each command (commands.go) is a core.Command applied with
// Tx.Apply; its answer is queued on the connection. At the end of every
// batch, and of every timer tick, the core hands the batch's events (grants,
// timeouts, expiries, releases) to the server, which turns them into pushes
// to the sessions concerned and wakes their writers.
//
// Locks belong to sessions (the client's socketId), not to TCP connections.
// A session whose connection drops keeps its locks for Config.SessionGrace;
// pushes meant for it are kept and replayed, in order, when it reconnects
// with the same socketId. When the grace period ends its held locks are
// released and its waiting requests removed.
//
// # Restarts and shutdown
//
// State is in memory: a restart loses every lock (a reconnecting client is
// told its session is new). A client may believe it holds a lock until the
// send time of the last request the server answered on its session plus
// the session grace, which the handshake announces; the server never frees
// a session's locks earlier (the grace starts when the session's connection
// has ended, after its last answer).
//
// So a start that may follow a crash grants nothing for Config.QuietPeriod
// (default: the grace plus 1 % plus 5 ms): requests queue and are granted
// when it ends, try-locks are refused as busy, and status shows quietUntil.
// With Config.DataDir (internal/datadir) the server knows how its previous
// run ended: a new directory, or a clean shutdown whose holders all
// confirmed, grants at once; a crash, or a shutdown with a holder that did
// not confirm, is quiet, for the longer of the quiet period recorded by
// the crashed run and this run's own. Without a data directory every start
// is quiet unless QuietPeriod is negative (unsafe, for tests).
//
// Shutdown stops granting, pushes "expired <id> shutdown" for every held lock and
// then "error server shutting down!" to every connection, and waits up to
// Config.ShutdownWait for each holder's client to confirm with "bye <req>"
// (an extension: the client has marked its locks lost; the server then
// closes the connection) before it records the shutdown in the data
// directory. A connection that merely closes does not confirm: its client
// may have closed for its own reasons without reading the pushes.
//
// Fencing tokens never repeat across restarts: with Config.DataDir the
// high-water mark is kept on disk; in every case the first token is at
// least the start time in microseconds.
//
// # Caveats
//
// Every limit of Config is enforced per request or per connection; a client
// that breaks one gets an error (or, for a malformed frame, its connection
// closed) while every other client carries on.
package server
