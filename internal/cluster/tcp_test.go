package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/internal/proctest"
)

// tcpCluster is a cluster over loopback TCP with on-disk state.
type tcpCluster struct {
	t     *testing.T
	dirs  []string
	addrs []string
	nodes []*Node
	sms   []*lockedSM
	mod   func(i int, c *Config) // nil, or changes node i's configuration
}

// freeAddrs returns n distinct loopback addresses that were free a moment
// ago: every listener stays open until all n are chosen, or the kernel may
// hand out a port just closed again.
// freeAddrs returns n free loopback addresses, outside the ports the kernel
// gives outgoing connections (proctest.FreeAddr): a node restarts on its
// address of before.
func freeAddrs(t *testing.T, n int) []string {
	var out []string
	for range n {
		out = append(out, proctest.FreeAddr(t))
	}
	return out
}

func newTCPCluster(t *testing.T, n int) *tcpCluster {
	return newTCPClusterWith(t, n, nil)
}

// newTCPClusterWith is newTCPCluster, with mod changing each node's configuration.
func newTCPClusterWith(t *testing.T, n int, mod func(i int, c *Config)) *tcpCluster {
	tc := &tcpCluster{t: t, addrs: freeAddrs(t, n), mod: mod}
	base := t.TempDir()
	for i := range n {
		tc.dirs = append(tc.dirs, filepath.Join(base, fmt.Sprintf("n%d", i)))
	}
	tc.open()
	t.Cleanup(tc.close)
	return tc
}

func (tc *tcpCluster) open() {
	tc.t.Helper()
	var peers []Peer
	for i, a := range tc.addrs {
		peers = append(peers, Peer{ID: fmt.Sprintf("n%d", i), Addr: a})
	}
	tc.nodes, tc.sms = nil, nil
	for i := range tc.addrs {
		sm := newLockedSM(true)
		cfg := Config{ID: peers[i].ID, RaftAddr: tc.addrs[i], Dir: tc.dirs[i], Bootstrap: true, Peers: peers, SM: sm,
			Secret: []byte("tcp-cluster-test-secret")} // every raft connection authenticated
		if tc.mod != nil {
			tc.mod(i, &cfg)
		}
		if os.Getenv("CLUSTER_TEST_LOG") != "" {
			cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil)).With("node", cfg.ID)
		}
		var n *Node
		var err error
		// The port may linger briefly after the previous run closed it.
		for try := 0; ; try++ {
			if n, err = Open(cfg); err == nil || try == 50 {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			tc.t.Fatal(err)
		}
		tc.nodes = append(tc.nodes, n)
		tc.sms = append(tc.sms, sm)
	}
}

func (tc *tcpCluster) close() {
	for _, n := range tc.nodes {
		n.Close()
	}
}

func (tc *tcpCluster) leader() *Node {
	tc.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		for _, n := range tc.nodes {
			if n.IsLeader() {
				return n
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	tc.t.Fatal("no leader within 15s")
	return nil
}

func (tc *tcpCluster) snapshots() []string {
	var out []string
	for _, sm := range tc.sms {
		b, err := sm.Snapshot()
		if err != nil {
			tc.t.Fatal(err)
		}
		out = append(out, string(b))
	}
	return out
}

// converge waits until all nodes hold identical state containing want.
func (tc *tcpCluster) converge(want string) string {
	tc.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		s := tc.snapshots()
		if s[0] == s[1] && s[1] == s[2] && strings.Contains(s[0], want) {
			return s[0]
		}
		if time.Now().After(deadline) {
			tc.t.Fatalf("no convergence on %q:\n%.200s\n%.200s\n%.200s", want, s[0], s[1], s[2])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestTCPRestart: a 3-node cluster over loopback TCP with on-disk state; all three stop and reopen and
// the state (log, dedup window) is back, with a snapshot in the middle of it.
func TestTCPRestart(t *testing.T) {
	t.Parallel()
	tc := newTCPCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var o outcome
	tc.leader()
	for k := range 30 {
		if _, err := proposeRetry(t, tc.nodes, ctx, DedupCommand("c", uint64(k), fmt.Appendf(nil, "r%d", k)), &o); err != nil {
			t.Fatal(err)
		}
		if k == 15 {
			if err := tc.leader().Snapshot(); err != nil {
				t.Fatal(err)
			}
		}
	}
	before := tc.converge("r29")
	tc.close()
	if _, err := os.Stat(filepath.Join(tc.dirs[0], walDirName, "wal-meta.db")); err != nil {
		t.Fatal(err)
	}

	tc.open()
	tc.leader()
	// A repeat of a remembered key is answered from the restored window, not applied again.
	res, err := proposeRetry(t, tc.nodes, ctx, DedupCommand("c", 3, []byte("r3")), &o)
	if err != nil || string(res) != "4" { // r3 is the log's 4th line
		t.Fatalf("repeat after restart = %q, %v", res, err)
	}
	if _, err := proposeRetry(t, tc.nodes, ctx, DedupCommand("c", 100, []byte("after")), &o); err != nil {
		t.Fatal(err)
	}
	after := tc.converge("after")
	var beforeLog, afterLog []string
	for _, line := range strings.Split(before, "\"") {
		if strings.Contains(line, " r") {
			beforeLog = append(beforeLog, line)
		}
	}
	for _, line := range strings.Split(after, "\"") {
		if strings.Contains(line, " r") {
			afterLog = append(afterLog, line)
		}
	}
	if strings.Join(beforeLog, "\n") != strings.Join(afterLog, "\n") || len(afterLog) != 30 {
		t.Fatalf("log before restart:\n%v\nafter:\n%v", beforeLog, afterLog)
	}
}

// TestTCPThroughput measures proposals/s on a 3-node loopback cluster with fsync (reported, not
// asserted).
func TestTCPThroughput(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("measurement")
	}
	tc := newTCPCluster(t, 3)
	tc.leader()
	for _, workers := range []int{1, 64} {
		var o outcome
		// 1.5 s of proposals, and longer until one succeeds: a busy
		// machine made none in 1.5 s (the bound, 30 s, ends a stuck run).
		const measure = 1500 * time.Millisecond
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		var done atomic.Int64
		var entries0 int
		tc.sms[0].read(func(s *toySM) { entries0 = s.Entries }) // the leader may change: count on one node
		start := time.Now()
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for k := 0; ctx.Err() == nil && (time.Since(start) < measure || done.Load() == 0); k++ {
					if _, err := proposeRetry(t, tc.nodes, ctx, DedupCommand(fmt.Sprint(w), uint64(k), []byte("x")), &o); err != nil {
						return
					}
					done.Add(1)
				}
			})
		}
		wg.Wait()
		el := time.Since(start)
		cancel()
		var entries int
		tc.sms[0].read(func(s *toySM) { entries = s.Entries - entries0 })
		t.Logf("%2d proposers: %d proposals in %v = %.0f/s (%d entries; retries: not leader %d, unknown %d)",
			workers, done.Load(), el.Round(time.Millisecond), float64(done.Load())/el.Seconds(), entries,
			o.notLeader.Load(), o.unknown.Load())
		if done.Load() == 0 {
			t.Fatal("no proposal succeeded")
		}
	}
}
