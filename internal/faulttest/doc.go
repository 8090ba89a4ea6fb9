// Package faulttest holds the fault tests of mlock: real mlockd (or Redis)
// and real client processes, faults injected, and a checker of the history
// the clients write.
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
package faulttest
