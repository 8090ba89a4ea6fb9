// Package locking is a locking module in the model of Medusa's Locking
// Module: Execute, Acquire, Release and ReleaseAll with owner ids, over
// interchangeable providers.
//
// # Basics
//
//	m := locking.NewModule()                     // the memory provider is the default
//	err := m.Execute(ctx, []string{"cart:1"}, func(ctx context.Context) error {
//		return completeCart(ctx)                  // ctx is cancelled if the lock is lost
//	}, locking.ExecuteOptions{})
//
// Providers: the in-process Memory provider (this package, the default), an
// mlockd provider (package locking/mlockd) and a Redis provider compatible
// with Medusa's locking-redis key layout (package locking/redis). Register
// them with Module.Register, or open one from a URL with Open and run jobs
// on it with the function Execute:
//
//	p, err := locking.Open(ctx, "mlock://localhost:12340") // import _ "github.com/mlock-dev/mlock/locking/mlockd"
//	err = locking.Execute(ctx, p, []string{"cart:1"}, job, locking.ExecuteOptions{})
//
// A provider only acquires, renews and releases; Execute (the module's one
// lease watchdog, shared with the mlock client's Do and Hold) runs the job
// over those calls. Package locking/provider is the kit for writing a
// provider, and locking/lockingtest its conformance suite.
//
// # Guarantees (every provider)
//
//   - Acquiring several keys is all-or-nothing, and two callers asking for
//     overlapping keys in any order never deadlock.
//   - Execute takes the lock under a fresh owner, waits at most its timeout
//     (5 s by default), holds a lease separate from that timeout (60 s by
//     default) renewed every third of it while the job runs, cancels the
//     job's context and returns an ErrLost error if the lease is lost, and
//     always releases — also a grant that lands as the wait times out.
//   - The job is cancelled no later than its holder can justify with its
//     own clock: the send time of the last successful renewal plus the
//     lease, less a clock-drift margin (lease/100 + 5 ms: the clocks are
//     assumed to differ in rate by less than 1 %) and less
//     ExecuteOptions.Lead; at once when the provider learns of a loss
//     (Lease.Lost: mlockd's pushes and lost sessions, a Redis restart).
//   - The same owner acquiring exactly the keys it holds renews the lease;
//     another owner conflicts; another owner's Release changes nothing and
//     returns false.
//
// docs/locking.md lists every deviation from each Medusa provider.
//
// # Caveats
//
// Units are time.Duration, not Medusa's seconds. A lease is not mutual
// exclusion under every failure; use the fencing tokens of Lease where the
// provider has them.
package locking
