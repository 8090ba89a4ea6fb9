package server

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/mlock-dev/mlock/internal/cluster"
	"github.com/mlock-dev/mlock/internal/protocol"
)

// clusterChange is one membership change asked with "cluster <req> join
// <id> <raftAddr>" or "cluster <req> remove <id>" (administrators only).
type clusterChange struct {
	join     bool
	id, addr string // the member; addr: its raft address (join)
	req      string // the request id to answer
	by       string // who asked (for the log)
	// rollback, if set, is "cluster <req> rollback ..." instead
	// (cluster_rollback.go).
	rollback *rollbackReq
}

// parseClusterChange reads the arguments of a cluster command.
func parseClusterChange(f [][]byte) (*clusterChange, bool) {
	const actionAt, idAt, addrAt = 2, 3, 4 // after the verb and the request id
	if len(f) <= idAt || len(f[idAt]) == 0 {
		return nil, false
	}
	if protocol.Lower(f[actionAt], "rollback") {
		r, ok := parseRollback(f[idAt:])
		if !ok {
			return nil, false
		}
		return &clusterChange{rollback: &r}, true
	}
	switch {
	case protocol.Lower(f[actionAt], "join"):
		if len(f) <= addrAt || len(f[addrAt]) == 0 {
			return nil, false
		}
		return &clusterChange{join: true, id: string(f[idAt]), addr: string(f[addrAt])}, true
	case protocol.Lower(f[actionAt], "remove"):
		return &clusterChange{id: string(f[idAt])}, true
	}
	return nil, false
}

// errNoMember: a remove of an id that is not a member.
var errNoMember = errors.New("no member")

// changeTimeout bounds a membership change, redirects to a new leader included.
const changeTimeout = 15 * time.Second

// changeMembers runs ch on the leader (this node, or the one it forwards
// to) and returns the answer frame. It blocks until the change is committed,
// refused, or changeTimeout passes; it runs on the connection's pipeline, so
// the connection's later requests are answered after it.
func (s *Server) changeMembers(ctx context.Context, ch *clusterChange) []byte {
	ctx, cancel := context.WithTimeout(ctx, changeTimeout)
	defer cancel()
	req := []byte(ch.req)
	err := s.changeAnywhere(ctx, ch)
	if err == nil {
		return protocol.AppendOK(nil, req, []byte("done"))
	}
	if ch.rollback != nil {
		s.log.Warn("cluster: rollback refused", "request", ch.rollback.String(), "by", ch.by, "err", err)
		return protocol.AppendFailed(nil, req, protocol.CodeClusterChange, oneLine(err.Error()))
	}
	s.log.Warn("cluster: membership change failed", "join", ch.join, "id", ch.id, "by", ch.by, "err", err)
	return protocol.AppendFailed(nil, req, protocol.CodeClusterChange, oneLine(err.Error()))
}

// changeAnywhere runs ch here if this node leads, else on the leader,
// following redirects and waiting out elections until ctx ends.
func (s *Server) changeAnywhere(ctx context.Context, ch *clusterChange) error {
	cl := s.cl
	kind, body := fwdRemove, []byte(ch.id)
	if ch.join {
		kind, body = fwdJoin, []byte(ch.id+" "+ch.addr)
	}
	if ch.rollback != nil {
		kind, body = fwdRollback, []byte(ch.rollback.String())
	}
	maybeDone := false // an earlier attempt's outcome is unknown: it may have been applied
	for {
		info, changed := cl.node.Leader()
		var err error
		switch {
		case info.ID == cl.id && ch.rollback != nil:
			err = s.rollbackHere(ctx, *ch.rollback)
		case info.ID == cl.id:
			err = s.changeHere(ctx, ch)
			if errors.Is(err, errNoMember) && maybeDone {
				return nil // removed by the earlier attempt
			}
		case info.ClientAddr != "":
			var st byte
			var res []byte
			st, res, err = cl.fwd.call(ctx, info.ClientAddr, kind, body, changed)
			switch {
			case err != nil:
			case st == fwdOK:
				return nil
			case st == fwdNotLeader:
				err = cluster.ErrNotLeader
			case st == fwdUnknown:
				err = cluster.ErrUnknownOutcome
			case maybeDone && !ch.join && string(res) == errNoMember.Error()+" "+strconv.Quote(ch.id):
				return nil // removed by the earlier attempt
			default:
				return errors.New(string(res))
			}
		default:
			err = cluster.ErrNotLeader
		}
		if err == nil {
			return nil
		}
		if !errors.Is(err, cluster.ErrNotLeader) && !errors.Is(err, cluster.ErrUnknownOutcome) {
			return err
		}
		if errors.Is(err, cluster.ErrUnknownOutcome) {
			maybeDone = true
		}
		select {
		case <-changed:
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			if maybeDone {
				return fmt.Errorf("the change may or may not have been made (its outcome was not known in time; see mlock cluster status): %w", context.Cause(ctx))
			}
			return fmt.Errorf("no leader took the change in time: %w", context.Cause(ctx))
		case <-cl.ctx.Done():
			return errClosing
		}
	}
}

// changeHere runs ch on this node, which must lead (else ErrNotLeader).
func (s *Server) changeHere(ctx context.Context, ch *clusterChange) error {
	cl := s.cl
	if ch.join {
		if ch.id == "" || ch.addr == "" {
			return errors.New("join needs an id and a raft address")
		}
		if !cl.node.IsLeader() {
			return cl.node.Join(ctx, ch.id, ch.addr) // its *cluster.NotLeaderError
		}
		for _, p := range cl.node.Status().Peers {
			// Raft would move a member to the address given, or give one
			// address two ids: a mistyped join would cut a member off.
			switch {
			case p.ID == ch.id && p.Addr != ch.addr:
				return fmt.Errorf("%q is a member at %s: remove it first to move it", ch.id, p.Addr)
			case p.ID != ch.id && p.Addr == ch.addr:
				return fmt.Errorf("%s is the address of member %q", ch.addr, p.ID)
			}
		}
		if err := cl.node.Join(ctx, ch.id, ch.addr); err != nil {
			return err
		}
		s.refreshStatus() // the status command shows the change at once
		s.log.Info("cluster: node joined", "id", ch.id, "raft", ch.addr, "by", ch.by)
		return nil
	}
	known := false
	for _, p := range cl.node.Status().Peers {
		known = known || p.ID == ch.id
	}
	if !known {
		return fmt.Errorf("%w %q", errNoMember, ch.id)
	}
	if err := cl.node.Remove(ctx, ch.id); err != nil {
		return err
	}
	s.refreshStatus() // the status command shows the change at once
	s.log.Info("cluster: node removed", "id", ch.id, "by", ch.by)
	return nil
}

// oneLine keeps the first line of an error text, for a frame.
func oneLine(s string) string {
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' || s[i] == '\r' {
			return s[:i]
		}
	}
	return s
}
