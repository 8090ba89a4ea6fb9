package server

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/mlock-dev/mlock"
)

// The status command shows a membership change as soon as the change is
// answered: asked of the leader right after "cluster remove" of a follower
// (running, or stopped and failing), its view no longer lists it, and right
// after "cluster join" it lists it again (mlock cluster status takes the
// members from the leader's view).
func TestClusterStatusRightAfterMembershipChange(t *testing.T) {
	t.Parallel()
	for _, stopped := range []bool{false, true} {
		t.Run("stopped="+strconv.FormatBool(stopped), func(t *testing.T) {
			tc := newTestClusterWith(t, 3, false, func(tc *testCluster) {
				tc.configure = func(_ int, c *Config) { c.StatusRate = -1 }
			})
			l := tc.leader()
			via, gone := (l+1)%3, (l+2)%3 // a follower asks to remove the other follower
			id := "n" + strconv.Itoa(gone)
			if stopped {
				tc.stop(gone)
				deadline := time.Now().Add(30 * time.Second)
				// The leader found, not assumed: with gone stopped, a busy
				// machine may move the leadership to via.
				for l = tc.leaderNow(l); !peerFailing(tc.nodes[l].ClusterStatus(), id); l = tc.leaderNow(l) {
					if time.Now().After(deadline) {
						t.Fatalf("the leader does not see %s failing", id)
					}
					time.Sleep(10 * time.Millisecond)
				}
				via = 3 - l - gone
			}
			c, err := mlock.New("mlock://" + tc.addrs[via])
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			lc, err := mlock.New("mlock://" + tc.addrs[l])
			if err != nil {
				t.Fatal(err)
			}
			defer lc.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			members := func() []string {
				t.Helper()
				st, err := lc.Status(ctx)
				if err != nil || st.Cluster == nil {
					t.Fatalf("the leader's status: %+v, %v", st, err)
				}
				var ids []string
				for _, p := range st.Cluster.Peers {
					ids = append(ids, p.ID)
				}
				return ids
			}
			if got := members(); len(got) != 3 {
				t.Fatalf("members before the change: %v", got)
			}
			if err := c.ClusterRemove(ctx, id); err != nil {
				t.Fatalf("ClusterRemove(%s): %v", id, err)
			}
			if got := members(); len(got) != 2 || slices.Contains(got, id) {
				t.Fatalf("the leader's status right after removing %s: members %v", id, got)
			}
			if stopped {
				return
			}
			if err := c.ClusterJoin(ctx, id, "raft"+strconv.Itoa(gone)); err != nil {
				t.Fatalf("ClusterJoin(%s): %v", id, err)
			}
			if got := members(); len(got) != 3 || !slices.Contains(got, id) {
				t.Fatalf("the leader's status right after %s joined again: members %v", id, got)
			}
		})
	}
}

func peerFailing(st *ClusterStatus, id string) bool {
	for _, p := range st.Peers {
		if p.ID == id {
			return p.Failing
		}
	}
	return false
}
