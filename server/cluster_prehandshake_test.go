package server

import (
	"bytes"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/internal/core"
	"github.com/mlock-dev/mlock/internal/proctest"
	"github.com/mlock-dev/mlock/internal/protocol"
)

// connGoroutines counts the process's goroutines of connections (their
// readers, writers, pipelines and the pipelines' watchers) and, of them,
// those of pipelines (pipeLoop and its watcher). The goroutines a
// forwarding link starts for its requests are not counted.
func connGoroutines() (all, pipes int) {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	for g := range bytes.SplitSeq(buf, []byte("\n\n")) {
		switch {
		case bytes.Contains(g, []byte("mlock/server.(*conn).pipeLoop")):
			pipes++
			all++
		case bytes.Contains(g, []byte("mlock/server.(*conn).readLoop")),
			bytes.Contains(g, []byte("mlock/server.(*conn).writeLoop")):
			all++
		}
	}
	return all, pipes
}

// preHandshakeCost opens n connections to srv (at addr) that send nothing,
// and returns the goroutines each of them added (rounded: the cluster's own
// links may come and go meanwhile) and how many pipeline goroutines they
// started in all; it closes them and waits for their goroutines to end
// (within slack: the links).
func preHandshakeCost(t *testing.T, srv *Server, addr string, n, slack int) (perConn, pipes int) {
	t.Helper()
	all0, pipes0 := connGoroutines()
	var idle []*raw
	for range n {
		idle = append(idle, dialFrom(t, addr, "127.0.0.1"))
	}
	proctest.WaitFor(t, 10*time.Second, "the connections in the pre-handshake pool", func() bool {
		got := 0
		srv.batch(func(*core.Tx) { got = srv.unauthed })
		return got == n
	})
	// Every connection but the last has its goroutines started: accept
	// starts them after its batch, before it takes the next connection.
	all, p := connGoroutines()
	for _, c := range idle {
		c.nc.Close()
	}
	proctest.WaitFor(t, 10*time.Second, "the closed connections' goroutines to end", func() bool {
		left, _ := connGoroutines()
		return left <= all0+slack
	})
	return (all - all0 + n/2) / n, p - pipes0
}

// A connection before its connect costs a cluster node what it costs a
// single node: its reader and writer, no pipeline (goroutine, context and
// watcher), which starts with its connect. A forwarding link starts none
// either. The counts are of goroutines, not of time or memory: they do not
// depend on the machine. Not parallel: it counts the process's goroutines.
func TestClusterPreHandshakeConnectionCostsWhatOneNodeCosts(t *testing.T) {
	const n = 100
	single := start(t, Config{StatusRate: -1, AuthTimeout: time.Minute})
	singlePer, singlePipes := preHandshakeCost(t, single, single.Addr().String(), n, 0)

	tc := newTestClusterWith(t, 3, false, func(tc *testCluster) {
		tc.configure = func(_ int, c *Config) { c.AuthTimeout = time.Minute }
	})
	l := tc.leader()
	f := (l + 1) % 3
	clusterPer, clusterPipes := preHandshakeCost(t, tc.nodes[f], tc.addrs[f], n, 8)
	t.Logf("goroutines per pre-handshake connection: single node %d, cluster follower %d; pipelines started: %d, %d",
		singlePer, clusterPer, singlePipes, clusterPipes)
	if clusterPer > singlePer {
		t.Errorf("a pre-handshake connection starts %d goroutines on a cluster node, %d on a single node", clusterPer, singlePer)
	}
	if clusterPipes != 0 {
		t.Errorf("%d pre-handshake connections started %d pipeline goroutines, want none", n, clusterPipes)
	}

	// A connection that waited before its connect then works as any: its
	// pipeline starts with its connect, and its requests go through the
	// log (forwarded to the leader, whose link starts no pipeline).
	waiting := dialFrom(t, tc.addrs[f], "127.0.0.1")
	refused := dialFrom(t, tc.addrs[f], "127.0.0.1")
	proctest.WaitFor(t, 10*time.Second, "two pre-handshake connections", func() bool {
		got := 0
		tc.nodes[f].batch(func(*core.Tx) { got = tc.nodes[f].unauthed })
		return got == 2
	})
	// A request before the connect is refused here, as on a single node,
	// and ends the connection.
	refused.send("ping p0")
	refused.expect("error " + protocol.CodeConnectFirst.Text())
	refused.closed()
	waiting.send("connect late 1.0")
	waiting.expect("connected 1.0 new *")
	id := waiting.lock("r1", "a 10000 0 0")
	waiting.locked(id)
	waiting.unlock("r2", id)
	waiting.ping("p1")
	if _, p := connGoroutines(); p != 2 {
		// pipeLoop and its watcher, for the connected client alone.
		t.Errorf("%d pipeline goroutines with one connected client, want 2 (its pipeline and watcher)", p)
	}
	var links int
	tc.nodes[l].batch(func(*core.Tx) { links = tc.nodes[l].adm.links })
	if links == 0 {
		t.Errorf("the follower forwarded through no link to the leader")
	}
	waiting.nc.Close()
	proctest.WaitFor(t, 10*time.Second, "the connected client's pipeline to end", func() bool {
		_, p := connGoroutines()
		return p == 0
	})
	if t.Failed() {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		for g := range strings.SplitSeq(string(buf), "\n\n") {
			if strings.Contains(g, "mlock/server.(*conn).") {
				t.Logf("%s", g)
			}
		}
	}
}
