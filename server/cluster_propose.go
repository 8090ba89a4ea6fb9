package server

import (
	"context"
	"errors"
	"time"

	"github.com/mlock-dev/mlock/internal/cluster"
)

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
		if errors.Is(err, errStaleNode) {
			return nil, err // refused: asking again is refused again
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
	cmd := cluster.DedupCommand(cl.run+"past", 0, cl.encode(&logCmd{op: opDetachNode, node: cl.id, conn: cl.run}))
	if _, err := s.replicate(cl.ctx, cmd); err != nil && cl.ctx.Err() == nil {
		s.log.Warn("cluster: detaching the sessions of an earlier run", "err", err)
	}
}
