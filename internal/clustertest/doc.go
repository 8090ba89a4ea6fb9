// Package clustertest holds the fault test of an mlockd cluster: three real
// mlockd processes on loopback, Go clients (package mlock) that lock, extend
// and unlock a few resources through every node, and faults injected while
// they run.
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
//	MLOCK_CLUSTER_FAULT_ROUNDS=100 go test ./internal/clustertest/ -run TestClusterFaults -v -count=1 -timeout 60m
//
// MLOCK_CLUSTER_FAULT_KEEP=DIR copies the history and the nodes' logs to DIR
// when a check fails. Linux only (signals, process groups); every process is
// stopped by its process id at the end of the test.
package clustertest
