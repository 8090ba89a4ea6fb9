package server

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mlock-dev/mlock/internal/protocol"
	"github.com/mlock-dev/mlock/internal/testenv"
)

// TestMain checks for leaked goroutines. Ignored: the waiters of a raft future that raft never answers
// (an entry it found already applied; see internal/cluster futureError and complete): they end only with
// the process.
func TestMain(m *testing.M) {
	// The cluster tests wait for elections, leases and timeouts far more
	// than they compute: 32 at a time, not GOMAXPROCS (alone on 2 cores,
	// the package then uses about a third of them).
	testenv.WaitBound(32)
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/mlock-dev/mlock/internal/cluster.(*leadership).futureError.func1"),
		goleak.IgnoreAnyFunction("github.com/mlock-dev/mlock/internal/cluster.(*leadership).complete"))
}

// start runs a server on 127.0.0.1:0 and stops it when the test ends.
// Without a data directory or a quiet period in cfg, the server grants at
// once (QuietPeriod -1).
func start(t testing.TB, cfg Config) *Server {
	t.Helper()
	if cfg.DataDir == "" && cfg.QuietPeriod == 0 {
		cfg.QuietPeriod = -1
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveOn(t, cfg, ln)
}

// serveOn runs a server on ln and stops it when the test ends.
func serveOn(t testing.TB, cfg Config, ln net.Listener) *Server {
	t.Helper()
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // seconds: a busy machine
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-done; err != ErrServerClosed {
			t.Errorf("Serve returned %v", err)
		}
	})
	for srv.Addr() == nil {
		time.Sleep(time.Millisecond)
	}
	return srv
}

// raw is a client speaking raw frames.
type raw struct {
	t   testing.TB
	nc  net.Conn
	buf []byte
}

func dialRaw(t testing.TB, srv *Server) *raw {
	t.Helper()
	nc, err := net.Dial("tcp", srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return &raw{t: t, nc: nc}
}

// connected dials and identifies as sid, expecting a new session.
func connected(t testing.TB, srv *Server, sid string) *raw {
	t.Helper()
	c := dialRaw(t, srv)
	c.send("connect " + sid + " 1.0")
	c.expect("connected 1.0 new *")
	return c
}

func (c *raw) send(payload string) {
	c.t.Helper()
	c.write(protocol.Append(nil, payload))
}

func (c *raw) write(b []byte) {
	c.t.Helper()
	if _, err := c.nc.Write(b); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// next returns the next frame's payload, or "" and the error.
func (c *raw) next(wait time.Duration) (string, error) {
	_ = c.nc.SetReadDeadline(time.Now().Add(wait))
	for {
		if len(c.buf) >= 4 {
			l := int(binary.BigEndian.Uint32(c.buf))
			if l < 5 {
				return "", fmt.Errorf("server sent frame length %d", l)
			}
			if len(c.buf) >= l {
				if c.buf[l-1] != '\n' {
					return "", fmt.Errorf("server frame without newline")
				}
				p := string(c.buf[4 : l-1])
				c.buf = c.buf[l:]
				return p, nil
			}
		}
		tmp := make([]byte, 4096)
		n, err := c.nc.Read(tmp)
		c.buf = append(c.buf, tmp[:n]...)
		if err != nil && n == 0 {
			return "", err
		}
	}
}

func (c *raw) read() string {
	c.t.Helper()
	// Seconds: a frame a test expects comes; the bound is only reached by
	// a failing test (and a busy machine, under the race detector, takes
	// over a second for a cluster's commit).
	p, err := c.next(10 * time.Second)
	if err != nil {
		c.t.Fatalf("reading a frame: %v", err)
	}
	return p
}

// expect reads one frame and compares it with want; "*" in want matches
// one field.
func (c *raw) expect(want string) []string {
	c.t.Helper()
	got := c.read()
	if !match(got, want) {
		c.t.Fatalf("got %q, want %q", got, want)
	}
	return strings.Split(got, " ")
}

// match compares got with want word by word: "*" matches any one word, and
// a last word "**" any number of words (a cluster follower's handshake ends
// with its leader=<addr> hint).
func match(got, want string) bool {
	g, w := strings.Split(got, " "), strings.Split(want, " ")
	if len(w) > 0 && w[len(w)-1] == "**" {
		w = w[:len(w)-1]
		if len(g) < len(w) {
			return false
		}
		g = g[:len(w)]
	}
	if len(g) != len(w) {
		return false
	}
	for i := range w {
		if w[i] != "*" && w[i] != g[i] {
			return false
		}
	}
	return true
}

// expectAfterLocked is expect that first skips re-announced locked pushes.
func (c *raw) expectAfterLocked(want string) []string {
	c.t.Helper()
	for {
		got := c.read()
		if strings.HasPrefix(got, "locked ") && !strings.HasPrefix(want, "locked ") {
			continue
		}
		if !match(got, want) {
			c.t.Fatalf("got %q, want %q", got, want)
		}
		return strings.Split(got, " ")
	}
}

// quiet asserts nothing arrives for a short while.
func (c *raw) quiet() {
	c.t.Helper()
	if p, err := c.next(50 * time.Millisecond); err == nil {
		c.t.Fatalf("unexpected frame %q", p)
	}
}

// closed asserts the server closes the connection (after any frames).
func (c *raw) closed() {
	c.t.Helper()
	for {
		p, err := c.next(10 * time.Second)
		if err == io.EOF || (err != nil && strings.Contains(err.Error(), "reset")) {
			return
		}
		if err != nil {
			c.t.Fatalf("want close, got %v", err)
		}
		c.t.Fatalf("want close, got frame %q", p)
	}
}

// lock sends a lock and returns the lock id from the result.
func (c *raw) lock(req, args string) string {
	c.t.Helper()
	c.send("lock " + req + " " + args)
	f := c.expect("result " + req + " success *")
	return f[3]
}

// locked expects the locked push for id and returns its token.
func (c *raw) locked(id string) string {
	c.t.Helper()
	f := c.expect("locked " + id + " * *")
	return f[3]
}

// unlock frees the lock id as request req and expects it done.
func (c *raw) unlock(req, id string) {
	c.t.Helper()
	c.send("unlock " + req + " " + id)
	c.expect("result " + req + " success done")
}
