package rawio

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waitBlocked waits until a goroutine in fn (a function name as stack
// traces print it) waits for the network poller: the call is parked in
// its wait for the socket, not merely started.
func waitBlocked(t *testing.T, fn string) {
	t.Helper()
	buf := make([]byte, 1<<20)
	deadline := time.Now().Add(10 * time.Second)
	for pause := time.Millisecond; ; pause = min(2*pause, 20*time.Millisecond) {
		n := runtime.Stack(buf, true)
		for _, g := range strings.Split(string(buf[:n]), "\n\n") {
			if strings.Contains(g, "[IO wait") && strings.Contains(g, fn) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no goroutine in %s waits for the socket within 10 s", fn)
		}
		time.Sleep(pause) // the poll's interval: a parked goroutine sends no event
	}
}

// pair returns the two ends of a loopback TCP connection.
func pair(t *testing.T) (a, b net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ch := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			ch <- nil
			return
		}
		ch <- c
	}()
	a, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b = <-ch
	if b == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func raw(t *testing.T, nc net.Conn) *Conn {
	t.Helper()
	c, ok := New(nc)
	if !ok {
		t.Skip("no raw system calls on this platform")
	}
	return c
}

// Bytes written raw arrive in order, and raw reads get what the peer wrote,
// then io.EOF once it closed.
func TestReadWrite(t *testing.T) {
	a, b := pair(t)
	ra, rb := raw(t, a), raw(t, b)
	msg := bytes.Repeat([]byte("0123456789"), 100_000) // more than the socket buffers hold
	errc := make(chan error, 1)
	go func() {
		n, err := ra.Write(msg)
		if err == nil && n != len(msg) {
			err = errors.New("short write")
		}
		a.(*net.TCPConn).CloseWrite()
		errc <- err
	}()
	got, err := io.ReadAll(rb)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("read %d bytes, want the %d written", len(got), len(msg))
	}
	if n, err := rb.Read(make([]byte, 10)); n != 0 || err != io.EOF {
		t.Fatalf("after the end: %d, %v; want 0, io.EOF", n, err)
	}
	if n, err := rb.Read(nil); n != 0 || err != nil {
		t.Fatalf("empty read: %d, %v", n, err)
	}
}

// Deadlines and Close end a waiting read or write with the errors the
// connection itself would return.
func TestDeadlinesAndClose(t *testing.T) {
	a, b := pair(t)
	ra := raw(t, a)
	a.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	start := time.Now()
	if _, err := ra.Read(make([]byte, 10)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past its deadline: %v", err)
	}
	if d := time.Since(start); d < 40*time.Millisecond || d > 5*time.Second {
		t.Fatalf("the read waited %v for a 50 ms deadline", d)
	}
	a.SetReadDeadline(time.Time{})

	// A write to a peer that reads nothing fills the socket, then waits.
	a.(*net.TCPConn).SetWriteBuffer(4096)
	b.(*net.TCPConn).SetReadBuffer(4096)
	a.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	n, err := ra.Write(make([]byte, 8<<20))
	if !errors.Is(err, os.ErrDeadlineExceeded) || n >= 8<<20 {
		t.Fatalf("write to a peer that reads nothing: %d bytes, %v", n, err)
	}
	// TryWrite returns at once on the full socket.
	a.SetWriteDeadline(time.Time{})
	start = time.Now()
	if _, err := ra.TryWrite(make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("TryWrite waited %v", d)
	}

	done := make(chan error, 1)
	go func() {
		_, err := ra.Read(make([]byte, 10))
		done <- err
	}()
	waitBlocked(t, "rawio.(*Conn).Read")
	a.Close()
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read of a closed connection: %v", err)
	}
	if _, err := ra.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write to a closed connection: %v", err)
	}
}

// A peer that resets the connection: the error is an *net.OpError with
// the system call's error inside.
func TestReset(t *testing.T) {
	a, b := pair(t)
	ra := raw(t, a)
	b.(*net.TCPConn).SetLinger(0)
	b.Close() // RST
	// The reset arrives after a while: a write fails once it has.
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		if _, err = ra.Write([]byte("after the reset")); err != nil {
			break
		}
		time.Sleep(time.Millisecond) // the poll's interval: the reset's arrival sends no event
	}
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != "write" {
		t.Fatalf("write after a reset: %v (%T)", err, err)
	}
}

// Only plain TCP connections are read raw.
func TestNewOnlyPlainTCP(t *testing.T) {
	p1, p2 := net.Pipe()
	defer p1.Close()
	defer p2.Close()
	if _, ok := New(p1); ok {
		t.Fatal("New accepted a pipe")
	}
	a, _ := pair(t)
	if _, ok := New(tls.Client(a, &tls.Config{})); ok {
		t.Fatal("New accepted a TLS connection")
	}
}

// A write waiting for a full socket ends with net.ErrClosed when the
// connection is closed, and TryWrite writes a prefix of what it is given.
func TestWriteWaitingThenClosed(t *testing.T) {
	a, b := pair(t)
	ra := raw(t, a)
	a.(*net.TCPConn).SetWriteBuffer(4096)
	b.(*net.TCPConn).SetReadBuffer(4096)
	big := make([]byte, 8<<20)
	n, err := ra.TryWrite(big)
	if err != nil || n == 0 || n >= len(big) {
		t.Fatalf("TryWrite on an empty socket: %d of %d bytes, %v; want a prefix", n, len(big), err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := ra.Write(big)
		done <- err
	}()
	waitBlocked(t, "rawio.(*Conn).write")
	select {
	case err := <-done:
		t.Fatalf("a write to a full socket returned: %v", err)
	default:
	}
	a.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("write when the connection closed: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end a waiting write")
	}
}
