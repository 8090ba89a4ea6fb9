package cluster

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/hashicorp/raft"
	raftwal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/mlock-dev/mlock/internal/datadir"
)

// RecoverConfig configures Recover.
type RecoverConfig struct {
	// Dir is the stopped node's Config.Dir (required). It must hold raft state: Recover never makes a
	// cluster out of nothing.
	Dir string
	// ID is the node's Config.ID (required): it must be a member of a configuration found in Dir (the
	// latest, or an earlier one), which guards against recovering a directory under another node's id.
	ID string
	// RaftAddr is the raft address the node will listen on. "": its address in that configuration.
	RaftAddr string
	// SM is the state machine to replay the node's state into (required): a fresh one, as Open's.
	SM StateMachine
	// Adjust, if set, is called once the whole log is applied to SM and before the new snapshot is
	// taken, with the time of the last applied entry (Unix ns): the caller may change the state
	// (Recover's caller raises the fencing-token floor there). An error stops the recovery with Dir
	// unchanged.
	Adjust func(lastNow int64) error
	// DryRun replays and reports without changing anything in Dir.
	DryRun bool
	// Logger receives raft's log (nil: silent).
	Logger *slog.Logger
}

// RecoverReport says what Recover found and did.
type RecoverReport struct {
	// Previous is the configuration found: the latest one in the log, committed or not, else the
	// newest snapshot's.
	Previous []Peer
	// Voter is the one member of the new configuration (ID and raft address).
	Voter Peer
	// SnapshotIndex and SnapshotTerm are the newest snapshot's that was restored (0: none).
	SnapshotIndex, SnapshotTerm uint64
	// Replayed is how many log entries past the snapshot were applied (commands and others).
	Replayed int
	// LastIndex and LastTerm are the last entry's: the new snapshot's index, every entry up to it
	// counted as committed.
	LastIndex, LastTerm uint64
	// LastNow is the time of the last applied entry (Unix ns; 0 with no entry).
	LastNow int64
}

// Errors of Recover.
var (
	// ErrNoState: Dir holds no raft state (no log, no snapshot, no term).
	ErrNoState = errors.New("cluster: the directory holds no raft state")
	// ErrNotMember: ID is not in the configuration Dir holds.
	ErrNotMember = errors.New("cluster: the node id is not a member of the configuration in the directory")
)

// Recover turns a stopped node's raft state into that of a new cluster with this node as its only
// voter, keeping its whole state: the state machine is restored from the newest snapshot, every log
// entry after it is applied (committed or not: a node cannot tell whether the others committed what
// it received and never saw committed, and keeping it loses nothing a client was told), Adjust runs,
// and a snapshot of the result is written at the last entry's index with the configuration {ID}
// (committed at index 1, as raft's own RecoverCluster does). The log is then compacted away: a later
// Open starts from that snapshot, elects itself at once and grows with Join.
//
// Dir must not be in use: Recover takes the same lock as Open and fails with an error wrapping
// datadir.ErrInUse while a node runs on it. A crash during Recover leaves a directory that Open
// reads: either the old state (no new snapshot yet) or the recovered one (the new snapshot is the
// newest, and the log entries it covers are never read again); Recover may be run again on it.
//
// The other members of the old configuration must never be started again on their directories:
// together they are a majority of the old configuration and would elect a leader of their own.
func Recover(cfg RecoverConfig) (*RecoverReport, error) {
	switch {
	case cfg.Dir == "":
		return nil, errors.New("cluster: RecoverConfig.Dir is required")
	case cfg.ID == "":
		return nil, errors.New("cluster: RecoverConfig.ID is required")
	case cfg.SM == nil:
		return nil, errors.New("cluster: RecoverConfig.SM is required")
	}
	if err := checkOldLogStore(cfg.Dir); err != nil {
		return nil, err
	}
	walDir := filepath.Join(cfg.Dir, walDirName)
	if _, err := os.Stat(walDir); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%w: %s has no %s directory", ErrNoState, cfg.Dir, walDirName)
		}
		return nil, fmt.Errorf("cluster: %w", err)
	}
	lock, err := datadir.Lock(walDir)
	if err != nil {
		return nil, fmt.Errorf("cluster: raft directory: %w", err)
	}
	defer lock.Close()

	logger := newHCLogger(cfg.Logger)
	meta := &metadb.BoltMetaDB{}
	if _, err := repairSealedTail(walDir, meta); err != nil {
		meta.Close()
		return nil, fmt.Errorf("cluster: open log %s: %w", walDir, err)
	}
	wal, err := raftwal.Open(walDir, raftwal.WithMetaStore(meta), raftwal.WithLogger(logger.Named("wal")),
		raftwal.WithSegmentSize(walSegmentSize))
	if err != nil {
		meta.Close()
		return nil, fmt.Errorf("cluster: open log %s: %w", walDir, err)
	}
	defer wal.Close()
	snaps, err := raft.NewFileSnapshotStoreWithLogger(cfg.Dir, 2, logger)
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	has, err := raft.HasExistingState(wal, wal, snaps)
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	if !has {
		return nil, fmt.Errorf("%w: %s", ErrNoState, cfg.Dir)
	}

	rep := &RecoverReport{}
	f := &fsm{sm: cfg.SM, applied: make(chan struct{}, 1)}
	var conf raft.Configuration
	var seen []raft.Configuration // every configuration found, the latest last
	metas, err := snaps.List()
	if err != nil {
		return nil, fmt.Errorf("cluster: list snapshots: %w", err)
	}
	if len(metas) > 0 {
		// Only the newest: falling back to an older one would leave a gap to the log, which raft
		// compacted up to the newest.
		m, rc, err := snaps.Open(metas[0].ID)
		if err != nil {
			return nil, fmt.Errorf("cluster: open snapshot %s: %w", metas[0].ID, err)
		}
		if err := f.Restore(rc); err != nil {
			return nil, fmt.Errorf("cluster: restore snapshot %s: %w", m.ID, err)
		}
		rep.SnapshotIndex, rep.SnapshotTerm = m.Index, m.Term
		conf = m.Configuration
		seen = append(seen, conf)
	}
	rep.LastIndex, rep.LastTerm = rep.SnapshotIndex, rep.SnapshotTerm

	first, err := wal.FirstIndex()
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	last, err := wal.LastIndex()
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	if last > rep.SnapshotIndex && first > rep.SnapshotIndex+1 {
		return nil, fmt.Errorf("cluster: the log starts at %d, after the snapshot's index %d: entries are missing", first, rep.SnapshotIndex)
	}
	for i := rep.SnapshotIndex + 1; i <= last && last > 0; i++ {
		var l raft.Log
		if err := wal.GetLog(i, &l); err != nil {
			return nil, fmt.Errorf("cluster: read log entry %d: %w", i, err)
		}
		switch l.Type {
		case raft.LogCommand:
			f.Apply(&l) // an entry that does not decode is skipped, as a running node does
		case raft.LogConfiguration:
			conf = raft.DecodeConfiguration(l.Data)
			seen = append(seen, conf)
		}
		rep.Replayed++
		rep.LastIndex, rep.LastTerm = l.Index, l.Term
	}
	rep.LastNow, _, _ = f.state()
	for _, s := range conf.Servers {
		rep.Previous = append(rep.Previous, Peer{ID: string(s.ID), Addr: string(s.Address), Suffrage: s.Suffrage.String()})
	}
	// The node must be a member of a configuration it holds: the latest, or an earlier one (the latest
	// may be an uncommitted change that removes it, which the recovery overrides).
	addr := ""
	for _, c := range slices.Backward(seen) {
		if i := slices.IndexFunc(c.Servers, func(s raft.Server) bool { return string(s.ID) == cfg.ID }); i >= 0 {
			addr = string(c.Servers[i].Address)
			break
		}
	}
	if addr == "" {
		ids := make([]string, len(rep.Previous))
		for j, p := range rep.Previous {
			ids[j] = p.ID
		}
		return nil, fmt.Errorf("%w: %q is not among %s (give the node's own --cluster-id)", ErrNotMember, cfg.ID, strings.Join(ids, ", "))
	}
	rep.Voter = Peer{ID: cfg.ID, Addr: cmp.Or(cfg.RaftAddr, addr), Suffrage: raft.Voter.String()}

	if cfg.Adjust != nil {
		if err := cfg.Adjust(rep.LastNow); err != nil {
			return nil, err
		}
	}
	if cfg.DryRun {
		return rep, nil
	}

	snap, err := f.Snapshot()
	if err != nil {
		return nil, fmt.Errorf("cluster: snapshot: %w", err)
	}
	// The transport only encodes the peers' addresses into the snapshot's metadata (as raft's own
	// transports do: the address itself).
	_, trans := raft.NewInmemTransport(raft.ServerAddress(rep.Voter.Addr))
	defer trans.Close()
	newConf := raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: raft.ServerID(cfg.ID), Address: raft.ServerAddress(rep.Voter.Addr)}}}
	sink, err := snaps.Create(raft.SnapshotVersionMax, rep.LastIndex, rep.LastTerm, newConf, 1, trans)
	if err != nil {
		return nil, fmt.Errorf("cluster: create snapshot: %w", err)
	}
	// Persist closes the sink (or cancels it on a failed write); a successful close makes the
	// snapshot the newest.
	if err := snap.Persist(sink); err != nil {
		return nil, fmt.Errorf("cluster: write snapshot: %w", err)
	}
	// The log entries the snapshot covers, the old configurations among them, are never read again
	// by raft (it starts from the snapshot); drop them so they cannot be sent to anyone either.
	if last > 0 {
		if err := wal.DeleteRange(first, last); err != nil {
			return nil, fmt.Errorf("cluster: compact the log: %w", err)
		}
	}
	return rep, nil
}
