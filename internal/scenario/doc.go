// Package scenario is the user-scenario suite: mlock used the way its users
// use it, with separate processes (each its own session), on one mlockd and
// on a 3-node cluster, all real processes on loopback. Its only code is
// LogLine, the line its worker programs write to the shared log; its test
// builds mlockd, mlock and a small worker program (testdata/order, on the
// Go client) and runs:
//
//   - the flash sale: orders, each its own process, on 5 hot SKUs, each
//     locking 1 to 3 of them in one request (sku:1|sku:3), holding them 50 to
//     200 ms, all asking at the same moment, so that the queues last far
//     longer than the ttl;
//   - the cron fleet: mlock run --skip-if-locked runs and waiting mlock run
//     runs (--timeout 60s) on one job, started in turn, the job a sh -c that
//     writes the start and end of its run to the log and takes 350 ms; every
//     run must exit 0 (run, or skipped), and at least one must be skipped;
//   - the same with Node.js processes: the mlock npm package
//     (js/packages/mlock, acquire with a ttl of 2 s, then a hold of 500 ms,
//     then unlock), and Medusa's Locking Module (@medusajs/locking, loaded by
//     Medusa's module loader) with the locking-mlock provider: checkouts
//     through execute with expire: 1 (testdata/node);
//   - the reconnect storm (TestStorm): sessions from four loopback
//     addresses (127.0.0.1 to 127.0.0.4), each holding or waiting for a
//     lock, in worker processes speaking the wire protocol as the original
//     client does (testdata/storm: a connection per session, the same
//     socketId again after a drop, a jittered backoff); one mlockd is
//     restarted, a cluster's leader killed, and every session connects
//     again at once. No handshake may be refused or evicted and no holds
//     overlap; on the cluster every session comes back resumed with its
//     lock or its place in the queue. 200 sessions by default, 2 000 with
//     MLOCK_SCENARIO_LONG=1.
//
// TestFencedFlashSale (fencing_test.go) is the proof of fenced writes
// (docs/fencing.md): 5 SKUs of limited stock in a private PostgreSQL, sold
// by buyer processes (testdata/buyer in Go, testdata/node/buyer.js through
// locking-mlock's execute) of which a third stop themselves (SIGSTOP) in
// their critical section and are resumed after 2.5 ttl, while mlockd, or
// the cluster's leader, is killed and started again. Each round runs the
// sale twice at once: written naively it must oversell; fenced, nothing is
// oversold, no update lost, every acknowledged sale kept. 2 rounds by
// default (40 buyers, ttl 1 s), 6 with MLOCK_SCENARIO_LONG=1 (50 buyers,
// ttl 1.5 s); it prints the table of both. It needs PostgreSQL (internal/
// pgtest) and the Node.js packages built, as the Node.js scenarios.
//
// The workers of a scenario connect first and wait for the test to close
// their standard input, so that they all ask at once. On a cluster, worker i
// is given every node's address starting with node i mod 3; odd Go workers
// also stay on that node (stay-on-node=1), so that grants also reach
// clients through followers.
//
// # The log
//
// Every worker appends to one shared log, one line per event, each line one
// write to a file opened with O_APPEND; times are the wall clock in Unix ns:
//
//	ready ID NS                          connected, waiting for the start signal
//	ask ID NS RESOURCES                  the lock request is sent
//	grant ID NS BELIEVED TOKEN RESOURCES [LAG]
//	                                     the grant reached the caller, believed
//	                                     held for BELIEVED ns from then on; LAG
//	                                     (the Node.js acquire): ns from its event
//	                                     loop's last tick before the grant to
//	                                     then, a bound of its own stall after
//	                                     its client's check of the grant
//	start ID NS TOKEN RESOURCES [EXP]    the critical section starts (a cron
//	                                     run: EXP is MLOCK_EXPIRES_AT, Unix ms)
//	end ID NS TOKEN RESOURCES            the critical section ends, the lock
//	                                     still believed held
//	stop ID NS TOKEN RESOURCES           a cron run's command, stopped by
//	                                     mlock run for a lost lock (SIGTERM),
//	                                     stops there
//	loss ID NS WHERE WHY...              the lock was lost: on arrival, during
//	                                     the hold, or found gone by the unlock
//	error ID NS WHAT...                  anything else that went wrong
//	done ID NS                           unlocked
//
// The Go and Node.js workers log a section's start and end with the time
// they read just before they checked that the lock was still believed held
// (the Go client's Deadline, the Node client's held, both on the monotonic
// clock), not the time they write the line: a worker descheduled between
// the check and the write would otherwise log an end later than any moment
// it could justify, and a section that seems to overlap the next holder's.
// Every process runs on the one machine, so the wall clocks of the lines
// compare: the Go processes and the cron jobs read the system's; the
// Node.js workers add to their monotonic clock its offset from it, measured
// when they start (not performance.timeOrigin, which a start descheduled at
// the wrong moment puts tens of ms off: testdata/node/common.js);
// TestNodeClock checks that their times fall between two readings of the
// test's own clock.
//
// BELIEVED is, for the Go client, time.Until(Lock.Deadline()) when Lock
// returns, and for Node.js, lock.deadline - Date.now() when acquire resolves
// (for Medusa, in a wrapper of the client's acquire: the provider's job gets
// no lock handle). mlock run does not show its belief to its command: a run
// whose grant arrives too short to use exits 125 (it refuses to start the
// command), one that loses it exits 75; the table shows the server's lease
// left at the start of the command instead (marked *), not checked against
// the two thirds: mlock run starts the command once it believes the lock
// held for longer than its watchdog's lead (kill-after + 100 ms) + 100 ms,
// renews it while the command runs, and the fork and exec of the command
// come in between.
//
// # The checks
//
// For each scenario and target the test prints a row: processes, grants,
// skipped cron runs, grants lost on arrival (lost, or believed for less than
// two thirds of ttl - ttl/100 - 5 ms when they arrive, LAG added), losses during the
// hold, overlapping critical sections on one resource (a section with no end
// line counts until its loss line, its stop line, or the exit of its process
// as the test saw it, whichever comes first: mlock run reaps its command
// before it exits; a process killed or not reaped, for ever), fencing tokens out of
// order along a resource's sections, unexpected exit statuses, the wait p50,
// p99 and maximum, the ttl and the least time believed at arrival. It fails
// unless every count of trouble is 0, every process exits 0, every waiting
// worker ran its critical section whole, and the longest wait exceeds the
// ttl (the scenario's premise: grants after waits longer than the lease).
//
// A short version runs by default (24 orders with a ttl of 1 s, 6 + 12 cron
// runs with a ttl of 3 s, 8 Node.js processes with a ttl of 2 s, 6 on the cluster, and 4
// Medusa checkouts holding 450 ms: loading Medusa costs about a second of
// CPU per process); the full counts (50 orders with a ttl of 2 s, 20 + 20
// cron runs with a ttl of 500 ms and jobs of 150 ms, 20 Node.js processes with a ttl of 1 s, 12 Medusa checkouts
// holding 300 ms, on both targets):
//
//	MLOCK_SCENARIO_LONG=1 go test ./internal/scenario/ -v -count=1 -timeout 30m
//
// The Node.js scenarios need node and the built packages (npm ci and npm run
// build in js/); without them they skip, except under CI=true, where they
// fail. -short skips the whole suite. MLOCK_TEST_ARTIFACTS=DIR keeps the
// files of a failing scenario (the shared log, every process's output, the
// servers' logs) in DIR. Linux
// and the BSDs only (process groups); every process is stopped by its
// process id at the end of the test.
package scenario
