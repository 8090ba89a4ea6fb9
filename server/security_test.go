package server

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/internal/auth"
	"github.com/mlock-dev/mlock/internal/core"
	"github.com/mlock-dev/mlock/internal/proctest"
	"github.com/mlock-dev/mlock/internal/protocol"
)

// ---- helpers of the security tests ----

// writeAuthFile writes an auth file (mode 0600) of lines in a temporary
// directory and returns its path.
func writeAuthFile(t testing.TB, lines ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "auth")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// authLine returns the auth-file line of a principal with a token.
func authLine(t testing.TB, name, token string, perms ...string) string {
	t.Helper()
	l, err := auth.Line(name, token, perms...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// tokens are the tokens of the principals of abServer.
type tokens struct{ a, b, admin string }

// abServer starts a server with an auth file: A may lock a:, B may lock b:
// and a:, ops administers. extra lines are appended.
func abServer(t testing.TB, cfg Config, extra ...string) (*Server, tokens) {
	t.Helper()
	tk := tokens{a: auth.NewToken(), b: auth.NewToken(), admin: auth.NewToken()}
	lines := append([]string{
		authLine(t, "A", tk.a, "prefix=a:"),
		authLine(t, "B", tk.b, "prefix=b:", "prefix=a:"),
		authLine(t, "ops", tk.admin, "admin"),
	}, extra...)
	cfg.AuthFile = writeAuthFile(t, lines...)
	return start(t, cfg), tk
}

// connectAs dials and identifies as sid of principal name, expecting a new
// session.
func connectAs(t testing.TB, srv *Server, sid, name, token string) *raw {
	t.Helper()
	c := dialRaw(t, srv)
	c.send("connect " + sid + " 1.0 auth=" + name + ":" + token)
	c.expect("connected 1.0 new *")
	return c
}

// refusedConnect dials, sends the connect line and expects the connection
// error want, then the close.
func refusedConnect(t testing.TB, srv *Server, line, want string) {
	t.Helper()
	c := dialRaw(t, srv)
	c.send(line)
	c.expect("error " + want)
	c.closed()
}

// ask sends a command and returns the payload of its success answer.
func (c *raw) ask(req, cmd string) string {
	c.t.Helper()
	c.send(cmd)
	return c.answer(req)
}

// answer reads the success answer of req and returns its payload.
func (c *raw) answer(req string) string {
	c.t.Helper()
	got := c.read()
	pre := "result " + req + " success "
	if !strings.HasPrefix(got, pre) {
		c.t.Fatalf("got %q, want the success of %s", got, req)
	}
	return got[len(pre):]
}

// statusOf reads the status document.
func (c *raw) statusOf(req string) *mlock.Status {
	c.t.Helper()
	var st mlock.Status
	if err := json.Unmarshal([]byte(c.ask(req, "status "+req)), &st); err != nil {
		c.t.Fatal(err)
	}
	return &st
}

// locksOf reads one page of the locks listing; args follow the request id.
func (c *raw) locksOf(req, args string) (*mlock.Locks, int) {
	c.t.Helper()
	payload := c.ask(req, strings.TrimSpace("locks "+req+" "+args))
	var ls mlock.Locks
	if err := json.Unmarshal([]byte(payload), &ls); err != nil {
		c.t.Fatal(err)
	}
	return &ls, len(payload)
}

// held expects the locked push of id and returns its expiry (Unix ms) and
// token.
func (c *raw) held(id string) (int64, string) {
	c.t.Helper()
	f := c.expect("locked " + id + " * *")
	exp, err := strconv.ParseInt(f[2], 10, 64)
	if err != nil {
		c.t.Fatal(err)
	}
	return exp, f[3]
}

// short is the 8 hex digits of a lock id that listings show.
func short(id string) string { return id[8:16] }

// ping asserts the connection answers a ping.
func (c *raw) ping(req string) {
	c.t.Helper()
	c.send("ping " + req)
	c.expect("result " + req + " success pong")
}

// ---- 1. authentication ----

func TestAuthRefusals(t *testing.T) {
	t.Parallel()
	srv, tk := abServer(t, Config{})
	cases := []struct{ name, line, want string }{
		{"no credentials", "connect s1 1.0", "authentication required!"},
		{"wrong token", "connect s1 1.0 auth=A:" + auth.NewToken(), "authentication failed!"},
		{"unknown name", "connect s1 1.0 auth=nobody:" + tk.a, "authentication failed!"},
		{"another's token", "connect s1 1.0 auth=A:" + tk.b, "authentication failed!"},
		{"no token", "connect s1 1.0 auth=A:", "authentication failed!"},
		{"no colon", "connect s1 1.0 auth=A", "authentication failed!"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { refusedConnect(t, srv, tc.line, tc.want) })
	}

	// The right token works, and an unknown extension field is ignored.
	a := dialRaw(t, srv)
	a.send("connect s1 1.0 future=1 auth=A:" + tk.a)
	a.expect("connected 1.0 new *")
	id := a.lock("1", "a:x 10000 0 0")
	a.held(id)
	a.send("lock 2 b:x 10000 0 0")
	a.expect("result 2 failed permission denied! b:x")
	// Every resource of a request is checked; the first refused is named.
	a.send("lock 3 a:y|b:y|c:y 10000 0 0")
	a.expect("result 3 failed permission denied! b:y")
	a.send("trylock 4 b:x 10000")
	a.expect("result 4 failed permission denied! b:x")
	a.quiet()

	adm := connectAs(t, srv, "ops1", "ops", tk.admin)
	st := adm.statusOf("1")
	if st.Limits.AuthFailed != uint64(len(cases)) || st.Limits.Forbidden != 3 {
		t.Fatalf("limits: authFailed %d (want %d), forbidden %d (want 3)", st.Limits.AuthFailed, len(cases), st.Limits.Forbidden)
	}
	if st.CurrentLocks != 1 {
		t.Fatalf("currentLocks %d, want 1: a refused request left something", st.CurrentLocks)
	}
}

func TestCredentialsWithoutAuthFile(t *testing.T) {
	t.Parallel()
	srv := start(t, Config{})
	refusedConnect(t, srv, "connect s1 1.0 auth=A:"+auth.NewToken(), "authentication is not configured!")
	// A 1.0 connect on loopback is the anonymous principal (protected mode).
	c := connected(t, srv, "s1")
	c.locked(c.lock("1", "anything 10000 0 0"))
}

// TestTokenlessPrincipalByAddress: a 1.0 client, which cannot send a token,
// is the token-less principal covering its address, with that principal's
// rights only; a token bound to other addresses is refused here.
func TestTokenlessPrincipalByAddress(t *testing.T) {
	t.Parallel()
	tok, far := auth.NewToken(), auth.NewToken()
	srv := start(t, Config{AuthFile: writeAuthFile(t,
		"legacy - prefix=legacy: from=127.0.0.1/32",
		authLine(t, "A", tok, "prefix=a:"),
		authLine(t, "remote", far, "prefix=r:", "from=10.0.0.0/8"),
	)})
	old := connected(t, srv, "node-client")
	old.locked(old.lock("1", "legacy:job 10000 0 0"))
	old.send("lock 2 a:job 10000 0 0")
	old.expect("result 2 failed permission denied! a:job")

	// A token still decides over the address.
	a := connectAs(t, srv, "node-client", "A", tok)
	a.locked(a.lock("1", "a:job 10000 0 0"))
	a.send("lock 2 legacy:job2 10000 0 0")
	a.expect("result 2 failed permission denied! legacy:job2")

	refusedConnect(t, srv, "connect s 1.0 auth=remote:"+far, "authentication failed!")
	// The token-less principal has no token to present.
	refusedConnect(t, srv, "connect s 1.0 auth=legacy:-", "authentication failed!")
}

// ---- 2. isolation between principals ----

func TestIsolationBetweenPrincipals(t *testing.T) {
	t.Parallel()
	// A short grace: an evicted lock is freed when its holder's belief
	// ends, at most a grace after the evict.
	srv, tk := abServer(t, Config{SessionGrace: 500 * time.Millisecond})
	adm := connectAs(t, srv, "ops1", "ops", tk.admin)

	// untouched checks, as the administrator sees it, that A's lock on
	// resource is as granted: id, token, expiry, owner, principal.
	untouched := func(t *testing.T, resource, id string, exp int64, tok, owner string) mlock.LocksEntry {
		t.Helper()
		// The server reads its clock between before and after (by as much
		// as a busy machine delays the answer): the expiry it shows is
		// judged against both.
		before := time.Now().UnixMilli()
		ls, _ := adm.locksOf("l", resource)
		after := time.Now().UnixMilli()
		if len(ls.Queues) != 1 || ls.Queues[0].Resource != resource || len(ls.Queues[0].Entries) == 0 {
			t.Fatalf("admin locks %s = %+v", resource, ls)
		}
		held := ls.Queues[0].Entries[0]
		if held.State != "held" || held.Lock != short(id) || strconv.FormatUint(held.Token, 10) != tok ||
			held.Owner != owner || held.Principal != "A" || held.TTLLeftMs == nil {
			t.Fatalf("A's lock as the admin sees it: %+v", held)
		}
		if left := *held.TTLLeftMs; before+left > exp+100 || after+left < exp-100 {
			t.Fatalf("A's lock expires at ~%d..%d, granted with %d: its expiry moved", before+left, after+left, exp)
		}
		return held
	}

	t.Run("socketId", func(t *testing.T) {
		a := connectAs(t, srv, "sid-1", "A", tk.a)
		id := a.lock("1", "a:sid 10000 0 0")
		a.locked(id)
		// B knows A's socketId: it gets a session of its own, without A's
		// lock, and A keeps its connection.
		b := connectAs(t, srv, "sid-1", "B", tk.b)
		b.quiet()
		a.quiet()
		a.ping("2")
		b.send("unlock 1 " + id)
		b.expect("result 1 failed lock not exist!")
		// A's own reconnect still resumes A's session.
		a2 := dialRaw(t, srv)
		a2.send("connect sid-1 1.0 auth=A:" + tk.a)
		a2.expect("connected 1.0 resumed *")
		a2.expect("locked " + id + " * *")
		a.expect("error session taken over by a new connection!")
		b.ping("2")
	})

	t.Run("lock id", func(t *testing.T) {
		a := connectAs(t, srv, "id-a", "A", tk.a)
		b := connectAs(t, srv, "id-b", "B", tk.b)
		id := a.lock("1", "a:id 10000 0 0")
		exp, tok := a.held(id)
		b.send("extend 1 " + id + " 1")
		b.expect("result 1 failed lock not exist!")
		b.send("extend 2 " + id + " 60000")
		b.expect("result 2 failed lock not exist!")
		b.send("unlock 3 " + id)
		b.expect("result 3 failed lock not exist!")
		a.quiet()
		untouched(t, "a:id", id, exp, tok, "")
		a.send("extend 2 " + id + " 10000")
		a.expect("result 2 success *")
	})

	t.Run("owner", func(t *testing.T) {
		a := connectAs(t, srv, "ow-a", "A", tk.a)
		b := connectAs(t, srv, "ow-b", "B", tk.b)
		id := a.lock("1", "a:x 10000 0 0 ownerA")
		exp, tok := a.held(id)
		b.send("releaseall 1 ownerA")
		b.expect("result 1 success 0")
		b.send("release 2 ownerA a:x")
		b.expect("result 2 success false")
		b.send("renew 3 ownerA a:x 1")
		b.expect("result 3 failed lock not exist!")
		b.send("trylock 4 a:x 60000 ownerA")
		b.expect("result 4 failed resource is locked! a:x")
		// Re-entry by A's owner name from B is a new request of B's that
		// queues behind A's lock.
		idB := b.lock("5", "a:x 60000 0 0 ownerA")
		if idB == id {
			t.Fatal("B's lock with A's owner name returned A's lock id")
		}
		b.quiet()
		a.quiet() // no push: A's lock was not touched
		held := untouched(t, "a:x", id, exp, tok, "ownerA")
		ls, _ := adm.locksOf("2", "a:x")
		if w := ls.Queues[0].Entries[1]; w.State != "waiting" || w.Lock != short(idB) || w.Owner != "ownerA" ||
			w.Principal != "B" || w.Session == held.Session || w.Session == "" {
			t.Fatalf("B's request as the admin sees it: %+v (A's: %+v)", w, held)
		}
		// A's owner still works for A.
		a.send("renew 2 ownerA a:x 10000")
		a.expect("result 2 success * " + tok)
		a.send("releaseall 3 ownerA")
		a.expect("result 3 success 1")
		a.expect("expired " + id + " released")
		b.locked(idB)
	})

	t.Run("listings", func(t *testing.T) {
		a := connectAs(t, srv, "ls-a", "A", tk.a)
		b := connectAs(t, srv, "ls-b", "B", tk.b)
		id := a.lock("1", "a:ls 10000 0 0")
		a.locked(id)
		idB := b.lock("1", "a:ls 10000 0 0")
		// B sees A's entry redacted, its own in full.
		ls, _ := b.locksOf("2", "a:ls")
		if len(ls.Queues) != 1 || len(ls.Queues[0].Entries) != 2 {
			t.Fatalf("B's locks a:ls = %+v", ls)
		}
		ra, rb := ls.Queues[0].Entries[0], ls.Queues[0].Entries[1]
		if ra.Owner != "" || ra.Lock != "" || ra.Session != "" || ra.Token != 0 || ra.Principal != "" || ra.State != "held" {
			t.Fatalf("A's entry shown to B is not redacted: %+v", ra)
		}
		if rb.Lock != short(idB) || rb.Session == "" || rb.State != "waiting" {
			t.Fatalf("B's own entry shown to B: %+v", rb)
		}
		b.send("locks 3 c:")
		b.expect("result 3 failed permission denied! c:")
		a.send("locks 3 b:")
		a.expect("result 3 failed permission denied! b:")
		a.send("locks 4")
		a.expect("result 4 failed permission denied!")
		a.send("locks 5 a")
		a.expect("result 5 failed permission denied! a")

		// status gives a non-administrator the counters only.
		st := b.statusOf("4")
		if len(st.Sockets)+len(st.Locks)+len(st.Queues) != 0 {
			t.Fatalf("status shown to B lists sockets %v, locks %v, queues %v", st.Sockets, st.Locks, st.Queues)
		}
		if st.CurrentLocks < 2 {
			t.Fatalf("status currentLocks %d, want at least 2", st.CurrentLocks)
		}
		if st := adm.statusOf("s"); len(st.Sockets) < 3 || len(st.Locks) < 2 || st.Queues["a:ls"] != 2 {
			t.Fatalf("admin status: sockets %v, locks %v, queues %v", st.Sockets, st.Locks, st.Queues)
		}
		a.send("unlock 2 " + id)
		a.expect("result 2 success done")
		b.locked(idB)
	})

	t.Run("evict", func(t *testing.T) {
		a := connectAs(t, srv, "ev-a", "A", tk.a)
		b := connectAs(t, srv, "ev-b", "B", tk.b)
		id := a.lock("1", "a:ev|a:ev2 10000 0 0")
		a.locked(id)
		idB := b.lock("1", "a:ev 10000 0 0")
		// Only an administrator evicts; the holder is told, the next
		// waiter granted.
		b.send("evict 2 a:ev")
		b.expect("result 2 failed permission denied!")
		a.quiet()
		adm.send("evict e a:ev")
		adm.expect("result e success 1")
		a.expect("expired " + id + " evicted")
		a.send("extend 2 " + id + " 10000")
		a.expect("result 2 failed lock not exist!")
		b.locked(idB) // after the grace
		a.expect("expired " + id)
		a.quiet()
		ls, _ := adm.locksOf("l", "a:ev2")
		if len(ls.Queues) != 0 {
			t.Fatalf("evict released only part of the lock: %+v", ls)
		}
	})
}

// ---- 3. another session of the same principal ----

func TestChangesFromAnotherSessionOfThePrincipal(t *testing.T) {
	t.Parallel()
	srv, tk := abServer(t, Config{})
	two := func(t *testing.T, name string) (*raw, *raw) {
		return connectAs(t, srv, name+"-1", "A", tk.a), connectAs(t, srv, name+"-2", "A", tk.a)
	}

	t.Run("unlock pushes to the holder", func(t *testing.T) {
		a1, a2 := two(t, "unlock")
		id := a1.lock("1", "a:u 10000 0 0")
		a1.locked(id)
		a2.send("unlock 1 " + id)
		a2.expect("result 1 success done")
		a1.expect("expired " + id + " released")
		a1.send("extend 2 " + id + " 10000")
		a1.expect("result 2 failed lock not exist!")
	})

	// grantedAfter asserts that the waiter w (request wid) is granted, and
	// not before exp (Unix ms).
	grantedAfter := func(t *testing.T, w *raw, wid string, exp int64) {
		t.Helper()
		w.expect("locked " + wid + " * *")
		if now := time.Now().UnixMilli(); now < exp {
			t.Fatalf("the waiter was granted at %d, before the holder's expiry %d", now, exp)
		}
	}

	t.Run("extend with a shorter ttl from elsewhere", func(t *testing.T) {
		a1, a2 := two(t, "extend")
		w := connectAs(t, srv, "extend-w", "A", tk.a)
		id := a1.lock("1", "a:e 3000 0 0") // seconds: the extends come well before it ends
		exp, _ := a1.held(id)
		wid := w.lock("1", "a:e 10000 0 0")
		for i := range 3 {
			req := strconv.Itoa(i)
			a2.send("extend " + req + " " + id + " 1")
			if got, _ := strconv.ParseInt(a2.answer(req), 10, 64); got < exp {
				t.Fatalf("extend with ttl 1 from another session: expiresAt %d, was %d", got, exp)
			}
		}
		grantedAfter(t, w, wid, exp)
		a1.expect("expired " + id)
		a2.quiet()
	})

	t.Run("renew and re-entry with a shorter ttl from elsewhere", func(t *testing.T) {
		a1, a2 := two(t, "renew")
		w := connectAs(t, srv, "renew-w", "A", tk.a)
		id := a1.lock("1", "a:s 3000 0 0 o1") // seconds: the re-entry comes well before it ends
		exp, tok := a1.held(id)
		wid := w.lock("1", "a:s 10000 0 0")
		a2.send("renew 2 o1 a:s 1")
		f := strings.Fields(a2.answer("2"))
		if got, _ := strconv.ParseInt(f[0], 10, 64); got < exp || f[1] != tok {
			t.Fatalf("renew with ttl 1 from another session: %q, was %d %s", f, exp, tok)
		}
		// Re-entry from a2 moves the lock (a1 is told), not shortened.
		a2.send("lock 3 a:s 1 0 0 o1")
		a2.expect("result 3 success " + id)
		if got, gotTok := a2.held(id); got < exp || gotTok != tok {
			t.Fatalf("re-entry with ttl 1 from another session: locked %d %s, was %d %s", got, gotTok, exp, tok)
		}
		a1.expect("expired " + id + " released")
		grantedAfter(t, w, wid, exp)
		a2.expect("expired " + id)
		a1.quiet()
	})

	t.Run("partial release pushes and ends extend", func(t *testing.T) {
		a1, a2 := two(t, "partial")
		id := a1.lock("1", "a:p|a:q 10000 0 0 o2")
		a1.locked(id)
		a2.send("release 1 o2 a:p")
		a2.expect("result 1 success true")
		a1.expect("expired " + id + " released")
		a1.send("extend 2 " + id + " 10000")
		a1.expect("result 2 failed lock not exist!")
		// The owner can still renew exactly what is left; unlock by id
		// still works.
		a1.send("renew 3 o2 a:q 10000")
		a1.expect("result 3 success * *")
		a1.send("unlock 4 " + id)
		a1.expect("result 4 success done")
		a1.quiet()
		a2.quiet()
	})
}

// ---- 4. protected mode ----

// fakeListener is a listener that claims an address and accepts nothing
// until it is closed.
type fakeListener struct {
	addr   net.Addr
	once   sync.Once
	closed chan struct{}
}

func newFakeListener(ip string) *fakeListener {
	return &fakeListener{addr: &net.TCPAddr{IP: net.ParseIP(ip), Port: 12340}, closed: make(chan struct{})}
}

func (l *fakeListener) Accept() (net.Conn, error) {
	<-l.closed
	return nil, net.ErrClosed
}

func (l *fakeListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *fakeListener) Addr() net.Addr { return l.addr }

func (l *fakeListener) isClosed() bool {
	select {
	case <-l.closed:
		return true
	default:
		return false
	}
}

// remoteListener is a loopback listener whose connections claim to come
// from another address: it stands for clients beyond loopback.
type remoteListener struct {
	net.Listener
	remote net.Addr
}

func (l remoteListener) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return remoteConn{nc, l.remote}, nil
}

type remoteConn struct {
	net.Conn
	remote net.Addr
}

func (c remoteConn) RemoteAddr() net.Addr { return c.remote }

// startRemote is start with every client appearing to come from ip.
func startRemote(t testing.TB, cfg Config, ip string) *Server {
	t.Helper()
	cfg.QuietPeriod = -1
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveOn(t, cfg, remoteListener{ln, &net.TCPAddr{IP: net.ParseIP(ip), Port: 40000}})
}

func TestProtectedModeRefusesRemoteClients(t *testing.T) {
	t.Parallel()
	t.Run("no credentials", func(t *testing.T) {
		srv := startRemote(t, Config{}, "10.0.0.1")
		c := dialRaw(t, srv)
		c.expect("error protected mode: only loopback clients are accepted without authentication!")
		c.closed()
	})
	t.Run("insecure", func(t *testing.T) {
		srv := startRemote(t, Config{Insecure: true}, "10.0.0.1")
		c := connected(t, srv, "far")
		c.locked(c.lock("1", "x 10000 0 0"))
	})
	t.Run("auth file", func(t *testing.T) {
		tok, near := auth.NewToken(), auth.NewToken()
		srv := startRemote(t, Config{AuthFile: writeAuthFile(t,
			authLine(t, "A", tok, "prefix=a:", "from=10.0.0.0/8"),
			authLine(t, "near", near, "prefix=n:", "from=127.0.0.1"),
		)}, "10.0.0.1")
		refusedConnect(t, srv, "connect s 1.0", "authentication required!")
		refusedConnect(t, srv, "connect s 1.0 auth=near:"+near, "authentication failed!")
		a := connectAs(t, srv, "s", "A", tok)
		a.locked(a.lock("1", "a:x 10000 0 0"))
	})
}

func TestProtectedModeDecisions(t *testing.T) {
	t.Parallel()
	mk := func(cfg Config) *Server {
		cfg.QuietPeriod = -1
		srv, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
		return srv
	}
	far, v6far := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("2001:db8::1")
	near := []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.1.2.3"),
		netip.MustParseAddr("::1"), netip.MustParseAddr("::ffff:127.0.0.1"), {}}

	plain := mk(Config{})
	for _, ip := range []netip.Addr{far, v6far, netip.MustParseAddr("::ffff:10.0.0.1")} {
		if !plain.protectedRefuses(ip) {
			t.Errorf("protected mode accepts %v", ip)
		}
		if p, code := plain.principalFor(&conn{srv: plain, ip: ip}, nil, false); p != nil || code != protocol.CodeProtectedMode {
			t.Errorf("principalFor(%v) = %v, %v; want protected mode", ip, p, code)
		}
	}
	for _, ip := range near {
		if plain.protectedRefuses(ip) {
			t.Errorf("protected mode refuses %v", ip)
		}
		if p, code := plain.principalFor(&conn{srv: plain, ip: ip}, nil, false); p == nil || p.Name != "" || !p.Admin {
			t.Errorf("principalFor(%v) = %v, %v; want the anonymous principal", ip, p, code)
		}
	}
	if p, code := plain.principalFor(&conn{srv: plain, ip: near[0]}, []byte("A:x"), true); p != nil || code != protocol.CodeAuthNotConfigured {
		t.Errorf("credentials without an auth file: %v, %v", p, code)
	}

	insecure := mk(Config{Insecure: true})
	if insecure.protectedRefuses(far) {
		t.Error("insecure refuses a remote address")
	}
	if p, _ := insecure.principalFor(&conn{srv: insecure, ip: far}, nil, false); p == nil || p.Name != "" {
		t.Errorf("insecure: principalFor(%v) = %v", far, p)
	}

	tok := auth.NewToken()
	withAuth := mk(Config{AuthFile: writeAuthFile(t,
		authLine(t, "A", tok, "prefix=a:"),
		"legacy - prefix=l: from=10.0.0.0/24",
	)})
	if withAuth.protectedRefuses(far) {
		t.Error("with an auth file the principals decide, not protected mode")
	}
	if p, code := withAuth.principalFor(&conn{srv: withAuth, ip: far}, []byte("A:"+tok), true); p == nil || p.Name != "A" {
		t.Errorf("token from %v: %v, %v", far, p, code)
	}
	if p, code := withAuth.principalFor(&conn{srv: withAuth, ip: far}, nil, false); p == nil || p.Name != "legacy" {
		t.Errorf("address %v: %v, %v; want legacy", far, p, code)
	}
	if p, code := withAuth.principalFor(&conn{srv: withAuth, ip: netip.MustParseAddr("10.0.1.1")}, nil, false); p != nil || code != protocol.CodeAuthRequired {
		t.Errorf("uncovered address: %v, %v; want authentication required", p, code)
	}
	if p, code := withAuth.principalFor(&conn{srv: withAuth, ip: far}, []byte("A:wrong"), true); p != nil || code != protocol.CodeAuthFailed {
		t.Errorf("wrong token: %v, %v; want authentication failed", p, code)
	}
}

func TestServeRefusesRemoteListenerWithoutCredentials(t *testing.T) {
	t.Parallel()
	for _, ip := range []string{"10.0.0.1", "0.0.0.0", "::"} {
		t.Run(ip, func(t *testing.T) {
			srv, err := New(Config{QuietPeriod: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Shutdown(context.Background())
			ln := newFakeListener(ip)
			err = srv.Serve(ln)
			if err == nil || errors.Is(err, ErrServerClosed) {
				t.Fatalf("Serve on %s without credentials: %v", ip, err)
			}
			for _, want := range []string{"--auth-file", "--insecure", "without credentials"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the error does not say %q: %v", want, err)
				}
			}
			if !ln.isClosed() {
				t.Error("Serve left the listener open")
			}
		})
	}
	t.Run("ListenAndServe", func(t *testing.T) {
		srv, err := New(Config{QuietPeriod: -1, Addr: "0.0.0.0:0"})
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Shutdown(context.Background())
		if err := srv.ListenAndServe(); err == nil || !strings.Contains(err.Error(), "--insecure") {
			t.Fatalf("ListenAndServe on 0.0.0.0 without credentials: %v", err)
		}
	})
	for _, cfg := range []Config{{Insecure: true}, {AuthFile: writeAuthFile(t, authLine(t, "A", auth.NewToken(), "admin"))}} {
		t.Run(fmt.Sprintf("insecure=%v", cfg.Insecure), func(t *testing.T) {
			cfg.QuietPeriod = -1
			srv, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			ln := newFakeListener("10.0.0.1")
			done := make(chan error, 1)
			go func() { done <- srv.Serve(ln) }()
			for srv.Addr() == nil {
				time.Sleep(time.Millisecond)
			}
			if err := srv.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != ErrServerClosed {
				t.Fatalf("Serve returned %v, want ErrServerClosed", err)
			}
		})
	}
}

// ---- 5. exhaustion ----

func TestMaxConnsPerIP(t *testing.T) {
	t.Parallel()
	// Loopback is not limited: every local client shares 127.0.0.1.
	local := start(t, Config{MaxConnsPerIP: 2, StatusRate: -1})
	for i := range 4 {
		connected(t, local, fmt.Sprintf("local%d", i))
	}
	// IPv6 addresses count by /64.
	if a, b := ipKey(netip.MustParseAddr("2001:db8::1")), ipKey(netip.MustParseAddr("2001:db8::ffff:2")); a != b || !a.IsValid() {
		t.Fatalf("one /64 counts once: %v %v", a, b)
	}
	if ipKey(netip.MustParseAddr("127.0.0.1")).IsValid() || ipKey(netip.MustParseAddr("::1")).IsValid() {
		t.Fatal("loopback is counted")
	}
	srv := startRemote(t, Config{MaxConnsPerIP: 5, StatusRate: -1, Insecure: true}, "10.0.0.1")
	var cs []*raw
	for i := range 4 {
		cs = append(cs, connected(t, srv, fmt.Sprintf("c%d", i)))
	}
	silent := dialRaw(t, srv) // a connection that never identifies counts too
	extra := dialRaw(t, srv)
	extra.send("connect extra 1.0") // refused at its connect: it might be a cluster's link
	extra.expect("error too many connections from this address!")
	// silent, of its address, is in the pool: extra is held (the tarpit).

	// Once a connection ends, a new one is accepted.
	silent.nc.Close()
	for deadline := time.Now().Add(3 * time.Second); ; {
		c := dialRaw(t, srv)
		c.send("connect again 1.0")
		p, err := c.next(3 * time.Second)
		if err == nil && match(p, "connected 1.0 new *") {
			break
		}
		if err == nil && p != "error too many connections from this address!" {
			t.Fatalf("got %q", p)
		}
		c.nc.Close()
		if time.Now().After(deadline) {
			t.Fatal("no connection accepted after one closed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	st := cs[0].statusOf("1")
	if st.Limits.RejectedPerIP < 1 || st.Limits.MaxConnsPerIP != 5 {
		t.Fatalf("limits: rejectedPerIp %d, maxConnsPerIp %d", st.Limits.RejectedPerIP, st.Limits.MaxConnsPerIP)
	}
}

func TestIdleTimeoutKeepsTheSessionForItsGrace(t *testing.T) {
	t.Parallel()
	// An idle timeout of seconds: busy's pings, 100 ms apart, keep it open
	// on a starved machine too (a second was crossed at load 40).
	const idleTimeout, grace = 5 * time.Second, 2 * time.Second
	srv := start(t, Config{IdleTimeout: idleTimeout, SessionGrace: grace, StatusRate: -1})
	idle := connected(t, srv, "idle")
	lastSent := time.Now() // before its last frame is sent: the server reads it later
	id := idle.lock("1", "r 60000 0 0")
	idle.locked(id)
	busy := connected(t, srv, "busy")
	wid := busy.lock("1", "r 60000 0 0")

	type event struct {
		frame string
		err   error
		at    time.Time
	}
	idleEvents := make(chan []event, 1)
	go func() {
		var evs []event
		for {
			p, err := idle.next(idleTimeout + 30*time.Second)
			evs = append(evs, event{p, err, time.Now()})
			if err != nil {
				break
			}
		}
		idleEvents <- evs
	}()

	// busy pings every 100 ms (so it is not idle) and watches for its
	// grant.
	var granted time.Time
	for n, deadline := 2, time.Now().Add(idleTimeout+grace+30*time.Second); granted.IsZero(); n++ {
		if time.Now().After(deadline) {
			t.Fatal("the waiter was never granted")
		}
		req := strconv.Itoa(n)
		busy.send("ping " + req)
		for {
			p := busy.read()
			if strings.HasPrefix(p, "locked "+wid+" ") {
				granted = time.Now()
				continue
			}
			if p != "result "+req+" success pong" {
				t.Fatalf("busy got %q", p)
			}
			break
		}
		if p, err := busy.next(100 * time.Millisecond); err == nil {
			if !strings.HasPrefix(p, "locked "+wid+" ") {
				t.Fatalf("busy got %q", p)
			}
			granted = time.Now()
		}
	}

	evs := <-idleEvents
	if len(evs) != 2 || evs[0].frame != "error idle timeout!" || (evs[1].err != io.EOF && !strings.Contains(fmt.Sprint(evs[1].err), "reset")) {
		t.Fatalf("the idle connection got %+v, want the idle timeout error and the close", evs)
	}
	// The times below are when this test saw the frames, later than the
	// server sent them (by as much as a busy machine delays a goroutine):
	// a lower bound is measured from lastSent, which is before the
	// server read the idle connection's last frame, so it cannot be
	// missed; an upper bound is seconds.
	closedAt := evs[0].at
	if d := closedAt.Sub(lastSent); d < idleTimeout-20*time.Millisecond || d > idleTimeout+5*time.Second {
		t.Fatalf("closed %v after its last frame, idle timeout %v", d, idleTimeout)
	}
	// The grace counts from the idle close, not from the last frame: the
	// waiter is granted a whole idle timeout and grace after it.
	if d := granted.Sub(lastSent); d < idleTimeout+grace-50*time.Millisecond {
		t.Fatalf("the idle session's lock went to the waiter %v after its last frame, before its idle timeout %v and grace %v", d, idleTimeout, grace)
	}
	t.Logf("idle close %v after the last frame; waiter granted %v after it", closedAt.Sub(lastSent), granted.Sub(closedAt))
	st := busy.statusOf("s")
	if st.Limits.IdleClosed != 1 || st.Limits.IdleTimeoutMs != idleTimeout.Milliseconds() {
		t.Fatalf("limits: idleClosed %d, idleTimeoutMs %d", st.Limits.IdleClosed, st.Limits.IdleTimeoutMs)
	}
}

// frameHeader returns the header of a frame with a payload of n bytes.
func frameHeader(n int) []byte {
	return binary.BigEndian.AppendUint32(nil, uint32(n+protocol.Overhead))
}

func TestFrameLimitBeforeHandshake(t *testing.T) {
	t.Parallel()
	srv := start(t, Config{})
	c := dialRaw(t, srv)
	c.write(append(frameHeader(MaxHandshakeFrame+1), "connect big 1.0 "...))
	c.expect("error frame too large!")
	c.closed()

	// A connect of exactly the limit is fine (unknown fields are ignored);
	// after it, frames up to MaxFrame are.
	payload := "connect big 1.0 pad="
	payload += strings.Repeat("x", MaxHandshakeFrame-len(payload))
	c = dialRaw(t, srv)
	c.send(payload)
	c.expect("connected 1.0 new *")
	req := strings.Repeat("r", 5000)
	c.send("ping " + req)
	c.expect("result " + req + " success pong")
}

func TestAuthTimeoutForSlowClients(t *testing.T) {
	t.Parallel()
	const timeout = 300 * time.Millisecond
	srv := start(t, Config{AuthTimeout: timeout})
	began := time.Now()
	c := dialRaw(t, srv)
	// A client that sends its connect a byte at a time, each byte well
	// within the auth timeout of the one before, is not given more time
	// for it: the server closes the connection while the bytes still come
	// (for 10 s, which a per-byte timeout would never end).
	const bytes, every = 95, 100 * time.Millisecond
	c.write(append(frameHeader(100), "conn"...))
	stop := make(chan struct{})
	sent := make(chan int, 1)
	go func() {
		n := 0
		defer func() { sent <- n }()
		for ; n < bytes; n++ {
			select {
			case <-stop:
				return
			case <-time.After(every): // the slowness under test
			}
			if _, err := c.nc.Write([]byte{'x'}); err != nil {
				return // closed, as it should be
			}
		}
	}()
	c.expect("error auth timeout!")
	c.closed()
	close(stop)
	if n := <-sent; n == bytes {
		t.Fatalf("the server read all %d slow bytes (%v) without closing the connection, auth timeout %v", n, time.Since(began), timeout)
	}
	if d := time.Since(began); d < timeout {
		t.Fatalf("closed after %v, before the auth timeout %v", d, timeout)
	}
}

func TestMaxSessionsCountsSessionsInGrace(t *testing.T) {
	t.Parallel()
	srv := start(t, Config{MaxSessions: 2, SessionGrace: 3 * time.Second, StatusRate: -1})
	c1 := connected(t, srv, "s1")
	c2 := connected(t, srv, "s2")
	c2.locked(c2.lock("1", "x 10000 0 0"))
	c2.nc.Close()
	for deadline := time.Now().Add(2 * time.Second); c1.statusOf("1").SocketCount != 1; {
		if time.Now().After(deadline) {
			t.Fatal("the closed connection is still counted")
		}
		time.Sleep(5 * time.Millisecond)
	}
	refusedConnect(t, srv, "connect s3 1.0", "too many sessions!")
	// The session in its grace may come back.
	c2 = dialRaw(t, srv)
	c2.send("connect s2 1.0")
	c2.expect("connected 1.0 resumed *")
	st := c1.statusOf("2")
	if st.Limits.SessionsRefused != 1 || st.Sessions != 2 || st.Limits.MaxSessions != 2 {
		t.Fatalf("limits: sessionsRefused %d, sessions %d, maxSessions %d", st.Limits.SessionsRefused, st.Sessions, st.Limits.MaxSessions)
	}
}

func TestEngineCaps(t *testing.T) {
	t.Parallel()
	name60 := strings.Repeat("n", 60)
	t.Run("locks per session", func(t *testing.T) {
		srv := start(t, Config{MaxLocksPerSession: 2})
		c := connected(t, srv, "s")
		c.locked(c.lock("1", "x 10000 0 0"))
		c.locked(c.lock("2", "y 10000 0 0"))
		c.send("lock 3 z 10000 0 0")
		c.expect("result 3 failed too many locks in this session!")
		d := connected(t, srv, "d")
		d.lock("1", "z 10000 0 0")
	})
	t.Run("session bytes", func(t *testing.T) {
		srv := start(t, Config{MaxSessionBytes: 100, StatusRate: -1})
		c := connected(t, srv, "s")
		c.locked(c.lock("1", "a"+name60+" 10000 0 0"))
		c.send("lock 2 b" + name60 + " 10000 0 0")
		c.expect("result 2 failed too many locks in this session!")
		d := connected(t, srv, "d")
		d.locked(d.lock("1", "b"+name60+" 10000 0 0"))
		if st := c.statusOf("3"); st.Limits.NameBytes != 122 || st.Limits.ServerFull != 0 || st.Limits.MaxSessionBytes != 100 {
			t.Fatalf("limits %+v", st.Limits)
		}
	})
	t.Run("locks", func(t *testing.T) {
		srv := start(t, Config{MaxLocks: 3, StatusRate: -1})
		c, d := connected(t, srv, "s"), connected(t, srv, "d")
		c.locked(c.lock("1", "x 10000 0 0"))
		c.lock("2", "x 10000 0 0") // waiting requests count
		id := d.lock("1", "y 10000 0 0")
		d.locked(id)
		d.send("lock 2 z 10000 0 0")
		d.expect("result 2 failed server is full!")
		d.send("unlock 3 " + id)
		d.expect("result 3 success done")
		d.locked(d.lock("4", "z 10000 0 0"))
		if st := c.statusOf("3"); st.Limits.ServerFull != 1 || st.CurrentLocks != 3 || st.Limits.MaxLocks != 3 {
			t.Fatalf("currentLocks %d, limits %+v", st.CurrentLocks, st.Limits)
		}
	})
	t.Run("entries", func(t *testing.T) {
		srv := start(t, Config{MaxEntries: 4, StatusRate: -1})
		c := connected(t, srv, "s")
		c.locked(c.lock("1", "e1|e2|e3 10000 0 0"))
		c.send("lock 2 e4|e5 10000 0 0")
		c.expect("result 2 failed server is full!")
		c.locked(c.lock("3", "e4 10000 0 0"))
		if st := c.statusOf("4"); st.Limits.ServerFull != 1 || st.Limits.Entries != 4 {
			t.Fatalf("limits %+v", st.Limits)
		}
	})
	t.Run("name bytes", func(t *testing.T) {
		srv := start(t, Config{MaxNameBytes: 100, StatusRate: -1})
		c, d := connected(t, srv, "s"), connected(t, srv, "d")
		c.locked(c.lock("1", "a"+name60+" 10000 0 0"))
		d.send("lock 1 b" + name60 + " 10000 0 0")
		d.expect("result 1 failed server is full!")
		d.locked(d.lock("2", "b 10000 0 0 own"))
		if st := c.statusOf("2"); st.Limits.ServerFull != 1 || st.Limits.NameBytes != 61+1+3 {
			t.Fatalf("limits %+v", st.Limits)
		}
	})
}

func TestStatusRate(t *testing.T) {
	t.Parallel()
	// One listing a second: the rule on the clock is bucketTake's test;
	// here, three listings written at once come well within a second of
	// each other, so the second and third are refused.
	srv, tk := abServer(t, Config{StatusRate: 1})
	adm := connectAs(t, srv, "ops1", "ops", tk.admin)
	a := connectAs(t, srv, "a1", "A", tk.a)
	adm.write(append(append(protocol.Append(nil, "status 1"), protocol.Append(nil, "locks 2")...), protocol.Append(nil, "status 3")...))
	adm.answer("1")
	adm.expect("result 2 failed too many requests, retry later!")
	adm.expect("result 3 failed too many requests, retry later!")
	// Counters-only status is not limited.
	for i := range 30 {
		a.statusOf(strconv.Itoa(i))
	}
	var limited uint64
	srv.batch(func(*core.Tx) { limited = srv.counters.rateLimited })
	if limited != 2 {
		t.Fatalf("rateLimited %d, want 2", limited)
	}
}

// The listing bucket, on a fake clock: a burst of rate, then one token
// every 1/rate second, never more than rate kept; a clock that goes back
// refills nothing.
func TestBucketTake(t *testing.T) {
	t.Parallel()
	const rate = 3
	sec := int64(time.Second)
	b := &bucket{tokens: rate, last: 0}
	steps := []struct {
		at   int64
		want bool
	}{
		{0, true}, {0, true}, {0, true}, {0, false}, // the burst
		{sec/3 - 1000, false}, {sec/3 + 1, true}, {sec/3 + 1, false}, // one token per third of a second
		{sec + 10, true}, {sec + 10, true}, {sec + 10, false},
		{sec / 2, false},                                                            // back in time: nothing
		{100 * sec, true}, {100 * sec, true}, {100 * sec, true}, {100 * sec, false}, // at most rate kept
	}
	for i, st := range steps {
		if got := b.take(st.at, rate); got != st.want {
			t.Fatalf("step %d: take at %v = %v, want %v", i, time.Duration(st.at), got, st.want)
		}
	}
}

// pipelineLocks sends n lock requests of c (lock <req> <line>) and reads
// their answers, writing and reading at once. It returns the lock ids.
func pipelineLocks(t testing.TB, c *raw, n int, line func(i int) string) []string {
	t.Helper()
	werr := make(chan error, 1)
	go func() {
		var b []byte
		for i := range n {
			b = protocol.Append(b, fmt.Sprintf("lock p%d %s", i, line(i)))
			if len(b) > 64<<10 || i == n-1 {
				if _, err := c.nc.Write(b); err != nil {
					werr <- err
					return
				}
				b = b[:0]
			}
		}
		werr <- nil
	}()
	ids := make([]string, 0, n)
	for len(ids) < n {
		p, err := c.next(10 * time.Second)
		if err != nil {
			t.Fatalf("after %d answers: %v", len(ids), err)
		}
		if strings.HasPrefix(p, "locked ") {
			continue
		}
		f := strings.Fields(p)
		if len(f) != 4 || f[0] != "result" || f[2] != "success" || f[1] != fmt.Sprintf("p%d", len(ids)) {
			t.Fatalf("answer %d: %q", len(ids), p)
		}
		ids = append(ids, f[3])
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	for { // the last grants' pushes
		p, err := c.next(100 * time.Millisecond)
		if err != nil {
			break
		}
		if !strings.HasPrefix(p, "locked ") {
			t.Fatalf("after the answers: %q", p)
		}
	}
	return ids
}

func TestLocksListingIsBoundedAndPaged(t *testing.T) {
	t.Parallel()
	const waiters, limit = 20_000, 100
	srv := start(t, Config{StatusLimit: limit, StatusRate: -1})
	c := connected(t, srv, "lister")
	pipelineLocks(t, c, waiters+1, func(int) string { return "big 60000 0 0" })
	pipelineLocks(t, c, 30, func(i int) string { return fmt.Sprintf("p:%03d 60000 0 0", i) })

	// The big queue: its length, at most limit entries, and a cursor.
	ls, size := c.locksOf("1", "")
	if len(ls.Queues) != 1 || ls.Queues[0].Resource != "big" || ls.Queues[0].Length != waiters+1 ||
		len(ls.Queues[0].Entries) != limit || !ls.Truncated || ls.Next != "big" {
		t.Fatalf("first page: %d queues, next %q, truncated %v, first %q of length %d with %d entries",
			len(ls.Queues), ls.Next, ls.Truncated, ls.Queues[0].Resource, ls.Queues[0].Length, len(ls.Queues[0].Entries))
	}
	if size > 64<<10 {
		t.Fatalf("a page of %d entries is %d bytes", limit, size)
	}
	t.Logf("locks over a queue of %d waiters: %d bytes", waiters, size)

	// A limit above the status limit is capped; pages follow each other.
	ls, _ = c.locksOf("2", "p: 10")
	if len(ls.Queues) != 10 || ls.Queues[0].Resource != "p:000" || ls.Next != "p:009" {
		t.Fatalf("page p: 10: %d queues from %q, next %q", len(ls.Queues), ls.Queues[0].Resource, ls.Next)
	}
	ls, _ = c.locksOf("3", "p: 10 p:009")
	if len(ls.Queues) != 10 || ls.Queues[0].Resource != "p:010" {
		t.Fatalf("page after p:009 starts at %q", ls.Queues[0].Resource)
	}
	var seen []string
	after := ""
	for page := 0; ; page++ {
		if page > 10 {
			t.Fatal("paging does not end")
		}
		ls, _ = c.locksOf("4", strings.TrimSpace("p: 7 "+after))
		for _, q := range ls.Queues {
			seen = append(seen, q.Resource)
		}
		if ls.Next == "" {
			break
		}
		after = ls.Next
	}
	if len(seen) != 30 || !slices.IsSorted(seen) || slices.Compact(slices.Clone(seen))[29] != "p:029" {
		t.Fatalf("paging saw %v", seen)
	}
	if ls, _ = c.locksOf("5", "p: 100000"); len(ls.Queues) != 30 || ls.Next != "" {
		t.Fatalf("limit above the status limit: %d queues, next %q", len(ls.Queues), ls.Next)
	}
	// With a limit or a cursor, "|" stands for the empty prefix (no
	// resource holds a '|'): the page after the big queue starts with p:.
	ls, _ = c.locksOf("6", "| 5 big")
	if len(ls.Queues) != 5 || ls.Queues[0].Resource != "p:000" || ls.Next != "p:004" {
		t.Fatalf("locks | 5 big: %+v", ls)
	}
}

// ---- 6. a healthy client during a listing attack ----

// percentile returns the p-th percentile (0 < p <= 100) of sorted ds.
func percentile(sorted []time.Duration, p float64) time.Duration {
	i := int(float64(len(sorted))*p/100+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// pingLatencies measures n pings of c, one every gap.
func pingLatencies(c *raw, n int, gap time.Duration) []time.Duration {
	c.t.Helper()
	ds := make([]time.Duration, 0, n)
	for i := range n {
		req := "p" + strconv.Itoa(i)
		began := time.Now()
		c.ping(req)
		ds = append(ds, time.Since(began))
		time.Sleep(gap)
	}
	slices.Sort(ds)
	return ds
}

func TestPingLatencyUnderListingAttack(t *testing.T) {
	t.Parallel()
	// The full size measures; without MLOCK_ASSERT_LATENCY, a tenth of it
	// checks that the attack runs and the healthy client is answered.
	waiters, attackers, pings, attack := 20_000, 4, 300, 2*time.Second
	if os.Getenv("MLOCK_ASSERT_LATENCY") == "" {
		waiters, pings, attack = 2_000, 30, 300*time.Millisecond
	}
	for _, tc := range []struct {
		name   string
		rate   int
		assert bool
	}{{"default status rate", 0, true}, {"no status rate", -1, false}} {
		t.Run(tc.name, func(t *testing.T) {
			srv, tk := abServer(t, Config{StatusRate: tc.rate})
			q := connectAs(t, srv, "queue", "ops", tk.admin)
			pipelineLocks(t, q, waiters+1, func(int) string { return "a:big 60000 0 0" })
			healthy := connectAs(t, srv, "healthy", "A", tk.a)
			pingLatencies(healthy, 20, 0) // warm up
			base := pingLatencies(healthy, 50, time.Millisecond)

			var conns []*raw
			for i := range attackers {
				conns = append(conns, connectAs(t, srv, fmt.Sprintf("attacker-%d", i), "ops", tk.admin))
			}
			stop := make(chan struct{})
			type tally struct {
				ok, limited, bytes int
				err                error
			}
			tallies := make(chan tally, attackers)
			answered := make(chan struct{}, attackers) // each attacker's first answer (or its end)
			for i, c := range conns {
				go func() {
					var tl tally
					first := true
					defer func() {
						if first {
							answered <- struct{}{}
						}
						tallies <- tl
					}()
					deadline := time.Now().Add(attack)
					for n := 0; time.Now().Before(deadline); n++ {
						select {
						case <-stop:
							return
						default:
						}
						cmd := "status"
						if (n+i)%2 == 0 {
							cmd = "locks"
						}
						if _, err := c.nc.Write(protocol.Append(nil, fmt.Sprintf("%s %d", cmd, n))); err != nil {
							tl.err = err
							return
						}
						p, err := c.next(30 * time.Second) // seconds: a busy machine lists 2 000 waiters slowly
						if first && err == nil {
							first = false
							answered <- struct{}{}
						}
						switch {
						case err != nil:
							tl.err = err
							return
						case strings.HasSuffix(p, "failed too many requests, retry later!"):
							tl.limited++
						case strings.HasPrefix(p, fmt.Sprintf("result %d success ", n)):
							tl.ok++
							tl.bytes += len(p)
						default:
							tl.err = fmt.Errorf("attacker got %.80q", p)
							return
						}
					}
				}()
			}
			for range attackers { // the attack is under way
				<-answered
			}
			ds := pingLatencies(healthy, pings, 3*time.Millisecond)
			close(stop)
			var all tally
			for range attackers {
				tl := <-tallies
				if tl.err != nil {
					t.Errorf("attacker: %v", tl.err)
				}
				all.ok += tl.ok
				all.limited += tl.limited
				all.bytes += tl.bytes
			}
			p50, p99, worst := percentile(ds, 50), percentile(ds, 99), ds[len(ds)-1]
			t.Logf("baseline ping p50 %v p99 %v; under attack (%d listings answered, %d MB, %d rate-limited): p50 %v p99 %v max %v; goal p99 < 10ms met: %v",
				percentile(base, 50), percentile(base, 99), all.ok, all.bytes>>20, all.limited, p50, p99, worst, p99 < 10*time.Millisecond)
			if all.ok == 0 {
				t.Fatal("the attack listed nothing")
			}
			// A latency is a measurement: on a loaded machine (the test
			// packages run side by side) it says more about the machine
			// than about the server. It is logged above, and asserted with
			// MLOCK_ASSERT_LATENCY=1 on a quiet machine.
			if tc.assert && os.Getenv("MLOCK_ASSERT_LATENCY") != "" && p99 >= 100*time.Millisecond {
				t.Fatalf("ping p99 %v under a listing attack", p99)
			}
			healthy.ping("end")
		})
	}
}

// ---- secrets ----

func TestPlainStatusWithCredentialsShowsCountersOnly(t *testing.T) {
	t.Parallel()
	srv, tk := abServer(t, Config{})
	a := connectAs(t, srv, "plain-secret-sid", "A", tk.a)
	id := a.lock("1", "a:plain-resource 10000 0 0")
	a.locked(id)
	nc, err := net.Dial("tcp", srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.Write([]byte("status\n"))
	nc.SetReadDeadline(time.Now().Add(3 * time.Second))
	b, err := io.ReadAll(nc)
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	if !strings.Contains(text, "currentLocks: 1") {
		t.Fatalf("plain status lacks the counters:\n%s", text)
	}
	for _, secret := range []string{"plain-resource", "plain-secret-sid", short(id), "127.0.0.1", tk.a} {
		if strings.Contains(text, secret) {
			t.Fatalf("plain status shows %q:\n%s", secret, text)
		}
	}
}

// TestSecretsStayOutOfLogsAndListings: socketIds, lock ids and tokens never
// appear whole in the log (at debug level), status, locks or errors.
func TestSecretsStayOutOfLogsAndListings(t *testing.T) {
	t.Parallel()
	var logs logBuffer
	// The idle timeout ends the test, but must not come before the other
	// events: 200 ms, then 1 s, were too short on a loaded machine.
	cfg := Config{IdleTimeout: 4 * time.Second, SessionGrace: 100 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	srv, tk := abServer(t, cfg)
	const sid = "very-secret-socket-id-0123456789"
	wrong := auth.NewToken()
	refusedConnect(t, srv, "connect "+sid+" 1.0 auth=A:"+wrong, "authentication failed!")
	a := connectAs(t, srv, sid, "A", tk.a)
	id := a.lock("1", "a:secret 10000 0 0")
	a.locked(id)
	// A takeover, a refused extend, a listing, an eviction, an idle close.
	a2 := dialRaw(t, srv)
	a2.send("connect " + sid + " 1.0 auth=A:" + tk.a)
	a2.expect("connected 1.0 resumed *")
	a2.expect("locked " + id + " * *")
	a.expect("error session taken over by a new connection!")
	adm := connectAs(t, srv, "ops-sid", "ops", tk.admin)
	var seen []string
	seen = append(seen, adm.ask("1", "status 1"), adm.ask("2", "locks 2"))
	adm.send("extend 3 " + id + " 1000")
	seen = append(seen, adm.read())
	adm.send("evict 4 a:secret")
	adm.expect("result 4 success 1")
	a2.expect("expired " + id + " evicted")
	a2.expect("expired " + id) // freed a grace later
	if p, err := a2.next(15 * time.Second); err != nil || p != "error idle timeout!" {
		t.Fatalf("got %q, %v; want error idle timeout!", p, err)
	}
	a2.closed()
	refusedConnect(t, srv, "connect x 1.0 auth=nobody:"+wrong, "authentication failed!")
	// The session's grace ends (logged).
	proctest.WaitFor(t, 10*time.Second, "the end of the session's grace in the log", func() bool {
		l := logs.String()
		return strings.Contains(l, "within the session grace") || strings.Contains(l, "after its grace period")
	})
	seen = append(seen, logs.String())
	if !strings.Contains(logs.String(), "taken over") || !strings.Contains(logs.String(), "idle") {
		t.Fatalf("the log lacks the events:\n%s", logs.String())
	}
	for _, text := range seen {
		for _, secret := range []string{sid, id, tk.a, tk.admin, wrong} {
			if strings.Contains(text, secret) {
				t.Fatalf("%q appears in:\n%s", secret, text)
			}
		}
	}
}
