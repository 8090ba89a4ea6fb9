package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	raftwal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/fs"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/hashicorp/raft-wal/segment"
	"github.com/mlock-dev/mlock/internal/datadir"
)

// StateMachine is the replicated state. The Node calls its methods from one goroutine, in log order,
// never concurrently with each other; anything else that reads the state (NextDeadline, the server's
// own reads) must synchronise with Apply itself.
//
// It must be deterministic: the same sequence of Apply calls (and Restore of the same snapshot) gives
// the same state and the same results on every node. It must not read a clock, a random source or map
// iteration order to change state: now is the only time.
type StateMachine interface {
	// Apply applies one log entry: the commands proposed together, in order, at the leader's time now
	// (Unix ns; never lower than the previous call's now, also across snapshots and leader changes).
	// cmds is nil for a tick entry (the leader's clock passed NextDeadline): Apply must then run the
	// deadlines due at now. The leader also proposes empty entries of its own (notices, see
	// BatchWindow): a tick at a time before NextDeadline must change nothing a read sees but the time
	// (a read index may leave such entries out, see Node.ReadIndex). It returns one result per command (len(results) == len(cmds), or the
	// Node panics). cmds alias the log entry: do not modify them, copy what you keep. The results
	// belong to the Node from then on (a Dedup keeps them): do not modify them later.
	Apply(now int64, cmds [][]byte) [][]byte
	// Snapshot returns the whole state, taken between two Applies (so in log order).
	Snapshot() ([]byte, error)
	// Restore replaces the whole state with one that Snapshot returned (possibly on another node).
	Restore(snapshot []byte) error
}

// IndexedStateMachine is a StateMachine that is told the raft index of what it is given: At(i)
// comes just before the Apply of the entry at index i, and just before a Restore, with the index of
// the snapshot restored (0: not known). It is called on the goroutine that calls Apply and Restore.
type IndexedStateMachine interface {
	StateMachine
	At(index uint64)
}

// Peer is one member of the cluster configuration.
type Peer struct {
	ID   string // unique node id, stable across restarts
	Addr string // raft (peer) address, host:port
	// Suffrage is "Voter", "Nonvoter" or "Staging" (Status only; Bootstrap peers are voters).
	Suffrage string
	// Failing (Status on the leader only) is true while the leader's heartbeats to this peer fail.
	Failing bool
	// FailingSince is the peer's last contact with the leader when heartbeats started failing.
	FailingSince time.Time
}

// Config configures a Node. The zero value of every optional field takes the documented default.
type Config struct {
	// ID is this node's unique, stable id (required).
	ID string
	// RaftAddr is the peer address: the TCP address the node listens on and advertises to its peers
	// when Transport is nil (required then). It must be an address the peers can dial (not 0.0.0.0);
	// port 0 picks one (see Node.RaftAddr).
	RaftAddr string
	// ClientAddr is this node's address for clients. It is replicated when the node becomes leader so
	// followers can tell clients (or forward) where the leader serves (LeaderInfo.ClientAddr). Optional.
	ClientAddr string
	// Dir holds the node's raft state: Dir/wal the log and the stable store (the current term and
	// vote; github.com/hashicorp/raft-wal: segment files of 8 MiB, preallocated, and wal-meta.db),
	// Dir/snapshots the last 2 snapshots. It is created (0700) if missing. Open refuses a Dir that
	// holds raft.db and no wal directory: the raft.db (bbolt) log of earlier development builds,
	// which this one does not read (ErrOldLogStore). "" keeps everything in memory (tests; nothing
	// survives Close).
	Dir string
	// Transport carries raft RPCs (tests: raft.NewInmemTransport). nil: a TCP transport on RaftAddr,
	// closed by Close. A given transport is also closed by Close (raft closes transports it is handed).
	Transport raft.Transport
	// Secret, when set, authenticates every connection of the TCP transport both ways (an HMAC
	// challenge over random nonces): a peer that does not know it cannot send or receive a raft RPC.
	// It does not encrypt the stream (TLS does). The same on every node.
	Secret []byte
	// TLS, when set, makes every connection of the TCP transport speak TLS (1.2 at least; the Secret's
	// handshake then runs inside it). An accepted connection is served the certificate of
	// TLS.Certificates or TLS.GetCertificate (so a reloaded certificate serves the next connections);
	// a dialed one verifies the peer's certificate against TLS.RootCAs (nil: the system's roots) for
	// the host of the peer's raft address (ServerName is set for each dial). nil: plain TCP. Every
	// node needs it or none: a node with TLS and one without cannot talk, and each logs why. Ignored
	// with Transport. The Node uses a copy.
	TLS *tls.Config
	// ClusterVersion returns the cluster version this node has applied (the state machine's; nil:
	// 0). With a Secret, the TCP transport's handshake carries it: once it is 2 or more this node
	// dials its peers saying so, and refuses a peer that does not (a build that cannot read the
	// cluster's log, as the previous release, or this build before it has applied that version):
	// such a peer's vote requests never reach it, so it can never be elected. Called at each dial and
	// accept; it must not block. Ignored with Transport.
	ClusterVersion func() int
	// Lowered reports whether this node applied a lowering of the cluster version (a rollback: see
	// docs/cluster.md) below 2 (nil: never). Its handshake then says the version it has applied, as
	// any node; but a peer of this build that has not applied the lowering yet (restarted, or down
	// meanwhile) refuses that, and could never be caught up: when a peer closes such a handshake
	// unanswered, this node dials it again saying raftMagicVersioned, which only a build that reads
	// the cluster's log accepts. Called at each dial; it must not block. Ignored with Transport.
	Lowered func() bool

	// Bootstrap creates a new cluster from Peers (all voters; empty: this node alone) when Dir holds no
	// raft state yet; it is ignored when the node has state. Every node listed may be bootstrapped with
	// the same Peers, or only one, the others joining later (Node.Join on the leader).
	Bootstrap bool
	Peers     []Peer

	// SM is the replicated state machine (required).
	SM StateMachine
	// Clock returns the leader's time in Unix ns. Default: time.Now().UnixNano(). Entries never go
	// backwards even if it does.
	Clock func() int64
	// NextDeadline returns the state machine's next deadline (Unix ns) and whether there is one. It is
	// called after every batch of applied entries (from raft's goroutine that applies, after Apply
	// returned) and by the leader when it sets its tick timer (from its own goroutine, concurrently
	// with Apply); when the leader's clock passes the deadline it proposes a tick (an entry with no
	// commands) at that time, unless an entry at least as late is already on its way. Followers never
	// tick. Optional.
	NextDeadline func() (int64, bool)
	// OnLeader is called once each time this node becomes leader, after a barrier (every earlier entry
	// is applied), with the time of the failover entry (>= every earlier entry's). It returns the
	// command to propose first (nil: none); the entry that carries it (a "leader entry") is applied
	// before any proposal of this term. Called from the leader's goroutine, concurrently with reads of
	// the state machine but never with Apply. Optional.
	OnLeader func(now int64) []byte

	// BatchWindow is how long the leader waits for more commands after the first one of a batch, while
	// an earlier entry is still being committed (an idle pipeline sends at once). Default 1 ms;
	// negative: never wait. It is also how long the leader waits, idle after an entry, before it
	// proposes an empty notice entry so that the followers learn the commit index (and can answer
	// their clients) without waiting for CommitTimeout. MaxBatch is the most commands in one entry.
	// Default 256.
	BatchWindow time.Duration
	MaxBatch    int

	// HeartbeatTimeout (default 500 ms): a follower that hears nothing from the leader for this long
	// (randomised up to twice) starts an election. ElectionTimeout (default 500 ms): a candidate's wait
	// before a new election round. LeaderLeaseTimeout (default HeartbeatTimeout/2): a leader that hears
	// from no quorum for this long steps down. CommitTimeout (default 250 ms): how often raft tells
	// idle followers the commit index (an append to each follower every CommitTimeout to twice that,
	// besides the heartbeats, every HeartbeatTimeout/10 to /5); the leader's notice entries (see
	// BatchWindow) tell them sooner, and a read index leaves out a notice committed last (see
	// Node.ReadIndex), so it bounds only when a follower learns that a notice, or raft's own entry,
	// is committed, and how soon an idle leader retries replication to a follower it could not reach.
	// Defaults suit a LAN: a dead leader is replaced in about 0.5-1.5 s.
	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	CommitTimeout      time.Duration
	// SnapshotInterval (default 30 s) is how often raft checks whether SnapshotThreshold (default 8192)
	// entries were applied since the last snapshot and then takes one; TrailingLogs (default 10240)
	// entries stay in the log after it so slightly lagging followers catch up without a snapshot.
	// Entries are batches (up to MaxBatch commands each).
	SnapshotInterval  time.Duration
	SnapshotThreshold uint64
	TrailingLogs      uint64
	// MaxAppendEntries (default 256) is the most entries per AppendEntries RPC and per disk write.
	MaxAppendEntries int

	// Logger receives raft's log (hclog adapted to slog). nil: silent.
	Logger *slog.Logger

	// OnStoreFailure, if set, is called once, from the raft goroutine that
	// wrote, when a write of the node's Raft log or stable store fails (a
	// full, failing or read-only disk): the node then stops (fail-stop,
	// see failstop.go) and the others lead. It must not block or call the
	// Node.
	OnStoreFailure func(err error)
	// WriteFault, if set (tests), is called before each write of the log
	// ("log") and stable ("stable") stores: an error it returns fails the
	// write as the disk's own would.
	WriteFault func(store string) error
}

// Defaults.
const (
	DefaultBatchWindow      = time.Millisecond
	DefaultMaxBatch         = 256
	DefaultHeartbeatTimeout = 500 * time.Millisecond
	DefaultElectionTimeout  = 500 * time.Millisecond
	DefaultCommitTimeout    = 250 * time.Millisecond
	DefaultSnapshotInterval = 30 * time.Second
	DefaultMaxAppendEntries = 256
)

// Errors.
var (
	// ErrNotLeader: this node is not the leader (or not yet ready as leader), nothing was proposed.
	// Errors from Propose, Join and Remove that match it are *NotLeaderError with the leader, if known.
	ErrNotLeader = errors.New("cluster: not the leader")
	// ErrUnknownOutcome: the command was handed to raft but leadership was lost (or the node closed,
	// or ctx ended) before its result was known: it may or may not be applied, now or later. Retry the
	// same command (with the same de-duplication key) on the new leader.
	ErrUnknownOutcome = errors.New("cluster: outcome unknown")
	// ErrClosed: the Node is closed.
	ErrClosed = errors.New("cluster: node closed")
	// ErrOldLogStore: Open found Config.Dir holding raft.db and no wal directory, the log store of
	// earlier development builds (bbolt), which this build does not read. Nothing was changed in Dir.
	ErrOldLogStore = errors.New("cluster: the directory holds raft.db, the Raft log of an earlier development build, which this build does not read")
)

// Names inside Config.Dir.
const (
	walDirName     = "wal"     // the raft-wal log and stable store
	walSegmentSize = 8 << 20   // bytes per log segment file (see doc.go, Versions)
	oldLogStore    = "raft.db" // earlier development builds' bbolt log and stable store
	logCacheSize   = 512       // recent entries kept in memory in front of the WAL
)

// LeaderInfo names the leader as this node knows it.
type LeaderInfo struct {
	ID       string // "" during an election
	RaftAddr string
	// ClientAddr is the leader's Config.ClientAddr, known once its leader entry is applied here
	// ("" before that, or if it set none).
	ClientAddr string
}

// NotLeaderError is returned when a leader-only call reaches a node that is not the ready leader.
type NotLeaderError struct {
	Leader LeaderInfo
}

func (e *NotLeaderError) Error() string {
	if e.Leader.ID == "" {
		return "cluster: not the leader (no leader known)"
	}
	return fmt.Sprintf("cluster: not the leader (leader %s at %s)", e.Leader.ID, e.Leader.RaftAddr)
}

// Is makes errors.Is(err, ErrNotLeader) true.
func (e *NotLeaderError) Is(target error) bool { return target == ErrNotLeader }

// Node is one member of a cluster. Its methods are safe for concurrent use.
type Node struct {
	cfg   Config
	raft  *raft.Raft
	fsm   *fsm
	trans raft.Transport
	// stream is the TCP transport's stream layer (nil with Config.Transport).
	stream *streamLayer
	wal    *raftwal.WAL // nil when in memory (closes its meta store too)
	// dirLock holds the wal directory's lock (datadir.Lock) while wal is open.
	dirLock *os.File

	obsCh    chan raft.Observation
	observer *raft.Observer
	notifyCh chan bool
	closing  chan struct{}
	wg       sync.WaitGroup // monitor and observer goroutines

	mu sync.Mutex
	// lead is the current leadership session (nil when not leader); guarded by mu.
	lead *leadership
	// changed is closed and replaced whenever the leader as seen here may have changed; guarded by mu.
	changed chan struct{}
	// failing maps peer id → last contact, for peers whose heartbeats fail (leader only); guarded by mu.
	failing map[string]time.Time
	// closed is set by Close; guarded by mu.
	closed bool

	closeOnce sync.Once

	// failed: a write of the stores failed (failstop.go); opened is closed
	// when Open returns (raft is set if it succeeded).
	failed atomic.Bool
	opened chan struct{}
}

// Open starts a node: it opens (or creates) its stores, bootstraps a new cluster if asked, and joins
// the raft group. It returns at once; leadership comes later (see WaitLeader).
func Open(cfg Config) (_ *Node, err error) {
	if cfg.ID == "" {
		return nil, errors.New("cluster: Config.ID is required")
	}
	if cfg.SM == nil {
		return nil, errors.New("cluster: Config.SM is required")
	}
	if cfg.Transport == nil && cfg.RaftAddr == "" {
		return nil, errors.New("cluster: Config.RaftAddr or Config.Transport is required")
	}
	if cfg.Clock == nil {
		cfg.Clock = func() int64 { return time.Now().UnixNano() }
	}
	if cfg.BatchWindow == 0 {
		cfg.BatchWindow = DefaultBatchWindow
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = DefaultMaxBatch
	}
	logger := newHCLogger(cfg.Logger)

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.ID)
	rc.Logger = logger
	rc.HeartbeatTimeout = orDur(cfg.HeartbeatTimeout, DefaultHeartbeatTimeout)
	rc.ElectionTimeout = orDur(cfg.ElectionTimeout, DefaultElectionTimeout)
	rc.LeaderLeaseTimeout = orDur(cfg.LeaderLeaseTimeout, rc.HeartbeatTimeout/2)
	rc.CommitTimeout = orDur(cfg.CommitTimeout, DefaultCommitTimeout)
	rc.SnapshotInterval = orDur(cfg.SnapshotInterval, DefaultSnapshotInterval)
	if cfg.SnapshotThreshold > 0 {
		rc.SnapshotThreshold = cfg.SnapshotThreshold
	}
	if cfg.TrailingLogs > 0 {
		rc.TrailingLogs = cfg.TrailingLogs
	}
	rc.MaxAppendEntries = cfg.MaxAppendEntries
	if rc.MaxAppendEntries <= 0 {
		rc.MaxAppendEntries = DefaultMaxAppendEntries
	}
	// BatchApplyCh stays off: raft (v1.8.0 too) never answers a future still in a buffered apply
	// channel when it shuts down, and our entries are already batches (see leadership.collect).
	notifyCh := make(chan bool, 16)
	rc.NotifyCh = notifyCh
	if err := raft.ValidateConfig(rc); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}

	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	n := &Node{
		cfg:      cfg,
		notifyCh: notifyCh,
		closing:  make(chan struct{}),
		changed:  make(chan struct{}),
		failing:  make(map[string]time.Time),
		opened:   make(chan struct{}),
	}
	defer func() {
		if err != nil {
			n.raft = nil // a failed write during Open closes nothing twice
		}
		close(n.opened)
	}()
	n.fsm = &fsm{sm: cfg.SM, applied: make(chan struct{}, 1), onLeaderInfo: n.notifyChanged, nextDeadline: cfg.NextDeadline}
	n.fsm.armed.Store(math.MinInt64) // not leading: no tick timer to re-arm

	var (
		logs   raft.LogStore
		stable raft.StableStore
		snaps  raft.SnapshotStore
	)
	if cfg.Dir == "" {
		mem := raft.NewInmemStore()
		logs, stable, snaps = mem, mem, newMemSnaps()
	} else {
		if err := checkOldLogStore(cfg.Dir); err != nil {
			return nil, err
		}
		walDir := filepath.Join(cfg.Dir, walDirName)
		if err := os.MkdirAll(walDir, 0o700); err != nil {
			return nil, fmt.Errorf("cluster: %w", err)
		}
		// One process per directory: a second would wait forever on the WAL's meta store.
		if n.dirLock, err = datadir.Lock(walDir); err != nil {
			return nil, fmt.Errorf("cluster: raft directory: %w", err)
		}
		// Our own meta store (wal-meta.db) so that a failed open closes it (raft-wal leaves it open
		// then, and with it a file lock a later open in this process would wait on forever).
		meta := &metadb.BoltMetaDB{}
		repaired, err := repairSealedTail(walDir, meta)
		if err != nil {
			meta.Close()
			n.dirLock.Close()
			return nil, fmt.Errorf("cluster: open log %s: %w", walDir, err)
		}
		if repaired {
			logger.Warn("cluster: the log's last segment was full and sealed but not recorded (a crash during its rotation): recorded now", "dir", walDir)
		}
		n.wal, err = raftwal.Open(walDir, raftwal.WithMetaStore(meta), raftwal.WithLogger(logger.Named("wal")),
			raftwal.WithSegmentSize(walSegmentSize), raftwal.WithSegmentFiler(segment.NewFiler(walDir, walFS{fs.New()})))
		if err != nil {
			meta.Close()
			n.dirLock.Close()
			return nil, fmt.Errorf("cluster: open log %s: %w", walDir, err)
		}
		stable = n.wal
		// The WAL reads an entry back from its segment file (a pread and a decode, each time); the
		// cache answers the followers' replication and their apply of what they just stored from
		// memory.
		logs, err = raft.NewLogCache(logCacheSize, n.wal)
		if err == nil {
			snaps, err = raft.NewFileSnapshotStoreWithLogger(cfg.Dir, 2, logger)
		}
		if err != nil {
			n.closeStores()
			return nil, fmt.Errorf("cluster: %w", err)
		}
	}

	logs, stable = failStopLogs{logs, n}, failStopStable{stable, n}
	snaps = indexedSnaps{snaps, n.fsm}

	n.trans = cfg.Transport
	if n.trans == nil {
		n.trans, n.stream, err = newTCPTransport(cfg.RaftAddr, cfg.Secret, cfg.TLS, cfg.ClusterVersion, cfg.Lowered, logger)
		if err != nil {
			n.closeStores()
			return nil, fmt.Errorf("cluster: listen: %w", err)
		}
	}

	if cfg.Bootstrap {
		has, err := raft.HasExistingState(logs, stable, snaps)
		if err == nil && !has {
			err = raft.BootstrapCluster(rc, logs, stable, snaps, n.trans, n.bootstrapConfiguration())
		}
		if err != nil {
			n.closeTransport()
			n.closeStores()
			return nil, fmt.Errorf("cluster: bootstrap: %w", err)
		}
	}

	n.raft, err = raft.NewRaft(rc, n.fsm, logs, stable, snaps, n.trans)
	if err != nil {
		n.closeTransport()
		n.closeStores()
		return nil, fmt.Errorf("cluster: %w", err)
	}
	n.obsCh = make(chan raft.Observation, 64)
	n.observer = raft.NewObserver(n.obsCh, false, func(o *raft.Observation) bool {
		switch o.Data.(type) {
		case raft.LeaderObservation, raft.FailedHeartbeatObservation, raft.ResumedHeartbeatObservation,
			raft.PeerObservation:
			return true
		}
		return false
	})
	n.raft.RegisterObserver(n.observer)
	n.wg.Add(2)
	go n.monitor()
	go n.observe()
	return n, nil
}

func orDur(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

func (n *Node) bootstrapConfiguration() raft.Configuration {
	var c raft.Configuration
	for _, p := range n.cfg.Peers {
		c.Servers = append(c.Servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.Addr)})
	}
	if len(c.Servers) == 0 {
		c.Servers = []raft.Server{{Suffrage: raft.Voter, ID: raft.ServerID(n.cfg.ID), Address: n.trans.LocalAddr()}}
	}
	return c
}

func (n *Node) closeTransport() {
	if c, ok := n.trans.(raft.WithClose); ok {
		c.Close()
	}
}

// closeStores closes the WAL (after raft stopped using it), then releases the directory.
func (n *Node) closeStores() error {
	if n.wal == nil {
		return nil
	}
	err := n.wal.Close()
	n.dirLock.Close()
	return err
}

// checkOldLogStore returns ErrOldLogStore (with what to do) when dir holds raft.db and no wal
// directory. It creates nothing.
func checkOldLogStore(dir string) error {
	if _, err := os.Stat(filepath.Join(dir, oldLogStore)); err != nil {
		return nil // no raft.db (or unreadable: opening the WAL reports it)
	}
	if _, err := os.Stat(filepath.Join(dir, walDirName)); err == nil {
		return nil // a WAL already: raft.db is a leftover this build never reads
	}
	return fmt.Errorf("%w (%s): move the directory away and start this node with an empty one, "+
		"it catches up from the leader if the other nodes run; if every node has such a directory, "+
		"start them all with empty ones, a new cluster (its locks and sessions are not kept)",
		ErrOldLogStore, filepath.Join(dir, oldLogStore))
}

// Close leaves the cluster's work to the others: it stops raft (without removing this node from the
// configuration), answers pending proposals (ErrNotLeader or ErrUnknownOutcome), closes the transport
// and the stores. Later calls return nil.
func (n *Node) Close() error {
	var err error
	n.closeOnce.Do(func() {
		n.mu.Lock()
		n.closed = true
		n.mu.Unlock()
		err = n.raft.Shutdown().Error() // also closes the transport
		n.raft.DeregisterObserver(n.observer)
		close(n.closing)
		n.wg.Wait()
		if cerr := n.closeStores(); err == nil {
			err = cerr
		}
		n.notifyChanged()
	})
	return err
}

// monitor follows raft's leadership notifications and runs one leadership session at a time.
func (n *Node) monitor() {
	defer n.wg.Done()
	var cur *leadership
	stop := func() {
		if cur == nil {
			return
		}
		cur.cancel()
		<-cur.exited
		n.mu.Lock()
		n.lead = nil
		n.mu.Unlock()
		n.notifyChanged()
		cur = nil
	}
	defer stop()
	for {
		select {
		case <-n.closing:
			return
		case isLeader := <-n.notifyCh:
			if !isLeader {
				stop()
				continue
			}
			if cur != nil {
				continue
			}
			cur = newLeadership(n)
			n.mu.Lock()
			n.lead = cur
			n.mu.Unlock()
			n.notifyChanged()
			go cur.run()
		}
	}
}

// observe follows raft observations: leader changes and the leader's view of failing peers.
func (n *Node) observe() {
	defer n.wg.Done()
	for {
		select {
		case <-n.closing:
			return
		case o := <-n.obsCh:
			switch d := o.Data.(type) {
			case raft.FailedHeartbeatObservation:
				n.mu.Lock()
				if _, ok := n.failing[string(d.PeerID)]; !ok {
					n.failing[string(d.PeerID)] = d.LastContact
				}
				n.mu.Unlock()
			case raft.ResumedHeartbeatObservation:
				n.mu.Lock()
				delete(n.failing, string(d.PeerID))
				n.mu.Unlock()
			case raft.LeaderObservation:
				n.mu.Lock()
				clear(n.failing)
				n.mu.Unlock()
				n.notifyChanged()
			case raft.PeerObservation:
				if d.Removed {
					n.mu.Lock()
					delete(n.failing, string(d.Peer.ID))
					n.mu.Unlock()
				}
			}
		}
	}
}

// notifyChanged wakes everyone waiting for a leader change.
func (n *Node) notifyChanged() {
	n.mu.Lock()
	close(n.changed)
	n.changed = make(chan struct{})
	n.mu.Unlock()
}

// ID returns the node's id.
func (n *Node) ID() string { return n.cfg.ID }

// RaftAddr returns the node's peer address (the transport's, so with the port picked for ":0").
func (n *Node) RaftAddr() string { return string(n.trans.LocalAddr()) }

// Leader returns the leader as this node knows it, and a channel closed at the next change of what
// this node knows about the leader (or of its own readiness as leader).
func (n *Node) Leader() (LeaderInfo, <-chan struct{}) {
	n.mu.Lock()
	ch := n.changed
	n.mu.Unlock()
	addr, id := n.raft.LeaderWithID()
	info := LeaderInfo{ID: string(id), RaftAddr: string(addr)}
	if _, lid, client := n.fsm.state(); info.ID != "" && lid == info.ID {
		info.ClientAddr = client
	}
	return info, ch
}

// Term returns the node's current Raft term. Each election is in a higher
// one: a leader elected again, even the same member, is in a new term.
func (n *Node) Term() uint64 { return n.raft.CurrentTerm() }

// LeaderAddr returns the leader's client address (LeaderInfo.ClientAddr), "" if not known yet.
func (n *Node) LeaderAddr() string {
	info, _ := n.Leader()
	return info.ClientAddr
}

// IsLeader reports whether this node is the leader and ready for proposals (its leader entry applied).
func (n *Node) IsLeader() bool {
	n.mu.Lock()
	l := n.lead
	n.mu.Unlock()
	if l == nil {
		return false
	}
	select {
	case <-l.ready:
		return true
	default:
		return false
	}
}

// WaitLeader waits until some node is the ready leader, as far as this node can tell: this node is
// ready, or another node's leader entry has been applied here. It returns the leader, or ctx's error.
func (n *Node) WaitLeader(ctx context.Context) (LeaderInfo, error) {
	for {
		info, ch := n.Leader()
		if info.ID == n.cfg.ID && n.IsLeader() {
			return info, nil
		}
		if info.ID != "" && info.ID != n.cfg.ID && n.leaderEntryApplied(info.ID) {
			return info, nil
		}
		n.mu.Lock()
		closed := n.closed
		n.mu.Unlock()
		if closed {
			return LeaderInfo{}, ErrClosed
		}
		// raft's leader view changes without an observation in a few cases (a restored snapshot):
		// poll as well.
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return LeaderInfo{}, ctx.Err()
		case <-ch:
		case <-t.C:
		}
		t.Stop()
	}
}

func (n *Node) leaderEntryApplied(id string) bool {
	_, lid, _ := n.fsm.state()
	return lid == id
}

func (n *Node) notLeader() error {
	n.mu.Lock()
	closed := n.closed
	n.mu.Unlock()
	if closed {
		return ErrClosed
	}
	info, _ := n.Leader()
	if info.ID == n.cfg.ID { // raft says us, but our leader session is not (or no longer) ready
		info = LeaderInfo{}
	}
	return &NotLeaderError{Leader: info}
}

// Role is a node's raft state.
type Role string

// Roles.
const (
	Follower  Role = "follower"
	Candidate Role = "candidate"
	Leader    Role = "leader"
	Shutdown  Role = "shutdown"
)

// Status is a node's view of the cluster.
type Status struct {
	ID           string
	Role         Role
	Ready        bool // Role is Leader and the leader entry is applied (Propose accepted)
	Leader       LeaderInfo
	Term         uint64
	LastIndex    uint64 // last log index stored here
	CommitIndex  uint64
	AppliedIndex uint64
	// LastContact is the last time a follower heard from the leader (zero on the leader itself).
	LastContact time.Time
	// LastNow is the time of the last applied entry (Unix ns).
	LastNow int64
	// Peers is the latest configuration (raft v1.8 exposes no per-peer match index; the leader marks
	// peers whose heartbeats fail).
	Peers []Peer
}

// Status returns the node's view of the cluster. Safe at any time, also after Close (Role Shutdown).
func (n *Node) Status() Status {
	info, _ := n.Leader()
	lastNow, _, _ := n.fsm.state()
	st := Status{
		ID:           n.cfg.ID,
		Leader:       info,
		Ready:        n.IsLeader(),
		Term:         n.raft.CurrentTerm(),
		LastIndex:    n.raft.LastIndex(),
		CommitIndex:  n.raft.CommitIndex(),
		AppliedIndex: n.raft.AppliedIndex(),
		LastNow:      lastNow,
	}
	switch n.raft.State() {
	case raft.Leader:
		st.Role = Leader
	case raft.Candidate:
		st.Role = Candidate
	case raft.Follower:
		st.Role = Follower
	default:
		st.Role = Shutdown
	}
	if st.Role != Leader {
		st.LastContact = n.raft.LastContact()
	}
	if f := n.raft.GetConfiguration(); f.Error() == nil {
		n.mu.Lock()
		for _, s := range f.Configuration().Servers {
			p := Peer{ID: string(s.ID), Addr: string(s.Address), Suffrage: s.Suffrage.String()}
			if t, ok := n.failing[p.ID]; ok && st.Role == Leader {
				p.Failing, p.FailingSince = true, t
			}
			st.Peers = append(st.Peers, p)
		}
		n.mu.Unlock()
	}
	return st
}

// Join adds a voter (id at raft address addr) to the cluster; leader only (else *NotLeaderError).
// Adding a member that exists with the same address does nothing. It waits until the configuration
// change is committed or ctx ends (the change may still happen then).
func (n *Node) Join(ctx context.Context, id, addr string) error {
	if !n.IsLeader() {
		return n.notLeader()
	}
	return n.waitFuture(ctx, n.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(addr), 0, enqueueTimeout(ctx)))
}

// Remove removes a member from the cluster; leader only (else *NotLeaderError). A leader removing
// itself steps down once the change commits. It waits like Join.
func (n *Node) Remove(ctx context.Context, id string) error {
	if !n.IsLeader() {
		return n.notLeader()
	}
	return n.waitFuture(ctx, n.raft.RemoveServer(raft.ServerID(id), 0, enqueueTimeout(ctx)))
}

func enqueueTimeout(ctx context.Context) time.Duration {
	if d, ok := ctx.Deadline(); ok {
		return max(time.Until(d), time.Millisecond)
	}
	return 0
}

func (n *Node) waitFuture(ctx context.Context, f raft.Future) error {
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		return n.mapRaftErr(err)
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", ErrUnknownOutcome, ctx.Err())
	}
}

// mapRaftErr turns a raft future's error into ours: raft.ErrNotLeader and the like (never appended) →
// *NotLeaderError; others (leadership lost, shutdown) → ErrUnknownOutcome.
func (n *Node) mapRaftErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrEnqueueTimeout),
		errors.Is(err, raft.ErrLeadershipTransferInProgress):
		return n.notLeader()
	default:
		return fmt.Errorf("%w: %w", ErrUnknownOutcome, err)
	}
}

// Snapshot asks raft to take a snapshot now (and compact the log). Mostly for tests and operators.
func (n *Node) Snapshot() error {
	return n.raft.Snapshot().Error()
}
