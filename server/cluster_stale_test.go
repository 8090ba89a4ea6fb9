package server

import (
	"encoding/binary"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/internal/cluster"
	"github.com/mlock-dev/mlock/internal/proctest"
)

// waitPeer polls the leader l's view of member id until ok holds (15 s).
// When l no longer leads (a busy machine starved a heartbeat and the
// leadership moved), the view of the node that leads now is polled.
func (tc *testCluster) waitPeer(l int, id, what string, ok func(ClusterNode) bool) ClusterNode {
	tc.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		l = tc.leaderNow(l)
		for _, p := range tc.nodes[l].ClusterStatus().Peers {
			if p.ID == id && ok(p) {
				return p
			}
		}
		if time.Now().After(deadline) {
			tc.t.Fatalf("the leader n%d's view of %s: %+v, want %s", l, id, tc.nodes[l].ClusterStatus().Peers, what)
		}
		time.Sleep(10 * time.Millisecond) // polled: status has no event to wait on
	}
}

// leaderNow returns l if node l runs and leads, else the node that leads
// now (waited for, as leader does).
func (tc *testCluster) leaderNow(l int) int {
	tc.t.Helper()
	if s := tc.nodes[l]; s != nil && s.cl.node.IsLeader() {
		return l
	}
	return tc.leader()
}

// refusedAll is the count of forwarded commands refused as a stale
// member's, on every running node: the one that leads may have changed.
func (tc *testCluster) refusedAll() uint64 {
	var n uint64
	for _, s := range tc.nodes {
		if s != nil {
			n += s.cl.formats.refusedN.Load()
		}
	}
	return n
}

// A member that reads a format below the cluster version (here a node that
// says it reads format 1 and writes it, as the previous release writes) is
// fenced by the leader once it starts in a cluster at the raised version:
// its client's connect is refused with a clear error (nothing of it is
// applied), it is made a nonvoter and shown stale; started again on a
// build that reads the version, it is a voter again and serves.
func TestStaleMemberRefusedAndFenced(t *testing.T) {
	t.Parallel()
	var stale atomic.Int32
	stale.Store(-1)
	ownFormat := func(id string) int {
		if i := stale.Load(); i >= 0 && id == "n"+string(rune('0'+i)) {
			return logFormat1
		}
		return 0
	}
	tc := newTestClusterWith(t, 3, true, func(tc *testCluster) { tc.hooks.ownFormat = ownFormat })
	// The leader is found at each step, not assumed: on a busy machine it
	// may move (f, a follower when chosen, may lead after its restart).
	l := tc.leader()
	tc.waitFormats(l, map[string]int{"n0": logFormat, "n1": logFormat, "n2": logFormat})
	for i := range 3 {
		proctest.WaitFor(t, 15*time.Second, "the cluster version on n"+strconv.Itoa(i), func() bool {
			return tc.nodes[i].ClusterStatus().Version == logFormat
		})
	}
	l = tc.leader()
	f := (l + 1) % 3
	id := "n" + string(rune('0'+f))

	// A restart on this build is no stale member, though the node writes
	// format 1 until it has applied the version again (its detach of its
	// earlier run's sessions, at once).
	tc.stop(f)
	tc.start(f)
	r := tc.dial(f, "restarted")
	r.expect("connected 1.0 new * **")
	if n := tc.refusedAll(); n != 0 {
		t.Fatalf("the leader refused %d forwarded commands of a node of this build restarted", n)
	}
	for _, p := range tc.nodes[tc.leader()].ClusterStatus().Peers {
		if p.Stale != "" || p.Suffrage != "Voter" {
			t.Fatalf("after a restart on this build: %+v", p)
		}
	}

	// f goes back to a build that reads format 1.
	tc.stop(f)
	stale.Store(int32(f))
	tc.start(f)
	want := map[string]int{"n0": logFormat, "n1": logFormat, "n2": logFormat}
	want[id] = logFormat1
	tc.waitFormats(tc.leader(), want) // it said so: it is answered as this build is (v0.1.0 says nothing)
	c := tc.dial(f, "stale")
	c.expect("error node cannot read the cluster log!")
	p := tc.waitPeer(tc.leader(), id, "a stale nonvoter", func(p ClusterNode) bool { return p.Stale != "" && p.Suffrage == "Nonvoter" })
	t.Logf("%s fenced: %s", id, p.Stale)
	if n := tc.refusedAll(); n == 0 {
		t.Error("the leader refused no forwarded command")
	}
	// The others serve meanwhile.
	other := (f + 1) % 3
	d := tc.dial(other, "healthy")
	d.expect("connected 1.0 new * **")
	lk := d.lock("1", "r 60000 0 0")
	d.locked(lk)

	// Back on a build that reads the version: a voter again, and it serves.
	tc.stop(f)
	stale.Store(-1)
	tc.start(f)
	l = tc.leader()
	if l != f {
		tc.waitPeer(l, id, "a voter, not stale", func(p ClusterNode) bool { return p.Stale == "" && p.Suffrage == "Voter" })
	}
	e := tc.dial(f, "back")
	e.expect("connected 1.0 new * **")
}

// Which member is stale, as the leader decides it (staleWhy): the cluster
// version, what the member said, whether its forwarded command was
// refused, whether it is reached, and how long this node has led.
func TestStaleWhy(t *testing.T) {
	now := time.Now()
	cl := &clusterState{id: "n0"}
	cl.versionNow.Store(logFormat)
	cl.formats.leadSince = now.Add(-time.Minute)
	cl.formats.upSince = map[string]time.Time{"n1": now.Add(-time.Minute), "n2": now.Add(-time.Second)}
	peer := func(id string, failing bool) cluster.Peer { return cluster.Peer{ID: id, Failing: failing} }
	cases := []struct {
		name  string
		setup func()
		p     cluster.Peer
		v     int
		stale bool
	}{
		{"itself", func() {}, peer("n0", false), logFormat, false},
		{"version 1: every build reads it", func() {}, peer("n1", false), logFormat1, false},
		{"silent, reached for a minute", func() {}, peer("n1", false), logFormat, true},
		{"silent, reached for a second", func() {}, peer("n2", false), logFormat, false},
		{"silent, heartbeats failing", func() {}, peer("n1", true), logFormat, false},
		{"said the version", func() { cl.noteFormat("n1", logFormat, nil) }, peer("n1", false), logFormat, false},
		{"said a lower format", func() { cl.noteFormat("n1", logFormat-1, nil) }, peer("n1", false), logFormat, true},
		{"refused, then said the version", func() {
			cl.formats.refused = map[string]string{"n1": "refused"}
			cl.noteFormat("n1", logFormat, nil)
		}, peer("n1", false), logFormat, false},
		{"refused, said the version before (restarted on an older build)", func() {
			cl.noteFormat("n1", logFormat, nil)
			cl.formats.refused = map[string]string{"n1": "refused"}
		}, peer("n1", false), logFormat, true},
		{"refused, said nothing", func() {
			delete(cl.formats.said, "n2")
			cl.formats.refused = map[string]string{"n2": "refused"}
		}, peer("n2", false), logFormat, true},
	}
	for _, c := range cases {
		cl.formats.said, cl.formats.refused = nil, nil
		c.setup()
		if got := cl.staleWhy(c.p, c.v, now); (got != "") != c.stale {
			t.Errorf("%s: staleWhy = %q, want stale %v", c.name, got, c.stale)
		}
	}
	// A new leader waits formatFresh before it counts silence.
	cl.formats.said, cl.formats.refused = nil, nil
	cl.formats.leadSince = now.Add(-time.Second)
	if got := cl.staleWhy(peer("n1", false), logFormat, now); got != "" {
		t.Errorf("silent member, leader for a second: staleWhy = %q, want not stale", got)
	}
}

// The answer to a stale member's forwarded command: a node that told the
// leader its formats on the forwarding connection is told why (it tells its
// client); one that never did (v0.1.0, which asked again every 20 ms for
// ever) is answered as if the command had ended its connection.
func TestStaleAnswer(t *testing.T) {
	cl := &clusterState{id: "n0"}
	if st, res := cl.staleAnswer("why", true); st != fwdFailed || string(res) != staleRefusal+"why" {
		t.Errorf("on a connection that said its formats: %d %q", st, res)
	}
	if st, res := cl.staleAnswer("why", false); st != fwdOK || len(res) != 1 || res[0] != ansEnd {
		t.Errorf("on a connection that said nothing: %d %q", st, res)
	}
	if _, err := proposed(cl.staleAnswer("why", true)); !errors.Is(err, errStaleNode) {
		t.Errorf("the follower's reading of the refusal: %v, want errStaleNode", err)
	}
	told, silent := &conn{}, &conn{}
	cl.noteFormat("n1", logFormat1, told)
	if f, ok := cl.saidOn(told); !ok || f != logFormat1 {
		t.Errorf("saidOn(the connection n1 said its formats on) = %d, %v", f, ok)
	}
	if _, ok := cl.saidOn(silent); ok {
		t.Error("saidOn(a connection nothing was said on) = true")
	}
}

// What the leader does with a command below the cluster version, by the
// forwarding connection it comes on (checkForwarded): asks again while the
// connection is young and said nothing (a node of this build says its
// formats at once); proposes it once a member said there that it reads the
// version (a node of this build catching up); refuses it as a stale
// member's when a member said there that it reads less (told why), or when
// the connection stayed silent for announceGrace (v0.1.0: answered as if
// its connection had ended, so that it stops asking).
func TestForwardedBelowVersion(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, false)
	waitClusterVersion(t, tc, logFormat)
	l := tc.leader()
	srv := tc.nodes[l]
	var id uint64
	dial := func() *raw { return tc.dialForward(l) }
	// ask sends a request of kind on c and returns the answer's status and
	// result.
	ask := func(c *raw, kind byte, req []byte) (byte, string) {
		t.Helper()
		id++
		c.write(frame(string(append(binary.BigEndian.AppendUint64(nil, id), append([]byte{kind}, req...)...))))
		p, err := c.next(10 * time.Second)
		if err != nil || len(p) < 9 || binary.BigEndian.Uint64([]byte(p)) != id {
			t.Fatalf("request %d: %q, %v", id, p, err)
		}
		if p[8] == fwdNotLeader && !srv.cl.node.IsLeader() {
			t.Skip("the leadership moved") // the answers are a leader's
		}
		return p[8], p[9:]
	}
	var seq uint64
	old := func(node string) []byte { // a detach in format 1 that does nothing
		seq++
		return cluster.DedupCommand("below", seq, appendLogCmd(nil, &logCmd{op: opDetach, node: node, conn: "c", session: "nobody"}))
	}
	if l := tc.leader(); tc.nodes[l] != srv {
		t.Skip("the leadership moved") // the answers below are a leader's
	}

	catching := dial()
	if st, _ := ask(catching, fwdPropose, old("x1")); st != fwdNotLeader {
		t.Fatalf("a young connection that said nothing: status %d, want fwdNotLeader (ask again)", st)
	}
	if st, _ := ask(catching, fwdFormat, []byte("x1 "+strconv.Itoa(logFormat))); st != fwdOK {
		t.Fatalf("fwdFormat: status %d", st)
	}
	if st, res := ask(catching, fwdPropose, old("x1")); st != fwdOK || res == string([]byte{ansEnd}) {
		t.Fatalf("after the member said it reads the version: %d %q, want it proposed", st, res)
	}

	older := dial()
	if st, _ := ask(older, fwdFormat, []byte("x2 "+strconv.Itoa(logFormat-1))); st != fwdOK {
		t.Fatalf("fwdFormat: status %d", st)
	}
	if st, res := ask(older, fwdPropose, old("x2")); st != fwdFailed || !strings.HasPrefix(res, staleRefusal) {
		t.Fatalf("a member that reads less: %d %q, want refused, told why", st, res)
	}

	silent := dial()
	time.Sleep(announceGrace) // fixed: the connection's age, the test's input
	before := srv.cl.formats.refusedN.Load()
	st, res := ask(silent, fwdPropose, old("x3"))
	// The age counts from the server's accept, which a busy machine makes
	// later than the dial: "ask again" until it is announceGrace old.
	for deadline := time.Now().Add(15 * time.Second); st == fwdNotLeader && time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond) // poll interval
		st, res = ask(silent, fwdPropose, old("x3"))
	}
	if st != fwdOK || res != string([]byte{ansEnd}) {
		t.Fatalf("a silent connection: %d %q, want fwdOK, ansEnd (as if it had ended the connection)", st, res)
	}
	if srv.cl.formats.refusedN.Load() != before+1 {
		t.Fatal("the silent connection's command was not counted refused")
	}
}
