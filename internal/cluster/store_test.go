package cluster

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	raftwal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/hashicorp/raft-wal/types"

	"github.com/mlock-dev/mlock/internal/datadir"
)

func openDiskNode(t *testing.T, dir string, sm *lockedSM) *Node {
	t.Helper()
	_, tr := raft.NewInmemTransport("")
	n, err := Open(Config{ID: "a", Transport: tr, Dir: dir, Bootstrap: true, SM: sm})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestRestartKeepsLogAndTerm: a node reopened on its Dir finds its term and its log in the WAL (no
// snapshot was taken: the state comes back by replaying the log), and goes on from there.
func TestRestartKeepsLogAndTerm(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "node")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	sm := newLockedSM(false)
	n := openDiskNode(t, dir, sm)
	if _, err := n.WaitLeader(ctx); err != nil {
		n.Close()
		t.Fatal(err)
	}
	for _, c := range []string{"a", "b", "c"} {
		if _, err := n.Propose(ctx, []byte(c)); err != nil {
			n.Close()
			t.Fatal(err)
		}
	}
	before := n.Status()
	var beforeLog []string
	sm.read(func(s *toySM) { beforeLog = slices.Clone(s.Log) })
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{walDirName + "/wal-meta.db", "snapshots"} {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			t.Fatal(err)
		}
	}
	segs, _ := filepath.Glob(filepath.Join(dir, walDirName, "*.wal"))
	if len(segs) == 0 {
		t.Fatalf("no segment file in %s", filepath.Join(dir, walDirName))
	}

	sm = newLockedSM(false)
	n = openDiskNode(t, dir, sm)
	defer n.Close()
	if _, err := n.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := n.Propose(ctx, []byte("d"))
	if err != nil || string(res) != "4" { // a, b, c replayed from the log before it
		t.Fatalf("Propose after restart = %q, %v", res, err)
	}
	after := n.Status()
	if after.Term <= before.Term || after.LastIndex <= before.LastIndex {
		t.Fatalf("before restart term %d, last index %d; after: term %d, last index %d",
			before.Term, before.LastIndex, after.Term, after.LastIndex)
	}
	sm.read(func(s *toySM) {
		if s.Restores != 0 || len(s.Log) != 4 || !slices.Equal(s.Log[:3], beforeLog) {
			t.Fatalf("restores %d, log before restart %q, after %q", s.Restores, beforeLog, s.Log)
		}
	})
}

// TestTruncatedLogRestart: a cut-off leader's uncommitted entry is cut from its log after the heal
// (a tail truncation of its WAL), then the whole cluster restarts from disk. raft-wal before v0.4.1
// marked the truncated segment sealed without writing its index, and the node then failed at every
// start ("sealed segment has no index block").
func TestTruncatedLogRestart(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	onDisk := func(i int, c *Config) { c.Dir = filepath.Join(base, fmt.Sprintf("n%d", i)) }
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	tc := newInmemCluster(t, 3, false, onDisk)
	li := tc.leader()
	if _, err := tc.nodes[li].Propose(ctx, []byte("first")); err != nil {
		t.Fatal(err)
	}
	tc.converge()
	committed := tc.nodes[li].Status().CommitIndex
	tc.isolate(li)
	if _, err := tc.nodes[li].Propose(ctx, []byte("lost")); !errors.Is(err, ErrUnknownOutcome) && !errors.Is(err, ErrNotLeader) {
		t.Fatalf("Propose on a cut-off leader = %v", err)
	}
	if last := tc.nodes[li].Status().LastIndex; last <= committed {
		t.Fatalf("the cut-off leader's last index %d, commit index %d: nothing to truncate", last, committed)
	}
	nl := tc.leader(li)
	if _, err := tc.nodes[nl].Propose(ctx, []byte("after")); err != nil {
		t.Fatal(err)
	}
	tc.heal(li)
	if snap := tc.converge(); strings.Contains(string(snap), " lost") {
		t.Fatal("the cut-off leader's uncommitted command was applied")
	}
	tc.close()

	tc = newInmemCluster(t, 3, false, onDisk)
	nl = tc.leader()
	if _, err := tc.nodes[nl].Propose(ctx, []byte("restarted")); err != nil {
		t.Fatal(err)
	}
	snap := string(tc.converge())
	if !strings.Contains(snap, " first") || !strings.Contains(snap, " after") || strings.Contains(snap, " lost") {
		t.Fatalf("state after the restart: %.300s", snap)
	}
}

// TestOldLogStoreRefused: a Dir holding the bbolt raft.db of earlier builds and no wal directory is
// refused, untouched, with an error that says what to do; once a wal directory exists, a raft.db
// beside it is a leftover that Open ignores.
func TestOldLogStoreRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	old := filepath.Join(dir, "raft.db")
	if err := os.WriteFile(old, []byte("an old bbolt file"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, tr := raft.NewInmemTransport("")
	n, err := Open(Config{ID: "a", Transport: tr, Dir: dir, Bootstrap: true, SM: newLockedSM(false)})
	if err == nil {
		n.Close()
		t.Fatal("Open accepted a directory with raft.db")
	}
	tr.Close()
	if !errors.Is(err, ErrOldLogStore) || !strings.Contains(err.Error(), old) ||
		!strings.Contains(err.Error(), "start this node with an empty one") {
		t.Fatalf("Open = %v", err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 || ents[0].Name() != "raft.db" {
		t.Fatalf("Open changed the directory: %v", ents)
	}
	if b, _ := os.ReadFile(old); string(b) != "an old bbolt file" {
		t.Fatalf("raft.db changed: %q", b)
	}

	if err := os.Mkdir(filepath.Join(dir, walDirName), 0o700); err != nil {
		t.Fatal(err)
	}
	sm := newLockedSM(false)
	n = openDiskNode(t, dir, sm)
	defer n.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := n.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	if res, err := n.Propose(ctx, []byte("x")); err != nil || string(res) != "1" {
		t.Fatalf("Propose = %q, %v", res, err)
	}
}

// TestStdLogKept: importing raft-wal must not leave the standard library's log package redirected
// (see the init in log.go).
func TestStdLogKept(t *testing.T) {
	// The process's standard error: go test -json sets os.Stderr to
	// os.Stdout after the package's init has run.
	f, ok := log.Writer().(*os.File)
	if !ok || f.Fd() != 2 || log.Flags() != log.LstdFlags || log.Prefix() != "" {
		t.Fatalf("log package: writer %T, flags %d, prefix %q", log.Writer(), log.Flags(), log.Prefix())
	}
}

// TestDirInUseRefused: a second node on the directory of a running one is refused at once, naming
// the holder, instead of waiting on the log's files; the directory is free again after Close.
func TestDirInUseRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	open := func() (*Node, error) {
		return Open(Config{ID: "n0", RaftAddr: "127.0.0.1:0", Dir: dir, Bootstrap: true,
			Peers: []Peer{{ID: "n0", Addr: "127.0.0.1:0"}}, SM: newLockedSM(false)})
	}
	first, err := open()
	if err != nil {
		t.Fatal(err)
	}
	second, err := open()
	if err == nil {
		second.Close()
		first.Close()
		t.Fatal("a second node opened the directory of a running one")
	}
	if !errors.Is(err, datadir.ErrInUse) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", os.Getpid())) {
		t.Fatalf("second Open: %v, want ErrInUse naming pid %d", err, os.Getpid())
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	again, err := open()
	if err != nil {
		t.Fatalf("Open after Close: %v", err)
	}
	again.Close()
}

// failingMeta fails every CommitState once armed, as a crash before the commit would (nothing of it
// is persisted).
type failingMeta struct {
	*metadb.BoltMetaDB
	armed bool
}

func (m *failingMeta) CommitState(s types.PersistentState) error {
	if m.armed {
		return errors.New("crash before the meta commit")
	}
	return m.BoltMetaDB.CommitState(s)
}

// fillSegmentLosingRotation fills the first segment of a new log in dir
// (segments of 8 KiB, entries of 600 bytes) with a meta store whose
// commits fail: the append that fills the segment seals its file, and the
// rotation that records that is lost. It returns the last index stored and
// fails the test unless the segment filled.
func fillSegmentLosingRotation(t *testing.T, dir string) (last uint64) {
	t.Helper()
	m := &failingMeta{BoltMetaDB: &metadb.BoltMetaDB{}}
	w, err := raftwal.Open(dir, raftwal.WithMetaStore(m), raftwal.WithSegmentSize(8192))
	if err != nil {
		t.Fatal(err)
	}
	m.armed = true
	for i := uint64(1); i <= 40; i++ {
		if err := w.StoreLogs([]*raft.Log{{Index: i, Term: 1, Data: make([]byte, 600)}}); err != nil {
			break // the rotation's commit failed: the tail is sealed on disk only
		}
		last = i
	}
	w.Close()
	if last == 0 || last == 40 {
		t.Fatalf("stored through %d: the segment did not fill", last)
	}
	return last
}

// checkEntries fails the test unless w holds entries 1 to through, each
// at its index.
func checkEntries(t *testing.T, w *raftwal.WAL, through uint64) {
	t.Helper()
	for i := uint64(1); i <= through; i++ {
		var l raft.Log
		if err := w.GetLog(i, &l); err != nil || l.Index != i {
			t.Fatalf("entry %d after the repair: %v (index %d)", i, err, l.Index)
		}
	}
}

// TestSealedTailRepaired: the append that fills a segment seals its file; the rotation that records
// that commits to the meta store afterwards. With that commit lost, raft-wal alone refuses every later
// append, after every restart; repairSealedTail records the rotation, and the log goes on with every
// entry kept.
func TestSealedTailRepaired(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	last := fillSegmentLosingRotation(t, dir)

	// Without the repair, the reopened log refuses appends.
	w, err := raftwal.Open(dir, raftwal.WithMetaStore(&metadb.BoltMetaDB{}), raftwal.WithSegmentSize(8192))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.StoreLogs([]*raft.Log{{Index: last + 1, Term: 1, Data: []byte("x")}}); !errors.Is(err, raftwal.ErrSealed) {
		t.Fatalf("append to the unrepaired log: %v, want ErrSealed (raft-wal fixed it? then drop the repair)", err)
	}
	w.Close()

	meta := &metadb.BoltMetaDB{}
	repaired, err := repairSealedTail(dir, meta)
	if err != nil || !repaired {
		t.Fatalf("repairSealedTail = %v, %v", repaired, err)
	}
	w, err = raftwal.Open(dir, raftwal.WithMetaStore(meta), raftwal.WithSegmentSize(8192))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.StoreLogs([]*raft.Log{{Index: last + 1, Term: 1, Data: []byte("x")}}); err != nil {
		t.Fatalf("append after the repair: %v", err)
	}
	checkEntries(t, w, last+1)
	// A second repair finds nothing to do.
	w.Close()
	meta2 := &metadb.BoltMetaDB{}
	if again, err := repairSealedTail(dir, meta2); err != nil || again {
		t.Fatalf("second repairSealedTail = %v, %v", again, err)
	}
	meta2.Close()
}
