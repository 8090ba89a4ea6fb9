package server

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/internal/cluster"
)

// A client on a follower that sends its requests without waiting for the
// answers gets every answer, in order, each request applied once and in the
// order sent: the follower forwards a connection's commands behind each
// other and the leader queues each behind the previous one. Also with the
// leader stopped midway (the follower proposes what was on its way again,
// in order, to the next leader), and with a leader that does not pipeline
// (an older build: the follower forwards one at a time).
func TestClusterFollowerPipelines(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name       string
		stopLeader bool
		oldLeader  bool
	}{
		{"steady", false, false},
		{"leader stopped", true, false},
		{"older leader", false, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// The applies are held from the first round until the leader
			// has queued a command behind another (or a third of the
			// rounds are sent): the requests find earlier ones on their
			// way however fast, or busy, the machine. After that, an entry
			// takes at least 1 ms to apply.
			var hold atomic.Bool
			release := make(chan struct{})
			tc := newTestClusterWith(t, 3, false, func(tc *testCluster) {
				tc.hooks.noProposeNext = tt.oldLeader
				tc.hooks.apply = func(string, int64, [][]byte) {
					if hold.Load() {
						<-release
					}
					time.Sleep(time.Millisecond)
				}
			})
			l := tc.leader()
			f := (l + 1) % 3
			c := tc.dial(f, "pipe")
			c.expect("connected 1.0 new * **")
			// Each round locks p and releases it: a trylock applied before
			// the release before it would fail (p held), a release applied
			// before its trylock would release nothing.
			const rounds = 300
			results := make(chan string, 2*rounds)
			go func() {
				defer close(results)
				for {
					p, err := c.next(30 * time.Second)
					if err != nil {
						return
					}
					if strings.HasPrefix(p, "result ") {
						results <- p
					}
				}
			}()
			released := false
			free := func() {
				if !released {
					released = true
					hold.Store(false)
					close(release)
				}
			}
			defer free() // before the cluster stops
			hold.Store(true)
			var queued uint64
			for i := range rounds {
				c.write(append(frame(fmt.Sprintf("trylock %d p 10000 o", 2*i+1)), frame(fmt.Sprintf("releaseall %d o", 2*i+2))...))
				if !released && (i == rounds/3-1 || tc.nodes[l].cl.queuedNext.Load() > 0) {
					free()
				}
				if tt.stopLeader && i == rounds/3 {
					queued = tc.nodes[l].cl.queuedNext.Load()
					tc.stop(l)
				}
				time.Sleep(200 * time.Microsecond) // the test's input: requests arrive while earlier ones commit
			}
			for i := range 2 * rounds {
				var got string
				select {
				case p, ok := <-results:
					if !ok {
						t.Fatalf("the connection ended after %d answers", i)
					}
					got = p
				case <-time.After(30 * time.Second):
					t.Fatalf("no answer %d within 30 s", i+1)
				}
				f := strings.Fields(got)
				ok := len(f) == 4 && f[1] == fmt.Sprint(i+1) && f[2] == "success"
				if ok && i%2 == 1 {
					ok = f[3] == "1" // one lock released
				}
				if !ok {
					t.Fatalf("answer %d: %q", i+1, got)
				}
			}
			if !tt.stopLeader {
				queued = tc.nodes[l].cl.queuedNext.Load()
			}
			switch {
			case tt.oldLeader && queued != 0:
				t.Fatalf("the leader that does not pipeline queued %d commands behind others", queued)
			case !tt.oldLeader && queued == 0:
				t.Fatal("the follower forwarded no command behind another")
			}
			if tt.oldLeader {
				fw := tc.nodes[f].cl.fwd
				fw.mu.Lock()
				fc := fw.conns[tc.addrs[l]]
				fw.mu.Unlock()
				if fc == nil || !fc.noNext.Load() {
					t.Fatal("the follower did not note that the leader does not pipeline")
				}
			}
			t.Logf("%d commands queued behind another on the leader", queued)
		})
	}
}

// The leader queues a command forwarded as fwdProposeNext only behind the
// one just before it of the same follower connection (same key, the
// previous sequence number, queued by this forwarding connection); else it
// does nothing and answers fwdNotLeader. A follower's commands then apply
// as a prefix of what it sent, in order.
func TestClusterForwardedChain(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, false)
	// The commands are written in the format of the version in force: a
	// command below it from a forwarding connection that said nothing is
	// answered "ask again" (checkForwarded) while the version rises.
	waitClusterVersion(t, tc, logFormat)
	for try := 1; ; try++ {
		l := tc.leader()
		term := tc.nodes[l].cl.node.Term()
		err := forwardedChain(t, tc, l)
		if tc.nodes[l].cl.node.Term() == term && tc.nodes[l].cl.node.IsLeader() {
			if err != nil {
				t.Fatal(err)
			}
			return
		}
		// Another election meanwhile: the answers are those of no leader.
		if try == 3 {
			t.Fatalf("the leadership changed during each of %d tries (last: %v)", try, err)
		}
	}
}

// forwardedChain runs TestClusterForwardedChain's steps against the leader
// l, on two forwarding connections.
func forwardedChain(t *testing.T, tc *testCluster, l int) error {
	srv := tc.nodes[l]
	var id uint64
	type fwdClient struct {
		c       *raw
		answers map[uint64]byte
	}
	dial := func() *fwdClient {
		return &fwdClient{c: tc.dialForward(l), answers: map[uint64]byte{}}
	}
	// ask sends a command of kind for key and seq on f and returns the
	// answer's status.
	ask := func(f *fwdClient, kind byte, key string, seq uint64) (byte, error) {
		id++
		want := id
		body := srv.cl.encode(&logCmd{op: opDetach, node: "elsewhere", conn: key, session: "nobody"}) // does nothing
		req := append([]byte{kind}, cluster.DedupCommand(key, seq, body)...)
		f.c.write(frame(string(append(binary.BigEndian.AppendUint64(nil, want), req...))))
		for {
			if st, ok := f.answers[want]; ok {
				return st, nil
			}
			p, err := f.c.next(10 * time.Second)
			if err != nil {
				return 0, fmt.Errorf("no answer to request %d: %v", want, err)
			}
			if len(p) < 9 {
				return 0, fmt.Errorf("short answer %q", p)
			}
			f.answers[binary.BigEndian.Uint64([]byte(p))] = p[8]
		}
	}
	one, two := dial(), dial()
	before := srv.cl.queuedNext.Load()
	for _, step := range []struct {
		on   *fwdClient
		kind byte
		key  string
		seq  uint64
		want byte
		why  string
	}{
		{one, fwdPropose, "a", 10, fwdOK, "a first command"},
		{one, fwdProposeNext, "a", 11, fwdOK, "the next one"},
		{two, fwdProposeNext, "a", 12, fwdNotLeader, "the one before came on another forwarding connection"},
		{one, fwdProposeNext, "a", 13, fwdNotLeader, "a gap: 12 was not queued here"},
		{one, fwdProposeNext, "a", 14, fwdNotLeader, "after a refusal: the chain is broken"},
		{one, fwdProposeNext, "a", 12, fwdNotLeader, "the chain ended with the refusal"},
		{one, fwdProposeNext, "b", 1, fwdNotLeader, "no earlier command of b"},
		{one, fwdPropose, "a", 12, fwdOK, "the follower starts over"},
		{one, fwdProposeNext, "a", 13, fwdOK, "and goes on"},
	} {
		got, err := ask(step.on, step.kind, step.key, step.seq)
		if err != nil {
			return err
		}
		if got != step.want {
			return fmt.Errorf("%c %s/%d (%s): status %d, want %d", step.kind, step.key, step.seq, step.why, got, step.want)
		}
	}
	if n := srv.cl.queuedNext.Load() - before; n != 2 {
		return fmt.Errorf("%d commands queued behind another, want 2", n)
	}
	return nil
}

// A connection that sent nothing for longer than its last log command's
// bound, long answered, is not given up: its next requests are answered, on
// the leader and on a follower; nor is a connection that sends a log
// command now and then, its oldest answered ones past their bound.
func TestClusterIdlePastTheBound(t *testing.T) {
	t.Parallel()
	tc := newTestClusterWith(t, 3, false, func(tc *testCluster) { tc.hooks.noLeaderWait = time.Second })
	l := tc.leader()
	var cs []*raw
	for i := range 12 {
		c := tc.dial([]int{l, (l + 1) % 3}[i%2], fmt.Sprintf("idle%d", i))
		c.expect("connected 1.0 new * **")
		c.send("ping 1")
		c.expect("result 1 success pong")
		cs = append(cs, c)
	}
	time.Sleep(1500 * time.Millisecond) // fixed: idle past the bound (1 s), the test's input
	// Each round asks every connection at once, then reads every answer:
	// a connection asks its next only once its last is answered, and the
	// twelve wait for the log together, not one after another.
	round := func(n int, what string) {
		t.Helper()
		for _, c := range cs {
			c.send(fmt.Sprintf("ping %d", n))
		}
		for i, c := range cs {
			if p, err := c.next(10 * time.Second); err != nil || p != fmt.Sprintf("result %d success pong", n) {
				t.Fatalf("connection %d (on the %s), ping %d %s: %q, %v", i, []string{"leader", "follower"}[i%2], n, what, p, err)
			}
		}
	}
	round(2, "after idling")
	// A slow, steady client: more answered commands than may be on their
	// way (maxInflight), the oldest far past its bound.
	for n := 3; n < 3+2*maxInflight; n++ {
		time.Sleep(150 * time.Millisecond) // fixed: the client's pace, the test's input
		round(n, "at a steady pace")
	}
}

// A follower's log commands on their way to a leader that does not answer
// them (its log stalled, while it still leads) are bounded as when there is
// no leader (docs/cluster.md, "Bounded waits"): a lock whose wait timeout
// passes is answered timeout, then the connection is closed; nothing waits
// for the client's next request to notice.
func TestClusterFollowerBoundsForwardedWaits(t *testing.T) {
	t.Parallel()
	tc := newTestClusterWith(t, 3, false, func(tc *testCluster) { tc.hooks.noLeaderWait = 2 * time.Second })
	l := tc.leader()
	waitClusterVersion(t, tc, logFormat3) // locks carry their deadline
	c := tc.dial((l+1)%3, "stalled")
	c.expect("connected 1.0 new * **")
	tc.hooks.dropForwarded.Store(true)
	start := time.Now()
	c.send("lock 1 q 10000 300 0") // waits at most 300 ms: answered at its least wait, 1 s
	c.expectTimedOut("1")
	if d := time.Since(start); d < time.Second || d > 1900*time.Millisecond {
		t.Fatalf("answered after %v, want about 1 s (the lock's least wait), before noLeaderWait", d)
	}
	c.closed()
}

// A follower that applies a command's entry before the leader's answer to
// the forwarded command comes writes the answer once, from its apply, and
// does not give the connection up when the command's bound passes while it
// still waits for the leader's answer.
func TestClusterFollowerAppliedBeforeTheLeaderAnswers(t *testing.T) {
	t.Parallel()
	var leader atomic.Value // the leader's id
	var slow atomic.Bool    // the leader's next apply of the marked command takes 1.5 s
	tc := newTestClusterWith(t, 3, false, func(tc *testCluster) {
		tc.hooks.noLeaderWait = 2 * time.Second
		tc.hooks.apply = func(node string, _ int64, cmds [][]byte) {
			if id, _ := leader.Load().(string); node != id {
				return
			}
			for _, c := range cmds {
				if bytes.Contains(c, []byte("slowq")) && slow.CompareAndSwap(true, false) {
					time.Sleep(1500 * time.Millisecond) // fixed: the leader's late answer, the test's input
				}
			}
		}
	})
	l := tc.leader()
	leader.Store(tc.nodes[l].cl.id)
	waitClusterVersion(t, tc, logFormat3)
	c := tc.dial((l+1)%3, "applied-first")
	c.expect("connected 1.0 new * **")
	slow.Store(true)
	c.send("lock 1 slowq 10000 300 0") // its bound: 1 s (the least wait)
	f := c.expect("result 1 success *")
	c.expect("locked " + f[3] + " * *")
	// Past the bound, and past the leader's late answer: nothing more.
	if p, err := c.next(1700 * time.Millisecond); err == nil || errors.Is(err, io.EOF) {
		t.Fatalf("after the lock's answer: %q, %v; want nothing", p, err)
	}
	c.send("ping 2")
	if p, err := c.next(5 * time.Second); err != nil || p != "result 2 success pong" {
		t.Fatalf("after the lock: %q, %v; want the ping's answer", p, err)
	}
	if slow.Load() {
		t.Fatal("the leader's apply was not slowed: the test did not test")
	}
}
