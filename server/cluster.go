package server

import (
	"context"
	crand "crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/mlock-dev/mlock/internal/auth"
	"github.com/mlock-dev/mlock/internal/cluster"
	"github.com/mlock-dev/mlock/internal/core"
	"github.com/mlock-dev/mlock/internal/protocol"
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
	ctx    context.Context // ends at Shutdown
	cancel context.CancelFunc
	nconn  atomic.Uint64

	status   atomic.Pointer[ClusterStatus] // refreshed by refreshStatus (never read from raft under the core's lock)
	statusMu sync.Mutex                    // refreshStatus reads and stores in one step: an older view never replaces a newer one
	conns    map[string]*conn              // guarded by the core: this node's connections by key
	genesis  bool                          // guarded by the core, replicated: the first leader's seed is applied
	ac       conn                          // guarded by the core: the connection commands are applied as
	fields   [][]byte                      // guarded by the core
	ans      []byte                        // guarded by the core: the answer being built

	bg sync.WaitGroup // background goroutines (detach of a lost node, ...)

	// removed: this node is not in the cluster's latest configuration (it
	// was removed): it serves no client (see watchPeers).
	removed atomic.Bool
	// wasMember: this node has been in the configuration in this run
	// (watchPeers only).
	wasMember bool

	// paramsDiffer is how this node's settings differ from those of the
	// leader whose opParams was applied last ("" : they do not).
	paramsDiffer textValue
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
	if cc.ID == "" {
		return errors.New("server: Cluster.ID is required")
	}
	if len(cc.Secret) < 16 {
		return errors.New("server: Cluster.Secret must have at least 16 bytes")
	}
	if cc.ClientAddr == "" {
		cc.ClientAddr = s.cfg.Addr
	}
	if host, _, err := net.SplitHostPort(cc.ClientAddr); err != nil || host == "" || isUnspecified(host) {
		// The other nodes forward to it, and clients are told it: a
		// wildcard would send them to their own machine.
		return fmt.Errorf("server: the cluster client address %q (--cluster-advertise; default: the listen address) "+
			"must be one the other nodes can dial, not a wildcard", cc.ClientAddr)
	}
	var rnd [6]byte
	_, _ = crand.Read(rnd[:])
	cl := &clusterState{cfg: cc, id: cc.ID, run: cc.ID + "/" + hex.EncodeToString(rnd[:]) + "/",
		secret: sha256.Sum256(append([]byte("mlock cluster forward\x00"), cc.Secret...)),
		conns:  make(map[string]*conn)}
	if cc.CAFile != "" {
		pem, err := os.ReadFile(cc.CAFile)
		if err != nil {
			return fmt.Errorf("server: cluster CA: %w", err)
		}
		cl.roots = x509.NewCertPool()
		if !cl.roots.AppendCertsFromPEM(pem) {
			return fmt.Errorf("server: cluster CA: no certificate in %s", cc.CAFile)
		}
	}
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
		TLS:       raftTLS,
		Bootstrap: cc.Bootstrap, Peers: peers, SM: smHook{cl},
		NextDeadline: func() (int64, bool) {
			if testHoldTicks.Load() {
				return 0, false
			}
			return s.core().NextDeadline()
		},
		OnLeader: func(now int64) []byte {
			fresh := false
			s.batch(func(*core.Tx) { fresh = !cl.genesis })
			if fresh {
				return cluster.DedupCommand("", 0, appendGenesis(nil, now, s.stateParams()))
			}
			return cluster.DedupCommand("", 0, appendLogCmd(nil, &logCmd{op: opFailover, until: now + int64(window)}))
		},
		HeartbeatTimeout: cc.HeartbeatTimeout, ElectionTimeout: cc.ElectionTimeout,
		LeaderLeaseTimeout: cc.LeaderLeaseTimeout, CommitTimeout: cc.CommitTimeout,
		SnapshotInterval: cc.SnapshotInterval, SnapshotThreshold: cc.SnapshotThreshold,
		TrailingLogs: cc.TrailingLogs, MaxAppendEntries: cc.MaxAppendEntries,
		BatchWindow: cc.BatchWindow, MaxBatch: cc.MaxBatch,
		Logger: s.log.With("component", "raft"),
	})
	if err != nil {
		cl.cancel()
		return fmt.Errorf("server: %w", err)
	}
	s.log.Info("cluster node", "id", cc.ID, "raft", cl.node.RaftAddr(), "dir", cc.Dir, "bootstrap", cc.Bootstrap)
	cl.bg.Add(2)
	go s.detachOwnPast()
	go s.watchPeers()
	if cc.Join != "" {
		cl.bg.Add(1)
		go s.joinCluster()
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

// opGenesis (the first leader's first command): seed (32 bytes), first
// token (uvarint), settings (string, settings.String; absent in the logs
// of earlier versions). It gives the replicated lock table its secret seed
// of lock ids and its first fencing token (the time in µs, as a single
// node), and puts the leader's settings in force: a new cluster's log
// determines its state from its first entry on.
const opGenesis byte = 7

func appendGenesis(dst []byte, now int64, params string) []byte {
	var seed [32]byte
	_, _ = crand.Read(seed[:])
	dst = append(dst, opGenesis)
	dst = append(dst, seed[:]...)
	dst = binary.AppendUvarint(dst, uint64(now/int64(time.Microsecond)))
	return appendStr(dst, params)
}

// ---- the replicated state machine ----

// testApplyHook, if set (tests), sees every entry a node applies.
var testApplyHook func(node string, now int64, cmds [][]byte)

// testHoldTicks, if set (tests), keeps a leader from proposing ticks: a
// deadline is processed by the next entry, whatever it is.
var testHoldTicks atomic.Bool

// smHook is the state machine the node drives: the de-duplication window
// around the replica, and the tests' hook.
type smHook struct{ cl *clusterState }

func (h smHook) Apply(now int64, cmds [][]byte) [][]byte {
	if testApplyHook != nil {
		testApplyHook(h.cl.id, now, cmds)
	}
	return h.cl.dedup.Apply(now, cmds)
}
func (h smHook) Snapshot() ([]byte, error) { return h.cl.dedup.Snapshot() }
func (h smHook) Restore(b []byte) error    { return h.cl.dedup.Restore(b) }

// replica is the server's cluster.StateMachine (wrapped in a cluster.Dedup):
// the core in manual mode, the sessions (principal's name, attached node
// and connection, offline pushes, pruned) and the genesis flag. Apply runs
// every command in one core batch at the entry's time; a command proposed
// by a connection of this node writes its answer, then its pushes, to
// that connection.
type replica struct{ s *Server }

func (r *replica) Apply(now int64, cmds [][]byte) [][]byte {
	s := r.s
	out := make([][]byte, len(cmds))
	var genesis []byte
	// A failover is applied at the time of the previous entry, before this
	// entry's time processes what is due: after a long election, or a
	// restart of the whole cluster, the deadlines that passed meanwhile
	// are moved to the end of the window instead of running first.
	for _, b := range cmds {
		if len(b) > 0 && b[0] == opFailover {
			var m logCmd
			if decodeLogCmd(b, &m) == nil {
				c := s.core()
				c.BatchAt(c.Now(), func(tx *core.Tx) { tx.Apply(&core.Command{Op: core.OpFailover, Until: m.until}) })
			}
		}
	}
	s.core().BatchAt(now, func(tx *core.Tx) {
		if len(cmds) == 0 {
			tx.Apply(&core.Command{Op: core.OpTick})
			return
		}
		for i, b := range cmds {
			if len(b) > 0 && b[0] == opGenesis {
				genesis = b
				out[i] = []byte{0}
				continue
			}
			out[i] = s.applyLocked(tx, b)
		}
	})
	if genesis != nil {
		s.applyGenesis(now, genesis)
	}
	return out
}

// applyGenesis replaces the empty core of a new cluster with one seeded by
// the command, with the settings it carries in force (once: a repeat does
// nothing). A genesis of an earlier version, without settings, keeps the
// node's own in force until the first opParams.
func (s *Server) applyGenesis(now int64, b []byte) {
	cl := s.cl
	if len(b) < 1+32+1 {
		return
	}
	var seed [32]byte
	copy(seed[:], b[1:33])
	d := decoder{p: b[33:]}
	first := d.uvarint()
	if d.bad {
		return
	}
	var params string
	hasParams := len(d.p) > 0
	if hasParams {
		params = d.str()
		if d.bad || len(d.p) != 0 {
			s.log.Error("cluster: genesis: the settings do not decode: the node's own stay in force")
			hasParams = false
		}
	}
	old := s.core()
	fresh := false
	var set settings
	old.Batch(func(*core.Tx) { fresh, set = !cl.genesis, s.set })
	if !fresh {
		return
	}
	if hasParams {
		st, err := parseSettings(params, set)
		if err != nil {
			s.log.Error("cluster: genesis: the leader's settings do not apply: the node's own stay in force", "err", err)
		} else {
			set = st
		}
	}
	c, err := s.newCore(set, nil, &seed, first)
	if err != nil {
		s.log.Error("cluster: genesis", "err", err)
		return
	}
	c.BatchAt(now, func(*core.Tx) {})
	changed := false
	old.Batch(func(*core.Tx) {
		cl.genesis = true
		changed = s.set != set
		s.set = set
		cl.dedup.SetWindow(set.DedupWindow)
		s.corep.Store(c)
	})
	old.Close()
	if changed {
		s.log.Info("cluster: settings in force (the first leader's)", "settings", set.String())
	}
}

// applyLocked applies one log command and returns its answer.
func (s *Server) applyLocked(tx *core.Tx, b []byte) []byte {
	var m logCmd
	if err := decodeLogCmd(b, &m); err != nil {
		s.log.Error("cluster: log command does not decode: skipped", "err", err)
		return []byte{0}
	}
	cl := s.cl
	cl.ans = append(cl.ans[:0], 0)
	switch m.op {
	case opFrames:
		s.applyFramesLocked(tx, &m)
	case opAttach:
		s.applyAttachLocked(tx, &m)
	case opDetach:
		if sess := s.sessions[m.session]; sess != nil && sess.node == m.node && sess.key == m.conn {
			s.detachLocked(tx, sess)
		}
	case opDetachNode:
		var ids []string
		for id, sess := range s.sessions {
			if sess.node == m.node && (m.conn == "" || !hasPrefix(sess.key, m.conn)) {
				ids = append(ids, id)
			}
		}
		slices.Sort(ids) // deterministic
		for _, id := range ids {
			s.detachLocked(tx, s.sessions[id])
		}
		if len(ids) > 0 {
			s.log.Info("cluster: sessions of a node detached", "node", m.node, "sessions", len(ids))
		}
	case opFailover:
		n := tx.Apply(&core.Command{Op: core.OpFailover, Until: m.until}).N
		s.log.Debug("cluster: failover", "until", time.Unix(0, m.until), "deadlines-moved", n)
	case opHoldGrants:
		tx.Apply(&core.Command{Op: core.OpHoldGrants, Until: m.until})
	case opParams:
		s.applyParamsLocked(tx, m.params)
	}
	s.deliverPushesLocked()
	return []byte{cl.ans[0]}
}

// stateParams is the canonical text of this node's own settings that
// applying the log depends on (limits, grace, default TTL, the
// de-duplication window): what it proposes while it leads (the genesis,
// opParams), and so puts in force on every node.
func (s *Server) stateParams() string {
	return settingsOf(&s.cfg).String()
}

// applyParamsLocked applies an opParams command: the leader's settings are
// in force from the next command on, on every node, this one's own flags
// aside (the engine's limits and grace, the handlers' limits, the
// de-duplication window). Settings that do not parse or are out of range
// change nothing (on every node alike).
func (s *Server) applyParamsLocked(tx *core.Tx, text string) {
	st, err := parseSettings(text, s.set)
	switch {
	case err != nil:
		s.log.Error("cluster: the leader's settings do not apply: the ones in force stay", "err", err, "in-force", s.set.String())
	case st != s.set:
		if err := tx.SetLimits(st.engineConfig()); err != nil { // validated: not expected
			s.log.Error("cluster: the leader's settings do not apply: the ones in force stay", "err", err)
			break
		}
		s.set = st
		s.cl.dedup.SetWindow(st.DedupWindow)
		s.log.Info("cluster: settings in force (the leader's)", "settings", st.String(), "proposed", time.Unix(0, tx.Now()))
	}
	s.checkParamsLocked(text, tx.Now())
}

// checkParamsLocked compares the leader's settings (an opParams command
// applied at time at) with this node's own flags and reports the
// differences: the leader's are in force, this node's would be only while
// it leads (an error in the log, once for each new difference, unless the
// command is older than two rounds of them: a log replayed after every
// node's settings changed; clusterState.paramsDiffer).
func (s *Server) checkParamsLocked(leader string, at int64) {
	cl := s.cl
	mine := strings.Fields(s.stateParams())
	theirs := strings.Fields(leader)
	var diff []string
	for _, kv := range mine {
		if !slices.Contains(theirs, kv) {
			name, _, _ := strings.Cut(kv, "=")
			other := "unset"
			for _, o := range theirs {
				if n, v, _ := strings.Cut(o, "="); n == name {
					other = v
				}
			}
			diff = append(diff, kv+" (leader: "+other+")")
		}
	}
	msg := strings.Join(diff, ", ")
	if msg != "" && msg != cl.paramsDiffer.Load() && time.Since(time.Unix(0, at)) < 2*paramsEvery {
		s.log.Error("cluster: this node's settings differ from the leader's: the leader's are in force on every "+
			"node; this node's flags count only while it leads, and then change the limits, grace, default TTL and "+
			"de-duplication window of the whole cluster: give every node the same",
			"differ", msg, "proposed", time.Unix(0, at))
	}
	cl.paramsDiffer.Store(msg)
}

func hasPrefix(s, p string) bool { return len(s) >= len(p) && s[:len(p)] == p }

// detachLocked starts sess's grace: it is attached nowhere.
func (s *Server) detachLocked(tx *core.Tx, sess *session) {
	sess.node, sess.key = "", ""
	s.rebindLocked(sess, false)
	tx.Apply(&core.Command{Op: core.OpDetach, Session: sess.id})
}

// localConn returns this node's connection of a command, nil if it was
// proposed elsewhere or the connection is gone.
func (s *Server) localConn(m *logCmd) *conn {
	if m.node != s.cl.id {
		return nil
	}
	return s.cl.conns[m.conn]
}

// rebindLocked makes sess.c follow the replicated attachment: the local
// connection of (node, key) if it is here, else none. A connection that
// loses the session is closed: told "taken over" if another connection
// took it (takeover), silently otherwise (its client connects again).
func (s *Server) rebindLocked(sess *session, takeover bool) {
	var want *conn
	if sess.node == s.cl.id {
		want = s.cl.conns[sess.key]
	}
	if sess.c == want {
		if want == nil && (sess.p == nil || sess.p.Name != sess.pname) {
			sess.p = &auth.Principal{Name: sess.pname}
		}
		return
	}
	if old := sess.c; old != nil {
		old.sess = nil
		sess.c = nil
		s.online--
		if takeover {
			old.sendError(protocol.CodeTakenOver)
			s.log.Info("session taken over by a new connection", "session", sess.hash, "old", old.remote)
		} else {
			old.finish()
		}
	}
	if want != nil {
		if want.sess != nil && want.sess != sess {
			want.sess.c = nil
			s.online--
		}
		sess.c = want
		want.sess = sess
		sess.p = want.p
		s.online++
	}
	if sess.c == nil && (sess.p == nil || sess.p.Name != sess.pname) {
		sess.p = &auth.Principal{Name: sess.pname} // rights count only where it is attached
	}
}

// applyAttachLocked is connect, applied: the session (new, or resumed
// with its offline pushes and its held locks announced again) moves to the
// connection, taking it over from any other.
func (s *Server) applyAttachLocked(tx *core.Tx, m *logCmd) {
	cl := s.cl
	local := s.localConn(m)
	sess := s.sessions[m.session]
	if sess != nil && sess.node == "" {
		// The session's grace may be over at the entry's time while no tick
		// processed it yet (the entry came first): process what is due, and
		// if the engine closed the session, this attach starts a new one.
		// The old one's events of this batch, its end included, stay its
		// own (eventLocked). Every node applies the same entry at the same
		// time: every node decides alike.
		tx.Apply(&core.Command{Op: core.OpTick})
		if !tx.HasSession(m.session) {
			delete(s.sessions, m.session)
			if s.ended == nil {
				s.ended = make(map[string]*session)
			}
			s.ended[m.session] = sess
			sess = nil
		}
	}
	resumed := sess != nil
	if sess == nil {
		if len(s.sessions) >= s.set.MaxSessions {
			s.counters.sessionsRefused++
			cl.ans = protocol.AppendError(cl.ans, protocol.CodeTooManySessions)
			cl.ans[0] = ansEnd
			s.answerLocked(local, m.seq, cl.ans[1:], true)
			return
		}
		sess = &session{id: m.session, hash: s.shortHash(m.session)}
		s.sessions[m.session] = sess
	}
	sess.pname = m.principal
	resumed = tx.Apply(&core.Command{Op: core.OpAttach, Session: m.session}).OK && resumed
	moved := sess.node != "" && (sess.node != m.node || sess.key != m.conn)
	sess.node, sess.key = m.node, m.conn
	s.rebindLocked(sess, moved)
	cl.ans[0] = ansAttached
	cl.ans = protocol.AppendConnectedLeader(cl.ans, resumed, s.set.graceMs(), s.leaderHint(local))
	cl.ans = append(cl.ans, sess.offline...)
	sess.offline = nil
	sess.pruned = false
	s.answerLocked(local, m.seq, cl.ans[1:], false)
	if resumed {
		// As connect: the held locks announced again, and those evicted
		// told again (an evicted lock ends at the eviction plus the grace,
		// which the new connection's answers would let its holder outlive).
		tx.SessionLocks(m.session, func(li core.LockInfo) {
			switch {
			case li.Revoked:
				s.push(sess, protocol.PushEvicted, li.ID)
			case li.Granted:
				s.pushLocked(sess, li.ID, li.Deadline, li.Token)
			}
		})
	}
}

// leaderHint is the leader's client address for the connected answer to
// local, this node's connection (nil: none here), if its connect asked for
// it ("want=leader": a client that reads the hint; an older parser would
// take the grace word for something else): the client may move there
// and save every request the forwarding hop and the follower's wait for the
// commit index. "" on the leader, without a local connection, or while no
// leader is known. Only this node's answer carries it (the replicated
// result is the flags byte), so it need not be deterministic.
func (s *Server) leaderHint(local *conn) string {
	if local == nil || !local.wantLeader {
		return ""
	}
	info, _ := s.cl.node.Leader()
	if info.ID == "" || info.ID == s.cl.id {
		return ""
	}
	return info.ClientAddr
}

// answerLocked writes frames to c, the proposing connection, unless its
// answer to proposal seq was written already (from the proposal's result,
// when this node applies later than the leader).
func (s *Server) answerLocked(c *conn, seq uint64, frames []byte, end bool) {
	if c == nil || c.answered >= seq {
		return
	}
	c.setAnswered(seq)
	c.write(frames)
	if end {
		c.finish()
	}
}

// applyFramesLocked runs the client frames of a connection, in order, with
// the handlers of a single node (rights were checked where it is
// connected). A connection that no longer holds its session (taken over,
// detached) is closed instead.
func (s *Server) applyFramesLocked(tx *core.Tx, m *logCmd) {
	cl := s.cl
	local := s.localConn(m)
	sess := s.sessions[m.session]
	if sess == nil || sess.node != m.node || sess.key != m.conn {
		cl.ans[0] = ansEnd
		if local != nil && local.answered < m.seq {
			local.finish()
		}
		return
	}
	ac := &cl.ac
	*ac = conn{srv: s, sess: sess, trusted: true, capture: &cl.ans, remote: "cluster"}
	for _, fr := range m.frames {
		cl.fields = protocol.Split(cl.fields[:0], fr)
		if len(cl.fields) == 0 {
			continue
		}
		at := len(cl.ans)
		ac.observeCommand(tx, cl.fields)
		if local != nil && local.answered < m.seq {
			local.write(cl.ans[at:]) // the answer, then its pushes
		}
		s.deliverPushesLocked()
		if ac.ended {
			cl.ans[0] = ansEnd
			if local != nil && local.answered < m.seq {
				local.finish()
			}
			// The connection ends here: its later commands (already on
			// their way, pipelined) find the session detached and are
			// ignored, as a single server drops what follows the frame
			// that closed the connection. The detach its end proposes
			// finds nothing left to do.
			s.detachLocked(tx, sess)
			break
		}
	}
	if local != nil && local.answered < m.seq {
		local.setAnswered(m.seq)
	}
	ac.capture = nil
}

// setAnswered records that this node's apply wrote the answer to the
// connection's proposal seq (under the core's lock), and wakes its pipeline
// if it waits for it (see pipeline.applied).
func (c *conn) setAnswered(seq uint64) {
	c.answered = seq
	if c.pipe != nil {
		select {
		case c.pipe.applied <- struct{}{}:
		default:
		}
	}
}

// Snapshot layout: "MLSS" 2, genesis byte, the settings in force (string,
// settings.String), uvarint sessions, each: id, principal, node, key,
// offline (length-prefixed), pruned byte; in id order; then the core's
// snapshot. Version 1 has no settings: it restores with the node's own,
// until the next opParams.
const (
	sessionsMagic   = "MLSS\x02"
	sessionsMagicV1 = "MLSS\x01"
)

func (r *replica) Snapshot() ([]byte, error) {
	s := r.s
	b := []byte(sessionsMagic)
	s.batch(func(*core.Tx) {
		if s.cl.genesis {
			b = append(b, 1)
		} else {
			b = append(b, 0)
		}
		b = appendStr(b, s.set.String())
		ids := make([]string, 0, len(s.sessions))
		for id := range s.sessions {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		b = binary.AppendUvarint(b, uint64(len(ids)))
		for _, id := range ids {
			sess := s.sessions[id]
			b = appendStr(b, id)
			b = appendStr(b, sess.pname)
			b = appendStr(b, sess.node)
			b = appendStr(b, sess.key)
			b = binary.AppendUvarint(b, uint64(len(sess.offline)))
			b = append(b, sess.offline...)
			if sess.pruned {
				b = append(b, 1)
			} else {
				b = append(b, 0)
			}
		}
	})
	cs, err := s.core().Snapshot()
	if err != nil {
		return nil, err
	}
	return append(b, cs...), nil
}

func (r *replica) Restore(snap []byte) error {
	s := r.s
	if len(snap) < len(sessionsMagic)+1 || string(snap[:len(sessionsMagic)]) != sessionsMagic &&
		string(snap[:len(sessionsMagicV1)]) != sessionsMagicV1 {
		return errors.New("server: not a cluster snapshot")
	}
	genesis := snap[len(sessionsMagic)] == 1
	d := decoder{p: snap[len(sessionsMagic)+1:]}
	set := settingsOf(&s.cfg) // an older snapshot's: the node's own
	if string(snap[:len(sessionsMagic)]) == sessionsMagic {
		text := d.str()
		if d.bad {
			return errBadCommand
		}
		st, err := parseSettings(text, set)
		if err != nil {
			return fmt.Errorf("server: cluster snapshot: %w", err)
		}
		set = st
	}
	n := d.uvarint()
	if d.bad || n > uint64(len(d.p)) {
		return errBadCommand
	}
	restored := make(map[string]*session, n)
	for range n {
		sess := &session{id: d.str(), pname: d.str(), node: d.str(), key: d.str()}
		sess.offline = append([]byte(nil), d.bytes()...)
		if d.bad || len(d.p) == 0 {
			return errBadCommand
		}
		sess.pruned = d.p[0] == 1
		d.p = d.p[1:]
		if len(sess.offline) == 0 {
			sess.offline = nil
		}
		restored[sess.id] = sess
	}
	c, err := s.newCore(set, d.p, nil, 0)
	if err != nil {
		return err
	}
	old := s.core()
	changed := false
	old.Batch(func(*core.Tx) {
		for id, o := range s.sessions {
			if n := restored[id]; n != nil {
				n.hash, n.p, n.c = o.hash, o.p, o.c
				continue
			}
			if o.c != nil {
				o.c.sess = nil
				o.c.finish()
				s.online--
			}
		}
		s.sessions = restored
		for _, sess := range restored {
			if sess.hash == "" {
				sess.hash = s.shortHash(sess.id)
			}
			s.rebindLocked(sess, false)
		}
		s.cl.genesis = genesis
		changed = s.set != set
		s.set = set
		s.corep.Store(c)
		// The entries the snapshot covers are never applied here: the
		// answers this node's connections wait for from them would never
		// be written. Their clients reconnect, resume their sessions and
		// ask again (none at start-up).
		for _, lc := range s.cl.conns {
			lc.finish()
		}
	})
	old.Close()
	if changed {
		s.log.Info("cluster: settings in force (the snapshot's)", "settings", set.String())
	}
	return nil
}

// ---- proposing ----

// errClosing: the server is shutting down; the command was not answered.
var errClosing = errors.New("server: shutting down")

// replicate proposes cmd (a cluster.DedupCommand) until it is applied,
// through this node if it leads or the leader's forwarding otherwise, and
// returns its answer. During an election it waits; after an unknown
// outcome it proposes the same command again (the de-duplication window
// answers a repeat). It ends with ctx's error or errClosing.
func (s *Server) replicate(ctx context.Context, cmd []byte) ([]byte, error) {
	cl := s.cl
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if cl.ctx.Err() != nil {
			return nil, errClosing
		}
		info, changed := cl.node.Leader()
		var (
			res []byte
			err error
		)
		switch {
		case info.ID == cl.id:
			res, err = cl.node.Propose(ctx, cmd)
		case info.ClientAddr != "":
			res, err = cl.fwd.propose(ctx, info.ClientAddr, cmd, changed)
		default:
			err = cluster.ErrNotLeader
		}
		if err == nil {
			return res, nil
		}
		if errors.Is(err, cluster.ErrClosed) {
			return nil, errClosing
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		// Not the leader, no leader, or an unknown outcome: wait for a
		// change (or a little) and propose again.
		t := time.NewTimer(20 * time.Millisecond)
		if errors.Is(err, cluster.ErrNotLeader) && info.ClientAddr == "" {
			t.Reset(200 * time.Millisecond)
		}
		select {
		case <-changed:
		case <-t.C:
		case <-ctx.Done():
		case <-cl.ctx.Done():
		}
		t.Stop()
	}
}

// seqKey is the de-duplication key of a connection's proposals.
func (c *conn) dedupCmd(seq uint64, body []byte) []byte {
	return cluster.DedupCommand(c.key, seq, body)
}

// detachOwnPast detaches the sessions attached to connections of this
// node's earlier runs (gone with that run), once a leader takes it.
func (s *Server) detachOwnPast() {
	cl := s.cl
	defer cl.bg.Done()
	cmd := cluster.DedupCommand(cl.run+"past", 0, appendLogCmd(nil, &logCmd{op: opDetachNode, node: cl.id, conn: cl.run}))
	if _, err := s.replicate(cl.ctx, cmd); err != nil && cl.ctx.Err() == nil {
		s.log.Warn("cluster: detaching the sessions of an earlier run", "err", err)
	}
}

// watchRemoved follows whether this node is still a member. A node removed
// from the cluster while it runs is never sent the log again: it could
// answer none of its clients. Its connections are closed
// without a word, and later ones too once they connect, so that their
// clients move to another node (the leader detaches their sessions). A node
// that has not been a member yet in this run (joining) is not removed.
func (s *Server) watchRemoved(st *ClusterStatus) {
	cl := s.cl
	member := false
	for _, p := range st.Peers {
		member = member || p.ID == cl.id
	}
	// Only a node that was a member in this run: one that joins stores the
	// configurations before the one that adds it first.
	cl.wasMember = cl.wasMember || member
	removed := cl.wasMember && !member && len(st.Peers) > 0
	if removed == cl.removed.Load() {
		return
	}
	cl.removed.Store(removed)
	if !removed {
		s.log.Info("cluster: this node is a member again: it serves clients")
		return
	}
	s.log.Warn("cluster: this node is no longer a member of the cluster: it closes its clients' connections " +
		"and serves none until it is added again (mlock cluster join)")
	s.batch(func(*core.Tx) {
		for c := range s.conns {
			if !c.forward {
				c.finish()
			}
		}
	})
}

// paramsEvery is how often a leader proposes its settings again (opParams).
const paramsEvery = time.Minute

// watchPeers runs on every node and acts while it leads: the sessions
// attached to a node the leader has not heard from for the failover window
// are detached (their grace starts), as if their connections dropped; so
// are, after the window too, those attached to a node that is no longer a
// member (removed: it is never heard from again, and no longer watched).
func (s *Server) watchPeers() {
	cl := s.cl
	defer cl.bg.Done()
	window := cl.cfg.window()
	done := map[string]bool{}
	// gone: nodes that sessions are attached to and that are not members,
	// since when this leader knows it; members: the members gone was last
	// computed for ("" : not since this node leads).
	gone := map[string]time.Time{}
	members := ""
	var paramsAt time.Time // when this leader last proposed its settings
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	var n uint64
	detach := func(node string, since time.Time, why string) bool {
		n++
		cmd := cluster.DedupCommand(cl.run+"lost/"+strconv.FormatUint(n, 10), 0,
			appendLogCmd(nil, &logCmd{op: opDetachNode, node: node}))
		ctx, cancel := context.WithTimeout(cl.ctx, window)
		defer cancel()
		if _, err := cl.node.Propose(ctx, cmd); err != nil {
			return false
		}
		s.log.Warn("cluster: "+why+": its sessions detached", "node", node, "since", since)
		return true
	}
	s.refreshStatus()
	for {
		select {
		case <-cl.ctx.Done():
			return
		case <-t.C:
		}
		st := s.refreshStatus()
		s.watchRemoved(st)
		if !cl.node.IsLeader() {
			clear(done)
			clear(gone)
			members = ""
			paramsAt = time.Time{}
			continue
		}
		if time.Since(paramsAt) >= paramsEvery {
			// Every node checks its settings against this leader's: at once,
			// and again now and then for the nodes that restarted since.
			ctx, cancel := context.WithTimeout(cl.ctx, window)
			if _, err := cl.node.Propose(ctx, cluster.DedupCommand("", 0, appendLogCmd(nil, &logCmd{op: opParams, params: s.stateParams()}))); err == nil {
				paramsAt = time.Now()
			}
			cancel()
		}
		peers := cl.node.Status().Peers
		for _, p := range peers {
			if !p.Failing {
				delete(done, p.ID)
				continue
			}
			if done[p.ID] || time.Since(p.FailingSince) < window {
				continue
			}
			if detach(p.ID, p.FailingSince, "node lost") {
				done[p.ID] = true
			}
		}
		ids := make([]string, 0, len(peers))
		for _, p := range peers {
			ids = append(ids, p.ID)
		}
		if !slices.Contains(ids, cl.id) {
			continue // the configuration is not known (a leader is in its own)
		}
		slices.Sort(ids)
		if key := strings.Join(ids, "\x00") + "\x00"; key != members {
			// The members changed (or this node just took the lead): which
			// nodes do sessions hang on that are none of them?
			members = key
			now := time.Now()
			s.batch(func(*core.Tx) {
				for _, sess := range s.sessions {
					if sess.node != "" && !slices.Contains(ids, sess.node) {
						if _, ok := gone[sess.node]; !ok {
							gone[sess.node] = now
						}
					}
				}
			})
		}
		for id, since := range gone {
			if slices.Contains(ids, id) {
				delete(gone, id) // a member again
				continue
			}
			if time.Since(since) >= window && detach(id, since, "node no longer a member") {
				delete(gone, id)
			}
		}
	}
}

// ---- connections ----

// pipeline is a connection's commands in cluster mode, in arrival order:
// the reader decides each frame (and queues it); one goroutine proposes the
// replicated ones (all that are queued, in one log command) and writes the
// local answers in between, once every earlier log command is answered, so
// answers keep the order of the requests. On the leader a log command is
// queued behind the connection's earlier ones without waiting for them (at
// most maxInflight on their way); elsewhere it is forwarded once the
// previous one is answered.
type pipeline struct {
	mu     sync.Mutex
	items  []item // guarded by mu
	closed bool   // guarded by mu: the reader ended
	wake   chan struct{}
	// applied (cap 1) is poked when this node's apply writes an answer to
	// one of the connection's proposals (conn.answered moves).
	applied chan struct{}
	done    chan struct{} // closed when the pipeline goroutine ends
	seq     uint64        // pipeline goroutine only: the last proposal
	// attached: an attach of this connection was applied (its detach is
	// due when it ends). Pipeline goroutine, then cleanup.
	attached bool
}

// item is one decided request.
type item struct {
	frame  []byte // a replicated request (a copy of its payload)
	local  []byte // else: frames to write (already answered here)
	end    bool   // the connection ends after local
	attach *logCmd
	bye    bool
	change *clusterChange // a membership change, run by the pipeline in its turn
}

func newPipeline() *pipeline {
	return &pipeline{wake: make(chan struct{}, 1), applied: make(chan struct{}, 1), done: make(chan struct{})}
}

func (p *pipeline) push(items []item) {
	p.mu.Lock()
	p.items = append(p.items, items...)
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *pipeline) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// maxGroupBytes bounds the frames of one proposal.
const maxGroupBytes = 256 << 10

// maxInflight bounds a connection's proposals on their way at once on the
// leader (pipelining: the next is queued while the earlier ones commit).
const maxInflight = 8

// flight is one of a connection's proposals queued on the leader.
type flight struct {
	cmd []byte // the DedupCommand, to propose again after a failure
	pr  *cluster.Proposal
}

// pipeLoop is the pipeline goroutine of c.
func (c *conn) pipeLoop() {
	s := c.srv
	p := c.pipe
	defer s.wg.Done()
	defer close(p.done)
	ctx, cancel := context.WithCancel(s.cl.ctx)
	defer cancel()
	go func() {
		select {
		case <-c.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	var group [][]byte
	size := 0
	// fl: proposals queued on this node's leadership and not yet answered,
	// oldest first (they are answered in order: raft commits a prefix).
	var fl []flight
	// settle waits for the oldest in-flight proposals until at most keep
	// remain. After a failure (not applied, or outcome unknown: leadership
	// lost) it waits for every later one, then proposes the failed one and
	// every later one again, in order, each once applied (those already
	// applied are answered by the de-duplication window). False: the
	// connection ends.
	settle := func(keep int) bool {
		for len(fl) > keep {
			res, err := fl[0].pr.Wait(ctx)
			if err == nil {
				fl = fl[1:]
				if !c.goesOn(res) {
					return false
				}
				continue
			}
			if ctx.Err() != nil || errors.Is(err, cluster.ErrClosed) {
				return false
			}
			again := fl
			fl = nil
			for _, f := range again[1:] {
				_, _ = f.pr.Wait(ctx)
			}
			for _, f := range again {
				res, err := s.replicate(ctx, f.cmd)
				if err != nil || !c.goesOn(res) {
					return false
				}
			}
		}
		return true
	}
	// applied waits until this node has applied the connection's last
	// proposal, which writes its answer: the leader answers a follower's
	// forwarded command before the follower applies it, and an answer
	// written here (status, locks, a refusal, bye, a membership change)
	// must not overtake it. On the leader it is so already. False: the
	// connection ends (its proposal found the session gone, or a snapshot
	// replaced the entries: the connection was closed).
	applied := func() bool {
		for {
			done := false
			s.batch(func(*core.Tx) { done = c.answered >= p.seq })
			if done {
				return true
			}
			select {
			case <-p.applied:
			case <-ctx.Done():
				return false
			}
		}
	}
	flush := func() bool {
		if len(group) == 0 {
			return true
		}
		p.seq++
		body := appendLogCmd(nil, &logCmd{op: opFrames, node: s.cl.id, conn: c.key, seq: p.seq, session: c.sid, frames: group})
		group, size = nil, 0
		cmd := c.dedupCmd(p.seq, body)
		// On the leader: queued behind the earlier ones of the same
		// leadership, without waiting for them.
		var after *cluster.Proposal
		if len(fl) > 0 {
			after = fl[len(fl)-1].pr
		}
		if pr, err := s.cl.node.ProposeAsync(ctx, cmd, after); err == nil {
			fl = append(fl, flight{cmd: cmd, pr: pr})
			return settle(maxInflight)
		}
		// Elsewhere (a follower forwards; no ready leader): after
		// everything on its way, one at a time.
		if !settle(0) {
			return false
		}
		res, err := s.replicate(ctx, cmd)
		if err != nil {
			return false
		}
		return c.goesOn(res)
	}
	for {
		p.mu.Lock()
		items, closed := p.items, p.closed
		p.items = nil
		p.mu.Unlock()
		if len(items) == 0 {
			if closed {
				return
			}
			// Idle: the oldest proposal on its way is still checked as
			// soon as it is answered, so a failed one is proposed again
			// without waiting for the client's next request.
			var oldest <-chan struct{}
			if len(fl) > 0 {
				oldest = fl[0].pr.Done()
			}
			select {
			case <-p.wake:
			case <-oldest:
				if !settle(len(fl) - 1) {
					return
				}
			case <-ctx.Done():
				return
			}
			continue
		}
		for _, it := range items {
			if it.frame != nil {
				group = append(group, it.frame)
				size += len(it.frame)
				if size < maxGroupBytes {
					continue
				}
			}
			if !flush() {
				return
			}
			if it.frame == nil && !settle(0) {
				return // what follows is answered here, after every earlier answer
			}
			if it.frame == nil && it.attach == nil && !applied() {
				return // ... and after this node's apply wrote them
			}
			switch {
			case it.attach != nil:
				p.seq++
				it.attach.seq = p.seq
				// Not cut short by the connection's end: whether the
				// session was attached here must be known, or its detach
				// (clusterCleanup) would be skipped and the session stay
				// attached to a dead connection, its grace never starting.
				res, err := s.replicate(s.cl.ctx, c.dedupCmd(p.seq, appendLogCmd(nil, it.attach)))
				if err != nil {
					return
				}
				if len(res) > 0 && res[0]&ansAttached != 0 {
					p.attached = true
				}
				if !c.goesOn(res) {
					return
				}
			case it.change != nil:
				ans := s.changeMembers(ctx, it.change)
				s.batch(func(*core.Tx) { c.write(ans) })
			case it.bye:
				s.batch(func(*core.Tx) { c.bye() })
				return
			case it.local != nil || it.end:
				end := it.end
				s.batch(func(*core.Tx) {
					c.write(it.local)
					if end {
						c.finish()
					}
				})
				if end {
					return
				}
			}
		}
		if !flush() {
			return
		}
	}
}

// goesOn reports, from the result res of a proposal the leader applied,
// whether the connection goes on. It writes nothing: the answer (and the
// pushes of the entries before it) are written by this node's own apply of
// the entry, in log order. Writing the leader's result at once would let an
// answer overtake a grant pushed by an earlier entry this node has not
// applied yet, and a client counts a grant's lease from the send time of
// the last request answered before it (see the root package's safety rule).
func (c *conn) goesOn(res []byte) bool {
	return len(res) == 0 || res[0]&ansEnd == 0
}

// decideFrames is handleFrames in cluster mode: every complete frame is
// decided (parsed, checked against this node's rights) and queued on the
// pipeline in one local batch.
func (c *conn) decideFrames(buf []byte, fields [][]byte) ([]byte, [][]byte, bool) {
	s := c.srv
	if c.forward {
		return c.forwardFrames(buf)
	}
	off := 0
	stop := false
	var items []item
	s.batch(func(tx *core.Tx) {
		for !stop {
			payload, n, want, err := protocol.Next(buf[off:], c.maxFrame())
			if err != nil {
				items = append(items, item{local: protocol.AppendError(nil, c.badFrame(err)), end: true})
				stop = true
				break
			}
			if n == 0 {
				if want > cap(buf) {
					nb := make([]byte, len(buf)-off, want)
					copy(nb, buf[off:])
					buf, off = nb, 0
				}
				break
			}
			fields = protocol.Split(fields[:0], payload)
			s.framesIn.Add(1)
			var it item
			it, stop = c.observeDecide(tx, fields, payload)
			items = append(items, it)
			off += n
			if c.forward {
				stop = false
				break
			}
		}
	})
	if len(items) > 0 {
		c.pipe.push(items)
	}
	rest := copy(buf, buf[off:])
	buf = buf[:rest]
	if c.forward && !stop {
		return c.forwardFrames(buf)
	}
	return buf, fields, stop
}

// decide handles one frame on the connection's node: what needs only this
// node (the connect's credentials, rights, ping, status, listings) is
// answered here, in order; the rest is queued for the log.
func (c *conn) decide(tx *core.Tx, f [][]byte, payload []byte) (item, bool) {
	s := c.srv
	verb, _ := protocol.ParseVerb(f[0])
	var buf []byte
	c.capture, c.ended = &buf, false
	defer func() { c.capture = nil }()
	local := func() (item, bool) {
		return item{local: buf, end: c.ended}, c.ended
	}
	if c.p == nil {
		if c.evicted {
			return item{end: true}, true // evicted before its handshake: told, and closing
		}
		if string(f[0]) == "forward" && len(f) >= 2 {
			return c.acceptForward(f[1])
		}
		if verb != protocol.VerbConnect {
			c.sendError(protocol.CodeConnectFirst)
			return local()
		}
		switch {
		case len(f) < 2 || len(f[1]) == 0:
			c.sendError(protocol.CodeSocketIDRequired)
		case len(f) < 3 || len(f[2]) == 0:
			c.sendError(protocol.CodeAPIVersionRequired)
		case len(f[1]) > s.cfg.MaxSocketIDLen:
			c.sendError(protocol.CodeSocketIDTooLong)
		case bytes0(f[1]):
			c.sendError(protocol.CodeInvalidSocketID)
		case s.closing:
			c.sendError(protocol.CodeShuttingDown)
		case s.cl.removed.Load():
			c.finish() // not a member: its client goes to another node (see watchRemoved)
		}
		if c.ended {
			return local()
		}
		cred, hasCred := authField(f[3:])
		p, code := s.principalFor(c, cred, hasCred)
		if p == nil {
			s.counters.authFailed++
			s.logRefusal(tx.Now(), "connect refused: "+code.Text(), "remote", c.remote, "tls", s.tlsConf != nil)
			c.park = s.crowdedLocked(c) // limits.go: the tarpit
			s.leavePreLocked(c)         // done with its handshake: its slot is free now
			c.sendError(code)
			return local()
		}
		sid := scope(p, string(f[1]))
		old := s.sessions[sid]
		if !s.connQuotaLocked(tx, c, p, old == nil, old != nil && old.c != nil && old.c.counted == p.Name) {
			return local()
		}
		c.p, c.sid = p, sid
		s.leavePreLocked(c)
		c.authed = true
		c.wantLeader = hasField(f[3:], "want=leader")
		return item{attach: &logCmd{op: opAttach, node: s.cl.id, conn: c.key, session: c.sid, principal: p.Name}}, false
	}
	var req []byte
	if len(f) > 1 {
		req = f[1]
	}
	p := c.p
	if c.sess != nil && c.sess.c == c {
		p = c.sess.p // the rights in force (the auth file may have been reloaded)
	}
	switch verb {
	case protocol.VerbPing:
		// Through the log: the answer then comes after the pushes of every
		// entry committed before the ping was sent, and proves the session
		// attached in the replicated state. A client counts a pong as a
		// lower bound of when its session was last alive and of when later
		// grants were made; a pong from this node's own state could be
		// answered by a node that lags, or that a partition cut off while
		// the leader already detached the session.
		return item{frame: append([]byte(nil), payload...)}, false
	case protocol.VerbStatus:
		if p.Admin && !s.allowListing(tx, p.Name) {
			c.failed(req, protocol.CodeRateLimited)
		} else {
			c.ok(req, s.statusJSON(tx, p.Admin))
		}
	case protocol.VerbLocks:
		sess := c.sess
		c.sess = &session{p: p}
		c.locks(tx, req, f)
		c.sess = sess
	case protocol.VerbBye:
		return item{bye: true}, true
	case protocol.VerbConnect:
		c.sendError(protocol.CodeDuplicateConnect)
	case protocol.VerbEvict:
		if !p.Admin {
			s.counters.forbidden++
			c.failed(req, protocol.CodeForbidden)
			break
		}
		return item{frame: append([]byte(nil), payload...)}, false
	case protocol.VerbCluster:
		if !p.Admin {
			s.counters.forbidden++
			c.failed(req, protocol.CodeForbidden)
			break
		}
		ch, ok := parseClusterChange(f)
		if !ok {
			c.failed(req, protocol.CodeMissingArguments)
			break
		}
		ch.req, ch.by = string(req), p.Name
		return item{change: ch}, false
	case protocol.VerbLock, protocol.VerbTryLock:
		if len(f) >= 3 && !p.Admin {
			for _, r := range s.splitResources(string(f[2])) {
				if !p.May(r) {
					s.counters.forbidden++
					buf = protocol.AppendFailed(buf, req, protocol.CodeForbidden, r)
					return local()
				}
			}
		}
		if !s.lockQuotaLocked(tx, p) {
			// Against the replicated state this node has applied: requests
			// of the principal on their way through the log are not in it
			// yet (see docs/security.md).
			s.counters.quotaRefused++
			c.failed(req, protocol.CodeQuotaLocks)
			return local()
		}
		return item{frame: append([]byte(nil), payload...)}, false
	case protocol.VerbExtend, protocol.VerbRenew:
		// The rights in force on this node now, as on a single node: a
		// reload may have taken the lock's resources away from the
		// principal. Giving a lock up (unlock, release) stays allowed.
		if !p.Admin {
			if r, ok := c.revoked(tx, p, verb, f); ok {
				s.counters.forbidden++
				buf = protocol.AppendFailed(buf, req, protocol.CodeForbidden, r)
				return local()
			}
		}
		return item{frame: append([]byte(nil), payload...)}, false
	case protocol.VerbUnlock, protocol.VerbRelease, protocol.VerbReleaseAll, protocol.VerbReleaseIn, protocol.VerbReleaseAllIn:
		return item{frame: append([]byte(nil), payload...)}, false
	default:
		c.failed(req, protocol.CodeInvalidMessage)
	}
	return local()
}

// revoked returns the first resource of an extend's lock (f[2], known to
// this node and p's own: another's is answered lock not exist! by the
// apply) or of a renew (f[3]) that p may no longer lock.
func (c *conn) revoked(tx *core.Tx, p *auth.Principal, verb protocol.Verb, f [][]byte) (string, bool) {
	var resources []string
	switch {
	case verb == protocol.VerbRenew && len(f) >= 4:
		resources = c.srv.splitResources(string(f[3]))
	case verb == protocol.VerbExtend && len(f) >= 3:
		id, ok := core.ParseID(f[2])
		if !ok {
			return "", false
		}
		li, found := tx.Lookup(id)
		if !found {
			return "", false
		}
		if owner, _ := unscope(li.Session); owner != p.Name {
			return "", false
		}
		resources = li.Resources
	}
	for _, r := range resources {
		if !p.May(r) {
			return r, true
		}
	}
	return "", false
}

func bytes0(b []byte) bool {
	for _, x := range b {
		if x == 0 {
			return true
		}
	}
	return false
}

// clusterCleanup is cleanup's cluster part, before the local one: the
// pipeline finishes what was read, then the session (if this connection
// attached it) is detached in the log, after every answer it was given.
func (c *conn) clusterCleanup() {
	s := c.srv
	p := c.pipe
	p.close()
	<-p.done
	if !p.attached {
		return
	}
	p.seq++
	cmd := c.dedupCmd(p.seq, appendLogCmd(nil, &logCmd{op: opDetach, node: s.cl.id, conn: c.key, session: c.sid}))
	if _, err := s.replicate(s.cl.ctx, cmd); err != nil {
		s.log.Debug("cluster: detach not proposed (shutting down)", "remote", c.remote)
	}
}

// ---- status ----

// ClusterStatus is the "cluster" object of the status document of a node.
type ClusterStatus = protocol.StatusCluster

// ClusterNode is one member in ClusterStatus.
type ClusterNode = protocol.StatusClusterNode

func (s *Server) clusterStatus() *ClusterStatus {
	st := s.cl.node.Status()
	cs := &ClusterStatus{ID: st.ID, Role: string(st.Role), Ready: st.Ready, Leader: st.Leader.ID,
		LeaderAddr: st.Leader.ClientAddr, Term: st.Term, LastIndex: st.LastIndex,
		CommitIndex: st.CommitIndex, AppliedIndex: st.AppliedIndex, Peers: []ClusterNode{}}
	for _, p := range st.Peers {
		cs.Peers = append(cs.Peers, ClusterNode{ID: p.ID, Addr: p.Addr, Suffrage: p.Suffrage, Failing: p.Failing})
	}
	return cs
}

// refreshStatus reads the node's view of the cluster and stores it for the
// status command, which must not read raft under the core's lock. It runs
// every 100 ms (watchPeers) and once a membership change made here is
// committed, so that a status asked right after the change shows it.
func (s *Server) refreshStatus() *ClusterStatus {
	cl := s.cl
	cl.statusMu.Lock()
	defer cl.statusMu.Unlock()
	st := s.clusterStatus()
	cl.status.Store(st)
	return st
}

// ClusterStatus returns the node's view of the cluster now, nil on a
// single node. (The status command shows one at most 100 ms old, and on
// the leader one that has every membership change it committed.)
func (s *Server) ClusterStatus() *ClusterStatus {
	if s.cl == nil {
		return nil
	}
	return s.clusterStatus()
}

// clusterStop is Shutdown in cluster mode: the sessions of this node are
// detached in the log (their grace starts; their clients move to another
// node), every connection closes without a word, and the node leaves the
// cluster's work to the others. The locks stay in the cluster.
func (s *Server) clusterStop(ctx context.Context) {
	cl := s.cl
	s.batch(func(*core.Tx) { s.closing = true })
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	cmd := cluster.DedupCommand(cl.run+"stop", 0, appendLogCmd(nil, &logCmd{op: opDetachNode, node: cl.id}))
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
