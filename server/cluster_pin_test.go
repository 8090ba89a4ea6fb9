package server

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/internal/cluster"
	"github.com/mlock-dev/mlock/internal/core"
	"github.com/mlock-dev/mlock/internal/proctest"
)

// snapshotNames returns the names of the snapshots in a node's raft
// directory (term-index-time), the latest last.
func snapshotNames(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, "snapshots"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		if e.IsDir() && !strings.HasSuffix(e.Name(), ".tmp") {
			names = append(names, e.Name())
		}
	}
	sort.Slice(names, func(i, j int) bool { return snapshotLater(names[j], names[i]) })
	return names
}

// snapshotLater reports whether the snapshot named a is later than the one
// named b, by term, then index, then time: numbers, not strings ("2-130-…"
// is later than "2-95-…").
func snapshotLater(a, b string) bool {
	var at, ai, am, bt, bi, bm uint64
	for _, x := range []struct {
		name       string
		t, i, msec *uint64
	}{{a, &at, &ai, &am}, {b, &bt, &bi, &bm}} {
		if n, err := fmt.Sscanf(strings.ReplaceAll(x.name, "-", " "), "%d %d %d", x.t, x.i, x.msec); n != 3 {
			panic(fmt.Sprintf("snapshot name %q is not term-index-time: %v", x.name, err))
		}
	}
	if at != bt {
		return at > bt
	}
	if ai != bi {
		return ai > bi
	}
	return am > bm
}

// isLowering reports whether the log command c is a rollback's lowering
// (opVersion 1).
func isLowering(c []byte) bool {
	_, _, body, err := cluster.ParseDedupCommand(c)
	var m logCmd
	return err == nil && decodeLogCmd(body, &m) == nil && m.op == opVersion && m.version == logFormat1
}

// A node pinned by a rollback restarts on a snapshot older than the
// lowering (it stopped before its snapshot past the lowering: here that
// snapshot is removed). It restores the cluster version of then (4) in its
// replicated state, as every node had it, but keeps the pin: from its start
// on, through the replay of the entries before the lowering and after it
// applied the lowering again, it writes and says version 1, its raft
// handshake says 1 and its version file keeps "1 rollback <index>". Before,
// the restore raised it to 4 and unpinned it, and it wrote format 4 until
// it replayed the lowering: commands that a member already running the
// previous release skips. It is not ready for the previous release until
// it has applied the lowering again and taken a snapshot past it.
func TestClusterRollbackRestartOnOlderSnapshot(t *testing.T) {
	t.Parallel()
	var x atomic.Pointer[Server] // the restarted node, once started
	var mu sync.Mutex
	var bad []string
	replayed, relowered := 0, false
	tc := newTestClusterWith(t, 3, true, func(tc *testCluster) {
		tc.hooks.apply = func(node string, _ int64, cmds [][]byte) {
			s := x.Load()
			if s == nil || node != s.cl.id {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			// What the entries before this one left.
			if v, w, r := s.cl.versionNow.Load(), s.cl.writeFormat(), s.cl.raftVersion(); v != logFormat1 || w != logFormat1 ||
				r != logFormat1 || !s.cl.pinned.Load() {
				bad = append(bad, fmt.Sprintf("version %d, writes %d, handshake %d, pinned %v (lowering applied again: %v)",
					v, w, r, s.cl.pinned.Load(), relowered))
			}
			for _, c := range cmds {
				relowered = relowered || isLowering(c)
			}
			if !relowered {
				replayed++
			}
		}
	})
	tc.waitVersion(logFormat, false)
	l := tc.leader()
	xi := (l + 1) % 3
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := mlock.New("mlock://" + tc.addrs[l])
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The snapshot older than the lowering, then commands of format 4 and
	// the rollback.
	if err := tc.nodes[xi].cl.node.Snapshot(); err != nil {
		t.Fatal(err)
	}
	older := snapshotNames(t, tc.dirs[xi])
	if _, err := c.Lock(ctx, "held", &mlock.LockOptions{TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := c.ClusterRollback(ctx, 1, false); err != nil {
		t.Fatalf("rollback: %v", err)
	}
	tc.waitVersion(logFormat1, true)
	proctest.WaitFor(t, 30*time.Second, "the node ready for the previous release", func() bool {
		return tc.nodes[xi].ClusterStatus().RollbackReady
	})
	pinFile, err := os.ReadFile(filepath.Join(tc.dirs[xi], versionFile))
	if err != nil {
		t.Fatal(err)
	}
	c.Close()

	// The whole cluster stops; the node loses its snapshot past the
	// lowering and starts alone (no leader: it applies nothing).
	tc.stop(xi)
	for _, name := range snapshotNames(t, tc.dirs[xi]) {
		if snapshotLater(name, older[len(older)-1]) {
			if err := os.RemoveAll(filepath.Join(tc.dirs[xi], "snapshots", name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := range tc.n {
		tc.stop(i)
	}
	tc.start(xi)
	s := tc.nodes[xi]
	mu.Lock()
	x.Store(s)
	mu.Unlock()
	format, _, err := logFormatOf(s.cl.encode(&logCmd{op: opDetach, node: s.cl.id}))
	if err != nil {
		t.Fatal(err)
	}
	ver := 0
	s.batch(func(*core.Tx) { ver = s.cl.version })
	if ver != logFormat || s.cl.versionNow.Load() != logFormat1 || !s.cl.pinned.Load() || s.cl.raftVersion() != logFormat1 ||
		format != logFormat1 || s.ClusterStatus().RollbackReady {
		t.Fatalf("restarted on the snapshot before the lowering: replicated version %d (want %d: the snapshot's), "+
			"version %d, pinned %v, handshake %d, writes format %d, ready %v",
			ver, logFormat, s.cl.versionNow.Load(), s.cl.pinned.Load(), s.cl.raftVersion(), format, s.ClusterStatus().RollbackReady)
	}
	if b, err := os.ReadFile(filepath.Join(tc.dirs[xi], versionFile)); err != nil || string(b) != string(pinFile) {
		t.Fatalf("version file after the restart: %q, %v; want %q", b, err, pinFile)
	}

	// The others start: it replays the entries before the lowering, then
	// the lowering.
	for i := range tc.n {
		if i != xi {
			tc.start(i)
		}
	}
	proctest.WaitFor(t, 30*time.Second, "the lowering applied again", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return relowered
	})
	tc.waitVersion(logFormat1, true)
	proctest.WaitFor(t, 30*time.Second, "the node ready for the previous release again", func() bool {
		return s.ClusterStatus().RollbackReady
	})
	mu.Lock()
	if replayed == 0 || len(bad) != 0 {
		t.Errorf("entries replayed before the lowering: %d; states off the pin before an entry: %d, first %q",
			replayed, len(bad), append(bad, "")[0])
	}
	mu.Unlock()
	if b, err := os.ReadFile(filepath.Join(tc.dirs[xi], versionFile)); err != nil || string(b) != string(pinFile) {
		t.Fatalf("version file after the lowering applied again: %q, %v; want %q", b, err, pinFile)
	}

	// A node that joins learns the pin with the lowering's index (it asks
	// with "index"); one of an earlier build, which asks without, is told
	// the two words it reads. (Here another member learns it again.)
	o := tc.nodes[(xi+1)%3]
	st, res, err := o.cl.fwd.call(ctx, tc.addrs[xi], fwdVersion, nil, nil)
	if err != nil || st != fwdOK || string(res) != "1 rollback" {
		t.Fatalf("the version asked without \"index\": %d %q %v", st, res, err)
	}
	want, _ := parseVersionState(string(pinFile))
	o.cl.pinAt.Store(0)
	if !o.learnVersion(tc.addrs[xi]) || o.cl.pinAt.Load() != want.at || !o.cl.pinned.Load() {
		t.Fatalf("learnt: lowering at %d, pinned %v; want %d", o.cl.pinAt.Load(), o.cl.pinned.Load(), want.at)
	}
	if b, err := os.ReadFile(filepath.Join(tc.dirs[(xi+1)%3], versionFile)); err != nil || string(b) != string(pinFile) {
		t.Fatalf("the learner's version file: %q, %v; want %q", b, err, pinFile)
	}
}

// The version file's forms: a version; pinned by a rollback, with the
// lowering's index or (written by an earlier build) without; nothing else.
func TestVersionStateParse(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want versionState
		ok   bool
	}{
		{"4\n", versionState{version: 4}, true},
		{"1 rollback\n", versionState{version: 1, pinned: true}, true},
		{"1 rollback 1234\n", versionState{version: 1, pinned: true, at: 1234}, true},
		{"1 rollback 0\n", versionState{}, false},
		{"1 rollback x\n", versionState{}, false},
		{"1 pinned 3\n", versionState{}, false},
		{"1 rollback 3 4\n", versionState{}, false},
		{"three\n", versionState{}, false},
		{"-1\n", versionState{}, false},
		{"", versionState{}, false},
	} {
		got, ok := parseVersionState(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("parseVersionState(%q) = %+v, %v; want %+v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
		if ok && got.String()+"\n" != tc.in {
			t.Errorf("%+v written back: %q, want %q", got, got.String()+"\n", tc.in)
		}
	}
	dir := t.TempDir()
	for _, vs := range []versionState{{version: 4}, {version: 1, pinned: true, at: 77}, {version: 1, pinned: true}} {
		if err := writeVersionFile(dir, vs); err != nil {
			t.Fatal(err)
		}
		if got, err := readVersionState(dir); err != nil || got != vs {
			t.Fatalf("wrote %+v, read %+v, %v", vs, got, err)
		}
	}
}
