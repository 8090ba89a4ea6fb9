package cluster

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// newLayer is a stream layer on a free loopback port, closed when the test ends.
func newLayer(t *testing.T, secret string) *streamLayer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := newStreamLayer(ln, []byte(secret), nil)
	t.Cleanup(func() { s.Close() })
	return s
}

// accepted accepts one connection and reads what it can, in the background:
// its data, or the error that ended the read.
func accepted(s *streamLayer) <-chan error {
	ch := make(chan error, 1)
	go func() {
		c, err := s.Accept()
		if err != nil {
			ch <- err
			return
		}
		defer c.Close()
		b := make([]byte, 5)
		if _, err := io.ReadFull(c, b); err != nil {
			ch <- err
			return
		}
		if string(b) != "hello" {
			ch <- errors.New("read " + string(b))
			return
		}
		c.Write([]byte("world"))
		ch <- nil
	}()
	return ch
}

// helloWorld says hello on c and fails the test unless the answer is world (see accepted).
func helloWorld(t *testing.T, c net.Conn) {
	t.Helper()
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "world" {
		t.Fatalf("answer %q, %v", buf, err)
	}
}

// Peers that share the secret talk; the handshake is invisible to raft.
func TestRaftConnectionsAuthenticated(t *testing.T) {
	t.Parallel()
	a, b := newLayer(t, "the-cluster-secret"), newLayer(t, "the-cluster-secret")
	got := accepted(b)
	c, err := a.Dial(raft.ServerAddress(b.Addr().String()), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	helloWorld(t, c)
	if err := <-got; err != nil {
		t.Fatalf("acceptor: %v", err)
	}
}

// A peer with another secret is refused both ways: its Dial fails, and the
// acceptor never reads its bytes.
func TestRaftConnectionWrongSecret(t *testing.T) {
	t.Parallel()
	a, b := newLayer(t, "one-secret-of-a-cluster"), newLayer(t, "another-secret-entirely")
	got := accepted(b)
	if _, err := a.Dial(raft.ServerAddress(b.Addr().String()), time.Second); !errors.Is(err, errRaftAuth) {
		t.Fatalf("Dial with the wrong secret: %v, want errRaftAuth", err)
	}
	if err := <-got; err == nil {
		t.Fatal("the acceptor read from a peer with the wrong secret")
	}
}

// A client that does not speak the handshake (or sends raft RPCs right
// away) is closed without its bytes being read as raft traffic.
func TestRaftConnectionWithoutHandshake(t *testing.T) {
	t.Parallel()
	b := newLayer(t, "the-cluster-secret")
	got := accepted(b)
	c, err := net.Dial("tcp", "127.0.0.1:"+portOf(b))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("hello, this is not a handshake at all............"))
	if err := <-got; !errors.Is(err, errRaftAuth) {
		t.Fatalf("acceptor: %v, want errRaftAuth", err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := io.ReadFull(c, make([]byte, 64)); err == nil {
		t.Fatalf("the unauthenticated client got %d bytes", n)
	}
}

func portOf(s *streamLayer) string {
	_, p, _ := net.SplitHostPort(s.Addr().String())
	return p
}
