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
// Deadlines: the leader asks Config.NextDeadline after each applied entry and, when its clock passes
// it, proposes a tick (an entry with no commands). Followers never tick.
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
// Storage: Config.Dir holds raft.db (github.com/hashicorp/raft-boltdb/v2 on bbolt: log and stable
// store, fsync per write, behind a 512-entry log cache) and raft's file snapshot store (2 retained).
// Dir "" keeps everything in memory.
//
// # Versions
//
// hashicorp/raft v1.7.3 with raft-boltdb/v2 v2.3.1 (bbolt raised to v1.3.11). raft v1.8.0 needs
// go-metrics v0.7, with which raft-boltdb v2.3.1 does not build; v1.8.0 would mean raft-wal instead,
// a younger log store, while bbolt is the store etcd has run for years. v1.8.0 brings nothing this
// package uses, and the disk write per group commit, not the log store, bounds the throughput here.
package cluster
