// Package cluster replicates opaque commands with Raft (github.com/hashicorp/raft) into a
// deterministic StateMachine. It knows nothing about what the commands mean.
//
// # Model
//
// Every log entry is a batch: {now, cmds}. now is the leader's clock (Unix ns) when it proposed the
// entry, never lower than the previous entry's (the state machine's clock is the max of both, so
// it never goes backwards, also across leader changes and restarts). Every node applies every entry
// with one StateMachine.Apply(now, cmds) call, in log order; nothing on a follower reads its own clock.
//
// Group commit: the leader collects concurrent Propose calls into one entry (up to Config.MaxBatch
// commands; while an earlier entry is still being committed it waits up to Config.BatchWindow for
// more, an idle leader sends at once). raft itself writes and replicates many entries per disk write
// and RPC (MaxAppendEntries) and applies them through a batching FSM: one fsync per
// group, never per command.
//
// Deadlines: the leader sets a timer for Config.NextDeadline (again whenever an applied entry brings
// an earlier deadline) and, when its clock passes it, proposes a tick (an entry with no commands).
// Followers never tick.
//
// Leader change: a new leader commits a barrier (every earlier entry applied), then one leader entry
// carrying Config.OnLeader's command (the state machine's failover rule) and the leader's id and
// client address (LeaderInfo.ClientAddr on every node). Propose waits until that entry is applied.
//
// Exactly once: a Propose whose command reached raft but whose result is unknown (leadership lost)
// returns ErrUnknownOutcome; the caller retries with the same command. Dedup wraps a StateMachine
// to apply each (client, seq) key once and answer repeats from a replicated window.
//
// Forwarding: only the leader proposes. A follower's Propose returns *NotLeaderError with the leader
// (its raft and client address); the server forwards over its own client protocol. A forwarding RPC
// multiplexed on the raft port would need a custom StreamLayer and a second protocol on it; the
// client port already carries everything a forwarded command needs, so it is not done here.
//
// Storage: Config.Dir/wal holds the log and the stable store (github.com/hashicorp/raft-wal: an
// append-only log in preallocated 8 MiB segment files, one fsync per write; the current term,
// the vote and the list of segments in a small bbolt file, wal-meta.db, written only when those
// change), behind a 512-entry log cache: the WAL reads an entry back from its file (about 4 µs, a
// pread and a decode), the cache serves what the followers' replication and apply read from memory.
// Config.Dir/snapshots is raft's file snapshot store (2 retained). A Dir holding raft.db, the bbolt
// store of earlier development builds, and no wal directory is refused (ErrOldLogStore); there is no
// migration. Dir "" keeps everything in memory.
//
// # Versions
//
// hashicorp/raft v1.8.0 with raft-wal v0.4.1. The log store's write is on every group commit's path,
// on the leader and then on a follower, one after the other: raft-boltdb (bbolt) writes pages and
// syncs twice per transaction, 375 µs to store one 600-byte entry on the machine measured against
// 147 µs for raft-wal's append and single fsync (1000 sequential StoreLogs calls each), and the
// leader spent about 45% of its CPU in it. raft-wal is younger (its authors still call it
// experimental): each append batch ends with a commit frame holding a CRC of the batch, and
// recovery drops a torn last batch, which fsync never acknowledged. v0.4.1, not v0.4.0: v0.4.0
// marks a segment cut by a tail truncation (a follower dropping a deposed leader's entries) sealed
// without writing its index, and the node then fails at every start (TestTruncatedLogRestart);
// v0.4.1 also closes wal-meta.db on Close. v0.4.1 still records a segment's rotation in wal-meta.db
// only after the append that filled the segment sealed its file: a crash in between left the log
// refusing every append, at every start; Open records such a rotation before the WAL opens
// (repairSealedTail, TestSealedTailRepaired). Segments are 8 MiB, not raft-wal's 64 MiB: every tail
// truncation starts a new preallocated segment, and leader changes on a lightly loaded cluster
// would otherwise leave 64 MiB files until compaction passes them. Its segment preallocation pulls in etcd v3.3's capnslog,
// which redirects the standard log package when the program starts (log.go puts it back).
// raft v1.8.0 builds with raft-wal and go-metrics v0.7; what it adds (restoring committed logs at
// start) is off and unused. Pre-vote (since v1.7) is on. It still leaves a future in a buffered
// apply channel unanswered at shutdown, so BatchApplyCh stays off. No go-metrics sink is
// configured: raft's metrics calls end in go-metrics' default blackhole sink.
package cluster
