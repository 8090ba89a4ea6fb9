package server

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"time"

	"github.com/mlock-dev/mlock/internal/cluster"
	"github.com/mlock-dev/mlock/internal/core"
)

// Recovery from lost quorum: the fencing-token floor. The recovered node
// knows the tokens of the entries it received; the old majority may have
// committed (and answered) entries it never received, each of which may
// have granted tokens above its last. Those entries came after the last
// entry it has (their leader's times are at least that entry's) and before
// the recovery. The next token of the recovered cluster is therefore its
// last token + 1, raised by:
//
//   - every request that was waiting in its state (each may have been
//     granted since, with a token of its own), and
//   - RecoverTokenRate tokens per microsecond from the time of its last
//     entry to the recovery, plus RecoverClockSlack (for the old leaders'
//     clocks running ahead of the recovering machine's).
//
// RecoverTokenRate (10 per µs, 10 million grants a second) is far above
// what a cluster can commit: each new request is a client frame the
// leader parses, logs, replicates and applies on one goroutine (the best
// measured is about 40 000 lock-and-unlock cycles a second, a few µs of
// CPU each), and a grant that needs no new request is one of the waiting
// ones counted above. RecoverConfig.TokenFloor raises the floor further,
// for an operator who knows more (the highest token a fenced store has
// accepted).
const (
	RecoverTokenRate  = 10
	RecoverClockSlack = time.Minute
)

// Errors of RecoverCluster (wrapped): the directory holds no raft state;
// the id is not a member of any configuration the directory holds.
var (
	ErrRecoverNoState   = cluster.ErrNoState
	ErrRecoverNotMember = cluster.ErrNotMember
)

// RecoverConfig configures RecoverCluster.
type RecoverConfig struct {
	// Dir is the stopped node's ClusterConfig.Dir (required).
	Dir string
	// ID is the node's ClusterConfig.ID (required; a member of the
	// configuration in Dir).
	ID string
	// RaftAddr is the raft address the node will run with; "": the one the
	// configuration in Dir has for ID.
	RaftAddr string
	// TokenFloor, when above the computed floor, is the first token the
	// recovered cluster gives.
	TokenFloor uint64
	// Now is the recovery's time (nil: time.Now).
	Now func() time.Time
	// DryRun replays and reports without changing anything.
	DryRun bool
	// Logger receives raft's log (nil: silent).
	Logger *slog.Logger
}

// RecoverReport says what RecoverCluster found and did.
type RecoverReport struct {
	cluster.RecoverReport
	// Genesis: the state holds the first leader's seed and first token. A
	// state without (a cluster whose first leader's entry never reached
	// this node) holds no lock; the recovered cluster's first leader
	// starts the tokens at its own time in µs, as a new cluster does.
	Genesis bool
	// Held, Waiting and Sessions count the recovered state.
	Held, Waiting, Sessions int
	// LastToken is the last token this node knew of; NextToken is the first
	// token the recovered cluster gives (0 without Genesis).
	LastToken, NextToken uint64
	// Gap is the time from the last entry to the recovery.
	Gap time.Duration
}

// RecoverCluster turns the stopped cluster node's state in cfg.Dir into a
// one-node cluster of that node (cluster.Recover), keeping every lock,
// queue, session and offline push it knew of, and raises its
// fencing-token counter to the floor above (the entries the rest of the
// old cluster committed without it are lost; their tokens never repeat).
// Started on the directory with the same --cluster-id, the node leads
// alone at once; members are added with `mlock cluster join`. See
// docs/operations.md.
func RecoverCluster(cfg RecoverConfig) (*RecoverReport, error) {
	now := time.Now
	if cfg.Now != nil {
		now = cfg.Now
	}
	s, err := newReplayServer(cfg.ID)
	if err != nil {
		return nil, err
	}
	defer func() { s.core().Close() }()
	rep := &RecoverReport{}
	adjust := func(lastNow int64) error {
		at := now()
		rep.Gap = max(at.Sub(time.Unix(0, lastNow)), 0)
		var st core.Stats
		s.batch(func(tx *core.Tx) {
			rep.Genesis = s.cl.genesis
			st = tx.Stats()
			rep.Sessions = len(s.sessions)
		})
		rep.Held, rep.Waiting, rep.LastToken = st.Held, st.Live-st.Held, st.LastToken
		if !rep.Genesis {
			return nil
		}
		next := tokenFloor(st.LastToken, rep.Waiting, rep.Gap)
		next = max(next, cfg.TokenFloor)
		if err := s.raiseTokens(next); err != nil {
			return err
		}
		rep.NextToken = next
		return nil
	}
	crep, err := cluster.Recover(cluster.RecoverConfig{Dir: cfg.Dir, ID: cfg.ID, RaftAddr: cfg.RaftAddr,
		SM: smHook{s.cl}, Adjust: adjust, DryRun: cfg.DryRun, Logger: cfg.Logger})
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	rep.RecoverReport = *crep
	return rep, nil
}

// tokenFloor is the first token of a recovered cluster whose last known
// token is last, with waiting requests, gap after its last entry (see
// RecoverTokenRate). It saturates instead of wrapping.
func tokenFloor(last uint64, waiting int, gap time.Duration) uint64 {
	us := uint64(max(gap, 0)/time.Microsecond) + uint64(RecoverClockSlack/time.Microsecond)
	margin := uint64(math.MaxUint64)
	if us <= (math.MaxUint64-uint64(waiting))/RecoverTokenRate {
		margin = us*RecoverTokenRate + uint64(waiting)
	}
	if last >= math.MaxUint64-1-margin {
		return math.MaxUint64
	}
	return last + 1 + margin
}

// newReplayServer is a server with the state machine of cluster node id
// and nothing else: no listener, no raft node, no data directory, the
// default settings (the log's and the snapshot's come into force as a
// node's do), a silent log.
func newReplayServer(id string) (*Server, error) {
	s, err := New(Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), QuietPeriod: -1})
	if err != nil {
		return nil, err
	}
	cl := &clusterState{cfg: ClusterConfig{ID: id}, id: id, run: id + "/recover/", conns: make(map[string]*conn)}
	cl.ctx, cl.cancel = context.WithCancel(context.Background())
	cl.cancel()
	s.cl = cl
	c, err := s.newCore(s.set, nil, nil, 0)
	if err != nil {
		s.core().Close()
		return nil, err
	}
	old := s.core()
	s.corep.Store(c)
	old.Close()
	cl.dedup = cluster.NewDedup(&replica{s}, 0)
	return s, nil
}

// raiseTokens makes next the replica's next fencing token (never lower
// than it was): the core is restored from its own snapshot with the
// engine's token counter set to next.
func (s *Server) raiseTokens(next uint64) error {
	old := s.core()
	snap, err := old.Snapshot()
	if err != nil {
		return err
	}
	raised, err := withTokenCounter(snap, next)
	if err != nil {
		return err
	}
	var set settings
	old.Batch(func(*core.Tx) { set = s.set })
	c, err := s.newCore(set, raised, nil, 0)
	if err != nil {
		return fmt.Errorf("server: recovery: the raised state does not restore: %w", err)
	}
	var got uint64
	c.Batch(func(tx *core.Tx) { got = tx.LastToken() })
	if got+1 < next {
		c.Close()
		return fmt.Errorf("server: recovery: the token counter is %d after raising it to %d", got+1, next)
	}
	old.Batch(func(*core.Tx) { s.corep.Store(c) })
	old.Close()
	return nil
}

// errTokenCounter: a core snapshot whose token counter is not where this
// build reads it (another format).
var errTokenCounter = errors.New("server: recovery: the core snapshot's token counter cannot be read")

// withTokenCounter returns the core snapshot snap with the lock table's
// token counter (the next token) set to next, if that raises it: "mlkc"
// version time, then the table's "mlkt" version time next ...
// (internal/core and internal/locktable, snapshot.go).
func withTokenCounter(snap []byte, next uint64) ([]byte, error) {
	p := snap
	skip := func(magic string, version uint64) bool {
		if len(p) < len(magic) || string(p[:len(magic)]) != magic {
			return false
		}
		p = p[len(magic):]
		v, n := binary.Uvarint(p)
		if n <= 0 || v > version {
			return false
		}
		p = p[n:]
		if _, n = binary.Varint(p); n <= 0 {
			return false
		}
		p = p[n:]
		return true
	}
	if !skip("mlkc", 1) || !skip("mlkt", 2) {
		return nil, errTokenCounter
	}
	cur, n := binary.Uvarint(p)
	if n <= 0 {
		return nil, errTokenCounter
	}
	if next <= cur {
		return snap, nil
	}
	at := len(snap) - len(p)
	out := make([]byte, 0, len(snap)+binary.MaxVarintLen64)
	out = append(out, snap[:at]...)
	out = binary.AppendUvarint(out, next)
	return append(out, p[n:]...), nil
}
