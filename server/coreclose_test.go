package server

import (
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/internal/protocol"
	"github.com/mlock-dev/mlock/internal/testcert"
)

// stallConn is a server-side socket whose writes and close, once armed,
// block until released, as they do toward a client that does not read (a
// write, and a TLS close's close_notify, wait on a full socket buffer). A
// write still ends at its write deadline.
type stallConn struct {
	net.Conn
	armed   atomic.Bool
	entered chan string   // "write" or "close", each time one blocks
	release chan struct{} // closed: nothing blocks any more

	mu  sync.Mutex
	wdl time.Time
	dl  chan struct{} // closed and replaced when the write deadline changes
}

func (c *stallConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	c.wdl = t
	close(c.dl)
	c.dl = make(chan struct{})
	c.mu.Unlock()
	return c.Conn.SetWriteDeadline(t)
}

func (c *stallConn) SetDeadline(t time.Time) error {
	if err := c.SetWriteDeadline(t); err != nil {
		return err
	}
	return c.Conn.SetReadDeadline(t)
}

func (c *stallConn) Write(b []byte) (int, error) {
	if c.armed.Load() {
		select {
		case c.entered <- "write":
		default:
		}
		for {
			c.mu.Lock()
			wdl, dl := c.wdl, c.dl
			c.mu.Unlock()
			if !wdl.IsZero() && !time.Now().Before(wdl) {
				return 0, os.ErrDeadlineExceeded
			}
			var tick <-chan time.Time
			if !wdl.IsZero() {
				tm := time.NewTimer(time.Until(wdl))
				defer tm.Stop()
				tick = tm.C
			}
			select {
			case <-c.release:
				return c.Conn.Write(b)
			case <-dl:
			case <-tick:
			}
		}
	}
	return c.Conn.Write(b)
}

func (c *stallConn) Close() error {
	if c.armed.Load() {
		select {
		case c.entered <- "close":
		default:
		}
		<-c.release
	}
	return c.Conn.Close()
}

// stallListener wraps every accepted socket in a stallConn and hands it to
// the test.
type stallListener struct {
	net.Listener
	release  chan struct{}
	accepted chan *stallConn
}

func (l *stallListener) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	sc := &stallConn{Conn: nc, entered: make(chan string, 8), release: l.release, dl: make(chan struct{})}
	l.accepted <- sc
	return sc, nil
}

// TestOutputLimitCloseNotUnderCoreLock: a TLS connection closed for
// going over its output limit, whose socket blocks (a client that does
// not read), holds up no other client: the server neither writes
// close_notify nor closes the socket under the core's lock.
func TestOutputLimitCloseNotUnderCoreLock(t *testing.T) {
	ca := testcert.New(t)
	cfg := Config{MaxPendingOutput: 512, QuietPeriod: -1}
	cfg.TLSCertFile, cfg.TLSKeyFile = ca.Server(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sl := &stallListener{Listener: ln, release: make(chan struct{}), accepted: make(chan *stallConn, 4)}
	var once sync.Once
	unblock := func() { once.Do(func() { close(sl.release) }) }
	srv := serveOn(t, cfg, sl)
	t.Cleanup(unblock) // before the server's shutdown (cleanups run last first)

	a, _ := dialTLS(t, srv, clientTLS(t, ca, ""))
	aSock := <-sl.accepted
	a.send("connect slow 1.0")
	a.expect("connected 1.0 new *")
	b, _ := dialTLS(t, srv, clientTLS(t, ca, ""))
	<-sl.accepted
	b.send("connect other 1.0")
	b.expect("connected 1.0 new *")

	// a stops reading, and asks for far more than its output limit in one
	// write: the batch that answers goes over it.
	aSock.armed.Store(true)
	var burst []byte
	for i := range 300 {
		burst = protocol.Append(burst, fmt.Sprintf("ping %d", i+1))
	}
	a.write(burst)
	select {
	case what := <-aSock.entered:
		t.Logf("the server's %s to the slow client blocks", what)
	case <-time.After(10 * time.Second):
		t.Fatal("the server never wrote to nor closed the slow client")
	}
	// While it blocks, the other client is served.
	b.send("ping 1")
	p, err := b.next(10 * time.Second)
	if err != nil || !strings.HasPrefix(p, "result 1 success pong") {
		t.Fatalf("another client's ping while the slow client's close blocks: %q, %v (the core's lock is held)", p, err)
	}
	unblock()
}
