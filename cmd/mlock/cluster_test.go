package main

import (
	"strings"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/server"
	"github.com/mlock-dev/mlock/server/servertest"
)

// mlock cluster status right after mlock cluster remove: a removed follower
// is no longer listed, and after the leader removed itself the status
// answers at once from the members left, without asking the removed node
// that the others still name as leader until they elect another (it serves
// no client any more).
func TestClusterStatusAfterRemove(t *testing.T) {
	t.Parallel()
	const n = 3
	ids := []string{"a", "b", "c"}
	var client, raftAddr []string
	var peers []server.ClusterPeer
	for i := range n {
		client = append(client, refusedAddr(t))
		raftAddr = append(raftAddr, refusedAddr(t))
		peers = append(peers, server.ClusterPeer{ID: ids[i], Addr: raftAddr[i]})
	}
	for i := range n {
		servertest.Start(t, server.Config{Addr: client[i], StatusRate: -1, SessionGrace: 3 * time.Second,
			Cluster: &server.ClusterConfig{ID: ids[i], RaftAddr: raftAddr[i], ClientAddr: client[i], Bootstrap: true,
				Peers: peers, Secret: []byte("0123456789abcdef-cluster-cli-test")}}, client[i])
	}
	uri := func(nodes ...int) string {
		var a []string
		for _, i := range nodes {
			a = append(a, client[i])
		}
		return "mlock://" + strings.Join(a, ",")
	}
	leader := -1
	deadline := time.Now().Add(20 * time.Second)
	for leader < 0 {
		stdout, _, code := runMlock(t, "cluster", "status", "--uri", uri(0, 1, 2), "--timeout", "2s")
		for i, id := range ids {
			if code == 0 && strings.HasPrefix(stdout, "leader "+id+" ") {
				leader = i
			}
		}
		if leader < 0 && time.Now().After(deadline) {
			t.Fatalf("no leader: %s", stdout)
		}
	}
	f1, f2 := (leader+1)%n, (leader+2)%n
	// A follower removed through the other one.
	stdout, stderr, code := runMlock(t, "cluster", "remove", "--uri", uri(f2), ids[f1])
	if code != 0 || stdout != "node "+ids[f1]+" removed\n" {
		t.Fatalf("cluster remove %s: exit %d, stdout %q, stderr %q", ids[f1], code, stdout, stderr)
	}
	// On a busy machine the two left may hold an election first: "no leader
	// known" is then the right answer, and the status is asked again.
	for deadline := time.Now().Add(10 * time.Second); ; {
		stdout, stderr, code = runMlock(t, "cluster", "status", "--uri", uri(leader, f2))
		if code == 0 || stderr != "mlock cluster status: no leader known\n" || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond) // poll interval
	}
	if code != 0 || listsNode(stdout, ids[f1]) || !listsNode(stdout, ids[leader]) || !listsNode(stdout, ids[f2]) {
		t.Fatalf("cluster status right after removing %s: exit %d, stderr %q\n%s", ids[f1], code, stderr, stdout)
	}
	// The leader removes itself.
	stdout, stderr, code = runMlock(t, "cluster", "remove", "--uri", uri(f2), ids[leader])
	if code != 0 {
		t.Fatalf("cluster remove %s (the leader): exit %d, stdout %q, stderr %q", ids[leader], code, stdout, stderr)
	}
	stdout, stderr, code = runMlock(t, "cluster", "status", "--uri", uri(f2))
	if listsNode(stdout, ids[leader]) || strings.Contains(stdout, client[leader]) || !listsNode(stdout, ids[f2]) {
		t.Fatalf("cluster status right after the leader %s removed itself: exit %d, stderr %q\n%s", ids[leader], code, stderr, stdout)
	}
	if code != 0 && stderr != "mlock cluster status: no leader known\n" {
		t.Fatalf("cluster status during the election: exit %d, stderr %q", code, stderr)
	}
}

// listsNode reports whether a cluster status table has a row for id.
func listsNode(table, id string) bool {
	for _, l := range strings.Split(table, "\n") {
		if strings.HasPrefix(l, id+" ") {
			return true
		}
	}
	return false
}
