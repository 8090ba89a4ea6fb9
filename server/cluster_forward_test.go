package server

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"strings"
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
			tc := newTestClusterWith(t, 3, false, func(tc *testCluster) {
				tc.hooks.noProposeNext = tt.oldLeader
				// An entry takes at least 1 ms to apply: the requests,
				// 200 µs apart, find earlier ones on their way however
				// fast the machine.
				tc.hooks.apply = func(string, int64, [][]byte) { time.Sleep(time.Millisecond) }
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
			var queued uint64
			for i := range rounds {
				c.write(append(frame(fmt.Sprintf("trylock %d p 10000 o", 2*i+1)), frame(fmt.Sprintf("releaseall %d o", 2*i+2))...))
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
	l := tc.leader()
	srv := tc.nodes[l]
	nc, err := net.Dial("tcp", tc.addrs[l])
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c := &raw{t: t, nc: nc}
	c.write(frame("forward " + hex.EncodeToString(srv.cl.secret[:])))
	var id uint64
	send := func(kind byte, key string, seq uint64) uint64 {
		id++
		body := srv.cl.encode(&logCmd{op: opDetach, node: "elsewhere", conn: key, session: "nobody"}) // does nothing
		req := append([]byte{kind}, cluster.DedupCommand(key, seq, body)...)
		b := binary.BigEndian.AppendUint64(nil, id)
		c.write(frame(string(append(b, req...))))
		return id
	}
	answers := map[uint64]byte{}
	status := func(want uint64) byte {
		for {
			if st, ok := answers[want]; ok {
				return st
			}
			p, err := c.next(10 * time.Second)
			if err != nil {
				t.Fatalf("no answer to request %d: %v", want, err)
			}
			if len(p) < 9 {
				t.Fatalf("short answer %q", p)
			}
			answers[binary.BigEndian.Uint64([]byte(p))] = p[8]
		}
	}
	before := srv.cl.queuedNext.Load()
	for _, step := range []struct {
		kind byte
		key  string
		seq  uint64
		want byte
		why  string
	}{
		{fwdPropose, "a", 10, fwdOK, "a first command"},
		{fwdProposeNext, "a", 11, fwdOK, "the next one"},
		{fwdProposeNext, "a", 13, fwdNotLeader, "a gap: 12 was not queued here"},
		{fwdProposeNext, "a", 14, fwdNotLeader, "after a refusal: the chain is broken"},
		{fwdProposeNext, "a", 12, fwdNotLeader, "the chain ended with the refusal"},
		{fwdProposeNext, "b", 1, fwdNotLeader, "no earlier command of b"},
		{fwdPropose, "a", 12, fwdOK, "the follower starts over"},
		{fwdProposeNext, "a", 13, fwdOK, "and goes on"},
	} {
		if got := status(send(step.kind, step.key, step.seq)); got != step.want {
			t.Fatalf("%c %s/%d (%s): status %d, want %d", step.kind, step.key, step.seq, step.why, got, step.want)
		}
	}
	if n := srv.cl.queuedNext.Load() - before; n != 2 {
		t.Fatalf("%d commands queued behind another, want 2", n)
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
	if d := time.Since(start); d > 1900*time.Millisecond {
		t.Fatalf("answered after %v, want about 1 s (the lock's least wait), before noLeaderWait", d)
	}
	c.closed()
}
