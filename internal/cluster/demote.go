package cluster

import (
	"context"
	"fmt"

	"github.com/hashicorp/raft"
)

// Demote makes voter id a nonvoter: it keeps receiving the log but never
// stands for election, and the voters refuse its vote requests. Leader only
// (else *NotLeaderError); demoting a nonvoter or a non-member does nothing.
// Join makes it a voter again. It waits like Join.
func (n *Node) Demote(ctx context.Context, id string) error {
	if !n.IsLeader() {
		return n.notLeader()
	}
	return n.waitFuture(ctx, n.raft.DemoteVoter(raft.ServerID(id), 0, enqueueTimeout(ctx)))
}

// PeerRefusesVersion returns why the peer at raft address addr refuses this node's raft connections
// ("": it does not, or this node has not dialed it since): it closed the handshake this node starts
// at cluster version 2 or more (see Config.ClusterVersion) without answering, as a node of a build
// that cannot read the cluster's log (the previous release) does. A peer that speaks TLS on its raft
// port when this node does not is told apart only by its log. Always "" with Config.Transport.
func (n *Node) PeerRefusesVersion(addr string) string {
	if n.stream == nil {
		return ""
	}
	v := n.stream.refusedAt(addr)
	if v == 0 {
		return ""
	}
	return fmt.Sprintf("it closes the raft handshake of cluster version %d unanswered: a build that cannot read the cluster's log", v)
}
