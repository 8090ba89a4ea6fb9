// Package faulttest holds the fault tests of mlock, on real processes
// with faults injected: one server (mlockd or Redis) with client processes
// and a checker of the history they write, and a three-node mlockd cluster
// with Go clients and a linearizability checker. The tests of both wait
// for leases, elections and outages far more than they compute, and run at
// once.
//
// # One server
//
// The tests build cmd/mlockd, cmd/mlock and a small worker
// (testdata/worker) and run, for each fault kind, a server behind a TCP
// proxy and a few workers that take one lock in turn. Each worker appends
// "start", "beat" (an action under the lock) and "end" lines with its
// fencing token and the time to a shared log; the harness adds the faults
// and the workers' exits. The checker then requires, per resource:
//
//   - no two critical sections overlap (a section whose worker was killed
//     before writing its end lasts until the harness saw it dead), and
//   - fencing tokens strictly increase in start order.
//
// For the Redis provider the first rule is weaker: a Redis restarted
// without its data cannot refuse a newcomer, so an overlap passes if the
// older holder has the smaller token (a fenced resource rejects its late
// writes) and learned of the loss within its next renewal (ttl/3, plus a
// margin).
//
// The faults: kill -9 and restart of the server, SIGSTOP/SIGCONT of the
// server and of a holder, a proxy that cuts, delays, blackholes (stops
// forwarding, connections open) or refuses connections, and a Redis restart
// for the Redis provider; plus the cases of issue 10 as named kinds.
//
// A failed kind prints the offending sections and the history lines around
// them; MLOCK_FAULT_KEEP=DIR keeps the whole log. The run is short by
// default (two rounds per kind, all kinds in parallel, well under a
// minute); MLOCK_FAULT_ROUNDS=100 runs a long one:
//
//	go test ./internal/faulttest/ -v -count=1
//	MLOCK_FAULT_ROUNDS=100 go test ./internal/faulttest/ -v -count=1 -timeout 90m -run TestFaults
//
// Every kind is strict: a violation fails its test.
//
// Everything runs on 127.0.0.1; every process is stopped by its process
// group id at the end of its test.
//
// # A cluster
//
// TestClusterFaults: three real mlockd processes on loopback, Go clients
// (package mlock) that lock, extend and unlock a few resources through
// every node, and faults injected while they run.
//
// Each round injects one fault: kill -9 of the leader, of a follower, or of
// the node a client is connected to, then a restart of that node on the same
// Raft and data directories; or SIGSTOP of the leader for longer than an
// election, then SIGCONT. The round ends when the cluster agrees on a ready
// leader again.
//
// The clients record every call: its invocation and response times (the
// test process's monotonic clock), its outcome (ok, a definite refusal, lost,
// or unknown: a connection error or an abandoned wait, which may or may not
// have taken effect), each grant's fencing token, and each holder's belief:
// from the grant until the earlier of its unlock's invocation, the moment it
// learned of a loss, and the latest Lock.Deadline it saw. The checks:
//
//   - safety: on one resource no two belief intervals overlap, and fencing
//     tokens strictly increase in the order of the intervals;
//   - linearizability (github.com/anishathalye/porcupine), per resource,
//     against a lock model: a lock is granted only when the resource is free
//     or its holder's lease may have ended (the holder's latest Deadline is
//     before the grant's response), with a token above every earlier one; an
//     extend succeeds only for the holder; an unlock frees it. An operation of
//     unknown outcome has an infinite response time and may or may not take
//     effect (a lock of unknown outcome may leave an invisible holder, which
//     may expire at any time);
//   - availability: the time from each fault to the next grant and until
//     every request in flight at the fault has had its answer (p50, p99),
//     and the failed requests by kind and cause (reported, not a failure of
//     the test).
//
// The run is short by default (MLOCK_CLUSTER_FAULT_ROUNDS rounds, default
// 8, about half a minute); a long one:
//
//	MLOCK_CLUSTER_FAULT_ROUNDS=100 go test ./internal/faulttest/ -run TestClusterFaults -v -count=1 -timeout 60m
//
// MLOCK_CLUSTER_FAULT_KEEP=DIR copies the history and the nodes' logs to DIR
// when a check fails. Linux only (signals, process groups); every process is
// stopped by its process id at the end of the test.
//
// Beside it, on their own clusters: TestFailover (what a kill -9 of the
// leader costs clients under load), TestLeaderlessWait (a lock's wait
// timeout on a node without a quorum) and TestRollingUpgrade (the previous
// release's nodes replaced one at a time under load).
package faulttest
