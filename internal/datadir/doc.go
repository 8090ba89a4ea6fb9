// Package datadir is mlockd's data directory: what one run of the server
// leaves for the next, so that a restart is safe.
//
// It keeps three files in the directory:
//
//   - lock: held with an exclusive advisory lock (flock) while a server uses
//     the directory, so that a second server on the same directory fails to
//     open it instead of giving the same tokens twice;
//   - state: how the last run ended, in one word (running, or crashed;
//     clean; unconfirmed: shut down while a client may still believe it
//     holds a lock), the wall-clock time until which a client of an earlier
//     run may still believe it holds a lock ("quiet until"), and the quiet
//     period in force in the last run;
//   - token-mark: the fencing-token high-water mark, one decimal number and
//     a newline: every token ever given from this directory is below it.
//
// Every write goes to a temporary file that is synced, renamed over the old
// file, and followed by a sync of the directory, so a crash leaves either the
// old or the new content.
//
// # The quiet period
//
// A server that starts after a crash must grant nothing while a client of the
// previous run may still believe it holds a lock: for the session grace period
// plus a margin for clock drift (QuietPeriod). [Dir.Start] decides, from the
// state file, whether this start is quiet and until when, and records that
// the server is running, so that a crash from then on leaves "running"
// behind, with the run's quiet period: the start after a crash is quiet for
// the longer of that period and its own, so restarting with a shorter
// session grace or quiet period does not shorten what the clients of the
// crashed run may still believe. [Dir.CleanShutdown] records the end of a
// shutdown: clean when no client can believe it holds a lock, unconfirmed
// with the time until which one may when the server could not confirm that
// every holder learned of the shutdown.
//
// A start grants at once only when it provably follows no live holder: on a
// new directory (no state and no token mark), after a clean shutdown, or
// after an unconfirmed one whose recorded quiet time has passed. A missing state next to a token mark (a
// directory written by an older mlockd), an unreadable or corrupt state file,
// and a state that says "running" all mean a quiet start.
//
// Recorded times are wall-clock Unix nanoseconds: a wall clock stepped back
// between two runs lengthens the quiet period, one stepped forward shortens
// it. The margin of QuietPeriod covers drift, not steps.
//
// # Concurrency
//
// A Dir is safe for concurrent use. MarkDue, asked after every batch of
// grants, takes no lock and does no I/O; ReserveTokens does no I/O unless
// the mark must move. A server gives no token at or above TokenMark, the
// mark on disk: when a write fails (a full, failing or read-only disk) it
// stops granting past the mark until a write succeeds, so a token never
// repeats whatever the clock does between runs. SetFaultHook injects
// errors at each step of the writes, for tests.
package datadir
