package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/mlock-dev/mlock/internal/testenv"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	testenv.WaitBound(8) // the tests wait for elections and timeouts
	// The waiter of a raft future raft never answers (see futureError, awaitCompleter) ends only with
	// the process.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/mlock-dev/mlock/internal/cluster.(*leadership).futureError.func1"), goleak.IgnoreAnyFunction("github.com/mlock-dev/mlock/internal/cluster.(*leadership).complete"))
}

// toySM is a deterministic state machine: an append-only log of "now cmd" lines. A command's result
// is the log length after it. Commands "deadline:T" add a deadline at T (Unix ns); a tick (no
// commands) at now removes the deadlines <= now and logs them.
type toySM struct {
	Entries   int      // Apply calls
	Ticks     int      // Apply calls without commands
	Log       []string // "now cmd"
	LastNow   int64
	Deadlines []int64 // sorted
	Restores  int     `json:"-"`
	Backwards bool    `json:"-"` // an Apply's now went backwards
}

func (s *toySM) Apply(now int64, cmds [][]byte) [][]byte {
	if now < s.LastNow {
		s.Backwards = true
	}
	s.LastNow = now
	s.Entries++
	if cmds == nil {
		s.Ticks++
	}
	for len(s.Deadlines) > 0 && s.Deadlines[0] <= now {
		s.Log = append(s.Log, fmt.Sprintf("%d deadline %d", now, s.Deadlines[0]))
		s.Deadlines = s.Deadlines[1:]
	}
	res := make([][]byte, len(cmds))
	for i, c := range cmds {
		if d, ok := bytes.CutPrefix(c, []byte("deadline:")); ok {
			t, _ := strconv.ParseInt(string(d), 10, 64)
			j := 0
			for j < len(s.Deadlines) && s.Deadlines[j] <= t {
				j++
			}
			s.Deadlines = append(s.Deadlines[:j], append([]int64{t}, s.Deadlines[j:]...)...)
		}
		s.Log = append(s.Log, fmt.Sprintf("%d %s", now, c))
		res[i] = []byte(strconv.Itoa(len(s.Log)))
	}
	return res
}

func (s *toySM) Snapshot() ([]byte, error) { return json.Marshal(s) }

func (s *toySM) Restore(b []byte) error {
	var n toySM
	if err := json.Unmarshal(b, &n); err != nil {
		return err
	}
	n.Restores = s.Restores + 1
	*s = n
	return nil
}

// lockedSM lets the test read a state machine while the node applies to it. It also counts the
// failover commands (OnLeader) it applied.
type lockedSM struct {
	mu  sync.Mutex
	toy *toySM
	sm  StateMachine // toy, or a Dedup around it
}

func newLockedSM(dedup bool) *lockedSM {
	l := &lockedSM{toy: &toySM{}}
	l.sm = l.toy
	if dedup {
		l.sm = NewDedup(l.toy, 0)
	}
	return l
}

func (l *lockedSM) Apply(now int64, cmds [][]byte) [][]byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sm.Apply(now, cmds)
}

func (l *lockedSM) Snapshot() ([]byte, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sm.Snapshot()
}

func (l *lockedSM) Restore(b []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sm.Restore(b)
}

func (l *lockedSM) read(fn func(s *toySM)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fn(l.toy)
}

func (l *lockedSM) nextDeadline() (int64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.toy.Deadlines) == 0 {
		return 0, false
	}
	return l.toy.Deadlines[0], true
}

// testCluster is a cluster of in-memory nodes connected pairwise.
type testCluster struct {
	t        *testing.T
	nodes    []*Node
	trans    []*raft.InmemTransport
	sms      []*lockedSM
	onLeader []atomic.Int32 // OnLeader calls per node
}

// fastConfig sets raft's timeouts for tests: a second, not so short that
// a leader loses its lease whenever the race detector and a second test
// run on 2 cores starve it of the CPU (with 200 ms, beside one, elections
// and lost leaderships failed a third of the package's tests).
func fastConfig(c *Config) {
	c.HeartbeatTimeout = time.Second
	c.ElectionTimeout = time.Second
	c.LeaderLeaseTimeout = 500 * time.Millisecond
	c.CommitTimeout = 5 * time.Millisecond
}

func newInmemCluster(t *testing.T, n int, dedup bool, mod func(i int, c *Config)) *testCluster {
	t.Helper()
	tc := &testCluster{t: t, onLeader: make([]atomic.Int32, n)}
	var peers []Peer
	for i := range n {
		addr, tr := raft.NewInmemTransport(raft.ServerAddress(fmt.Sprintf("node%d", i)))
		tc.trans = append(tc.trans, tr)
		peers = append(peers, Peer{ID: fmt.Sprintf("n%d", i), Addr: string(addr)})
	}
	for i := range n {
		for j := range n {
			if i != j {
				tc.trans[i].Connect(tc.trans[j].LocalAddr(), tc.trans[j])
			}
		}
	}
	for i := range n {
		sm := newLockedSM(dedup)
		tc.sms = append(tc.sms, sm)
		cfg := Config{
			ID:           peers[i].ID,
			ClientAddr:   fmt.Sprintf("client%d", i),
			Transport:    tc.trans[i],
			Bootstrap:    true,
			Peers:        peers,
			SM:           sm,
			NextDeadline: sm.nextDeadline,
			OnLeader: func(now int64) []byte {
				tc.onLeader[i].Add(1)
				return DedupCommand("", 0, fmt.Appendf(nil, "failover %s", peers[i].ID))
			},
		}
		if !dedup {
			cfg.OnLeader = func(now int64) []byte {
				tc.onLeader[i].Add(1)
				return fmt.Appendf(nil, "failover %s", peers[i].ID)
			}
		}
		fastConfig(&cfg)
		if mod != nil {
			mod(i, &cfg)
		}
		nd, err := Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		tc.nodes = append(tc.nodes, nd)
	}
	t.Cleanup(tc.close)
	return tc
}

func (tc *testCluster) close() {
	for _, n := range tc.nodes {
		if n != nil {
			n.Close()
		}
	}
}

// leader waits (bounded) for a ready leader among the nodes not in skip, and returns its index.
func (tc *testCluster) leader(skip ...int) int {
	tc.t.Helper()
	deadline := time.Now().Add(30 * time.Second) // seconds: a busy machine
	for time.Now().Before(deadline) {
		for i, n := range tc.nodes {
			if n != nil && !contains(skip, i) && n.IsLeader() {
				return i
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	tc.t.Fatal("no leader within 30s")
	return -1
}

// propose proposes "p0" to "p<n-1>" on node i, one after another, and fails the test at the first
// error.
func (tc *testCluster) propose(ctx context.Context, i, n int) {
	tc.t.Helper()
	for k := range n {
		if _, err := tc.nodes[i].Propose(ctx, fmt.Appendf(nil, "p%d", k)); err != nil {
			tc.t.Fatal(err)
		}
	}
}

func contains(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// isolate cuts node i off from every other node (both directions).
func (tc *testCluster) isolate(i int) {
	tc.trans[i].DisconnectAll()
	for j, tr := range tc.trans {
		if j != i {
			tr.Disconnect(tc.trans[i].LocalAddr())
		}
	}
}

// heal reconnects node i to every other node.
func (tc *testCluster) heal(i int) {
	for j, tr := range tc.trans {
		if j != i {
			tr.Connect(tc.trans[i].LocalAddr(), tc.trans[i])
			tc.trans[i].Connect(tr.LocalAddr(), tr)
		}
	}
}

// converge waits (bounded) until the given nodes applied the same index and hold identical snapshots,
// and returns that snapshot.
func (tc *testCluster) converge(idx ...int) []byte {
	tc.t.Helper()
	if len(idx) == 0 {
		for i := range tc.nodes {
			idx = append(idx, i)
		}
	}
	deadline := time.Now().Add(30 * time.Second) // seconds: a busy machine
	var last [][]byte
	for time.Now().Before(deadline) {
		last = last[:0]
		same := true
		for _, i := range idx {
			b, err := tc.sms[i].Snapshot()
			if err != nil {
				tc.t.Fatal(err)
			}
			if len(last) > 0 && !bytes.Equal(b, last[0]) {
				same = false
			}
			last = append(last, b)
		}
		if same {
			return last[0]
		}
		time.Sleep(10 * time.Millisecond)
	}
	for k, b := range last {
		tc.t.Logf("node %d: %.300s", idx[k], b)
	}
	tc.t.Fatal("state machines did not converge within 30s")
	return nil
}

// outcome counts what Propose returned.
type outcome struct {
	ok, notLeader, unknown, other atomic.Int64
}

// proposeRetry proposes cmd on whichever node is the ready leader until it succeeds (bounded by ctx),
// retrying the same bytes after ErrNotLeader and ErrUnknownOutcome.
func proposeRetry(t *testing.T, nodes []*Node, ctx context.Context, cmd []byte, o *outcome) ([]byte, error) {
	for {
		for _, n := range nodes {
			if n == nil || !n.IsLeader() {
				continue
			}
			pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			res, err := n.Propose(pctx, cmd)
			cancel()
			switch {
			case err == nil:
				o.ok.Add(1)
				return res, nil
			case ctx.Err() != nil:
				return nil, ctx.Err()
			case errors.Is(err, ErrUnknownOutcome):
				o.unknown.Add(1)
			case errors.Is(err, ErrNotLeader):
				o.notLeader.Add(1)
			default:
				o.other.Add(1)
				t.Errorf("Propose: %v", err)
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}
