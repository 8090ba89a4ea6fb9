package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/internal/cluster"
	"github.com/mlock-dev/mlock/internal/core"
	"github.com/mlock-dev/mlock/internal/proctest"
	"github.com/mlock-dev/mlock/internal/protocol"
)

// A log command or a snapshot of a format above this build's is refused
// with an error naming both formats; a node that meets such a command in
// its log stops applying (nothing of the entry, nor of any later one) and
// takes no snapshot.
func TestLogFormatFutureRefused(t *testing.T) {
	t.Parallel()
	future := appendLogCmd(nil, &logCmd{format: logFormat2, op: opParams, params: "x"})
	future[1] = logFormat + 1 // the header's format
	var m logCmd
	err := decodeLogCmd(future, &m)
	var ff *errFutureFormat
	if !errors.As(err, &ff) {
		t.Fatalf("decoding a command of format %d: %v, want an errFutureFormat", logFormat+1, err)
	}
	want := "log command of format " + strconv.Itoa(logFormat+1) + ": this build reads log command formats up to " + strconv.Itoa(logFormat)
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not say %q", err, want)
	}

	const ms = int64(time.Millisecond)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	s := replayServer(t, "r", nil)
	d := s.cl.dedup
	d.Apply(t0, [][]byte{cluster0(appendGenesis(nil, t0, replaySettings.String()))})
	d.Apply(t0+ms, [][]byte{dedupCmd("x/1/1", 1, &logCmd{op: opAttach, node: "x", conn: "x/1/1", session: "s1"})})
	before, err := d.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	lock := func(req string) []byte {
		return dedupCmd("x/1/1", 0, &logCmd{op: opFrames, node: "x", conn: "x/1/1", session: "s1",
			frames: [][]byte{[]byte("lock " + req + " a 60000 0 0")}})
	}
	// The lock before the unreadable command, in the same entry, is not
	// applied either: an entry is applied whole or not at all.
	d.Apply(t0+2*ms, [][]byte{lock("1"), cluster0(future)})
	why := s.cl.halted.Load()
	if !strings.Contains(why, want) {
		t.Fatalf("the node did not stop saying why: halted %q", why)
	}
	d.Apply(t0+3*ms, [][]byte{lock("2")})
	n := 0
	s.batch(func(tx *core.Tx) { tx.SessionLocks("s1", func(core.LockInfo) { n++ }) })
	if n != 0 {
		t.Fatalf("the stopped node applied %d locks", n)
	}
	if _, err := (&replica{s}).Snapshot(); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("a stopped node took a snapshot: %v", err)
	}

	// A snapshot of a future format.
	r := replayServer(t, "restore", nil)
	inner := before[bytes.Index(before, []byte(snapMagic)):]
	fut := append([]byte(nil), inner...)
	fut[len(snapMagic)] = snapFormat + 1
	err = (&replica{r}).Restore(fut)
	wantSnap := "snapshot of format " + strconv.Itoa(snapFormat+1) + ": this build reads snapshot formats up to " + strconv.Itoa(snapFormat)
	if !errors.As(err, &ff) || !strings.Contains(err.Error(), wantSnap) {
		t.Fatalf("restoring a snapshot of format %d: %v, want %q", snapFormat+1, err, wantSnap)
	}
	if err := (&replica{r}).Restore(inner); err == nil {
		t.Fatal("a node that refused a snapshot restored the next one: it stopped")
	}
}

// The previous build's formats are read: its log (format 1: no header,
// client frames) is what replayLog builds, and its snapshots (format 2)
// are those a cluster of version 1 takes; both restore and snapshot back
// byte for byte. A log of format 1 and one of format 2 bring a state
// machine to the same state.
func TestLogFormatPreviousRead(t *testing.T) {
	t.Parallel()
	log := replayLog()
	for _, e := range log {
		for _, c := range e.cmds {
			_, _, body, err := cluster.ParseDedupCommand(c)
			if err != nil || len(body) == 0 || body[0] == versionMark {
				t.Fatalf("replayLog is not in the previous build's format: %x", c)
			}
		}
	}
	a := replaySM(t, "a")
	for _, e := range log {
		a.Apply(e.now, e.cmds)
	}
	snap, err := a.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(snap, []byte(sessionsMagic)) {
		t.Fatalf("a cluster of version 1 did not write the previous build's snapshot format (%q)", sessionsMagic)
	}
	b := replaySM(t, "b")
	if err := b.Restore(snap); err != nil {
		t.Fatal(err)
	}
	if again, _ := b.Snapshot(); !bytes.Equal(again, snap) {
		t.Fatal("the previous format's snapshot restored differently")
	}
}

// A log written by this build, once every member reads its format, is read
// back by it after a restart of every node: the same locks, fencing tokens
// and sessions, the cluster version kept, and the commands written after
// the version was raised carry the format header.
func TestClusterVersionedLogRestart(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	versioned, unversioned := 0, 0
	raised := false
	apply := func(node string, now int64, cmds [][]byte) {
		if node != "n0" {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		for _, c := range cmds {
			// The commands of the client that connects once the version is
			// raised. (A node's own commands encoded before, and proposed
			// again with the same bytes under load, may be applied later.)
			_, _, body, err := cluster.ParseDedupCommand(c)
			var m logCmd
			if err != nil || !raised || decodeLogCmd(body, &m) != nil || !strings.HasSuffix(m.session, "keeper") {
				continue
			}
			if m.format == logFormat {
				versioned++
			} else {
				unversioned++
			}
		}
	}
	tc := newTestClusterWith(t, 3, true, func(tc *testCluster) { tc.hooks.apply = apply })
	l := tc.leader()
	tc.raiseVersion(l)
	mu.Lock()
	raised = true
	mu.Unlock()
	a := tc.dial(1, "keeper")
	a.expect("connected 1.0 new * **")
	id := a.lock("1", "kept 600000 0 0 owner1")
	tok := a.locked(id)
	tc.nodes[0].cl.node.Snapshot() // compact once: the restart restores a snapshot, then the log
	id2 := a.lock("2", "kept2 600000 0 0 owner1")
	tok2 := a.locked(id2)
	a.send("renew 3 owner1 kept2 600000")
	a.expect("result 3 success * " + tok2)
	a.nc.Close()
	for i := range 3 {
		tc.stop(i)
	}
	mu.Lock()
	if versioned == 0 || unversioned != 0 {
		t.Errorf("the client's commands after the version was raised: %d of format %d, %d of an older one", versioned, logFormat, unversioned)
	}
	mu.Unlock()
	b := restartKeeper(t, tc, id+" "+tok, id2+" "+tok2)
	id3 := b.lock("4", "new 1000 0 0")
	if tok3, _ := strconv.ParseUint(b.locked(id3), 10, 64); tok3 <= mustUint(tok2) {
		t.Fatalf("token %d after %s", tok3, tok2)
	}
	// Each node is back at the version once it has applied its log again
	// (a node may still be replaying it when the keeper is answered).
	for i := range 3 {
		proctest.WaitFor(t, 10*time.Second, fmt.Sprintf("n%d at cluster version %d after the restart", i, logFormat), func() bool {
			return tc.nodes[i].ClusterStatus().Version == logFormat
		})
	}
}

// raiseVersion raises the cluster version to this build's log format
// through the leader l, and waits until every node applied it.
func (tc *testCluster) raiseVersion(l int) {
	tc.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := cluster0(appendLogCmd(nil, &logCmd{format: logFormat, op: opVersion, version: logFormat}))
	if _, err := tc.nodes[l].replicate(ctx, cmd); err != nil {
		tc.t.Fatal(err)
	}
	for i := range tc.n {
		for tc.nodes[i].cl.writeFormat() != logFormat {
			if ctx.Err() != nil {
				tc.t.Fatalf("n%d did not apply the cluster version", i)
			}
			time.Sleep(5 * time.Millisecond) // polled: the apply has no event to wait on
		}
	}
}

// The same requests as client frames (format 1) and typed (format 2) bring
// a state machine to the same state, with the same answers: the typed log
// is the single node's parse step done once, the apply step everywhere.
func TestLogFormatTypedSameState(t *testing.T) {
	t.Parallel()
	log := replayLog()
	frames := replayServer(t, "frames", nil)
	typed := replayServer(t, "typed", nil)
	for k, e := range log {
		cmds := make([][]byte, len(e.cmds))
		for i, c := range e.cmds {
			client, seq, body, err := cluster.ParseDedupCommand(c)
			if err != nil {
				t.Fatal(err)
			}
			var m logCmd
			if err := decodeLogCmd(body, &m); err != nil {
				t.Fatal(err)
			}
			if m.op == opFrames {
				for _, fr := range m.frames {
					var r request
					if !parseRequest(verbOf(fr), protocol.Split(nil, fr), &r) {
						t.Fatalf("frame %q is no request", fr)
					}
					m.reqs = append(m.reqs, r)
				}
				m.op, m.frames = opRequests, nil
			}
			m.format = logFormat2
			cmds[i] = cluster.DedupCommand(client, seq, appendLogCmd(nil, &m))
		}
		if k == 1 {
			// Once the genesis is applied: the typed log's cluster version.
			v := cluster0(appendLogCmd(nil, &logCmd{format: logFormat2, op: opVersion, version: logFormat2}))
			typed.cl.dedup.Apply(e.now, [][]byte{v})
			frames.cl.dedup.Apply(e.now, [][]byte{cluster0(appendLogCmd(nil, &logCmd{op: opDetach, node: "z", session: "none"}))}) // does nothing, at the same time
		}
		want := frames.cl.dedup.Apply(e.now, e.cmds)
		got := typed.cl.dedup.Apply(e.now, cmds)
		for i := range want {
			if !bytes.Equal(got[i], want[i]) {
				t.Fatalf("entry %d command %d: typed answered %v, frames %v", k, i, got[i], want[i])
			}
		}
	}
	a, err := frames.core().Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := typed.core().Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Fatalf("the lock tables differ (%d and %d bytes)", len(a), len(b))
	}
	if typed.cl.writeFormat() != logFormat2 || frames.cl.writeFormat() != logFormat1 {
		t.Fatalf("cluster versions %d (typed) and %d (frames)", typed.cl.writeFormat(), frames.cl.writeFormat())
	}
}

// verbOf returns the verb of a frame.
func verbOf(fr []byte) protocol.Verb {
	v, _ := protocol.ParseVerb(protocol.Split(nil, fr)[0])
	return v
}

// The cluster version gates the log format: while a member says it reads
// only format 1 (a node of the previous build), every node writes the old
// form (client frames, no header) and the version stays 1; once that member
// runs this build (restarted on its directory), the leader raises the
// version and the requests are written typed, with the header. Status shows
// the version and what each member reads.
func TestClusterVersionGate(t *testing.T) {
	t.Parallel()
	var old atomic.Bool
	old.Store(true)
	ownFormat := func(id string) int {
		if id == "n2" && old.Load() {
			return logFormat1
		}
		return 0
	}
	var mu sync.Mutex
	var bodies [][]byte
	apply := func(node string, now int64, cmds [][]byte) {
		if node != "n0" {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		for _, c := range cmds {
			if _, _, body, err := cluster.ParseDedupCommand(c); err == nil && len(body) > 0 {
				bodies = append(bodies, append([]byte(nil), body...))
			}
		}
	}
	tc := newTestClusterWith(t, 3, true, func(tc *testCluster) { tc.hooks.apply, tc.hooks.ownFormat = apply, ownFormat })
	l := tc.leader()
	want := map[string]int{"n0": logFormat, "n1": logFormat, "n2": logFormat1}
	tc.waitFormats(l, want)
	c := tc.dial(0, "gate")
	c.expect("connected 1.0 new * **")
	id := c.lock("1", "g 60000 0 0")
	c.locked(id)
	c.send("unlock 2 " + id)
	c.expect("result 2 success done")
	tc.waitApplied(0, l)
	mu.Lock()
	frames := 0
	for _, b := range bodies {
		switch {
		case b[0] == versionMark:
			t.Errorf("a command of format %d was written while n2 reads format 1: %x", b[1], b)
		case b[0] == opFrames:
			frames++
		}
	}
	bodies = nil
	mu.Unlock()
	if frames == 0 {
		t.Fatal("no client frames (format 1) were written")
	}
	for i := range 3 {
		if v := tc.nodes[i].ClusterStatus().Version; v != logFormat1 {
			t.Fatalf("n%d: cluster version %d while n2 reads format 1", i, v)
		}
	}

	// n2 is upgraded: stopped, started again on its directory. Every node
	// runs the new version well before a follower would say its formats
	// again (announceEvery, which bounds the wait below by half): to a new
	// leader, n2 says them at once; when n2 is elected again, the others say
	// theirs to it at once too, though it has the id of the leader they last
	// told (restarted, it forgot what they said).
	c.nc.Close()
	tc.stop(2)
	old.Store(false)
	restarted := time.Now()
	tc.start(2)
	l = tc.leader()
	want["n2"] = logFormat
	tc.waitFormats(l, want)
	for i := 0; i < 3; {
		if tc.nodes[i].ClusterStatus().Version == logFormat {
			i++
			continue
		}
		if time.Since(restarted) > announceEvery/2 {
			t.Fatalf("n%d: cluster version %d %v after n2's restart, want %d once every member reads it (leader n%d)",
				i, tc.nodes[i].ClusterStatus().Version, time.Since(restarted), logFormat, l)
		}
		time.Sleep(10 * time.Millisecond) // polled: status has no event to wait on
	}
	raised := time.Since(restarted)
	t.Logf("the cluster version was raised %v after n2's restart (leader n%d)", raised, l)
	if raised > announceEvery/2 {
		t.Fatalf("the cluster version was raised %v after n2's restart, want well within announceEvery (%v)", raised, announceEvery)
	}
	d := tc.dial(1, "gate2")
	d.expect("connected 1.0 new * **")
	id = d.lock("1", "g2 60000 0 0")
	d.locked(id)
	// n0 applies the lock's entry in its time (the leader may have moved
	// meanwhile on a busy machine): waited for, not assumed.
	seen := 0
	proctest.WaitFor(t, 30*time.Second, "a typed request written once every member reads them, applied on n0", func() bool {
		mu.Lock()
		defer mu.Unlock()
		typed := 0
		for _, b := range bodies[seen:] {
			var m logCmd
			if decodeLogCmd(b, &m) == nil && m.op == opRequests && m.format == logFormat {
				typed++
			}
			if b[0] == opFrames {
				t.Errorf("client frames written at cluster version %d: %q", logFormat, b)
			}
		}
		seen = len(bodies)
		return typed > 0
	})
}

// A follower tells a leader its formats once, then every announceEvery; a
// leader of the same id in a new term (restarted: it forgot) at once, and
// a new leader after a second at most since the last try.
func TestFormatsAnnounceDue(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	var a formats
	if !a.due("n1 2", t0) {
		t.Fatal("the first leader is not told")
	}
	a.tried, a.toLeader = t0, "n1 2"
	for _, tc := range []struct {
		leader string
		after  time.Duration
		want   bool
	}{
		{"n1 2", time.Second, false},
		{"n1 2", announceEvery - time.Millisecond, false},
		{"n1 2", announceEvery, true},
		{"n1 3", time.Second, true}, // the same member, elected again
		{"n1 3", 500 * time.Millisecond, false},
		{"n2 3", time.Second, true},
	} {
		if got := a.due(tc.leader, t0.Add(tc.after)); got != tc.want {
			t.Errorf("told n1 in term 2 at t0: due(%q, t0+%v) = %v, want %v", tc.leader, tc.after, got, tc.want)
		}
	}
}

// waitFormats waits until the leader l's status shows the log format each
// member said it reads, as want (when l no longer leads, the node that
// leads now).
func (tc *testCluster) waitFormats(l int, want map[string]int) {
	tc.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		l = tc.leaderNow(l) // the leadership may have moved on a busy machine
		st := tc.nodes[l].ClusterStatus()
		got := map[string]int{}
		for _, p := range st.Peers {
			got[p.ID] = p.LogFormat
		}
		same := len(got) == len(want)
		for id, f := range want {
			same = same && got[id] == f
		}
		if same {
			return
		}
		if time.Now().After(deadline) {
			tc.t.Fatalf("the leader's view of the members' formats: %v, want %v", got, want)
		}
		time.Sleep(10 * time.Millisecond) // polled: status has no event to wait on
	}
}

// waitApplied waits until node i has applied what the leader l has
// committed now (n0's apply hook then saw it).
func (tc *testCluster) waitApplied(i, l int) {
	tc.t.Helper()
	commit := tc.nodes[l].cl.node.Status().CommitIndex
	deadline := time.Now().Add(10 * time.Second)
	for tc.nodes[i].cl.node.Status().AppliedIndex < commit {
		if time.Now().After(deadline) {
			tc.t.Fatalf("n%d did not apply up to %d", i, commit)
		}
		time.Sleep(5 * time.Millisecond) // polled: the apply has no event to wait on
	}
}

// The leader raises the cluster version on the word of members that said
// their formats on a forwarding connection still open only: a member whose
// connection ended (restarted, perhaps on v0.1.0, which says nothing) counts
// as format 1 until it says them again, however fresh its last word.
func TestRaiseTargetLiveOnly(t *testing.T) {
	cl := &clusterState{id: "n0"}
	cl.versionNow.Store(logFormat1)
	peers := []cluster.Peer{{ID: "n0"}, {ID: "n1"}, {ID: "n2"}}
	live := func() *conn { return &conn{done: make(chan struct{})} }
	n2 := live()
	cl.noteFormat("n1", logFormat, live())
	cl.noteFormat("n2", logFormat, n2)
	if v := cl.raiseTarget(peers); v != logFormat {
		t.Fatalf("every member said %d on a connection still open: raise to %d", logFormat, v)
	}
	close(n2.done) // n2's forwarding connection ended
	if v := cl.raiseTarget(peers); v != logFormat1 {
		t.Fatalf("n2 said %d on a connection that ended since: raise to %d, want %d (not known)", logFormat, v, logFormat1)
	}
	cl.noteFormat("n2", logFormat, live()) // said again, on its new connection
	if v := cl.raiseTarget(peers); v != logFormat {
		t.Fatalf("n2 said %d again: raise to %d", logFormat, v)
	}
	cl.noteFormat("n1", logFormat, nil) // on no known connection
	if v := cl.raiseTarget(peers); v != logFormat1 {
		t.Fatalf("n1 said %d on no known connection: raise to %d, want %d", logFormat, v, logFormat1)
	}
}

// A member's word read late on its older forwarding connection (the
// leader reads each connection on a reader of its own: its previous run's
// last announcement may be read after its new run's first word) does not
// replace the word said on its newer connection still open: once the older
// one is seen closed, the member would count as format 1 (a raise and a
// rollback wait for its next announcement, up to announceEvery), or, while
// it is still open, at its previous run's format (a raise to a format it
// does not read, if it was restarted on an older build).
func TestFormatWordLateOnOlderConnection(t *testing.T) {
	cl := &clusterState{id: "n0"}
	cl.versionNow.Store(logFormat1)
	peers := []cluster.Peer{{ID: "n0"}, {ID: "n1"}}
	t0 := time.Now()
	older := &conn{done: make(chan struct{}), accepted: t0}
	newer := &conn{done: make(chan struct{}), accepted: t0.Add(time.Second)}
	cl.noteFormat("n1", logFormat, newer)  // the new run's first word
	cl.noteFormat("n1", logFormat3, older) // the previous run's last, read late
	if v := cl.raiseTarget(peers); v != logFormat {
		t.Fatalf("n1 said %d on its newer connection, still open: raise to %d (its older connection's word taken)", logFormat, v)
	}
	if f, ok := cl.saidOn(older); !ok || f != logFormat3 {
		t.Fatalf("the older connection's own word: %d, %v, want %d", f, ok, logFormat3)
	}
	close(older.done)
	if f, ok := cl.memberFormatLive("n1"); !ok || f != logFormat {
		t.Fatalf("n1's older connection closed, its newer one open: memberFormatLive = %d, %v, want %d, true", f, ok, logFormat)
	}
	// The other way: restarted on a build that reads 3 at most, n2 says
	// so on its new connection; its previous run's word, 4, read late on
	// the older one still open, must not make the leader raise to 4 (a
	// command n2 cannot read: it would stop applying the log).
	peers = append(peers, cluster.Peer{ID: "n2"})
	older2 := &conn{done: make(chan struct{}), accepted: t0}
	newer2 := &conn{done: make(chan struct{}), accepted: t0.Add(time.Second)}
	cl.noteFormat("n2", logFormat3, newer2)
	cl.noteFormat("n2", logFormat, older2)
	if v := cl.raiseTarget(peers); v != logFormat3 {
		t.Fatalf("n2 said %d on its newer connection: raise to %d (its previous run's word taken)", logFormat3, v)
	}
	cl.noteFormat("n2", logFormat, newer2) // run this build again
	// A word on a newer connection than the member's last replaces it,
	// and so does one on an older connection once the newer has closed.
	newest := &conn{done: make(chan struct{}), accepted: t0.Add(2 * time.Second)}
	cl.noteFormat("n1", logFormat3, newest)
	if f, ok := cl.memberFormatLive("n1"); !ok || f != logFormat3 {
		t.Fatalf("n1 said %d on its newest connection: memberFormatLive = %d, %v", logFormat3, f, ok)
	}
	close(newest.done)
	cl.noteFormat("n1", logFormat, newer)
	if f, ok := cl.memberFormatLive("n1"); !ok || f != logFormat {
		t.Fatalf("n1 said %d on a connection open after its newest closed: memberFormatLive = %d, %v", logFormat, f, ok)
	}
}

// A rollback (or its cancel) refused for a member whose last word was said
// on a forwarding connection that has closed since says so: not that the
// member has said nothing lately (it did, and status shows that format).
func TestLiveFormatsWordOnClosedConnection(t *testing.T) {
	cl := &clusterState{id: "n0"}
	cl.versionNow.Store(logFormat)
	peers := []cluster.Peer{{ID: "n0"}, {ID: "n1"}, {ID: "n2"}}
	gone := &conn{done: make(chan struct{})}
	cl.noteFormat("n1", logFormat, gone)
	close(gone.done)
	why := cl.liveFormats(peers, " (v0.1.0 says nothing)", func(string, int) {})
	slices.Sort(why)
	want := []string{
		"member n1 said it reads log formats up to " + strconv.Itoa(logFormat) + " on a forwarding connection that has closed " +
			"since (perhaps restarted on another build; it says them again on its next one, within " + announceEvery.String() + ")",
		"member n2 has not said which log formats it reads lately (v0.1.0 says nothing)",
	}
	if !slices.Equal(why, want) {
		t.Fatalf("liveFormats:\n got %q\nwant %q", why, want)
	}
}

// The snapshot's format follows the cluster version: 2 (the previous
// release's) at version 1, 3 at versions 2 and 3, 4 from version 4 on (a
// build that reads log format 3 at most refuses it, as it refuses the
// log); each restores with its version.
func TestSnapshotFormatFollowsVersion(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	s := replayServer(t, "snapfmt", nil)
	d := s.cl.dedup
	d.Apply(t0, [][]byte{cluster0(appendGenesis(nil, t0, replaySettings.String()))})
	for i, c := range []struct{ version, format int }{{1, 2}, {2, 3}, {3, 3}, {4, 4}, {1, 2}} {
		if i > 0 {
			v := c.version
			d.Apply(t0+int64(i), [][]byte{cluster0(appendLogCmd(nil, &logCmd{format: max(v, s.cl.writeFormat()), op: opVersion, version: uint64(v)}))})
		}
		snap, err := d.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		inner := snap[bytes.Index(snap, []byte(snapMagic)):]
		if got := int(inner[len(snapMagic)]); got != c.format {
			t.Fatalf("version %d: snapshot format %d, want %d", c.version, got, c.format)
		}
		r := replayServer(t, "snapfmt-restore"+strconv.Itoa(i), nil)
		if err := r.cl.dedup.Restore(snap); err != nil {
			t.Fatalf("version %d: restore: %v", c.version, err)
		}
		if v := r.cl.versionNow.Load(); v != int64(c.version) {
			t.Fatalf("version %d: restored at version %d", c.version, v)
		}
	}
}
