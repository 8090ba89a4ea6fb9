package server

import (
	"context"
	"strconv"
	"strings"
	"sync"
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
// lowest among the members (a member that has not said so for formatFresh
// counts as format 1: a build before the formats, which says nothing) and,
// when it is above the version in force, proposes it (opVersion), in the
// new format itself: every member reads it. The version is replicated state: it never goes down (a member
// of an older build must not join a cluster of a higher version; it would
// stop applying, see halt).

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
}

type formatSaid struct {
	format int
	at     time.Time
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

// noteFormat records what member id said (fwdFormat, on the leader).
func (cl *clusterState) noteFormat(id string, format int) {
	cl.formats.mu.Lock()
	defer cl.formats.mu.Unlock()
	if cl.formats.said == nil {
		cl.formats.said = map[string]formatSaid{}
	}
	cl.formats.said[id] = formatSaid{format: format, at: time.Now()}
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
	st, _, err := cl.fwd.call(ctx, info.ClientAddr, fwdFormat, []byte(cl.id+" "+strconv.Itoa(cl.ownFormat())), nil)
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
	v := cl.ownFormat()
	for _, p := range peers {
		f, _ := cl.memberFormat(p.ID)
		v = min(v, f)
	}
	if int64(v) <= cl.versionNow.Load() {
		return
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
