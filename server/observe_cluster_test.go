package server

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/server/observe"
)

// In a cluster the metrics show the node's role, term and log indexes, the
// page's view its cluster, and /readyz is ready while a leader is known and
// turns not ready when the node loses its leader.
func TestClusterMetricsAndReadyz(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, false)
	l := tc.leader()
	f := (l + 1) % 3
	follower := startHTTP(t, tc.nodes[f])
	leader := startHTTP(t, tc.nodes[l])
	// A command through the follower, so that the log moves.
	c := tc.dial(f, "metrics")
	c.expect("connected 1.0 new * **")
	id := c.lock("1", "m 60000 0 0")
	c.locked(id)

	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(15 * time.Second); !ok(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	waitFor("the follower to be ready", func() bool { code, _ := get(t, follower+"/readyz"); return code == http.StatusOK })
	fams := scrape(t, follower)
	if value(t, fams, "mlock_cluster_role", "role=follower") != 1 || value(t, fams, "mlock_cluster_role", "role=leader") != 0 ||
		value(t, fams, "mlock_cluster_term") < 1 || value(t, fams, "mlock_cluster_index", "index=applied") < 1 ||
		value(t, fams, "mlock_cluster_index", "index=commit") < value(t, fams, "mlock_cluster_index", "index=applied")-0 ||
		value(t, fams, "mlock_cluster_peers") != 3 || value(t, fams, "mlock_cluster_leader_known") != 1 {
		_, body := get(t, follower+"/metrics")
		t.Fatalf("follower's cluster metrics:\n%s", grepLines(body, "mlock_cluster"))
	}
	fams = scrape(t, leader)
	if value(t, fams, "mlock_cluster_role", "role=leader") != 1 || value(t, fams, "mlock_cluster_leader_contact_seconds") != 0 {
		_, body := get(t, leader+"/metrics")
		t.Fatalf("leader's cluster metrics:\n%s", grepLines(body, "mlock_cluster"))
	}
	var view observe.View
	_, body := get(t, follower+"/api/view")
	if err := json.Unmarshal([]byte(body), &view); err != nil || view.Cluster == nil || view.Cluster.Role != "follower" ||
		view.Counts.Held != 1 {
		t.Fatalf("view on the follower: %s", body)
	}
	// Without the two others the follower has no leader: not ready.
	tc.stop(l)
	tc.stop((l + 2) % 3)
	waitFor("the follower to be not ready", func() bool {
		code, body := get(t, follower+"/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "no known leader")
	})
	if code, _ := get(t, follower+"/healthz"); code != http.StatusOK {
		t.Fatalf("healthz without a leader: %d", code)
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// A node removed from the cluster serves no client (it closes their
// connections): /readyz says so at once, not only once it stops hearing
// from the leader, and says it is removed; added again, it is ready.
func TestClusterRemovedNodeNotReady(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, false)
	l := tc.leader()
	g := (l + 1) % 3
	base := startHTTP(t, tc.nodes[g])
	c := tc.dial(g, "x")
	c.expect("connected 1.0 new * **")
	tc.change(l, g, false)
	c.closed() // the node knows it is removed
	if code, body := get(t, base+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "removed") {
		t.Fatalf("/readyz of a removed node: %d %q", code, body)
	}
	tc.change(l, g, true)
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if code, _ := get(t, base+"/readyz"); code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			_, body := get(t, base+"/readyz")
			t.Fatalf("a node added again is not ready: %s", body)
		}
	}
}

// A node that has not heard from a leader since it started counts the
// time since its start as the time since it last heard from one: 0 would
// read as "just heard from the leader", and an alert on
// mlock_cluster_leader_contact_seconds would never fire for a node cut
// off from its start.
func TestClusterLeaderContactNeverHeard(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, false)
	for i := range 3 {
		tc.stop(i)
	}
	tc.start(0) // alone: no leader can be elected
	base := startHTTP(t, tc.nodes[0])
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		code, body := get(t, base+"/readyz")
		if code == http.StatusServiceUnavailable && strings.Contains(body, "no known leader") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a node alone is still %d %q", code, body)
		}
	}
	fams := scrape(t, base)
	if value(t, fams, "mlock_cluster_leader_known") != 0 || value(t, fams, "mlock_cluster_leader_contact_seconds") <= 0 {
		_, body := get(t, base+"/metrics")
		t.Fatalf("a node that never heard from a leader:\n%s", grepLines(body, "mlock_cluster"))
	}
}
