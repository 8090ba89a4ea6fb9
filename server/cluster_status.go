package server

import (
	"encoding/json"

	"github.com/mlock-dev/mlock/internal/protocol"
)

// ClusterStatus is the "cluster" object of the status document of a node.
type ClusterStatus = protocol.StatusCluster

// ClusterNode is one member in ClusterStatus.
type ClusterNode = protocol.StatusClusterNode

func (s *Server) clusterStatus() *ClusterStatus {
	st := s.cl.node.Status()
	cs := &ClusterStatus{ID: st.ID, Role: string(st.Role), Ready: st.Ready, Leader: st.Leader.ID,
		LeaderAddr: st.Leader.ClientAddr, Term: st.Term, LastIndex: st.LastIndex,
		CommitIndex: st.CommitIndex, AppliedIndex: st.AppliedIndex, Peers: []ClusterNode{},
		Version: int(s.cl.versionNow.Load()), LogFormat: s.cl.ownFormat(), Halted: s.cl.halted.Load(),
		Pinned: s.cl.pinned.Load(), RollbackReady: s.cl.rollbackReady()}
	for _, p := range st.Peers {
		n := ClusterNode{ID: p.ID, Addr: p.Addr, Suffrage: p.Suffrage, Failing: p.Failing}
		if f, known := s.cl.memberFormat(p.ID); known {
			n.LogFormat = f
		}
		n.Stale = s.peerStale(p)
		cs.Peers = append(cs.Peers, n)
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

// clusterProbe answers the unframed "cluster\n" request: this node's own
// view of its cluster (role, term, indexes, version, peers; on the leader
// what it knows of each member) as one line of JSON, at most 100 ms old. It needs no
// session and no log, so a node without a leader answers it at once (a
// status asked on a session waits for the connect's entry). It shows what
// the unframed status shows to anyone who reaches the port. On a single
// server it is the line "error not a cluster node!".
func (s *Server) clusterProbe() []byte {
	if s.cl == nil {
		return []byte("error " + protocol.CodeNotCluster.Text() + "\n")
	}
	st := s.cl.status.Load() // at most 100 ms old (watchPeers)
	if st == nil {
		st = s.clusterStatus()
	}
	b, err := json.Marshal(st)
	if err != nil {
		return []byte("error " + err.Error() + "\n")
	}
	return append(b, '\n')
}
