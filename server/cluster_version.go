package server

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mlock-dev/mlock/internal/cluster"
)

// The cluster version (as etcd's): the highest log format every member
// reads. Every node writes that format, never a higher one, so a command
// kind or a snapshot field that a member's build cannot read is never
// written while that member is in the cluster (the old form is written
// meanwhile). Each member says which formats its build reads: a follower
// tells the leader (fwdFormat) when it learns of a new leader (a new term,
// even with the same member) and every announceEvery; the leader takes the
// lowest among the members (a member that has not said so for formatFresh,
// or said it on a forwarding connection that ended since, counts as format
// 1: a build before the formats says nothing) and,
// when it is above the version in force, proposes it (opVersion), in the
// new format itself: every member reads it. The version is replicated
// state: it goes down only by a rollback (cluster_rollback.go), which pins
// it until the operator raises it again (a member of an older build must
// not join a cluster of a higher version; it would stop applying, see
// halt).

// announceEvery is how often a follower tells the leader its formats
// again; formatFresh is how long the leader counts on what a member said.
const (
	announceEvery = 10 * time.Second
	formatFresh   = 3 * announceEvery
)

// formats is what the members said of their builds (on the leader).
type formats struct {
	mu   sync.Mutex
	said map[string]formatSaid // by member id
	// announcing (watchPeers only): to which leader (its id and term) this
	// node last said its formats, and when it last tried.
	toLeader string
	tried    time.Time

	// On the leader (fenceStale, checkForwarded): refused says why each
	// member whose forwarded command was refused cannot read the cluster
	// version; stale, why each member is fenced now (what status shows);
	// upSince, since when the leader's heartbeats to each member succeed;
	// leadSince, since when this node leads (zero: it does not).
	refused   map[string]string
	stale     map[string]string
	upSince   map[string]time.Time
	leadSince time.Time
	// changed: when this leader last tried to change each member's
	// suffrage (a failed try is made again a second later at the soonest).
	changed map[string]time.Time
	// refusedN counts the forwarded commands refused as a stale member's.
	refusedN atomic.Uint64
}

type formatSaid struct {
	format int
	at     time.Time
	// via is the forwarding connection that carried it (nil: unknown): a
	// member restarted on another build forwards on a new one.
	via *conn
}

// ownFormat is the highest log format this node's build reads.
func (cl *clusterState) ownFormat() int {
	if hk := cl.cfg.testHooks; hk != nil && hk.ownFormat != nil {
		if f := hk.ownFormat(cl.id); f > 0 {
			return f
		}
	}
	return logFormat
}

// memberFormat returns the highest log format member id said it reads,
// and whether it said so lately (this node's own is always known).
func (cl *clusterState) memberFormat(id string) (int, bool) {
	if id == cl.id {
		return cl.ownFormat(), true
	}
	cl.formats.mu.Lock()
	defer cl.formats.mu.Unlock()
	f, ok := cl.formats.said[id]
	if !ok || time.Since(f.at) > formatFresh {
		return logFormat1, false
	}
	return f.format, true
}

// noteFormat records what member id said (fwdFormat, on the leader), on
// the forwarding connection via.
func (cl *clusterState) noteFormat(id string, format int, via *conn) {
	cl.formats.mu.Lock()
	defer cl.formats.mu.Unlock()
	if cl.formats.said == nil {
		cl.formats.said = map[string]formatSaid{}
	}
	if via != nil {
		via.saidFormat = format
	}
	if prev := cl.formats.said[id]; newerOpen(prev.via, via) {
		// A word read late on an older connection (each connection has
		// its own reader) does not replace the member's word on a newer
		// one still open: a member opens a new forwarding connection to
		// an address only once its previous one ended on its side, so
		// the older word is its previous run's (or link's), and the
		// newer connection is the one memberFormatLive must follow.
		return
	}
	cl.formats.said[id] = formatSaid{format: format, at: time.Now(), via: via}
	if format >= int(cl.versionNow.Load()) {
		delete(cl.formats.refused, id)
	}
}

// newerOpen reports whether prev, the connection of a member's last word,
// is still open and was accepted after via, the connection of a word read
// now.
func newerOpen(prev, via *conn) bool {
	if prev == nil || via == nil || prev == via || !prev.accepted.After(via.accepted) {
		return false
	}
	select {
	case <-prev.done:
		return false
	default:
		return true
	}
}

// formatSaid is the body of this node's fwdFormat requests, which
// parseFormatSaid reads.
func (cl *clusterState) formatSaid() []byte {
	return []byte(cl.id + " " + strconv.Itoa(cl.ownFormat()))
}

// parseFormatSaid parses the body of a fwdFormat request: "<id> <format>".
func parseFormatSaid(b []byte) (string, int, bool) {
	id, f, ok := strings.Cut(string(b), " ")
	n, err := strconv.Atoi(f)
	return id, n, ok && id != "" && err == nil && n >= logFormat1
}

// announceFormat tells the leader, if another node leads, which formats
// this node reads: once to each new leader, then every announceEvery (every
// second while the leader does not take it: a leader of an older build
// refuses the request, and the cluster keeps its version).
func (s *Server) announceFormat() {
	cl := s.cl
	// The term first: a follower sets a new term just before the new
	// leader, and the term read first is less often paired with the old
	// leader (which costs an announcement to it, and a second's delay).
	term := cl.node.Term()
	info, _ := cl.node.Leader()
	if info.ID == "" || info.ID == cl.id || info.ClientAddr == "" {
		return
	}
	a := &cl.formats
	leader := info.ID + " " + strconv.FormatUint(term, 10)
	if !a.due(leader, time.Now()) {
		return
	}
	a.tried = time.Now()
	ctx, cancel := context.WithTimeout(cl.ctx, time.Second)
	defer cancel()
	st, _, err := cl.fwd.call(ctx, info.ClientAddr, fwdFormat, cl.formatSaid(), nil)
	if err == nil && st == fwdOK {
		a.toLeader = leader
	} else {
		a.toLeader = ""
	}
}

// due reports whether a follower should tell leader (its id and term) its
// formats at now: it has not told this leader yet (and did not try in the
// last second), or it told it announceEvery ago. A leader elected again is
// a new one, even the same member: restarted (upgraded), it has forgotten
// what the members said.
func (a *formats) due(leader string, now time.Time) bool {
	since := now.Sub(a.tried)
	if leader == a.toLeader {
		return since >= announceEvery
	}
	return a.tried.IsZero() || since >= time.Second
}

// raiseVersion runs on the leader: when every member reads a format above
// the cluster version in force, it proposes that format as the version.
func (s *Server) raiseVersion(peers []cluster.Peer) {
	cl := s.cl
	v := cl.raiseTarget(peers)
	if int64(v) <= cl.versionNow.Load() || cl.pinned.Load() {
		return // a rollback pinned the version: mlock cluster rollback --cancel raises it
	}
	ctx, cancel := context.WithTimeout(cl.ctx, cl.cfg.window())
	defer cancel()
	cmd := cluster.DedupCommand("", 0, appendLogCmd(nil, &logCmd{format: v, op: opVersion, version: uint64(v)}))
	if _, err := cl.node.Propose(ctx, cmd); err != nil {
		s.log.Warn("cluster: raising the cluster version", "version", v, "err", err)
		return
	}
	s.log.Info("cluster: every member reads log format "+strconv.Itoa(v)+": the cluster version is raised", "version", v)
}

// raiseTarget returns the highest log format every member of peers reads,
// as far as this node (the leader) knows: on the word each said on a
// forwarding connection still open (memberFormatLive; else it counts as
// format 1). A word said on a connection that ended since is not taken,
// however fresh: the member may have been restarted meanwhile on a build
// that reads less (v0.1.0 says nothing), and a raise it cannot read would
// reach it. A member of this build says its formats first on every
// forwarding connection it opens, and again every announceEvery (on its
// connection of then), so a healthy cluster raises all the same.
func (cl *clusterState) raiseTarget(peers []cluster.Peer) int {
	v := cl.ownFormat()
	for _, p := range peers {
		f, _ := cl.memberFormatLive(p.ID)
		v = min(v, f)
	}
	return v
}

// Stale members. A member whose build cannot read the cluster version must
// never serve: a build before the formats (v0.1.0) skips the commands it
// cannot decode and answers its clients from the state it diverged into
// (two holders of one lock, fencing tokens going back). It cannot be
// changed, so the leader fences such a member:
//
//   - it refuses the member's forwarded log commands (checkForwarded): a
//     command written in a format below the cluster version, on a
//     forwarding connection that did not say the member reads the version,
//     comes from a build that does not read it (its clients' connects and
//     requests fail; a build of this kind tells them staleRefusal's error);
//   - it demotes the member to a nonvoter (fenceStale): a nonvoter never
//     stands for election, and the voters refuse its vote requests, so it
//     cannot lead (a leader answers its own clients from its own state).
//     It is made a voter again once it says it reads the cluster version.
//
// A member is stale, while the cluster version is 2 or more, when its
// forwarded command was refused, when it said it reads a format below the
// version, or when it has said nothing for formatFresh although the
// leader's heartbeats to it succeeded for announceGrace and this node has
// led for formatFresh (a member says its formats within a second of a new
// leader, then every announceEvery; the previous release says nothing).

// announceGrace is how long a member reached again may stay silent.
const announceGrace = 5 * time.Second

// staleRefusal begins the refusal of a stale member's forwarded command.
const staleRefusal = "stale build: "

// errStaleNode: the leader refused this node's command: its build cannot
// read the cluster version.
var errStaleNode = errors.New("server: this node's build cannot read the cluster's log")

// checkForwarded decides, on the leader, what becomes of the log command
// cmd (a cluster.DedupCommand) forwarded on the connection via (nil: not
// known). ok: it is proposed. Else st and res are its answer, and nothing
// is done:
//
//   - a command in a format at or above the cluster version is proposed;
//   - so is one from a connection on which a member said it reads the
//     version: a node of this build writes the format of the version it
//     has applied, which lags behind the leader's while it catches up (a
//     restart, the version just raised), and says its formats first on
//     every forwarding connection it opens (forwarder.get);
//   - one from a connection that said nothing yet, less than announceGrace
//     old, is answered fwdNotLeader (ask again): a node of an earlier build
//     says its formats on it within announceEvery, v0.1.0 never;
//   - any other is a stale member's: it is refused (staleAnswer), and the
//     member fenced (fenceStale) until it says it reads the version.
func (s *Server) checkForwarded(cmd []byte, via *conn) (ok bool, st byte, res []byte) {
	cl := s.cl
	v := int(cl.versionNow.Load())
	if v <= logFormat1 {
		return true, 0, nil
	}
	_, _, body, err := cluster.ParseDedupCommand(cmd)
	if err != nil {
		return true, 0, nil // a bad command fails where it is applied
	}
	f, _, err := logFormatOf(body)
	if err != nil || f >= v {
		return true, 0, nil
	}
	said, announced := cl.saidOn(via)
	switch {
	case announced && said >= v:
		return true, 0, nil
	case via == nil:
		return false, fwdNotLeader, []byte(cl.node.LeaderAddr())
	case !announced && time.Since(via.accepted) < announceGrace:
		return false, fwdNotLeader, []byte(cl.node.LeaderAddr())
	}
	var m logCmd
	node := ""
	if decodeLogCmd(body, &m) == nil {
		node = m.node
	}
	why := fmt.Sprintf("node %s wrote a log command of format %d; the cluster version is %d: "+
		"its build cannot read the cluster's log", node, f, v)
	a := &cl.formats
	a.refusedN.Add(1)
	if node != "" {
		a.mu.Lock()
		if a.refused == nil {
			a.refused = map[string]string{}
		}
		_, again := a.refused[node]
		a.refused[node] = why
		a.mu.Unlock()
		if !again {
			s.log.Warn("cluster: a forwarded command refused: "+why, "node", node)
		}
	}
	st, res = cl.staleAnswer(why, announced)
	return false, st, res
}

// staleAnswer is the leader's answer to a log command refused as a stale
// member's (checkForwarded says why). A node that told the leader its
// formats on the forwarding connection (this build, or a later one) is
// answered fwdFailed with staleRefusal: it tells its client and closes. A
// node that never did (v0.1.0, which asked again every 20 ms for as long as
// it ran, once per connection of its clients) is answered as if the command
// had ended its connection (fwdOK, ansEnd): nothing was applied, and it
// stops asking; its client, never answered, goes to another node.
func (cl *clusterState) staleAnswer(why string, announced bool) (byte, []byte) {
	if !announced {
		return fwdOK, []byte{ansEnd}
	}
	return fwdFailed, []byte(staleRefusal + why)
}

// saidOn returns the log format a member said it reads on the forwarding
// connection via (its latest word there), and whether one said any there
// (whatever the member said since on another connection).
func (cl *clusterState) saidOn(via *conn) (int, bool) {
	if via == nil {
		return 0, false
	}
	a := &cl.formats
	a.mu.Lock()
	defer a.mu.Unlock()
	return via.saidFormat, via.saidFormat > 0
}

// staleWhy returns why member p is stale at cluster version v ("": it is
// not), on the leader at now; upSince and led as in formats.
func (cl *clusterState) staleWhy(p cluster.Peer, v int, now time.Time) string {
	if v <= logFormat1 || p.ID == cl.id {
		return ""
	}
	f, known := cl.memberFormat(p.ID)
	a := &cl.formats
	a.mu.Lock()
	defer a.mu.Unlock()
	if why := a.refused[p.ID]; why != "" {
		return why // until it says it reads the version (noteFormat)
	}
	switch {
	case known && f < v:
		return fmt.Sprintf("it reads log formats up to %d; the cluster version is %d", f, v)
	case !known && !p.Failing && !a.upSince[p.ID].IsZero() && now.Sub(a.upSince[p.ID]) >= announceGrace &&
		!a.leadSince.IsZero() && now.Sub(a.leadSince) >= formatFresh:
		return fmt.Sprintf("it has not said which log formats it reads for %v (a build before the formats, "+
			"as v0.1.0, says nothing); the cluster version is %d", formatFresh, v)
	}
	return ""
}

// fenceStale runs on the leader (every 100 ms, watchPeers): a stale voter
// is made a nonvoter, and a nonvoter that is not stale, reached and said it
// reads the cluster version, a voter again.
func (s *Server) fenceStale(peers []cluster.Peer) {
	cl := s.cl
	a := &cl.formats
	now := time.Now()
	a.mu.Lock()
	if a.leadSince.IsZero() {
		a.leadSince = now
	}
	if a.upSince == nil {
		a.upSince = map[string]time.Time{}
	}
	for _, p := range peers {
		if p.Failing {
			delete(a.upSince, p.ID)
		} else if a.upSince[p.ID].IsZero() {
			a.upSince[p.ID] = now
		}
	}
	a.mu.Unlock()
	v := int(cl.versionNow.Load())
	stale := map[string]string{}
	for _, p := range peers {
		why := cl.staleWhy(p, v, now)
		if why != "" {
			stale[p.ID] = why
		}
		f, known := cl.memberFormat(p.ID)
		demote := why != "" && p.Suffrage == "Voter"
		promote := why == "" && p.Suffrage == "Nonvoter" && p.ID != cl.id && known && f >= v && !p.Failing
		if !demote && !promote {
			continue
		}
		a.mu.Lock()
		if now.Sub(a.changed[p.ID]) < time.Second {
			a.mu.Unlock()
			continue
		}
		if a.changed == nil {
			a.changed = map[string]time.Time{}
		}
		a.changed[p.ID] = now
		a.mu.Unlock()
		var err error
		switch {
		case demote:
			ctx, cancel := context.WithTimeout(cl.ctx, cl.cfg.window())
			err = cl.node.Demote(ctx, p.ID)
			cancel()
			if err == nil {
				s.log.Warn("cluster: a member cannot read what the cluster writes: it is made a nonvoter, and its "+
					"forwarded commands are refused, until it runs a build that reads log format "+strconv.Itoa(v),
					"node", p.ID, "why", why)
			}
		case promote:
			ctx, cancel := context.WithTimeout(cl.ctx, cl.cfg.window())
			err = cl.node.Join(ctx, p.ID, p.Addr)
			cancel()
			if err == nil {
				s.log.Info("cluster: a member reads the cluster version again: it is a voter again", "node", p.ID, "format", f)
			}
		}
		if err != nil {
			s.log.Warn("cluster: changing a member's suffrage", "node", p.ID, "err", err)
		}
	}
	a.mu.Lock()
	a.stale = stale
	a.mu.Unlock()
}

// notLeading forgets what fenceStale learnt as the leader.
func (a *formats) notLeading() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.leadSince = time.Time{}
	a.stale, a.upSince, a.refused, a.changed = nil, nil, nil, nil
}

// staleNow returns why member id is fenced now ("": it is not; on the
// leader only).
func (a *formats) staleNow(id string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stale[id]
}

// peerStale returns why member p cannot read what the cluster writes ("":
// nothing says so; on the leader only): fenced by fenceStale, or, while the
// leader's heartbeats to it fail, refusing the raft handshake of the
// cluster version (a build that does not know it: see
// cluster.Config.ClusterVersion), which fences it as well.
func (s *Server) peerStale(p cluster.Peer) string {
	if why := s.cl.formats.staleNow(p.ID); why != "" {
		return why
	}
	if p.Failing {
		return s.cl.node.PeerRefusesVersion(p.Addr)
	}
	return ""
}

// versionFile, in a node's raft directory, holds the highest cluster
// version the node applied ("3\n"; written when it rises, fsynced), or
// the version a rollback lowered it to, pinned, with the raft index of the
// lowering ("1 rollback 1234\n": see cluster_rollback.go; an earlier build
// wrote "1 rollback\n", read as a pin of unknown index). A node restarted
// gets the version back from its snapshot, and from its log only once a
// leader has told it what is committed: until then the raft handshake
// (raftVersion) would take it for a node of a build that cannot read the
// log, and a peer of that build for one of its own. A pinned node that
// restores a snapshot, or replays entries, from before the lowering's
// index keeps the pin (setVersionLocked).
const versionFile = "cluster-version"

// pinWord follows the version in versionFile when a rollback lowered it.
const pinWord = "rollback"

// raftVersion is the cluster version this node's raft handshake carries
// (cluster.Config.ClusterVersion): the highest it applied, in this run or
// an earlier one on its directory, or since a rollback the version it
// lowered to. At 2 or more, it refuses the raft connections of a build
// that cannot read the log (v0.1.0), which can thus never win its vote.
func (cl *clusterState) raftVersion() int {
	return int(max(cl.versionNow.Load(), cl.versionFloor.Load()))
}

// versionState is what versionFile holds: the version, whether a
// rollback pinned it, and the raft index of the lowering that did (0: not
// known).
type versionState struct {
	version int
	pinned  bool
	at      uint64
}

// String is the file's text (without its newline), which
// parseVersionState reads.
func (vs versionState) String() string {
	text := strconv.Itoa(vs.version)
	if vs.pinned {
		text += " " + pinWord
		if vs.at > 0 {
			text += " " + strconv.FormatUint(vs.at, 10)
		}
	}
	return text
}

// parseVersionState reads "<v>", "<v> rollback" or "<v> rollback <index>".
func parseVersionState(text string) (versionState, bool) {
	var vs versionState
	f := strings.Fields(text)
	if len(f) == 0 || len(f) > 3 || len(f) >= 2 && f[1] != pinWord {
		return vs, false
	}
	v, err := strconv.Atoi(f[0])
	if err != nil || v < 0 {
		return vs, false
	}
	vs.version, vs.pinned = v, len(f) >= 2
	if len(f) == 3 {
		if vs.at, err = strconv.ParseUint(f[2], 10, 64); err != nil || vs.at == 0 {
			return versionState{}, false
		}
	}
	return vs, true
}

// readVersionFile returns the version in dir's versionFile (0: none).
func readVersionFile(dir string) (int, error) {
	vs, err := readVersionState(dir)
	return vs.version, err
}

// readVersionState returns what dir's versionFile holds (version 0:
// there is none).
func readVersionState(dir string) (versionState, error) {
	b, err := os.ReadFile(filepath.Join(dir, versionFile))
	if errors.Is(err, fs.ErrNotExist) {
		return versionState{}, nil
	}
	if err != nil {
		return versionState{}, fmt.Errorf("cluster version file: %w", err)
	}
	vs, ok := parseVersionState(string(b))
	if !ok {
		return versionState{}, fmt.Errorf("cluster version file %s: %q is not a version (write there the cluster version that mlock cluster status shows)",
			filepath.Join(dir, versionFile), strings.TrimSpace(string(b)))
	}
	return vs, nil
}

// writeVersionFile replaces dir's versionFile with vs, durably.
func writeVersionFile(dir string, vs versionState) error {
	tmp := filepath.Join(dir, versionFile+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.WriteString(vs.String() + "\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, versionFile))
	}
	if err == nil {
		var d *os.File
		if d, err = os.Open(dir); err == nil {
			err = d.Sync()
			d.Close()
		}
	}
	return err
}
