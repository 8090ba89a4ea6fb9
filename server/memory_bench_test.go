package server

import (
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/mlock-dev/mlock/internal/core"
	"github.com/mlock-dev/mlock/internal/protocol"
)

// The memory benchmarks report what the server holds per idle connection,
// per held lock and per unauthenticated connection, as the growth of the
// process's heap and goroutine stacks divided by the count (bytes/conn,
// bytes/lock). The client side of the connections lives in the same
// process and is included, so the numbers are upper bounds. Run them with
// -benchtime=1x:
//
//	go test -run '^$' -bench Memory -benchtime 1x ./server/

// inUse returns the heap and stack bytes in use after a collection.
func inUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse + m.StackInuse
}

const memConns = 2000

func memServer(b *testing.B) *Server {
	return start(b, Config{MaxConnsPerIP: -1, MaxUnauthenticated: -1, MaxUnauthenticatedPerIP: -1, MaxConns: memConns + 10,
		MaxSessions: memConns + 10, StatusRate: -1})
}

// waitConns waits until the server has n connections registered.
func waitConns(b *testing.B, srv *Server, n int) {
	deadline := time.Now().Add(20 * time.Second)
	for {
		var got int
		srv.core().Batch(func(*core.Tx) { got = len(srv.conns) })
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d connections registered, want %d", got, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func BenchmarkMemoryIdleConn(b *testing.B) {
	for range b.N {
		srv := memServer(b)
		before := inUse()
		conns := make([]net.Conn, memConns)
		var reply [64]byte
		for i := range conns {
			nc, err := net.Dial("tcp", srv.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			if _, err := nc.Write(protocol.Append(nil, fmt.Sprintf("connect idle%d 1.0", i))); err != nil {
				b.Fatal(err)
			}
			if _, err := nc.Read(reply[:]); err != nil { // connected 1.0 new <grace>
				b.Fatal(err)
			}
			conns[i] = nc
		}
		waitConns(b, srv, memConns)
		after := inUse()
		b.ReportMetric(float64(after-before)/memConns, "bytes/conn")
		for _, nc := range conns {
			nc.Close()
		}
	}
}

func BenchmarkMemoryHeldLock(b *testing.B) {
	const locks = 100_000
	for range b.N {
		srv := memServer(b)
		c := benchDial(b, srv.Addr().String(), "holder")
		before := inUse()
		for i := range locks {
			// order:NNNNNNNN, 14 bytes: a typical key.
			c.send(fmt.Sprintf("lock %d order:%08d 600000 0 0", i, i))
			c.recv() // result
			c.recv() // locked
		}
		after := inUse()
		b.ReportMetric(float64(after-before)/locks, "bytes/lock")
		c.nc.Close()
	}
}

// BenchmarkMemoryUnauthenticated: connections that never connect, each
// having sent all but the last byte of the largest frame accepted before
// the handshake: the most an unauthenticated client can make the server
// hold per connection (until the auth timeout closes it).
func BenchmarkMemoryUnauthenticated(b *testing.B) {
	for range b.N {
		memUnauthenticated(b, memServer(b))
	}
}

// BenchmarkMemoryUnauthenticatedCluster is BenchmarkMemoryUnauthenticated
// against a cluster node (of one member, its log in memory): a connection
// before its connect costs it what it costs a single node.
func BenchmarkMemoryUnauthenticatedCluster(b *testing.B) {
	for range b.N {
		memUnauthenticated(b, memClusterServer(b))
	}
}

func memUnauthenticated(b *testing.B, srv *Server) {
	frame := protocol.Append(nil, "connect "+string(make([]byte, MaxHandshakeFrame-20)))
	frame = frame[:min(len(frame), MaxHandshakeFrame+4)-1]
	before := inUse()
	conns := make([]net.Conn, memConns)
	for i := range conns {
		nc, err := net.Dial("tcp", srv.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		if _, err := nc.Write(frame); err != nil {
			b.Fatal(err)
		}
		conns[i] = nc
	}
	waitConns(b, srv, memConns)
	time.Sleep(200 * time.Millisecond) // let every reader take its bytes in
	after := inUse()
	b.ReportMetric(float64(after-before)/memConns, "bytes/conn")
	for _, nc := range conns {
		nc.Close()
	}
}

// memClusterServer is memServer as the one member of a cluster whose log
// is in memory, the leader once it returns.
func memClusterServer(b *testing.B) *Server {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	_, tr := raft.NewInmemTransport(raft.ServerAddress("raft0"))
	srv := serveOn(b, Config{MaxConnsPerIP: -1, MaxUnauthenticated: -1, MaxUnauthenticatedPerIP: -1, MaxConns: memConns + 10,
		MaxSessions: memConns + 10, StatusRate: -1, QuietPeriod: -1, Logger: slog.New(slog.DiscardHandler),
		Cluster: &ClusterConfig{ID: "n0", ClientAddr: ln.Addr().String(), Transport: tr, Bootstrap: true,
			Peers: []ClusterPeer{{ID: "n0", Addr: "raft0"}}, Secret: testSecret}}, ln)
	deadline := time.Now().Add(20 * time.Second)
	for !srv.cl.node.IsLeader() {
		if time.Now().After(deadline) {
			b.Fatal("the one member does not lead")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return srv
}

// BenchmarkMemoryTarpit: connections refused for their address's cap of
// pre-handshake connections and held in the tarpit until their auth
// timeout (limits.go): what each costs while held.
func BenchmarkMemoryTarpit(b *testing.B) {
	for range b.N {
		srv := start(b, Config{MaxUnauthenticatedPerIP: 1, AuthTimeout: time.Minute, StatusRate: -1})
		first, err := net.Dial("tcp", srv.Addr().String()) // takes the address's one slot
		if err != nil {
			b.Fatal(err)
		}
		waitConns(b, srv, 1)
		before := inUse()
		conns := make([]net.Conn, memConns)
		var reply [64]byte
		for i := range conns {
			nc, err := net.Dial("tcp", srv.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			if _, err := nc.Read(reply[:]); err != nil { // too many connections from this address!
				b.Fatal(err)
			}
			conns[i] = nc
		}
		srv.tarpit.mu.Lock()
		held := len(srv.tarpit.q) - srv.tarpit.head
		srv.tarpit.mu.Unlock()
		if held != memConns {
			b.Fatalf("%d sockets in the tarpit, want %d", held, memConns)
		}
		after := inUse()
		b.ReportMetric(float64(after-before)/memConns, "bytes/conn")
		for _, nc := range conns {
			nc.Close()
		}
		first.Close()
	}
}
