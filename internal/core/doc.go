// Package core is the lock service: it owns the lock engine
// (internal/locktable), the clock, the one deadline timer and the fan-out of
// events. Commands go in, events come out. The server (package server) and
// the in-process provider (locking.Memory) both run on a Core; neither
// touches the engine or a timer directly.
//
// # Basics
//
//	c, _ := core.New(core.Config{
//		OnBatch: func(tx *core.Tx, events []core.Event) {
//			for _, e := range events { /* tell e.Session about e */ }
//		},
//	})
//	defer c.Close()
//	c.Batch(func(tx *core.Tx) {
//		tx.Apply(&core.Command{Op: core.OpAttach, Session: "s"})
//		r := tx.Apply(&core.Command{Op: core.OpLock, Request: core.Request{
//			Session: "s", Resources: []string{"a"}, TTL: time.Minute}})
//		_ = r // r.Grant: the request's ID, and its token if granted at once
//	})
//
// A batch is one acquisition of the core's lock. Every command of a batch
// runs at the same time, Tx.Now, read once from the Clock. At the end of the
// batch OnBatch receives, in order, the events the commands caused for other
// requests (a waiter granted because a lock went away, a timeout, an expiry,
// a session dropped), then the core arms its timer at the engine's next
// deadline. When the timer fires, the core runs a batch of its own that
// processes what is due (OpTick) and calls OnBatch with the result.
//
// A request granted at once is reported only in its Result, not as an event,
// so the caller can answer the request before it announces the grant.
//
// # Holding grants
//
// A server that starts after a crash must grant nothing while a client of the
// previous run may still believe it holds a lock. It applies, before it
// serves anyone,
//
//	c.Apply(&core.Command{Op: core.OpHoldGrants, Until: quietUntil})
//
// (or sets EngineConfig.GrantAfter). Requests are accepted and queue as
// usual, try-locks are refused as busy, timeouts run; at Until the core's
// timer grants everything grantable, in arrival order, and OnBatch receives
// the Granted events. A hold is a command like the others, so a replicated
// log carries it as one entry at its time.
//
// # The seam for replication
//
// "Apply a command at time T" is one call:
//
//	c.BatchAt(T, func(tx *core.Tx) { tx.Apply(&cmd) })
//
// The engine is deterministic given its commands and their times (and the
// seed of its lock ids, EngineConfig.Seed), so a replicated log in front of
// BatchAt (each entry a time and commands) makes every replica hold the same
// table, byte for byte. A replica runs with Config.Manual: no timer, no
// clock; the leader reads NextDeadline and appends an OpTick entry when it
// is due. Snapshot and Restore carry the whole state, so a restored replica
// goes on exactly like the others. A new leader appends OpFailover, which
// postpones to the end of the election window every expiry, wait timeout
// and grace end that would fall in it, so that the election robs no holder
// of its lock.
//
// # Caveats
//
// OnBatch runs under the core's lock: it must be quick, may use the Tx read
// methods, must not call Tx.Apply (it panics) nor any Core method (deadlock).
// The same holds for the function passed to Batch, which may call Apply.
// After Close the timer no longer fires; batches still run.
package core
