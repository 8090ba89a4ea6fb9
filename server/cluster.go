package server

import (
	"context"
	crand "crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/mlock-dev/mlock/internal/cluster"
	"github.com/mlock-dev/mlock/internal/core"
)

// ClusterConfig makes the server one node of a cluster (see
// docs/cluster.md): the lock table, the sessions and their offline pushes
// are a state machine replicated with Raft, and any node serves clients
// with the protocol and semantics of a single node.
type ClusterConfig struct {
	// ID is this node's id: unique in the cluster, stable across restarts
	// (required).
	ID string
	// RaftAddr is the peer address the node listens on for Raft and
	// advertises to its peers (required unless Transport is set).
	RaftAddr string
	// ClientAddr is the address other nodes reach this node's clients port
	// on, to forward commands while it leads. Default: Config.Addr.
	ClientAddr string
	// Dir holds the Raft log and snapshots (required; "" keeps them in
	// memory, for tests: nothing survives a restart).
	Dir string
	// Bootstrap creates a new cluster of Peers (empty: this node alone)
	// when Dir holds no state yet; ignored otherwise.
	Bootstrap bool
	// Peers are the members of a bootstrapped cluster: id and raft address.
	Peers []ClusterPeer
	// Join is the client address of a member: a new node asks it (or the
	// leader it names) to add it as a voter. Ignored when Dir holds state.
	Join string
	// Secret authenticates forwarded commands and joins between the nodes,
	// and every Raft connection of the TCP transport (both ways, before any
	// RPC); every node has the same (required, at least 16 bytes). It seeds
	// nothing else: lock ids come from a random seed the first leader puts
	// in the log.
	Secret []byte
	// Transport carries Raft's messages (tests: raft.NewInmemTransport).
	// Nil: TCP on RaftAddr, which speaks TLS when the server does
	// (Config.TLSCertFile: the same certificate, reloaded with it; the
	// peers' verified against CAFile).
	Transport raft.Transport
	// CAFile verifies the other nodes' certificates when the nodes speak
	// TLS (Config.TLSCertFile): a follower forwards to the leader over TLS,
	// checking the leader's certificate for the host of its client address,
	// and a node dialing a peer's Raft port checks the peer's certificate
	// for the host of its Raft address. "": the system's roots.
	CAFile string

	// Raft tuning, passed to internal/cluster (zero: its defaults):
	// heartbeat 500 ms, election 500 ms, batch window 1 ms, 256 commands
	// a batch, snapshots every 8192 entries.
	HeartbeatTimeout, ElectionTimeout, LeaderLeaseTimeout, CommitTimeout time.Duration
	SnapshotInterval                                                     time.Duration
	SnapshotThreshold, TrailingLogs                                      uint64
	MaxAppendEntries                                                     int
	BatchWindow                                                          time.Duration
	MaxBatch                                                             int
	// DedupWindow is how many recent answers are kept to answer a retried
	// proposal (default 65536). Like the limits and the session grace, the
	// leader's is in force on every node (see docs/cluster.md).
	DedupWindow int

	testHooks *clusterTestHooks // tests only
}

// ClusterPeer is one member of a bootstrapped cluster.
type ClusterPeer struct {
	ID, Addr string
}

// window is the failover window: a new leader postpones to its first
// entry's time + window every deadline that would fall before (see
// docs/cluster.md): 2 × (heartbeat timeout + election timeout).
func (cc *ClusterConfig) window() time.Duration {
	hb := cc.HeartbeatTimeout
	if hb <= 0 {
		hb = cluster.DefaultHeartbeatTimeout
	}
	el := cc.ElectionTimeout
	if el <= 0 {
		el = cluster.DefaultElectionTimeout
	}
	return 2 * (hb + el)
}

// clusterState is a server's part of a cluster.
type clusterState struct {
	cfg    ClusterConfig
	id     string
	run    string // this run's prefix of connection keys: "<id>/<random>/"
	node   *cluster.Node
	dedup  *cluster.Dedup
	secret [32]byte       // sha256 of the secret: what a forwarding connection presents
	roots  *x509.CertPool // ClusterConfig.CAFile's; nil: the system's
	fwd    *forwarder
	reads  fwdReads        // a follower's reads (cluster_read.go)
	live   liveness        // the leader's word from its followers (cluster_read.go)
	ctx    context.Context // ends at Shutdown
	cancel context.CancelFunc
	nconn  atomic.Uint64
	// queuedNext counts the commands forwarded as fwdProposeNext that this
	// node queued as the leader (a follower's pipelining: forward.go).
	queuedNext atomic.Uint64

	status   atomic.Pointer[ClusterStatus] // refreshed by refreshStatus (never read from raft under the core's lock)
	statusMu sync.Mutex                    // refreshStatus reads and stores in one step: an older view never replaces a newer one
	conns    map[string]*conn              // guarded by the core: this node's connections by key
	genesis  bool                          // guarded by the core, replicated: the first leader's seed is applied
	ac       conn                          // guarded by the core: the connection commands are applied as
	fields   [][]byte                      // guarded by the core
	ans      []byte                        // guarded by the core: the answer being built

	bg sync.WaitGroup // background goroutines (detach of a lost node, ...)

	// givenUp: this node's connections whose proposals from a seq on were
	// given up (pipeRun.giveUp), by key, oldest first in givenOrder (at
	// most maxGivenUp): the locks those proposals make when they are
	// applied after all are cancelled (opCancel). Guarded by the core; not
	// replicated (what a cancel unlocks is).
	givenUp    map[string]uint64
	givenOrder []string
	// cancels carries the cancels to propose (opCancel) from the apply to
	// cancelLoop, which proposes them one after the other. Buffered; nil
	// (a recovery, a test) drops them.
	cancels chan cancelJob

	// removed: this node is not in the cluster's latest configuration (it
	// was removed): it serves no client (see watchPeers).
	removed atomic.Bool
	// wasMember: this node has been in the configuration in this run
	// (watchPeers only).
	wasMember bool

	// paramsDiffer is how this node's settings differ from those of the
	// leader whose opParams was applied last ("" : they do not).
	paramsDiffer textValue

	// version is the cluster version in force (opVersion; guarded by the
	// core, replicated): the highest log format every member reads, which
	// every node writes. versionNow is the same, for the proposers.
	version    int
	versionNow atomic.Int64
	// versionFloor is the highest cluster version this node's raft
	// directory says it applied, in this run or an earlier one
	// (versionFile): see raftVersion.
	versionFloor atomic.Int64
	// pinned: a rollback lowered the cluster version (an opVersion below
	// the version in force, applied here, or a snapshot of a lower version
	// restored while running), and the leader does not raise it on its own
	// until a raise is applied (mlock cluster rollback --cancel); kept in
	// versionFile. rollback tracks the raft directory's readiness for the
	// previous release (cluster_rollback.go).
	pinned   atomic.Bool
	rollback rollbackState
	// pinAt is the raft index of the lowering that pinned the version (0:
	// not known: a pin kept by an earlier build, or restored from a
	// snapshot while running), kept with the pin in versionFile; at is the
	// index of the entry being applied, or of the snapshot being restored
	// (0: not known; smHook.At). While pinned, what comes from below pinAt
	// (a replay of the log, or a snapshot, older than the lowering: a
	// restart) changes the replicated version (version) but not the one
	// this node writes, says and keeps (versionNow, the pin, versionFile):
	// held records that they differ (see setVersionLocked; on the apply
	// goroutine only).
	pinAt atomic.Uint64
	at    atomic.Uint64
	held  bool
	// halted says why this node stopped applying the log ("": it did not;
	// see halt).
	halted textValue
	// storeFailed says why this node's Raft directory could not be written
	// ("": it could; see clusterStoreFailed).
	storeFailed textValue
	// formats: what the members said of the log formats they read
	// (cluster_version.go).
	formats formats
}

// textValue is a string read and written atomically.
type textValue struct{ v atomic.Value }

func (t *textValue) Load() string {
	s, _ := t.v.Load().(string)
	return s
}

func (t *textValue) Store(s string) { t.v.Store(s) }

// openCluster opens the node; it runs in New, before the server is shared.
func (s *Server) openCluster() error {
	cc := *s.cfg.Cluster
	if err := checkCluster(&cc, s.cfg.Addr); err != nil {
		return err
	}
	var rnd [6]byte
	_, _ = crand.Read(rnd[:])
	cl := &clusterState{cfg: cc, id: cc.ID, run: cc.ID + "/" + hex.EncodeToString(rnd[:]) + "/",
		secret: sha256.Sum256(append([]byte("mlock cluster forward\x00"), cc.Secret...)),
		conns:  make(map[string]*conn), version: logFormat1, cancels: make(chan cancelJob, maxCancelQueue)}
	cl.versionNow.Store(logFormat1)
	if cc.Dir != "" {
		vs, err := readVersionState(cc.Dir)
		if err != nil {
			return fmt.Errorf("server: %w", err)
		}
		cl.versionFloor.Store(int64(vs.version))
		cl.pinned.Store(vs.pinned)
		cl.pinAt.Store(vs.at)
	}
	roots, err := clusterRoots(cc.CAFile)
	if err != nil {
		return err
	}
	cl.roots = roots
	cl.ctx, cl.cancel = context.WithCancel(context.Background())
	cl.fwd = newForwarder(s, cl)
	s.cl = cl
	c, err := s.newCore(s.set, nil, nil, 0)
	if err != nil {
		return err
	}
	s.corep.Store(c)
	cl.dedup = cluster.NewDedup(&replica{s}, cc.DedupWindow)
	peers := make([]cluster.Peer, len(cc.Peers))
	for i, p := range cc.Peers {
		peers[i] = cluster.Peer{ID: p.ID, Addr: p.Addr}
	}
	window := cc.window()
	var raftTLS *tls.Config // the Raft port speaks TLS when the clients' port does, with its certificate
	if s.certs != nil {
		raftTLS = &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: s.certs.GetCertificate, RootCAs: cl.roots}
	}
	cl.node, err = cluster.Open(cluster.Config{
		ID: cc.ID, RaftAddr: cc.RaftAddr, ClientAddr: cc.ClientAddr, Dir: cc.Dir, Transport: cc.Transport, Secret: cc.Secret,
		TLS: raftTLS,
		// The raft handshake refuses a peer that cannot read the version
		// applied here (see cluster.Config.ClusterVersion).
		ClusterVersion: cl.raftVersion,
		Lowered:        cl.pinned.Load,
		Bootstrap:      cc.Bootstrap, Peers: peers, SM: smHook{cl},
		NextDeadline: func() (int64, bool) {
			if hk := cc.testHooks; hk != nil && hk.holdTicks.Load() {
				return 0, false
			}
			return s.core().NextDeadline()
		},
		OnLeader: func(now int64) []byte {
			fresh := false
			s.batch(func(*core.Tx) { fresh = !cl.genesis })
			if fresh {
				return cluster.DedupCommand("", 0, cl.encode(newGenesis(now, s.stateParams())))
			}
			return cluster.DedupCommand("", 0, cl.encode(&logCmd{op: opFailover, until: now + int64(window)}))
		},
		HeartbeatTimeout: cc.HeartbeatTimeout, ElectionTimeout: cc.ElectionTimeout,
		LeaderLeaseTimeout: cc.LeaderLeaseTimeout, CommitTimeout: cc.CommitTimeout,
		SnapshotInterval: cc.SnapshotInterval, SnapshotThreshold: cc.SnapshotThreshold,
		TrailingLogs: cc.TrailingLogs, MaxAppendEntries: cc.MaxAppendEntries,
		BatchWindow: cc.BatchWindow, MaxBatch: cc.MaxBatch,
		Logger:         s.log.With("component", "raft"),
		OnStoreFailure: s.clusterStoreFailed,
		WriteFault: func(store string) error {
			if hk := cc.testHooks; hk != nil {
				if f := hk.storeFault.Load(); f != nil {
					return (*f)(cc.ID, store)
				}
			}
			return nil
		},
	})
	if err != nil {
		cl.cancel()
		return fmt.Errorf("server: %w", err)
	}
	s.log.Info("cluster node", "id", cc.ID, "raft", cl.node.RaftAddr(), "dir", cc.Dir, "bootstrap", cc.Bootstrap)
	cl.bg.Add(4)
	go s.detachOwnPast()
	go s.watchPeers()
	go s.cancelLoop()
	go s.rollbackLoop()
	if cc.Join != "" {
		cl.bg.Add(1)
		go s.joinCluster()
	}
	return nil
}

// clusterRoots reads the cluster's CA certificates from file (empty: nil,
// the system's roots). Errors: the file cannot be read or holds none.
func clusterRoots(file string) (*x509.CertPool, error) {
	if file == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("server: cluster CA: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("server: cluster CA: no certificate in %s", file)
	}
	return roots, nil
}

// checkCluster checks the cluster settings cc that openCluster needs and
// sets the client address to addr (the listen address) when it is empty.
func checkCluster(cc *ClusterConfig, addr string) error {
	if cc.ID == "" {
		return errors.New("server: Cluster.ID is required")
	}
	if len(cc.Secret) < 16 {
		return errors.New("server: Cluster.Secret must have at least 16 bytes")
	}
	if cc.ClientAddr == "" {
		cc.ClientAddr = addr
	}
	if host, _, err := net.SplitHostPort(cc.ClientAddr); err != nil || host == "" || isUnspecified(host) {
		// The other nodes forward to it, and clients are told it: a
		// wildcard would send them to their own machine.
		return fmt.Errorf("server: the cluster client address %q (--cluster-advertise; default: the listen address) "+
			"must be one the other nodes can dial, not a wildcard", cc.ClientAddr)
	}
	return nil
}

// isUnspecified reports whether host is a wildcard IP address (0.0.0.0, ::).
func isUnspecified(host string) bool {
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsUnspecified()
}

// newCore returns the core of a cluster node, in manual mode, with the
// engine's limits and grace of set: empty (with the lock-id seed and first
// token of a genesis command; before it, a zero seed that no lock is ever
// made with) or the core of a snapshot.
func (s *Server) newCore(set settings, snapshot []byte, seed *[32]byte, first uint64) (*core.Core, error) {
	if seed == nil {
		seed = new([32]byte)
	}
	var me *core.Core
	ecfg := set.engineConfig()
	ecfg.FirstToken, ecfg.Seed = max(first, 1), seed
	// Every replica must apply the log alike: a waiter freed after its
	// wait deadline is granted while the cluster version applied is below
	// 3 (a member may run a build that grants it), timed out from 3 on
	// (lateGrants: the version applied so far; Restore sets its
	// snapshot's, applyLocked follows every change).
	ecfg.LateGrants = lateGrants(s.cl.version)
	ccfg := core.Config{
		Engine: ecfg,
		Manual: true,
		// A batch on a core that a restore replaced does nothing more.
		OnBatch: func(tx *core.Tx, events []core.Event) {
			if s.corep.Load() == me {
				s.onBatch(tx, events)
			}
		},
	}
	var err error
	if snapshot == nil {
		me, err = core.New(ccfg)
	} else {
		me, err = core.Restore(ccfg, snapshot)
	}
	return me, err
}

// newGenesis returns the genesis command (opGenesis) of a new cluster
// whose first leader proposes it at now with its settings params: a random
// seed of lock ids, the time in µs as the first fencing token.
func newGenesis(now int64, params string) *logCmd {
	m := &logCmd{op: opGenesis, first: uint64(now / int64(time.Microsecond)), params: params, hasParams: true}
	_, _ = crand.Read(m.seed[:])
	return m
}

// appendGenesis appends a genesis in format 1, as the previous build
// writes it.
func appendGenesis(dst []byte, now int64, params string) []byte {
	return appendLogCmd(dst, newGenesis(now, params))
}

// writeFormat is the log format this node writes now: the cluster version
// (the highest every member reads).
func (cl *clusterState) writeFormat() int {
	return min(int(cl.versionNow.Load()), cl.ownFormat())
}

// encode returns m in the format this node writes now.
func (cl *clusterState) encode(m *logCmd) []byte {
	m.format = cl.writeFormat()
	return appendLogCmd(nil, m)
}

// clusterStop is Shutdown in cluster mode: the sessions of this node are
// detached in the log (their grace starts; their clients move to another
// node), every connection closes without a word, and the node leaves the
// cluster's work to the others. The locks stay in the cluster.
func (s *Server) clusterStop(ctx context.Context) {
	cl := s.cl
	s.batch(func(*core.Tx) { s.closing = true })
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	cmd := cluster.DedupCommand(cl.run+"stop", 0, cl.encode(&logCmd{op: opDetachNode, node: cl.id}))
	if _, err := s.replicate(dctx, cmd); err != nil {
		s.log.Warn("cluster: shutdown: sessions not detached; the leader detaches them when it loses this node", "err", err)
	}
	cancel()
	cl.cancel()
	s.batch(func(*core.Tx) {
		for c := range s.conns {
			c.finish()
		}
	})
	cl.bg.Wait()
	cl.fwd.close()
	if err := cl.node.Close(); err != nil {
		s.log.Warn("cluster: closing the node", "err", err)
	}
	s.core().Close()
}
