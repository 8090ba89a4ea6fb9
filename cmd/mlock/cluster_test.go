package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/internal/proctest"
	"github.com/mlock-dev/mlock/internal/testcert"
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
	ids, client, _ := startCluster(t)
	uri := func(nodes ...int) string {
		var a []string
		for _, i := range nodes {
			a = append(a, client[i])
		}
		return "mlock://" + strings.Join(a, ",")
	}
	leader := clusterLeader(t, uri(0, 1, 2), ids)
	f1, f2 := (leader+1)%n, (leader+2)%n
	// The commands below wait up to 20 s (not the default 5 s): on a busy
	// machine a node's session waits seconds for its log.
	// A follower removed through the other one.
	stdout, stderr, code := runMlock(t, "cluster", "remove", "--uri", uri(f2), "--timeout", "20s", ids[f1])
	for try := 0; try < 3 && code != 0 && (strings.Contains(stderr, "outcome unknown") || strings.Contains(stderr, "connection")); try++ {
		// A leader that lost its leadership while it committed the change
		// (a busy machine's election) says so, and a node without a leader
		// for its session's connect closes the connection: the operator
		// asks again; a change already made is then "no member".
		stdout, stderr, code = runMlock(t, "cluster", "remove", "--uri", uri(f2), "--timeout", "20s", ids[f1])
		if code != 0 && strings.Contains(stderr, "no member") {
			stdout, code = "node "+ids[f1]+" removed\n", 0
		}
	}
	if code != 0 || stdout != "node "+ids[f1]+" removed\n" {
		t.Fatalf("cluster remove %s: exit %d, stdout %q, stderr %q", ids[f1], code, stdout, stderr)
	}
	// On a busy machine the two left may hold an election first: "no leader
	// known" is then the right answer, and the status is asked again.
	for deadline := time.Now().Add(10 * time.Second); ; {
		stdout, stderr, code = runMlock(t, "cluster", "status", "--uri", uri(leader, f2), "--timeout", "20s")
		if code == 0 || stderr != "mlock cluster status: no leader known\n" || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond) // poll interval
	}
	if code != 0 || listsNode(stdout, ids[f1]) || !listsNode(stdout, ids[leader]) || !listsNode(stdout, ids[f2]) {
		t.Fatalf("cluster status right after removing %s: exit %d, stderr %q\n%s", ids[f1], code, stderr, stdout)
	}
	// The table's first line names the cluster version (not only --json).
	if first, _, _ := strings.Cut(stdout, "\n"); !strings.Contains(first, ", cluster version ") {
		t.Errorf("cluster status: the leader's line names no cluster version: %q", first)
	}
	// The leader removes itself.
	stdout, stderr, code = runMlock(t, "cluster", "remove", "--uri", uri(f2), "--timeout", "20s", ids[leader])
	if code != 0 {
		t.Fatalf("cluster remove %s (the leader): exit %d, stdout %q, stderr %q", ids[leader], code, stdout, stderr)
	}
	// A survivor that has not applied the change yet (a busy machine's
	// follower learns the commit with the next heartbeat) still names the
	// old leader, which answers that it is not a member: true, and asked
	// again until the change is applied.
	for deadline := time.Now().Add(20 * time.Second); ; {
		stdout, stderr, code = runMlock(t, "cluster", "status", "--uri", uri(f2), "--timeout", "20s")
		row := nodeRow(stdout, ids[leader])
		if row == "" || !strings.HasSuffix(row, " not a member") || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond) // poll interval: the follower applies the change
	}
	if listsNode(stdout, ids[leader]) || strings.Contains(stdout, client[leader]) || !listsNode(stdout, ids[f2]) {
		t.Fatalf("cluster status right after the leader %s removed itself: exit %d, stderr %q\n%s", ids[leader], code, stderr, stdout)
	}
	if code != 0 && stderr != "mlock cluster status: no leader known\n" {
		t.Fatalf("cluster status during the election: exit %d, stderr %q", code, stderr)
	}
}

// startCluster starts a cluster of three nodes, a, b and c, in this
// process, each on a free loopback address for its clients and another
// for raft, stopped when the test ends. It returns their ids, their client
// addresses and the functions that stop each earlier.
func startCluster(t *testing.T) (ids, client []string, stops []func()) {
	t.Helper()
	const n = 3
	ids = []string{"a", "b", "c"}
	var raftAddr []string
	var peers []server.ClusterPeer
	for i := range n {
		client = append(client, proctest.FreeAddr(t))
		raftAddr = append(raftAddr, proctest.FreeAddr(t))
		peers = append(peers, server.ClusterPeer{ID: ids[i], Addr: raftAddr[i]})
	}
	stops = make([]func(), n)
	for i := range n {
		_, stops[i] = servertest.Start(t, server.Config{Addr: client[i], StatusRate: -1, SessionGrace: 3 * time.Second,
			Cluster: &server.ClusterConfig{ID: ids[i], RaftAddr: raftAddr[i], ClientAddr: client[i], Bootstrap: true,
				Peers: peers, Secret: []byte("0123456789abcdef-cluster-cli-test")}}, client[i])
	}
	return ids, client, stops
}

// clusterLeader asks mlock cluster status at uri until it names a leader,
// for at most 20 s, and returns the leader's index in ids.
func clusterLeader(t *testing.T, uri string, ids []string) int {
	t.Helper()
	leader := -1
	for deadline := time.Now().Add(20 * time.Second); leader < 0; {
		stdout, _, code := runMlock(t, "cluster", "status", "--uri", uri, "--timeout", "2s")
		for i, id := range ids {
			if code == 0 && strings.HasPrefix(stdout, "leader "+id+" ") {
				leader = i
			}
		}
		if leader < 0 && time.Now().After(deadline) {
			t.Fatalf("no leader: %s", stdout)
		}
	}
	return leader
}

// listsNode reports whether a cluster status table has a row for id.
func listsNode(table, id string) bool { return nodeRow(table, id) != "" }

// nodeRow returns the row of id in a cluster status table, or "".
func nodeRow(table, id string) string {
	for _, l := range strings.Split(table, "\n") {
		if strings.HasPrefix(l, id+" ") {
			return strings.TrimRight(l, " ")
		}
	}
	return ""
}

// With two of its three nodes stopped, the survivor answers mlock cluster
// status with its own row (role, term, indexes) although it knows no
// leader: the probe needs no session, whose connect waits for the log (5 s,
// longer than the --timeout here, after which the row said EOF).
func TestClusterStatusWithoutLeader(t *testing.T) {
	t.Parallel()
	const n = 3
	ids, client, stops := startCluster(t)
	leader := clusterLeader(t, "mlock://"+strings.Join(client, ","), ids)
	survivor := (leader + 1) % n
	// The survivor has applied the log's first entries (a follower learns
	// the commit index with the leader's next append: on a busy machine the
	// leader could be stopped before it told).
	for deadline := time.Now().Add(30 * time.Second); ; {
		stdout, _, _ := runMlock(t, "cluster", "status", "--json", "--uri", "mlock://"+client[survivor], "--timeout", "2s")
		var views []nodeView
		if json.Unmarshal([]byte(stdout), &views) == nil && len(views) > 0 && views[0].Status != nil &&
			views[0].Status.ID == ids[survivor] && views[0].Status.AppliedIndex > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the survivor %s applied nothing in 30 s:\n%s", ids[survivor], stdout)
		}
		time.Sleep(100 * time.Millisecond) // polled: status has no event to wait on
	}
	stops[leader]()
	stops[(leader+2)%n]()
	// The survivor may still believe in the leader for a moment; its row
	// must be there at once either way.
	t0 := time.Now()
	stdout, stderr, code := runMlock(t, "cluster", "status", "--uri", "mlock://"+client[survivor], "--timeout", "2s")
	t.Logf("the survivor's row in %v", time.Since(t0).Round(time.Millisecond))
	var row []string
	for _, l := range strings.Split(stdout, "\n") {
		if f := strings.Fields(l); len(f) >= 8 && f[0] == ids[survivor] {
			row = f
		}
	}
	// NODE ADDRESS ROLE TERM LAST COMMIT APPLIED LAG MEMBER
	if row == nil || row[1] != client[survivor] || (row[2] != "follower" && row[2] != "candidate" && row[2] != "leader") ||
		row[3] == "-" || row[4] == "-" || row[6] == "-" {
		t.Fatalf("cluster status on the survivor %s: exit %d, stderr %q: no row of its own\n%s", ids[survivor], code, stderr, stdout)
	}
	// Once it has seen that no leader is left, it says so, still with its row.
	for deadline := time.Now().Add(20 * time.Second); ; {
		stdout, stderr, code = runMlock(t, "cluster", "status", "--json", "--uri", "mlock://"+client[survivor], "--timeout", "2s")
		if code == exitError && stderr == "mlock cluster status: no leader known\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster status on the survivor alone: exit %d, stderr %q\n%s", code, stderr, stdout)
		}
		time.Sleep(200 * time.Millisecond) // poll interval: the survivor's election timeout
	}
	// (The leader it still names, if any, is asked too, and has a row of
	// its own: unreachable.)
	var views []nodeView
	if err := json.Unmarshal([]byte(stdout), &views); err != nil || len(views) == 0 || views[0].Status == nil {
		t.Fatalf("cluster status --json on the survivor alone: %v\n%s", err, stdout)
	}
	if st := views[0].Status; st.ID != ids[survivor] || st.Role == "leader" || st.Term == 0 || st.AppliedIndex == 0 ||
		st.LogFormat == 0 || len(st.Peers) != n {
		t.Fatalf("cluster status --json on the survivor alone: %+v", *st)
	}
}

// The cluster probe speaks TLS to a TLS listener (mlocks://): a single
// server answers it, through the handshake, that it is no cluster node; a
// probe that does not speak the listener's protocol gets no view.
func TestClusterProbeTLS(t *testing.T) {
	t.Parallel()
	ca := testcert.New(t)
	cert, key := ca.Server(t)
	addr, _ := servertest.Start(t, server.Config{TLSCertFile: cert, TLSKeyFile: key, StatusRate: -1}, "")
	// Bounds of seconds for the machine's sake: a TLS handshake with the
	// race-enabled server takes seconds on a busy machine.
	o, err := clientOptions("mlocks://"+addr+"?tls-ca="+ca.CertFile(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if st, err := probeCluster(ctx, o, addr); !errors.Is(err, errNotClusterNode) {
		t.Fatalf("probe over TLS of a single server: %+v, %v; want %v", st, err, errNotClusterNode)
	}
	plain := o
	plain.TLS = nil
	if st, err := probeCluster(ctx, plain, addr); err == nil || errors.Is(err, errNotClusterNode) {
		t.Fatalf("plain probe of a TLS listener: %+v, %v; want a failure", st, err)
	}
	stdout, _, code := runMlock(t, "cluster", "status", "--uri", "mlocks://"+addr+"?tls-ca="+ca.CertFile(), "--timeout", "10s")
	if code != exitError || !strings.Contains(stdout, "not a cluster node") {
		t.Fatalf("cluster status of a single TLS server: exit %d\n%s", code, stdout)
	}
}
