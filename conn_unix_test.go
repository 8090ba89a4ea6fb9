//go:build unix

package mlock

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"
)

// The reader's write never blocks: once the socket's buffers are full (the
// server does not read), it writes nothing and returns at once.
func TestTryWriterDoesNotBlock(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	peer := <-accepted
	if peer == nil {
		t.Fatal("accept failed")
	}
	defer peer.Close()
	_ = nc.(*net.TCPConn).SetWriteBuffer(4096)

	w, ok := tryWriter(nc)
	if !ok {
		t.Fatal("no non-blocking write on a TCP connection")
	}
	chunk := bytes.Repeat([]byte("x"), 64<<10)
	var sent int
	deadline := time.Now().Add(10 * time.Second)
	for {
		if time.Now().After(deadline) {
			t.Fatalf("the socket never filled up (%d bytes written)", sent)
		}
		start := time.Now()
		n, err := w(chunk)
		if err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d > time.Second {
			t.Fatalf("a write blocked for %v", d)
		}
		sent += n
		if n == 0 {
			break // full: nothing written, no error
		}
	}
	// Everything the writes reported went out, in order.
	got := make(chan int, 1)
	go func() {
		n, _ := io.CopyN(io.Discard, peer, int64(sent))
		got <- int(n)
	}()
	if n := <-got; n != sent {
		t.Fatalf("peer read %d bytes, want %d", n, sent)
	}
	// A write error is returned as one.
	nc.Close()
	if _, err := w(chunk); err == nil {
		t.Fatal("write on a closed connection succeeded")
	}
}
