package server

import (
	"bytes"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/internal/cluster"
	"github.com/mlock-dev/mlock/internal/core"
	"github.com/mlock-dev/mlock/internal/proctest"
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
// anything else. Raft counts an entry applied when it hands it to the
// state machine's goroutine, a moment before the state has it: states
// taken at one applied index may differ for that moment, so until the
// deadline it takes them again until they are the same (a node whose state
// truly differs never gets there, and the caller's comparison says so).
func (tc *testCluster) replicaSnapshots() [][]byte {
	tc.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var last [][]byte
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
		if !still || tc.nodes[l].cl.node.Status().CommitIndex != commit {
			continue
		}
		last = snaps
		if allEqual(snaps) {
			return snaps
		}
		time.Sleep(10 * time.Millisecond)
	}
	if last == nil {
		tc.t.Fatal("the nodes did not reach the same applied index")
	}
	return last
}

func allEqual(bs [][]byte) bool {
	for _, b := range bs[1:] {
		if !bytes.Equal(bs[0], b) {
			return false
		}
	}
	return true
}

// The leader's settings are in force on every node, whatever the node's own
// flags: a follower with a smaller max TTL and session grace grants the
// lock the leader would (its client's included), announces the leader's
// grace, starts a detached session's grace with the leader's, and its
// state stays the leader's byte for byte. A replay of the same log into
// state machines with other flags gives the same state.
func TestClusterLeaderSettingsInForce(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	logs := map[string][]replayEntry{}
	apply := func(node string, now int64, cmds [][]byte) {
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
		tc.hooks.apply = apply
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
	for i := range 3 { // each node once it has applied the grants
		proctest.WaitFor(t, 10*time.Second, fmt.Sprintf("n%d holding one lock for each session", i), func() bool {
			return tc.sessionLocks(i, "onfollower") == 1 && tc.sessionLocks(i, "onleader") == 1
		})
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
			t.Fatalf("node states differ (%d and %d bytes)\n%q\n%q", len(snaps[0]), len(snaps[i]), snaps[0], snaps[i])
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
	t.Parallel()
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

// The replicated settings' text is part of the log's format: these are
// the texts the build before the settings table wrote (a genesis or an
// opParams of a node started with mlockd's defaults, with Config's zero
// value, and with other limits), recorded byte for byte. This build
// writes the same bytes for the same Config, and a log carrying them puts
// the same settings in force.
func TestReplicatedSettingsTextUnchanged(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		cfg  Config
		text string
	}{
		{"mlockd's defaults", Config{MaxResources: DefaultMaxResources, MaxNameLen: DefaultMaxNameLen, MaxQueueLen: DefaultMaxQueueLen,
			Cluster: &ClusterConfig{}},
			"dedup-window=65536 default-ttl=1m0s max-entries=4000000 max-locks=1000000 max-locks-per-session=100000 max-name-bytes=268435456 max-name-len=512 max-offline-bytes=1048576 max-queue-len=100000 max-resources=64 max-session-bytes=8388608 max-sessions=20000 max-timeout=24h0m0s max-ttl=24h0m0s session-grace=15s"},
		{"zero Config", Config{},
			"dedup-window=65536 default-ttl=1m0s max-entries=4000000 max-locks=1000000 max-locks-per-session=100000 max-name-bytes=268435456 max-name-len=0 max-offline-bytes=1048576 max-queue-len=0 max-resources=0 max-session-bytes=8388608 max-sessions=20000 max-timeout=24h0m0s max-ttl=24h0m0s session-grace=15s"},
		{"no limits", Config{MaxQueueLen: -1, MaxLocks: -1, MaxResources: -5, MaxSessions: -1, MaxOfflineBytes: -1, SessionGrace: -1},
			"dedup-window=65536 default-ttl=1m0s max-entries=4000000 max-locks=9223372036854775807 max-locks-per-session=100000 max-name-bytes=268435456 max-name-len=0 max-offline-bytes=9223372036854775807 max-queue-len=-1 max-resources=-5 max-session-bytes=8388608 max-sessions=9223372036854775807 max-timeout=24h0m0s max-ttl=24h0m0s session-grace=-1ns"},
		{"other limits", Config{MaxQueueLen: 7, MaxResources: 3, MaxNameLen: 9, MaxTTL: time.Hour, DefaultTTL: time.Minute,
			MaxTimeout: 2 * time.Hour, Cluster: &ClusterConfig{DedupWindow: 1000}, MaxSessions: 5, MaxOfflineBytes: 77, MaxEntries: 8,
			MaxNameBytes: 9, MaxSessionBytes: 10, MaxLocksPerSession: 11},
			"dedup-window=1000 default-ttl=1m0s max-entries=8 max-locks=1000000 max-locks-per-session=11 max-name-bytes=9 max-name-len=9 max-offline-bytes=77 max-queue-len=7 max-resources=3 max-session-bytes=10 max-sessions=5 max-timeout=2h0m0s max-ttl=1h0m0s session-grace=15s"},
	} {
		cfg := c.cfg.withDefaults()
		st := settingsOf(&cfg)
		if got := st.String(); got != c.text {
			t.Errorf("%s: this build writes\n%s\nthe build before wrote\n%s", c.name, got, c.text)
		}
		read, err := parseSettings(c.text, settings{})
		if err != nil || read != st {
			t.Errorf("%s: the recorded text reads as %+v, %v; want %+v", c.name, read, err, st)
		}
	}

	// A log whose genesis carries the recorded text of mlockd's defaults,
	// applied by a node started with other flags: those settings in force.
	const ms = int64(time.Millisecond)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	text := "dedup-window=500 default-ttl=30s max-entries=4000000 max-locks=1000000 max-locks-per-session=100000 max-name-bytes=268435456 max-name-len=512 max-offline-bytes=1048576 max-queue-len=2 max-resources=64 max-session-bytes=8388608 max-sessions=20000 max-timeout=24h0m0s max-ttl=2h0m0s session-grace=7s"
	s := replayServer(t, "recorded", func(c *Config) { c.MaxTTL, c.SessionGrace, c.MaxQueueLen = time.Minute, time.Second, 100 })
	s.cl.dedup.Apply(t0, [][]byte{cluster0(appendGenesis(nil, t0, text))})
	got := inForce(s)
	if got.String() != text || got.MaxTTL != 2*time.Hour || got.SessionGrace != 7*time.Second || got.MaxQueueLen != 2 ||
		got.DefaultTTL != 30*time.Second || s.cl.dedup.Window() != 500 {
		t.Fatalf("in force after the recorded genesis: %s (window %d)", got, s.cl.dedup.Window())
	}
	var grace time.Duration
	s.batch(func(tx *core.Tx) { grace = tx.SessionGrace() })
	if grace != 7*time.Second {
		t.Fatalf("the engine runs with grace %v, want the log's 7s", grace)
	}
	// The log's max-ttl (2h), not the node's (1m): a 90-minute lease is
	// granted; its max-queue-len (2): a third request on one resource is
	// refused.
	attach := dedupCmd("x/1/1", 1, &logCmd{op: opAttach, node: "x", conn: "x/1/1", session: "s1"})
	lock := dedupCmd("x/1/1", 2, &logCmd{op: opFrames, node: "x", conn: "x/1/1", session: "s1",
		frames: [][]byte{[]byte("lock 1 a 5400000 0 0 o1"), []byte("lock 2 a 1000 0 0 o2"), []byte("lock 3 a 1000 0 0 o3")}})
	s.cl.dedup.Apply(t0+ms, [][]byte{attach, lock})
	n := 0
	s.batch(func(tx *core.Tx) { tx.SessionLocks("s1", func(core.LockInfo) { n++ }) })
	if n != 2 {
		t.Fatalf("the session has %d live requests, want 2 (a 90-minute lease and one waiter; the queue full at 2)", n)
	}
}
