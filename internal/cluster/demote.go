package cluster

import (
	"context"

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
