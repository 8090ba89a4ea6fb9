package server

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/internal/cluster"
	"github.com/mlock-dev/mlock/internal/proctest"
)

// waitVersion waits until every running node has applied cluster version v
// (pinned or not, as pinned says).
func (tc *testCluster) waitVersion(v int, pinned bool) {
	tc.t.Helper()
	proctest.WaitFor(tc.t, 30*time.Second, "cluster version "+strconv.Itoa(v)+" on every node", func() bool {
		for _, s := range tc.nodes {
			if s != nil && (s.cl.versionNow.Load() != int64(v) || s.cl.pinned.Load() != pinned) {
				return false
			}
		}
		return true
	})
}

// The supported rollback, in process: a cluster at version 4 is lowered to
// 1 by mlock cluster rollback's request through a follower. Refused, with
// the reason, while a member is down (it could not apply the lowering) and
// for a version other than 1; a dry run changes nothing. The lowering is
// written in format 4 (a build before the rollback stops at it). Once
// lowered every node applies version 1 at the same entry, keeps "1 rollback" in its
// version file, lowers its raft handshake, writes format 1 only, takes a
// snapshot of format 2 (the previous release's) past the lowering and says
// it is ready; the leader does not raise the version again on its own, also
// across a restart; the locks held across it stay held. A cancel raises it
// again and lifts the pin.
func TestClusterRollback(t *testing.T) {
	t.Parallel()
	// Every command applied after the test said so, by node and format.
	var watching atomic.Bool
	var mu sync.Mutex
	high := map[string]int{} // node -> commands of format 2 or more applied while watching
	low := map[string]int{}
	lowering := map[int]int{} // format -> the lowerings (opVersion 1) applied, on any node
	tc := newTestClusterWith(t, 3, true, func(tc *testCluster) {
		tc.hooks.apply = func(node string, _ int64, cmds [][]byte) {
			mu.Lock()
			defer mu.Unlock()
			for _, c := range cmds {
				_, _, body, err := cluster.ParseDedupCommand(c)
				var m logCmd
				if err == nil && decodeLogCmd(body, &m) == nil && m.op == opVersion && m.version == logFormat1 {
					lowering[m.format]++
				}
				if err != nil || !watching.Load() {
					continue
				}
				if f, _, err := logFormatOf(body); err == nil && f >= logFormat2 {
					high[node]++
				} else if err == nil {
					low[node]++
				}
			}
		}
	})
	tc.waitVersion(logFormat, false)
	l := tc.leader()
	via, other := (l+1)%3, (l+2)%3
	c, err := mlock.New("mlock://" + tc.addrs[via])
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	held, err := c.Lock(ctx, "held", &mlock.LockOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}

	// Refused: another version; a member down (after the dry run said it
	// could be done).
	var me *mlock.Error
	if err := c.ClusterRollback(ctx, 2, true); !errors.As(err, &me) || me.Type != mlock.TypeRequest ||
		!strings.Contains(err.Error(), "only version 1") {
		t.Fatalf("rollback to 2: %v, want refused (only version 1)", err)
	}
	if err := c.ClusterRollback(ctx, 1, true); err != nil {
		t.Fatalf("dry run on a healthy cluster: %v", err)
	}
	tc.stop(other)
	id := "n" + strconv.Itoa(other)
	var refusal error
	// (The leader counts it down once its heartbeats fail.)
	proctest.WaitFor(t, 30*time.Second, "the dry run refused while "+id+" is down", func() bool {
		refusal = c.ClusterRollback(ctx, 1, true)
		return refusal != nil && strings.Contains(refusal.Error(), "member "+id+" is not reached")
	})
	if refusal = c.ClusterRollback(ctx, 1, false); refusal == nil || !strings.Contains(refusal.Error(), "member "+id+" is not reached") {
		t.Fatalf("rollback with %s down: %v, want refused", id, refusal)
	}
	if !errors.As(refusal, &me) || me.Type != mlock.TypeRequest || !strings.Contains(refusal.Error(), "every member must apply the lowering") {
		t.Fatalf("refusal: %v", refusal)
	}
	for _, s := range tc.nodes {
		if s != nil && (s.cl.versionNow.Load() != logFormat || s.cl.pinned.Load()) {
			t.Fatal("a dry run or a refused rollback changed the version")
		}
	}
	tc.start(other)
	proctest.WaitFor(t, 30*time.Second, "the dry run possible again", func() bool {
		return c.ClusterRollback(ctx, 1, true) == nil
	})

	// The rollback.
	if err := c.ClusterRollback(ctx, 1, false); err != nil {
		t.Fatalf("rollback: %v", err)
	}
	tc.waitVersion(logFormat1, true)
	mu.Lock()
	// In format 4 or later: a build before the rollback (format 3 at most)
	// stops at it rather than apply it as it would (keep writing format 3).
	if len(lowering) != 1 || lowering[logFormat] == 0 {
		t.Errorf("the lowerings applied, by format: %v; want all in format %d", lowering, logFormat)
	}
	mu.Unlock()
	proctest.WaitFor(t, 30*time.Second, "every node ready for the previous release", func() bool {
		for _, s := range tc.nodes {
			if !s.ClusterStatus().RollbackReady {
				return false
			}
		}
		return true
	})
	watching.Store(true)
	pinFile := ""
	for i, s := range tc.nodes {
		if v := s.cl.raftVersion(); v != logFormat1 {
			t.Fatalf("n%d's raft handshake after the rollback: version %d, want 1", i, v)
		}
		// "1 rollback <index of the lowering>": the same on every node.
		b, err := os.ReadFile(filepath.Join(tc.dirs[i], versionFile))
		if vs, ok := parseVersionState(string(b)); err != nil || !ok || vs.version != logFormat1 || !vs.pinned || vs.at == 0 ||
			string(b) != vs.String()+"\n" || pinFile != "" && string(b) != pinFile {
			t.Fatalf("n%d's version file: %q, %v (n0's %q)", i, b, err, pinFile)
		}
		pinFile = string(b)
		if snap := latestSnapshot(t, tc.dirs[i]); !bytes.Contains(snap, []byte("MLSS\x02")) || bytes.Contains(snap, []byte("MLSS\x03")) ||
			bytes.Contains(snap, []byte("MLSS\x04")) {
			t.Fatalf("n%d's latest snapshot is not of format 2 (the previous release's)", i)
		}
	}
	if err := c.ClusterRollback(ctx, 1, false); err != nil {
		t.Fatalf("the same rollback asked again: %v", err)
	}
	// The lock held across the rollback is still held; new grants go on.
	c2, err := mlock.New("mlock://" + tc.addrs[l])
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if _, err := c2.TryLock(ctx, "held", &mlock.LockOptions{TTL: time.Second}); err == nil {
		t.Fatal("a lock held before the rollback was granted to another client after it")
	}
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	next, err := c2.Lock(ctx, "held", &mlock.LockOptions{TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if next.Token() <= held.Token() {
		t.Fatalf("token after the rollback %d, before %d", next.Token(), held.Token())
	}
	if err := next.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// The leader does not raise the version again, also once it restarted
	// (the pin is kept in its directory) and another node leads.
	r := tc.leader()
	tc.stop(r)
	tc.start(r)
	if !tc.nodes[r].cl.pinned.Load() || tc.nodes[r].cl.raftVersion() != logFormat1 {
		t.Fatalf("n%d restarted: pinned %v, handshake version %d", r, tc.nodes[r].cl.pinned.Load(), tc.nodes[r].cl.raftVersion())
	}
	tc.leader()
	time.Sleep(time.Second) // ten rounds of watchPeers, which raised the version within one before
	tc.waitVersion(logFormat1, true)
	mu.Lock()
	if len(high) != 0 || len(low) == 0 {
		t.Fatalf("commands applied once every node was ready: of format 2 or more %v, of format 1 %v", high, low)
	}
	mu.Unlock()
	watching.Store(false)

	// The cancel raises it again, and lifts the pin (once every member
	// told the new leader its formats).
	var cerr error
	proctest.WaitFor(t, 30*time.Second, "the cancel accepted", func() bool {
		cerr = c.ClusterRollbackCancel(ctx)
		if cerr != nil && !strings.Contains(cerr.Error(), "has not said which log formats it reads lately") &&
			!strings.Contains(cerr.Error(), "on a forwarding connection that has closed since") {
			t.Fatalf("cancel: %v", cerr)
		}
		return cerr == nil
	})
	tc.waitVersion(logFormat, false)
	for i := range tc.nodes {
		if b, err := os.ReadFile(filepath.Join(tc.dirs[i], versionFile)); err != nil || string(b) != strconv.Itoa(logFormat)+"\n" {
			t.Fatalf("n%d's version file after the cancel: %q, %v", i, b, err)
		}
	}
	if err := c.ClusterRollbackCancel(ctx); err != nil {
		t.Fatalf("the cancel asked again: %v", err)
	}
}

// latestSnapshot returns the state of the latest snapshot in a node's raft
// directory.
func latestSnapshot(t *testing.T, dir string) []byte {
	t.Helper()
	names := snapshotNames(t, dir)
	if len(names) == 0 {
		t.Fatalf("no snapshot in %s", dir)
	}
	b, err := os.ReadFile(filepath.Join(dir, "snapshots", names[len(names)-1], "state.bin"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The rollback's request and its forwarded body parse back alike; bad
// arguments are refused.
func TestParseRollback(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want rollbackReq
		ok   bool
	}{
		{"1", rollbackReq{to: 1}, true},
		{"1 check", rollbackReq{to: 1, dry: true}, true},
		{"cancel", rollbackReq{cancel: true}, true},
		{"", rollbackReq{}, false},
		{"01", rollbackReq{}, false},
		{"-1", rollbackReq{}, false},
		{"1 now", rollbackReq{}, false},
		{"1 check x", rollbackReq{}, false},
		{"cancel 1", rollbackReq{}, false},
	} {
		got, ok := parseRollback(bytes.Fields([]byte(tc.in)))
		if ok != tc.ok || got != tc.want {
			t.Fatalf("parseRollback(%q) = %+v, %v; want %+v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
		if ok {
			if again, ok := parseRollback(bytes.Fields([]byte(got.String()))); !ok || again != got {
				t.Fatalf("%q: String %q parses as %+v, %v", tc.in, got.String(), again, ok)
			}
		}
	}
}

// The settings the previous release would not put in force alike are
// named; the defaults pass.
func TestPrevReleaseSettings(t *testing.T) {
	c := Config{}.withDefaults()
	st := settingsOf(&c)
	if err := prevReleaseSettings(st); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	bad := st
	bad.SessionGrace = 0
	if err := prevReleaseSettings(bad); err == nil || !strings.Contains(err.Error(), "session-grace") {
		t.Fatalf("session grace 0: %v", err)
	}
	bad = st
	bad.MaxSessions = -1
	if err := prevReleaseSettings(bad); err == nil || !strings.Contains(err.Error(), "max-sessions") {
		t.Fatalf("max-sessions -1: %v", err)
	}
}

// A node that joins through a member learns the cluster version its raft
// handshake must say (and a rollback's pin) before it asks to be added: at
// its first apply (it was added, and a leader reached it), its version file
// says the cluster's version already, so it refused the previous release's
// handshake from its first connection on (docs/cluster.md, "Stale
// members"). Before, it said MLRAFT1 until it had applied the version.
func TestClusterJoinerLearnsTheVersionFirst(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "n3")
	var first atomic.Pointer[string] // the joiner's version file at its first apply
	tc := newTestClusterWith(t, 3, true, func(tc *testCluster) {
		tc.hooks.apply = func(node string, _ int64, _ [][]byte) {
			if node != "n3" || first.Load() != nil {
				return
			}
			b, err := os.ReadFile(filepath.Join(dir, versionFile))
			s := string(b)
			if err != nil {
				s = err.Error()
			}
			first.CompareAndSwap(nil, &s)
		}
	})
	tc.waitVersion(logFormat, false)
	join := func(id, raftAddr, dir string) *Server {
		t.Helper()
		_, tr := raft.NewInmemTransport(raft.ServerAddress(raftAddr))
		for j := range tc.n {
			tr.Connect(tc.trans[j].LocalAddr(), tc.trans[j])
			tc.trans[j].Connect(tr.LocalAddr(), tr)
		}
		addr := proctest.FreeAddr(t)
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		srv, err := New(Config{Addr: addr, SessionGrace: 3 * time.Second, Logger: slog.New(slog.DiscardHandler),
			Cluster: &ClusterConfig{ID: id, ClientAddr: addr, Dir: dir, Transport: tr, Join: tc.addrs[0], Secret: testSecret,
				HeartbeatTimeout: tc.raftTimeout(), ElectionTimeout: tc.raftTimeout(), LeaderLeaseTimeout: tc.raftTimeout() / 2,
				testHooks: tc.hooks}})
		if err != nil {
			ln.Close()
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- srv.Serve(ln) }()
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			srv.Shutdown(ctx)
			<-done
		})
		return srv
	}
	srv := join("n3", "raft3", dir)
	proctest.WaitFor(t, 30*time.Second, "the joiner's first apply", func() bool { return first.Load() != nil })
	if got := *first.Load(); got != strconv.Itoa(logFormat)+"\n" {
		t.Fatalf("the joiner's version file at its first apply: %q, want %q", got, strconv.Itoa(logFormat)+"\n")
	}
	proctest.WaitFor(t, 30*time.Second, "the joiner at the cluster version", func() bool {
		return srv.cl.versionNow.Load() == logFormat && srv.cl.raftVersion() == logFormat
	})
}

// A member of a build before the rollback reads log format 3 and says so,
// as this build did before log format 4; it would not apply a lowering as
// one (it keeps writing format 3, and as the leader raises the version
// again). Here n2 is such a member (its ownFormat says 3): while it is in
// the cluster the version stays 3, and a rollback is refused, naming it and
// why; once it runs this build the version rises to 4 and a rollback may
// be made.
func TestRollbackRefusedBeforeRollbackBuild(t *testing.T) {
	t.Parallel()
	var old atomic.Bool
	old.Store(true)
	ownFormat := func(id string) int {
		if id == "n2" && old.Load() {
			return logFormat3
		}
		return 0
	}
	tc := newTestClusterWith(t, 3, false, func(tc *testCluster) { tc.hooks.ownFormat = ownFormat })
	tc.waitFormats(tc.leader(), map[string]int{"n0": logFormat, "n1": logFormat, "n2": logFormat3})
	tc.waitVersion(logFormat3, false)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// ask asks the leader of now for a rollback (dry: only the check).
	ask := func(dry bool) error {
		t.Helper()
		for {
			err := tc.nodes[tc.leader()].rollbackHere(ctx, rollbackReq{to: logFormat1, dry: dry})
			if !errors.Is(err, cluster.ErrNotLeader) || ctx.Err() != nil {
				return err
			}
		}
	}
	for _, dry := range []bool{true, false} {
		err := ask(dry)
		var re *errRollback
		if !errors.As(err, &re) || !strings.Contains(err.Error(), "reads log formats up to 3: its build cannot apply a rollback's lowering") ||
			!strings.Contains(err.Error(), "n2") {
			t.Fatalf("rollback (dry %v) with n2 reading format 3: %v, want refused naming n2 and why", dry, err)
		}
		t.Logf("refused: %v", err)
		if dry && strings.Contains(err.Error(), "member n2 ") { // (else n2 leads: "the leader n2 reads ...")
			// The Rollback runbook quotes what is said of the member.
			data, rerr := os.ReadFile("../docs/cluster.md")
			if rerr != nil {
				t.Fatal(rerr)
			}
			rb := strings.Join(strings.Fields(docSection(t, string(data), "Rollback")), " ")
			part, _, _ := strings.Cut(err.Error()[strings.Index(err.Error(), "member n2 "):], "; ")
			part, _, _ = strings.Cut(part, ": every member must")
			if !strings.Contains(rb, strings.Replace(part, "member n2 ", "member c ", 1)) {
				t.Errorf("docs/cluster.md's Rollback runbook does not quote %q", part)
			}
		}
	}
	tc.waitVersion(logFormat3, false) // nothing changed

	// n2 runs this build: the version rises to 4, and a rollback may be made.
	tc.stop(2)
	old.Store(false)
	tc.start(2)
	tc.waitVersion(logFormat, false)
	proctest.WaitFor(t, 30*time.Second, "the rollback's check passed", func() bool { return ask(true) == nil })
}
