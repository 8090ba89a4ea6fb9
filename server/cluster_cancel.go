package server

import (
	"github.com/mlock-dev/mlock/internal/cluster"
	"github.com/mlock-dev/mlock/internal/core"
	"github.com/mlock-dev/mlock/internal/protocol"
)

// Given-up requests (docs/cluster.md, "Bounded waits"). A node that closes a
// connection because its proposals were not applied in time (no leader, or
// no quorum) has told the client nothing more of them, or that its locks
// timed out; the client asks again elsewhere what it still wants. Those
// proposals may still be committed later (an entry stamped before its
// deadline by a leader that lost its quorum and led again; one the leader
// committed before the node learned it). The node remembers the
// connection's first unanswered proposal (giveUpLocked); when it applies a
// later one of that connection, it collects the locks it made and proposes
// opCancel, which unlocks them on every node alike. Nobody else can know
// these lock ids: the answers that named them were never written.

// maxGivenUp bounds the connections remembered as given up; the oldest is
// forgotten first (its proposals, if applied later still, are then bounded
// only by their leases).
const maxGivenUp = 1024

// giveUpLocked remembers that c's proposals from its first unanswered one
// on were given up. It runs under the core's lock, before c is closed.
func (s *Server) giveUpLocked(c *conn) {
	cl := s.cl
	if cl.givenUp == nil {
		cl.givenUp = make(map[string]uint64)
	}
	if _, ok := cl.givenUp[c.key]; !ok {
		if len(cl.givenOrder) >= maxGivenUp {
			delete(cl.givenUp, cl.givenOrder[0])
			cl.givenOrder = cl.givenOrder[1:]
		}
		cl.givenOrder = append(cl.givenOrder, c.key)
	}
	cl.givenUp[c.key] = c.answered + 1
}

// givenUpLocked reports whether the command m (requests of a connection)
// is one this node gave up: its locks are to be cancelled.
func (s *Server) givenUpLocked(m *logCmd) bool {
	cl := s.cl
	if m.node != cl.id || len(cl.givenUp) == 0 {
		return false
	}
	from, ok := cl.givenUp[m.conn]
	return ok && m.seq >= from
}

// maxCancelQueue bounds the cancels waiting to be proposed; past it one is
// dropped (logged): its locks end with their leases.
const maxCancelQueue = 256

// cancelJob is one cancel to propose: the locks (ids) that the given-up
// command seq of connection key made for session.
type cancelJob struct {
	key     string
	seq     uint64
	session string
	ids     []protocol.ID
}

// queueCancelLocked hands j to cancelLoop without waiting (it runs in the
// apply, under the core's lock).
func (s *Server) queueCancelLocked(j cancelJob) {
	select {
	case s.cl.cancels <- j:
	default:
		s.log.Warn("cluster: too many cancels of given-up requests waiting: one dropped (its locks end with their leases)",
			"locks", len(j.ids))
	}
}

// cancelLoop proposes the queued cancels, one after the other, until the
// server shuts down.
func (s *Server) cancelLoop() {
	cl := s.cl
	defer cl.bg.Done()
	for {
		select {
		case j := <-cl.cancels:
			s.proposeCancel(j.key, j.seq, j.session, j.ids)
		case <-cl.ctx.Done():
			return
		}
	}
}

// proposeCancel proposes an opCancel of ids, the locks that the given-up
// command seq of connection key made for session, until it is applied or
// the server shuts down (it waits for a leader). Its key makes a retry
// apply once.
func (s *Server) proposeCancel(key string, seq uint64, session string, ids []protocol.ID) {
	cl := s.cl
	if cl.writeFormat() < logFormat3 {
		s.log.Warn("cluster: locks made by given-up requests are not cancelled: a member of the cluster runs an earlier build "+
			"(they end with their leases)", "locks", len(ids))
		return
	}
	m := &logCmd{op: opCancel, session: session, ids: ids}
	cmd := cluster.DedupCommand(key+"/cancel", seq, cl.encode(m))
	if _, err := s.replicate(cl.ctx, cmd); err != nil {
		if cl.ctx.Err() == nil {
			s.log.Warn("cluster: cancelling the locks of given-up requests", "err", err, "locks", len(ids))
		}
		return
	}
	s.log.Info("cluster: the locks made by given-up requests after their connection was closed were cancelled",
		"locks", len(ids))
}

// applyCancelLocked applies an opCancel: each id that is still a lock of
// the session (granted or waiting) is unlocked, as its session's unlock
// would (its waiters may be granted); the others are gone already.
func (s *Server) applyCancelLocked(tx *core.Tx, m *logCmd) {
	freed := 0
	for _, id := range m.ids {
		if li, ok := tx.Lookup(id); !ok || li.Session != m.session {
			continue
		}
		if r := tx.Apply(&core.Command{Op: core.OpUnlock, ID: id, Session: m.session}); r.Err == nil {
			freed++
		}
	}
	if freed > 0 {
		s.counters.cancelled += uint64(freed)
		s.noteUnlocked(tx.Now())
	}
}
