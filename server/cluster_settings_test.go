package server

import (
	"bytes"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/internal/cluster"
	"github.com/mlock-dev/mlock/internal/core"
)

// settingsIn returns the settings in force on node i.
func (tc *testCluster) settingsIn(i int) settings {
	var st settings
	s := tc.nodes[i]
	s.batch(func(*core.Tx) { st = s.set })
	return st
}

// replicaSnapshots waits until every running node has applied the same
// entries, the leader's commit index, and returns each node's replicated
// state (sessions, settings in force, engine) taken while none applied
// anything else.
func (tc *testCluster) replicaSnapshots() [][]byte {
	tc.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		l := tc.leader()
		commit := tc.nodes[l].cl.node.Status().CommitIndex
		same := true
		for _, s := range tc.nodes {
			if s != nil && s.cl.node.Status().AppliedIndex != commit {
				same = false
			}
		}
		if !same {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		var snaps [][]byte
		for _, s := range tc.nodes {
			if s == nil {
				continue
			}
			b, err := (&replica{s}).Snapshot()
			if err != nil {
				tc.t.Fatal(err)
			}
			snaps = append(snaps, b)
		}
		still := true
		for _, s := range tc.nodes {
			if s != nil && s.cl.node.Status().AppliedIndex != commit {
				still = false
			}
		}
		if still && tc.nodes[l].cl.node.Status().CommitIndex == commit {
			return snaps
		}
	}
	tc.t.Fatal("the nodes did not reach the same applied index")
	return nil
}

// The leader's settings are in force on every node, whatever the node's own
// flags: a follower with a smaller max TTL and session grace grants the
// lock the leader would (its client's included), announces the leader's
// grace, starts a detached session's grace with the leader's, and its
// state stays the leader's byte for byte. A replay of the same log into
// state machines with other flags gives the same state.
func TestClusterLeaderSettingsInForce(t *testing.T) {
	var mu sync.Mutex
	logs := map[string][]replayEntry{}
	testApplyHook = func(node string, now int64, cmds [][]byte) {
		var cp [][]byte
		if cmds != nil {
			cp = make([][]byte, len(cmds))
			for i, c := range cmds {
				cp[i] = append([]byte(nil), c...)
			}
		}
		mu.Lock()
		logs[node] = append(logs[node], replayEntry{now, cp})
		mu.Unlock()
	}
	t.Cleanup(func() { testApplyHook = nil })
	odd := -1
	small := func(c *Config) {
		c.MaxTTL = time.Minute
		c.SessionGrace = time.Second
		if c.Cluster == nil {
			c.Cluster = &ClusterConfig{}
		}
		c.Cluster.DedupWindow = 1000
	}
	tc := newTestClusterWith(t, 3, false, func(tc *testCluster) {
		tc.configure = func(i int, c *Config) {
			if i == odd {
				small(c)
			}
		}
	})
	l := tc.leader()
	f := (l + 1) % 3
	odd = f
	tc.stop(f)
	tc.start(f)
	deadline := time.Now().Add(10 * time.Second)
	for tc.nodes[f].cl.paramsDiffer.Load() == "" { // the leader's opParams is applied
		if time.Now().After(deadline) {
			t.Fatal("the follower did not report its settings as different from the leader's")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if tc.nodes[f].cfg.MaxTTL != time.Minute {
		t.Fatal("the follower does not run with its own smaller max TTL")
	}

	// A lock with a ttl between the follower's max and the leader's, asked
	// on the follower and on the leader: granted, on every node.
	cf := tc.dial(f, "onfollower")
	cf.expect("connected 1.0 new 3000 **") // the leader's grace, not the follower's 1000
	idf := cf.lock("1", "x 120000 0 0")
	cf.locked(idf)
	cl := tc.dial(l, "onleader")
	cl.expect("connected 1.0 new 3000 **")
	idl := cl.lock("1", "y 120000 0 0")
	cl.locked(idl)
	cf.send("extend 2 " + idf + " 90000")
	cf.expect("result 2 success *")
	for i := range 3 {
		if n, m := tc.sessionLocks(i, "onfollower"), tc.sessionLocks(i, "onleader"); n != 1 || m != 1 {
			t.Errorf("n%d holds %d and %d locks for the two sessions, want 1 and 1", i, n, m)
		}
	}
	// The follower's client goes: its grace, the leader's 3 s, starts on
	// every node alike.
	cf.nc.Close()
	deadline = time.Now().Add(10 * time.Second)
	for {
		node, _ := tc.sessionNode(f, "onfollower")
		if node == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the session was not detached")
		}
		time.Sleep(10 * time.Millisecond)
	}
	snaps := tc.replicaSnapshots()
	for i := 1; i < len(snaps); i++ {
		if !bytes.Equal(snaps[0], snaps[i]) {
			t.Fatalf("node states differ (%d and %d bytes)", len(snaps[0]), len(snaps[i]))
		}
	}
	leaderSet := tc.settingsIn(l)
	if leaderSet.MaxTTL != DefaultMaxTTL || leaderSet.SessionGrace != 3*time.Second || leaderSet.DedupWindow != 1<<16 {
		t.Fatalf("the leader's settings: %s", leaderSet)
	}
	if got := tc.settingsIn(f); got != leaderSet {
		t.Fatalf("the follower's settings in force: %s\nthe leader's: %s", got, leaderSet)
	}
	var grace time.Duration
	tc.nodes[f].batch(func(tx *core.Tx) { grace = tx.SessionGrace() })
	if grace != 3*time.Second {
		t.Fatalf("the follower's engine runs with grace %v, want the leader's 3s", grace)
	}

	// The leader's log replayed into state machines with other flags (the
	// snapshots hold the de-duplication window's size too).
	mu.Lock()
	log := logs["n"+strconv.Itoa(l)]
	mu.Unlock()
	flags := []func(*Config){
		nil,
		small,
		func(c *Config) {
			c.MaxTTL, c.DefaultTTL, c.SessionGrace, c.MaxSessions, c.MaxResources = 2*time.Hour, 30*time.Second, 10*time.Second, 1, 1
		},
	}
	var replays [][]byte
	for k, fl := range flags {
		d := replaySMWith(t, "replay"+strconv.Itoa(k), fl)
		for _, e := range log {
			d.Apply(e.now, e.cmds)
		}
		b, err := d.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		replays = append(replays, b)
	}
	for k := 1; k < len(replays); k++ {
		if !bytes.Equal(replays[0], replays[k]) {
			t.Fatalf("replay %d with other flags differs (%d bytes, want %d)", k, len(replays[k]), len(replays[0]))
		}
	}
}

// inForce returns the settings in force on a replayed server.
func inForce(s *Server) settings {
	var st settings
	s.batch(func(*core.Tx) { st = s.set })
	return st
}

// A log's genesis puts its settings in force; a genesis of an earlier
// version, without settings, leaves the node's own in force until the first
// opParams, which then puts the leader's in force, every later command
// applied with them (a ttl above the node's own max is granted).
func TestClusterGenesisAndParamsSetTheSettings(t *testing.T) {
	const ms = int64(time.Millisecond)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	leader := replaySettings
	leader.MaxTTL, leader.SessionGrace, leader.DedupWindow = 2*time.Hour, 7*time.Second, 500
	own := func(c *Config) { c.MaxTTL, c.SessionGrace = time.Minute, time.Second }
	oldGenesis := appendGenesis(nil, t0, "")
	oldGenesis = oldGenesis[:len(oldGenesis)-1] // without the settings (their length, 0)
	lock := dedupCmd("x/1/1", 2, &logCmd{op: opFrames, node: "x", conn: "x/1/1", session: "s1",
		frames: [][]byte{[]byte("lock 1 a 120000 0 0 o1")}})
	attach := dedupCmd("x/1/1", 1, &logCmd{op: opAttach, node: "x", conn: "x/1/1", session: "s1"})
	params := dedupCmd("", 0, &logCmd{op: opParams, params: leader.String()})
	locks := func(s *Server) int {
		n := 0
		s.batch(func(tx *core.Tx) { tx.SessionLocks("s1", func(core.LockInfo) { n++ }) })
		return n
	}

	// New genesis: the leader's settings from the first entry on.
	s := replayServer(t, "new", own)
	s.cl.dedup.Apply(t0, [][]byte{cluster0(appendGenesis(nil, t0, leader.String()))})
	if got := inForce(s); got != leader {
		t.Fatalf("after the genesis: %s, want %s", got, leader)
	}
	s.cl.dedup.Apply(t0+ms, [][]byte{attach, lock})
	if locks(s) != 1 {
		t.Fatal("a ttl within the genesis' max was refused")
	}

	// Old genesis: the node's own until the opParams.
	s = replayServer(t, "old", own)
	s.cl.dedup.Apply(t0, [][]byte{cluster0(oldGenesis)})
	if got := inForce(s); got.MaxTTL != time.Minute || got.SessionGrace != time.Second {
		t.Fatalf("after an old genesis: %s, want the node's own", got)
	}
	s.cl.dedup.Apply(t0+ms, [][]byte{attach, lock})
	if locks(s) != 0 {
		t.Fatal("a ttl above the node's own max was granted before any settings were in the log")
	}
	s.cl.dedup.Apply(t0+2*ms, [][]byte{params, dedupCmd("x/1/1", 3, &logCmd{op: opFrames, node: "x", conn: "x/1/1",
		session: "s1", frames: [][]byte{[]byte("lock 2 a 120000 0 0 o1")}})})
	if got := inForce(s); got != leader {
		t.Fatalf("after the opParams: %s, want %s", got, leader)
	}
	if locks(s) != 1 {
		t.Fatal("a ttl within the leader's max was refused after its opParams")
	}
	if s.cl.dedup.Window() != 500 {
		t.Fatalf("de-duplication window %d, want the leader's 500", s.cl.dedup.Window())
	}

	// Settings that do not apply (out of range) leave those in force.
	bad := leader
	bad.DefaultTTL = 3 * time.Hour // above max-ttl
	s.cl.dedup.Apply(t0+3*ms, [][]byte{dedupCmd("", 0, &logCmd{op: opParams, params: bad.String()})})
	if got := inForce(s); got != leader {
		t.Fatalf("after settings out of range: %s, want %s", got, leader)
	}

	// The snapshot carries them: a node with other flags restores them.
	snap, err := s.cl.dedup.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	r := replayServer(t, "restored", nil)
	if err := r.cl.dedup.Restore(snap); err != nil {
		t.Fatal(err)
	}
	if got := inForce(r); got != leader || r.cl.dedup.Window() != 500 {
		t.Fatalf("restored: %s window %d, want %s", got, r.cl.dedup.Window(), leader)
	}
	if snap2, _ := r.cl.dedup.Snapshot(); !bytes.Equal(snap, snap2) {
		t.Fatal("the restored state snapshots differently")
	}

	// An older snapshot, without them, restores with the node's own.
	rs, err := (&replica{s}).Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	d := decoder{p: rs[len(sessionsMagic)+1:]}
	d.str()
	v1 := append([]byte(sessionsMagicV1), rs[len(sessionsMagic)])
	v1 = append(v1, d.p...)
	o := replayServer(t, "old-snapshot", own)
	if err := (&replica{o}).Restore(v1); err != nil {
		t.Fatal(err)
	}
	if got := inForce(o); got.MaxTTL != time.Minute || got.SessionGrace != time.Second {
		t.Fatalf("an old snapshot restored with %s, want the node's own", got)
	}
	if locks(o) != 1 {
		t.Fatal("the old snapshot's lock is gone")
	}
}

// dedupCmd is a log command framed for the de-duplication window.
func dedupCmd(client string, seq uint64, m *logCmd) []byte {
	if m.seq == 0 {
		m.seq = seq
	}
	return cluster.DedupCommand(client, seq, appendLogCmd(nil, m))
}

// cluster0 frames a command without a de-duplication key.
func cluster0(body []byte) []byte { return cluster.DedupCommand("", 0, body) }
