package server

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mlock-dev/mlock/internal/cluster"
	"github.com/mlock-dev/mlock/internal/core"
)

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
		return s.detachLost(node, since, why, cl.run+"lost/"+strconv.FormatUint(n, 10), window)
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
			s.announceFormat()
			cl.formats.notLeading()
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
			if _, err := cl.node.Propose(ctx, cluster.DedupCommand("", 0, cl.encode(&logCmd{op: opParams, params: s.stateParams()}))); err == nil {
				paramsAt = time.Now()
			}
			cancel()
		}
		peers := cl.node.Status().Peers
		s.raiseVersion(peers)
		s.fenceStale(peers)
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
			s.noteGone(ids, gone, time.Now())
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

// noteGone adds to gone, at now, each node that sessions are attached to
// and that is none of the members ids; a node already in gone keeps its
// time.
func (s *Server) noteGone(ids []string, gone map[string]time.Time, now time.Time) {
	s.batch(func(*core.Tx) {
		for _, sess := range s.sessions {
			if sess.node == "" || slices.Contains(ids, sess.node) {
				continue
			}
			if _, ok := gone[sess.node]; !ok {
				gone[sess.node] = now
			}
		}
	})
}

// detachLost proposes the detach of the sessions attached to node (key:
// the command's de-duplication key), if the failover window has passed
// since the leader last heard from it in any way: since (raft's last
// contact, or when it learned the node is no longer a member), the node's
// last read (a node that answers its clients' pings is heard from) and
// this leadership's start. A pong the node gave was confirmed by a leader
// after the ping arrived, and the session's grace starts after it (see
// docs/cluster.md, "Liveness").
func (s *Server) detachLost(node string, since time.Time, why, key string, window time.Duration) bool {
	cl := s.cl
	if !cl.live.startDetach(cl.node, node, since, window) {
		return false
	}
	cmd := cluster.DedupCommand(key, 0, cl.encode(&logCmd{op: opDetachNode, node: node}))
	ctx, cancel := context.WithTimeout(cl.ctx, window)
	defer cancel()
	if _, err := cl.node.Propose(ctx, cmd); err != nil {
		// Its outcome may be unknown: the node's reads stay refused while
		// this leadership lasts (until a detach is applied).
		return false
	}
	cl.live.endDetach(node)
	s.log.Warn("cluster: "+why+": its sessions detached", "node", node, "since", since)
	return true
}
