package server

import (
	"fmt"
	"strings"
	"testing"
	"time"
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
			tc := newTestClusterWith(t, 3, false, func(tc *testCluster) { tc.hooks.noProposeNext = tt.oldLeader })
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
