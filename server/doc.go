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
// try-lock and a listing of holders and waiters.
//
// Locks belong to sessions (the client's socketId), not to TCP connections.
// A session whose connection drops keeps its locks for Config.SessionGrace;
// pushes meant for it are kept and replayed, in order, when it reconnects
// with the same socketId. When the grace period ends its held locks are
// released and its waiting requests removed.
//
// # Caveats
//
// State is in memory: a restart loses every lock (a reconnecting client is
// told its session is new). Fencing tokens never repeat across restarts:
// with Config.DataDir the high-water mark is kept on disk; without it the
// first token is the start time in microseconds.
//
// Every limit of Config is enforced per request or per connection; a client
// that breaks one gets an error (or, for a malformed frame, its connection
// closed) while every other client carries on.
package server
