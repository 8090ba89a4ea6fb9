package server

import (
	"encoding/hex"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/internal/auth"
	"github.com/mlock-dev/mlock/internal/core"
)

// dialFrom connects to srv from the loopback address ip (127.0.0.x).
func dialFrom(t testing.TB, addr, ip string) *raw {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 10 * time.Second}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return &raw{t: t, nc: nc}
}

// MaxUnauthenticatedPerIP, when set, is the most of the pool one address
// holds: its newcomer past it is let in and evicts that address's oldest
// (told so, and its socket held until its auth timeout while the address
// is crowded); the other addresses (127.0.0.1 among them) are not touched.
func TestPreHandshakeCapPerAddressEvicts(t *testing.T) {
	t.Parallel()
	// The auth timeout, counted from a1's accept, is seconds past the check
	// that a1 is held, on a starved machine too (dials and handshakes took 3 s).
	srv := start(t, Config{MaxUnauthenticatedPerIP: 2, StatusRate: -1, AuthTimeout: 10 * time.Second})
	addr := srv.Addr().String()
	other := dialFrom(t, addr, "127.0.0.3")
	local := dialRaw(t, srv)
	a1 := dialFrom(t, addr, "127.0.0.2")
	a1.quiet()
	a2 := dialFrom(t, addr, "127.0.0.2")
	a2.quiet()
	a3 := dialFrom(t, addr, "127.0.0.2")
	a1.expect("error too many unauthenticated connections!")
	for _, c := range []*raw{other, local, a2, a3} {
		c.send("connect " + c.nc.LocalAddr().String() + " 1.0")
		c.expect("connected 1.0 new *")
	}
	tarpitted(t, a1, 10*time.Second)
	local.ping("q")
	st := local.statusOf("st")
	if st.Limits.RejectedPerIP != 0 || st.Limits.Unauthenticated != 0 || st.Limits.MaxUnauthenticatedPerIP != 2 || st.Limits.Evicted != 1 {
		t.Errorf("limits: refused per address %d, unauthenticated %d, per address %d, evicted %d; want 0, 0, 2, 1",
			st.Limits.RejectedPerIP, st.Limits.Unauthenticated, st.Limits.MaxUnauthenticatedPerIP, st.Limits.Evicted)
	}
}

// With the default limits, an address holding 200 idle pre-handshake connections
// (five times the 16 it used to be refused past) does not keep its next
// client out: nobody is refused while the pool has room.
func TestIdlePreHandshakeConnectionsDoNotKeepTheirAddressOut(t *testing.T) {
	t.Parallel()
	// An auth timeout far past the test's run, on a busy machine too.
	srv := start(t, Config{StatusRate: -1, AuthTimeout: time.Minute})
	addr := srv.Addr().String()
	var idle []*raw
	for range 200 {
		idle = append(idle, dialFrom(t, addr, "127.0.0.2"))
	}
	// Every one of them is in the pool (accepted, not refused).
	waitUnauthed(t, srv, 200)
	late := dialFrom(t, addr, "127.0.0.2")
	late.send("connect late 1.0")
	late.expect("connected 1.0 new *")
	late.ping("p")
	for _, c := range idle[:3] {
		c.quiet()
	}
	st := late.statusOf("st")
	if st.Limits.RejectedPerIP != 0 || st.Limits.Evicted != 0 || st.RejectedConnections != 0 || st.Limits.Unauthenticated != 200 {
		t.Errorf("limits: refused per address %d, evicted %d, refused %d, unauthenticated %d; want 0, 0, 0, 200",
			st.Limits.RejectedPerIP, st.Limits.Evicted, st.RejectedConnections, st.Limits.Unauthenticated)
	}
}

// waitUnauthed waits until srv has n pre-handshake connections.
func waitUnauthed(t *testing.T, srv *Server, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		var got int
		srv.core().Batch(func(*core.Tx) { got = srv.unauthed })
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d pre-handshake connections, want %d", got, n)
		}
		time.Sleep(5 * time.Millisecond) // poll interval
	}
}

// A full pool evicts from the address that holds the most of it, oldest
// first: a flood from one address cannot push out another address's
// client, even one older than the flood; the flood's own newcomers are
// refused at once, its connections in the pool untouched.
func TestPreHandshakePoolEvictsFromTheLargestHolder(t *testing.T) {
	t.Parallel()
	srv := start(t, Config{MaxUnauthenticated: 5, StatusRate: -1, AuthTimeout: 30 * time.Second})
	addr := srv.Addr().String()
	healthy := dialFrom(t, addr, "127.0.0.3") // the oldest of the pool
	healthy.quiet()
	var flood []*raw
	for range 4 {
		c := dialFrom(t, addr, "127.0.0.2")
		flood = append(flood, c)
	}
	waitUnauthed(t, srv, 5)
	// Two more from the flood's address: refused, the pool unchanged.
	for range 2 {
		dialFrom(t, addr, "127.0.0.2").expect("error too many unauthenticated connections!")
	}
	waitUnauthed(t, srv, 5)
	healthy.send("connect healthy 1.0")
	healthy.expect("connected 1.0 new *")
	// Two newcomers from a third address (the pool has room for the
	// first): the flood's oldest makes room for the second.
	third := []*raw{dialFrom(t, addr, "127.0.0.4")}
	waitUnauthed(t, srv, 5)
	third = append(third, dialFrom(t, addr, "127.0.0.4"))
	flood[0].expect("error too many unauthenticated connections!")
	for i, c := range third {
		c.send("connect third" + strconv.Itoa(i) + " 1.0")
		c.expect("connected 1.0 new *")
	}
	for _, c := range flood[1:] {
		c.send("connect " + c.nc.LocalAddr().String() + " 1.0")
		c.expect("connected 1.0 new *")
	}
	if st := healthy.statusOf("st"); st.Limits.Evicted != 1 {
		t.Errorf("evicted %d, want 1", st.Limits.Evicted)
	}
}

// tarpitted checks that the server holds c open after its refusal, and
// closes it by the end of its auth timeout d.
func tarpitted(t *testing.T, c *raw, d time.Duration) {
	t.Helper()
	// Held: not closed at once (the auth timeout, counted from the accept,
	// is seconds ahead of this check on a busy machine too).
	if p, err := c.next(200 * time.Millisecond); err == nil || !strings.Contains(err.Error(), "timeout") {
		t.Fatalf("the refused connection was not held: %q %v", p, err)
	}
	// Then closed at its auth timeout: a bound of seconds past it.
	p, err := c.next(d + 5*time.Second)
	if err != io.EOF && (err == nil || !strings.Contains(err.Error(), "reset")) {
		t.Fatalf("the refused connection was not closed at its auth timeout (%v): %q %v", d, p, err)
	}
}

// A connect refused for its credentials while its address is crowded with
// pre-handshake connections is held until its auth timeout; one refused
// from an address that is not is closed at once.
func TestTarpitForRefusedConnects(t *testing.T) {
	t.Parallel()
	srv := start(t, Config{AuthFile: writeAuthFile(t, authLine(t, "A", auth.NewToken(), "prefix=a:")),
		MaxUnauthenticatedPerIP: 2, AuthTimeout: 3 * time.Second})
	addr := srv.Addr().String()
	lone := dialFrom(t, addr, "127.0.0.3")
	lone.send("connect x 1.0")
	lone.expect("error authentication required!")
	lone.closed()
	dialFrom(t, addr, "127.0.0.2").quiet() // one silent, then a connect: the address is at its cap
	crowded := dialFrom(t, addr, "127.0.0.2")
	crowded.send("connect y 1.0")
	crowded.expect("error authentication required!")
	tarpitted(t, crowded, 3*time.Second)
}

// When the pool is full and every address holds as much of it, a newcomer
// from any address evicts the oldest pre-handshake connection.
func TestPreHandshakePoolEvictsTheOldest(t *testing.T) {
	t.Parallel()
	srv := start(t, Config{MaxUnauthenticated: 3, MaxUnauthenticatedPerIP: 2, StatusRate: -1})
	addr := srv.Addr().String()
	old := dialFrom(t, addr, "127.0.0.2")
	old.quiet()
	mid := []*raw{dialFrom(t, addr, "127.0.0.3"), dialFrom(t, addr, "127.0.0.4")}
	mid[0].quiet()
	mid[1].quiet()
	late := dialFrom(t, addr, "127.0.0.5")
	old.expect("error too many unauthenticated connections!")
	old.closed()
	late.send("connect late 1.0")
	late.expect("connected 1.0 new *")
	for _, c := range mid {
		c.send("connect " + c.nc.LocalAddr().String() + " 1.0")
		c.expect("connected 1.0 new *")
	}
}

// At MaxConns a newcomer evicts the oldest connection that has not
// connected; only when every connection is authenticated is it refused.
func TestMaxConnsEvictsBeforeRefusing(t *testing.T) {
	t.Parallel()
	srv := start(t, Config{MaxConns: 3, StatusRate: -1})
	c1 := connected(t, srv, "c1")
	connected(t, srv, "c2")
	pre := dialRaw(t, srv)
	pre.quiet()
	late := dialFrom(t, srv.Addr().String(), "127.0.0.2") // another address: 127.0.0.1 holds the most of the pool
	pre.expect("error too many unauthenticated connections!")
	pre.closed()
	late.send("connect late 1.0")
	late.expect("connected 1.0 new *")
	refused := dialRaw(t, srv)
	refused.send("connect refused 1.0") // let in, it might be a cluster's link: refused at its connect
	refused.expect("error too many connections!")
	refused.closed()
	if st := c1.statusOf("s"); st.Limits.Evicted != 1 || st.RejectedConnections != 1 {
		t.Errorf("evicted %d, rejected %d; want 1, 1", st.Limits.Evicted, st.RejectedConnections)
	}
}

// At MaxConns, with room in the pre-handshake pool, a newcomer whose own
// address holds the most of the pool is refused with MaxConns's text and
// counted as such, not as the full pool's.
func TestMaxConnsRefusalNamesMaxConns(t *testing.T) {
	t.Parallel()
	srv := start(t, Config{MaxConns: 3, StatusRate: -1})
	c1 := connected(t, srv, "c1")
	pre1, pre2 := dialRaw(t, srv), dialRaw(t, srv)
	pre1.quiet()
	pre2.quiet()
	waitFor(t, "two connections in the pool", func() bool { return c1.statusOf("p").Limits.Unauthenticated == 2 })
	refused := dialRaw(t, srv) // 127.0.0.1 holds the whole pool
	refused.expect("error too many connections!")
	// Evicted counts the pool's refusals and evictions; RejectedConnections
	// every refusal.
	if st := c1.statusOf("s"); st.RejectedConnections != 1 || st.Limits.Evicted != 0 {
		t.Errorf("refused %d, of which the pool's %d; want 1, 0", st.RejectedConnections, st.Limits.Evicted)
	}
}

// quotaServer runs a server whose auth file has A (quotas of its own), B
// (the server's defaults, given in cfg) and ops (admin).
func quotaServer(t *testing.T, cfg Config, aQuota ...string) (*Server, tokens, string) {
	t.Helper()
	tk := tokens{a: auth.NewToken(), b: auth.NewToken(), admin: auth.NewToken()}
	file := writeAuthFile(t, quotaLines(t, tk, aQuota...)...)
	cfg.AuthFile = file
	cfg.StatusRate = -1
	return start(t, cfg), tk, file
}

func quotaLines(t *testing.T, tk tokens, aQuota ...string) []string {
	return []string{
		authLine(t, "A", tk.a, append([]string{"prefix=a:"}, aQuota...)...),
		authLine(t, "B", tk.b, "prefix=b:"),
		authLine(t, "ops", tk.admin, "admin"),
	}
}

// A principal at its lock quota is refused more locks with a text of its
// own, its other sessions included; another principal is not; what it
// gives up makes room again.
func TestQuotaLocks(t *testing.T) {
	t.Parallel()
	srv, tk, _ := quotaServer(t, Config{PrincipalMaxLocks: 3}, "max-locks=2")
	a1 := connectAs(t, srv, "a1", "A", tk.a)
	a2 := connectAs(t, srv, "a2", "A", tk.a)
	b := connectAs(t, srv, "b", "B", tk.b)
	id := a1.lock("1", "a:x 60000 0 0")
	a1.locked(id)
	a2.lock("2", "a:x 60000 0 0") // waiting: it counts too
	a2.send("lock 3 a:y 60000 0 0")
	a2.expect("result 3 failed too many locks for this principal!")
	a1.send("trylock 4 a:z 60000")
	a1.expect("result 4 failed too many locks for this principal!")
	for i, r := range []string{"b:1", "b:2", "b:3"} { // B: the default quota, 3
		b.locked(b.lock(string(rune('5'+i)), r+" 60000 0 0"))
	}
	b.send("lock 8 b:4 60000 0 0")
	b.expect("result 8 failed too many locks for this principal!")
	a1.send("unlock 9 " + id)
	a1.expect("result 9 success done")
	a2.expect("locked * * *") // a2's waiting lock is granted
	a2.locked(a2.lock("10", "a:y 60000 0 0"))
	st := connectAs(t, srv, "ops", "ops", tk.admin).statusOf("st")
	pa, pb := st.Principals["A"], st.Principals["B"]
	if pa.Locks != 2 || pa.Sessions != 2 || pa.Conns != 2 || pa.MaxLocks != 2 || pa.MaxSessions != 10_000 {
		t.Errorf("A in status: %+v", pa)
	}
	if pb.Locks != 3 || pb.MaxLocks != 3 || pb.MaxConns != 5000 {
		t.Errorf("B in status: %+v", pb)
	}
	if st.Limits.QuotaRefused != 3 {
		t.Errorf("quotaRefused %d, want 3", st.Limits.QuotaRefused)
	}
}

// A principal at its quota of sessions or connections is refused a new
// one; its sessions in their grace count and may come back; another
// principal connects.
func TestQuotaSessionsAndConns(t *testing.T) {
	t.Parallel()
	srv, tk, _ := quotaServer(t, Config{SessionGrace: 5 * time.Second}, "max-sessions=2", "max-conns=3")
	a1 := connectAs(t, srv, "a1", "A", tk.a)
	a2 := connectAs(t, srv, "a2", "A", tk.a)
	a2.nc.Close() // in its grace: still a session
	refusedConnect(t, srv, "connect a3 1.0 auth=A:"+tk.a, "too many sessions for this principal!")
	b := connectAs(t, srv, "b", "B", tk.b)
	back := dialRaw(t, srv)
	back.send("connect a2 1.0 auth=A:" + tk.a)
	back.expect("connected 1.0 resumed *")
	// Three connections: a1, back and a takeover of a1's session, which
	// replaces a1 and does not count twice.
	again := dialRaw(t, srv)
	again.send("connect a1 1.0 auth=A:" + tk.a)
	again.expect("connected 1.0 resumed *")
	a1.expect("error session taken over by a new connection!")
	third := dialRaw(t, srv)
	third.send("connect a2 1.0 auth=A:" + tk.a)
	third.expect("connected 1.0 resumed *")
	back.expect("error session taken over by a new connection!")
	b.ping("1")
	st := b.statusOf("2")
	if st.Principals != nil {
		t.Errorf("a principal that does not administer sees the principals: %+v", st.Principals)
	}
}

// The connection quota counts connections, not sessions: the fourth
// connection of A is refused (max-conns=3) while B connects.
func TestQuotaConns(t *testing.T) {
	t.Parallel()
	srv, tk, _ := quotaServer(t, Config{}, "max-conns=3")
	for _, sid := range []string{"a1", "a2", "a3"} {
		connectAs(t, srv, sid, "A", tk.a)
	}
	refusedConnect(t, srv, "connect a4 1.0 auth=A:"+tk.a, "too many connections for this principal!")
	connectAs(t, srv, "b", "B", tk.b).ping("1")
}

// A reload applies new quotas to established sessions at once: lowered,
// the next lock past it is refused (what is held stays); raised, it is
// accepted.
func TestQuotaReload(t *testing.T) {
	t.Parallel()
	srv, tk, file := quotaServer(t, Config{}, "max-locks=5")
	a := connectAs(t, srv, "a1", "A", tk.a)
	for i, r := range []string{"a:1", "a:2", "a:3"} {
		a.locked(a.lock(string(rune('1'+i)), r+" 60000 0 0"))
	}
	rewrite := func(aQuota ...string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(joinLines(quotaLines(t, tk, aQuota...))), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := srv.Reload(); err != nil {
			t.Fatal(err)
		}
	}
	rewrite("max-locks=2")
	a.send("lock 4 a:4 60000 0 0")
	a.expect("result 4 failed too many locks for this principal!")
	a.ping("5") // the connection and its three locks stay
	rewrite("max-locks=unlimited")
	a.locked(a.lock("6", "a:4 60000 0 0"))
}

func joinLines(lines []string) string {
	out := ""
	for _, l := range lines {
		out += l + "\n"
	}
	return out
}

// On a cluster the quotas hold through every node: A's locks and sessions
// are counted over the cluster (checked on the node the client is
// connected to), its connections on each node, and B locks through a
// follower while A is at its quotas.
func TestClusterQuotas(t *testing.T) {
	t.Parallel()
	tk := tokens{a: auth.NewToken(), b: auth.NewToken(), admin: auth.NewToken()}
	file := writeAuthFile(t, quotaLines(t, tk, "max-locks=2", "max-sessions=2", "max-conns=1")...)
	tc := newTestClusterWith(t, 3, false, func(tc *testCluster) {
		tc.configure = func(_ int, c *Config) { c.AuthFile, c.StatusRate = file, -1 }
	})
	l := tc.leader()
	f1, f2 := (l+1)%3, (l+2)%3
	a1 := tc.dialConnect(f1, "connect a1 1.0 auth=A:"+tk.a)
	a1.expect("connected 1.0 new *")
	a2 := tc.dialConnect(l, "connect a2 1.0 auth=A:"+tk.a)
	a2.expect("connected 1.0 new *")
	a1.locked(a1.lock("1", "a:x 60000 0 0"))
	a2.locked(a2.lock("2", "a:y 60000 0 0"))
	// The third request of A, on another follower, sees both.
	waitApplied(t, tc, f2, func(s *Server) bool { return s.groupRequests("A") == 2 })
	a3 := tc.dialConnect(f2, "connect a3 1.0 auth=A:"+tk.a)
	a3.expect("error too many sessions for this principal!")
	a2.send("lock 3 a:z 60000 0 0")
	a2.expect("result 3 failed too many locks for this principal!")
	waitApplied(t, tc, f1, func(s *Server) bool { return s.groupRequests("A") == 2 })
	a1.send("lock 4 a:z 60000 0 0")
	a1.expect("result 4 failed too many locks for this principal!")
	// Connections count on each node: A has one on f1 already.
	more := tc.dialConnect(f1, "connect a2 1.0 auth=A:"+tk.a)
	more.expect("error too many connections for this principal!")
	b := tc.dialConnect(f2, "connect b 1.0 auth=B:"+tk.b)
	b.expect("connected 1.0 new *")
	b.locked(b.lock("5", "b:x 60000 0 0"))
	a1.ping("6")
	a2.ping("7")
}

// waitApplied waits until cond holds on node i (it has applied the log so
// far).
func waitApplied(t *testing.T, tc *testCluster, i int, cond func(*Server) bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(tc.nodes[i]); {
		if time.Now().After(deadline) {
			t.Fatalf("node %d did not apply in time", i)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// groupRequests is the live requests of a principal, as this node has
// applied them.
func (s *Server) groupRequests(name string) int {
	n := 0
	s.batch(func(tx *core.Tx) { n = tx.GroupRequests(name) })
	return n
}

// Each cause of a refused connection has its own text, its own reason in
// mlock_refusals_total and a log line that carries its count.
func TestConnectionRefusalsByCause(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cause, text, reason, logCount string
		cfg                           Config
		remote                        string
		run                           func(t *testing.T, srv *Server)
	}{
		{cause: "per address", text: "too many connections from this address!", reason: "max_conns_per_ip", logCount: "refused-total=1",
			cfg: Config{MaxConnsPerIP: 1, Insecure: true}, remote: "10.0.0.1",
			run: func(t *testing.T, srv *Server) {
				connected(t, srv, "c1")
				c := dialRaw(t, srv)
				c.send("connect c2 1.0")
				c.expect("error too many connections from this address!")
				c.closed() // alone in the pool and the tarpit: closed at once
			}},
		{cause: "eviction", text: "too many unauthenticated connections!", reason: "pool_full", logCount: "evicted-total=1",
			cfg: Config{MaxUnauthenticated: 1},
			run: func(t *testing.T, srv *Server) {
				old := dialRaw(t, srv)
				old.quiet()
				late := dialFrom(t, srv.Addr().String(), "127.0.0.2")
				old.expect("error too many unauthenticated connections!")
				old.closed() // its address has nothing else in the pool: closed at once
				late.send("connect late 1.0")
				late.expect("connected 1.0 new *")
			}},
		{cause: "full pool, own address", text: "too many unauthenticated connections!", reason: "pool_full", logCount: "refused-total=1",
			cfg: Config{MaxUnauthenticated: 1, AuthTimeout: 3 * time.Second},
			run: func(t *testing.T, srv *Server) {
				old := dialRaw(t, srv)
				old.quiet()
				late := dialRaw(t, srv) // its address holds the whole pool
				late.expect("error too many unauthenticated connections!")
				old.send("connect old 1.0")
				old.expect("connected 1.0 new *")
				tarpitted(t, late, 3*time.Second) // held until its auth timeout
			}},
		{cause: "server-wide", text: "too many connections!", reason: "max_conns", logCount: "refused-total=1",
			cfg: Config{MaxConns: 1},
			run: func(t *testing.T, srv *Server) {
				connected(t, srv, "c1")
				c := dialRaw(t, srv)
				c.send("connect c2 1.0")
				c.expect("error too many connections!")
				c.closed()
			}},
	} {
		t.Run(tc.cause, func(t *testing.T) {
			t.Parallel()
			var logs syncBuffer
			cfg := tc.cfg
			cfg.StatusRate = -1
			cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			var srv *Server
			if tc.remote != "" {
				srv = startRemote(t, cfg, tc.remote)
			} else {
				srv = start(t, cfg)
			}
			base := startHTTP(t, srv)
			tc.run(t, srv)
			fams := scrape(t, base)
			for _, reason := range []string{"max_conns_per_ip", "pool_full", "max_conns"} {
				want := 0.0
				if reason == tc.reason {
					want = 1
				}
				if got := value(t, fams, "mlock_refusals_total", "reason="+reason); got != want {
					t.Errorf("mlock_refusals_total{reason=%s} = %v, want %v", reason, got, want)
				}
			}
			if got := value(t, fams, "mlock_connections_rejected_total"); got != 1 {
				t.Errorf("mlock_connections_rejected_total = %v, want 1", got)
			}
			if l := logs.String(); !strings.Contains(l, tc.text) || !strings.Contains(l, tc.logCount) {
				t.Errorf("no log line with %q and %q:\n%s", tc.text, tc.logCount, l)
			}
		})
	}
}

// A cluster's own links are never refused by the limits meant for clients:
// a leader at MaxConns, full of its own clients, still takes a follower's
// forwarding link (which proves itself with the cluster's secret) and does
// not count it, while a client of its own past the limit is refused.
func TestClusterLinksPassClientLimits(t *testing.T) {
	t.Parallel()
	const maxConns = 3
	tc := newTestClusterWith(t, 3, false, func(tc *testCluster) {
		tc.configure = func(_ int, c *Config) { c.MaxConns = maxConns }
	})
	l := tc.leader()
	f := (l + 1) % 3
	srv := tc.nodes[l]
	counts := func() (clients, links int, rejected uint64) {
		srv.core().Batch(func(*core.Tx) {
			clients, links, rejected = len(srv.conns)-srv.adm.links, srv.adm.links, srv.counters.rejected
		})
		return clients, links, rejected
	}
	for i := range maxConns {
		// A follower's link that arrives while this client is before its
		// handshake, the leader at MaxConns, may evict it (the rule for
		// a full server; a busy machine makes the window long): dialed
		// again.
		for try := 1; ; try++ {
			c := tc.dial(l, "full"+strconv.Itoa(i))
			got := c.read()
			if match(got, "connected 1.0 new * **") {
				break
			}
			if got != "error too many unauthenticated connections!" || try == 10 {
				t.Fatalf("client %d, try %d: got %q, want connected", i, try, got)
			}
		}
	}
	if clients, _, _ := counts(); clients != maxConns {
		t.Fatalf("%d client connections on the leader, want %d", clients, maxConns)
	}
	refused := tc.dial(l, "one-too-many")
	refused.expect("error too many connections!")
	// The followers' links of before are closed: the next forwarded command
	// needs a new one, accepted by the full leader.
	closeLinks(srv)
	for deadline := time.Now().Add(30 * time.Second); ; {
		if _, n, _ := counts(); n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the followers' links did not end")
		}
		time.Sleep(5 * time.Millisecond) // poll interval
	}
	c := tc.dial(f, "via-follower")
	c.expect("connected 1.0 new * **")
	c.locked(c.lock("1", "r 10000 0 0"))
	clients, n, rejected := counts()
	if n == 0 || clients != maxConns || rejected != 1 {
		t.Errorf("leader: %d links, %d client connections, %d refused; want at least 1, %d, 1", n, clients, rejected, maxConns)
	}
	// A forwarding hello sent straight to the full leader is taken too.
	fc := tc.dialConnect(l, "forward "+hex.EncodeToString(srv.cl.secret[:]))
	for deadline := time.Now().Add(30 * time.Second); ; {
		if _, m, _ := counts(); m > n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a forwarding hello to the full leader was not taken as a link")
		}
		time.Sleep(5 * time.Millisecond) // poll interval
	}
	fc.quiet()
	if _, _, r := counts(); r != 1 {
		t.Errorf("%d refused, want 1", r)
	}
}

// failingListener fails its first accepts with an error that is not
// temporary (ENOBUFS, as a kernel short of memory answers), then accepts.
type failingListener struct {
	net.Listener
	fails atomic.Int32
}

func (l *failingListener) Accept() (net.Conn, error) {
	if l.fails.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.ENOBUFS)}
	}
	return l.Listener.Accept()
}

// A failed accept, even one that is not temporary, does not end the
// server: it retries, and a client connects once accepts succeed again.
func TestAcceptFailureIsRetried(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fl := &failingListener{Listener: ln}
	fl.fails.Store(3)
	srv := serveOn(t, Config{QuietPeriod: -1}, fl)
	c := connected(t, srv, "after-enobufs")
	c.send("ping 1")
	c.expect("result 1 success pong")
	if n := fl.fails.Load(); n >= 0 {
		t.Fatalf("%d failing accepts left, want none", n+1)
	}
}

// closeLinks closes srv's forwarding links (the followers' connections to
// it): their next forwarded command needs a new one.
func closeLinks(srv *Server) {
	var links []*conn
	srv.core().Batch(func(*core.Tx) {
		for c := range srv.conns {
			if c.link {
				links = append(links, c)
			}
		}
	})
	for _, c := range links {
		c.nc.Close()
	}
}
