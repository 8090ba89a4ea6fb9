package browser

import (
	"bufio"
	"context"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mlock-dev/mlock/internal/auth"
	"github.com/mlock-dev/mlock/internal/protocol"
	"github.com/mlock-dev/mlock/server"
	"github.com/mlock-dev/mlock/server/observe"
)

// TestMain fails the package if a test leaves a goroutine behind: the
// server's, the HTTP handler's or chromedp's.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// start runs an mlockd server with cfg on a loopback port, through the
// server package's exported API as cmd/mlockd does, and stops it when the
// test ends. Without a data directory it grants at once (no quiet period).
func start(t *testing.T, cfg server.Config) *server.Server {
	t.Helper()
	if cfg.DataDir == "" && cfg.QuietPeriod == 0 {
		cfg.QuietPeriod = -1
	}
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	// srv.Addr is nil until Serve, in its goroutine, has taken ln in: the
	// tests dial srv.Addr().
	for deadline := time.Now().Add(10 * time.Second); srv.Addr() == nil; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the server did not take its listener in within 10s")
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		<-done
	})
	return srv
}

// startHTTP serves srv's HTTP handler (the live page, its API) on a
// loopback port and returns its base URL.
func startHTTP(t *testing.T, srv *server.Server) string {
	t.Helper()
	h := srv.HTTPHandler(observe.Options{})
	ts := httptest.NewServer(h)
	t.Cleanup(func() { ts.Close(); h.Close() })
	return ts.URL
}

// raw is a client connection that speaks the wire protocol frame by frame.
type raw struct {
	t  *testing.T
	nc net.Conn
	r  *bufio.Reader
}

// dial connects to srv and sends the connect line.
func dial(t *testing.T, srv *server.Server, connect string) *raw {
	t.Helper()
	nc, err := net.Dial("tcp", srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	c := &raw{t: t, nc: nc, r: bufio.NewReader(nc)}
	c.send(connect)
	c.expect("connected 1.0 new *")
	return c
}

// connected dials and identifies as session sid, expecting a new session.
func connected(t *testing.T, srv *server.Server, sid string) *raw {
	t.Helper()
	return dial(t, srv, "connect "+sid+" 1.0")
}

// connectAs is connected as the principal name with its token.
func connectAs(t *testing.T, srv *server.Server, sid, name, token string) *raw {
	t.Helper()
	return dial(t, srv, "connect "+sid+" 1.0 auth="+name+":"+token)
}

func (c *raw) send(payload string) {
	c.t.Helper()
	if _, err := c.nc.Write(protocol.Append(nil, payload)); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// expect reads one frame and compares it with want word by word, "*"
// matching any one word. It returns the frame's words.
func (c *raw) expect(want string) []string {
	c.t.Helper()
	_ = c.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	p, err := protocol.ReadFrame(c.r, nil, 1<<20)
	if err != nil {
		c.t.Fatalf("reading a frame (want %q): %v", want, err)
	}
	got, w := strings.Split(string(p), " "), strings.Split(want, " ")
	ok := len(got) == len(w)
	for i := 0; ok && i < len(w); i++ {
		ok = w[i] == "*" || w[i] == got[i]
	}
	if !ok {
		c.t.Fatalf("got %q, want %q", p, want)
	}
	return got
}

// lock sends a lock and returns the lock id from the result.
func (c *raw) lock(req, args string) string {
	c.t.Helper()
	c.send("lock " + req + " " + args)
	return c.expect("result " + req + " success *")[3]
}

// locked expects the locked push for id.
func (c *raw) locked(id string) {
	c.t.Helper()
	c.expect("locked " + id + " * *")
}

// short is how the page shows a lock id: 8 of its characters.
func short(id string) string { return id[8:16] }

// writeAuthFile writes an auth file of one principal per line.
func writeAuthFile(t *testing.T, lines ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "auth")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// authLine returns the auth-file line of a principal with a token.
func authLine(t *testing.T, name, token string, perms ...string) string {
	t.Helper()
	l, err := auth.Line(name, token, perms...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}
