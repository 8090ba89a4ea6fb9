package cluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/mlock-dev/mlock/internal/testcert"
)

// tlsFor returns the TLS configuration of a node whose certificate ca signs
// for hosts (default 127.0.0.1), verifying its peers against roots.
func tlsFor(t *testing.T, ca *testcert.CA, roots *x509.CertPool, hosts ...string) *tls.Config {
	t.Helper()
	certFile, keyFile := ca.Server(t, hosts...)
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: roots}
}

// newTLSLayer is newLayer with TLS (nil conf: plain).
func newTLSLayer(t *testing.T, secret string, conf *tls.Config) *streamLayer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := newStreamLayer(ln, []byte(secret), conf)
	t.Cleanup(func() { s.Close() })
	return s
}

// talk dials b from a, says hello and expects world (see accepted).
func talk(t *testing.T, a *streamLayer, addr string) net.Conn {
	t.Helper()
	c, err := a.Dial(raft.ServerAddress(addr), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	helloWorld(t, c)
	return c
}

// Two nodes with TLS talk over TLS 1.2+, the authentication inside it.
func TestRaftTLSConnections(t *testing.T) {
	t.Parallel()
	ca := testcert.New(t)
	a := newTLSLayer(t, "the-cluster-secret", tlsFor(t, ca, ca.Pool()))
	b := newTLSLayer(t, "the-cluster-secret", tlsFor(t, ca, ca.Pool()))
	got := accepted(b)
	c := talk(t, a, b.Addr().String())
	if err := <-got; err != nil {
		t.Fatalf("acceptor: %v", err)
	}
	tc, ok := c.(*trackedConn).Conn.(*tls.Conn)
	if !ok {
		t.Fatalf("dialed a %T, want a TLS connection", c.(*trackedConn).Conn)
	}
	if st := tc.ConnectionState(); !st.HandshakeComplete || st.Version < tls.VersionTLS12 || len(st.VerifiedChains) == 0 {
		t.Fatalf("TLS state: complete %v, version %x, %d verified chains", st.HandshakeComplete, st.Version, len(st.VerifiedChains))
	}
	// Without a secret, TLS alone still works.
	a, b = newTLSLayer(t, "", tlsFor(t, ca, ca.Pool())), newTLSLayer(t, "", tlsFor(t, ca, ca.Pool()))
	got = accepted(b)
	talk(t, a, b.Addr().String())
	if err := <-got; err != nil {
		t.Fatalf("acceptor without a secret: %v", err)
	}
}

// recorder is a TCP proxy on loopback that keeps what each side sent.
type recorder struct {
	ln       net.Listener
	target   string
	mu       sync.Mutex
	toServer bytes.Buffer
	toClient bytes.Buffer
	wg       sync.WaitGroup
	conns    []net.Conn
}

func newRecorder(t *testing.T, target string) *recorder {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{ln: ln, target: target}
	r.wg.Add(1)
	go r.serve()
	t.Cleanup(r.close)
	return r
}

func (r *recorder) serve() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", r.target)
		if err != nil {
			c.Close()
			continue
		}
		r.mu.Lock()
		r.conns = append(r.conns, c, s)
		r.mu.Unlock()
		r.wg.Add(2)
		go r.copy(s, c, &r.toServer)
		go r.copy(c, s, &r.toClient)
	}
}

func (r *recorder) copy(dst, src net.Conn, rec *bytes.Buffer) {
	defer r.wg.Done()
	buf := make([]byte, 4096)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			r.mu.Lock()
			rec.Write(buf[:n])
			r.mu.Unlock()
			dst.Write(buf[:n])
		}
		if err != nil {
			dst.Close()
			return
		}
	}
}

func (r *recorder) close() {
	r.ln.Close()
	r.mu.Lock()
	for _, c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

func (r *recorder) recorded() (toServer, toClient []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return bytes.Clone(r.toServer.Bytes()), bytes.Clone(r.toClient.Bytes())
}

// On the wire, a TLS raft connection is TLS records: neither the magic of
// the handshake nor the data appear in plaintext. (The same exchange without
// TLS shows both, so the recorder sees what passes.)
func TestRaftTLSOnTheWire(t *testing.T) {
	t.Parallel()
	ca := testcert.New(t)
	for _, withTLS := range []bool{false, true} {
		var ca1, ca2 *tls.Config
		if withTLS {
			ca1, ca2 = tlsFor(t, ca, ca.Pool()), tlsFor(t, ca, ca.Pool())
		}
		a, b := newTLSLayer(t, "the-cluster-secret", ca1), newTLSLayer(t, "the-cluster-secret", ca2)
		rec := newRecorder(t, b.Addr().String())
		got := accepted(b)
		// The certificate is for 127.0.0.1, the recorder's host too.
		c := talk(t, a, rec.ln.Addr().String())
		if err := <-got; err != nil {
			t.Fatalf("tls %v: acceptor: %v", withTLS, err)
		}
		c.Close()
		toServer, toClient := rec.recorded()
		plain := bytes.Contains(toServer, []byte(raftMagic)) && bytes.Contains(toServer, []byte("hello")) &&
			bytes.Contains(toClient, []byte("world"))
		if plain == withTLS {
			t.Fatalf("tls %v: plaintext on the wire %v:\n%q\n%q", withTLS, plain, toServer, toClient)
		}
		if withTLS {
			if bytes.Contains(toServer, []byte("MLRAFT")) || bytes.Contains(toServer, []byte("hello")) || bytes.Contains(toClient, []byte("world")) {
				t.Fatalf("plaintext in the TLS stream:\n%q\n%q", toServer, toClient)
			}
			if len(toServer) == 0 || toServer[0] != 0x16 || len(toClient) == 0 || toClient[0] != 0x16 {
				t.Fatalf("the streams do not start with a TLS handshake record: %q..., %q...", toServer[:min(len(toServer), 8)], toClient[:min(len(toClient), 8)])
			}
		}
	}
}

// A plain TCP client that sends the raft handshake to a TLS raft port gets
// no answer in plaintext: the port speaks only TLS, and closes.
func TestRaftTLSPortRefusesPlaintext(t *testing.T) {
	t.Parallel()
	ca := testcert.New(t)
	b := newTLSLayer(t, "the-cluster-secret", tlsFor(t, ca, ca.Pool()))
	got := accepted(b)
	c, err := net.Dial("tcp", b.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write(append([]byte(raftMagic), make([]byte, nonceLen)...))
	c.SetReadDeadline(time.Now().Add(handshakeTimeout + time.Second))
	answer, _ := io.ReadAll(c)
	if len(answer) >= nonceLen {
		t.Fatalf("a plaintext handshake got an answer of %d bytes: %q", len(answer), answer)
	}
	if err := <-got; err == nil || !strings.Contains(err.Error(), "TLS") {
		t.Fatalf("acceptor: %v, want a TLS handshake error", err)
	}
}

// A peer whose certificate the cluster CA does not verify (another CA, or
// another host) is refused, and so is a dialer to it.
func TestRaftTLSWrongCertificate(t *testing.T) {
	t.Parallel()
	ca, other := testcert.New(t), testcert.New(t)
	for _, tt := range []struct {
		name string
		b    *tls.Config
	}{
		{"another CA", tlsFor(t, other, other.Pool())},
		{"another host", tlsFor(t, ca, ca.Pool(), "raft.example")},
	} {
		a := newTLSLayer(t, "the-cluster-secret", tlsFor(t, ca, ca.Pool()))
		b := newTLSLayer(t, "the-cluster-secret", tt.b)
		got := accepted(b)
		_, err := a.Dial(raft.ServerAddress(b.Addr().String()), 2*time.Second)
		var verr *tls.CertificateVerificationError
		if !errors.As(err, &verr) {
			t.Fatalf("%s: Dial: %v, want a certificate verification error", tt.name, err)
		}
		if err := <-got; err == nil {
			t.Fatalf("%s: the acceptor read from a peer that refused its certificate", tt.name)
		}
	}
}

// A node with TLS and a node without do not talk, either way, and say why
// at once (well within the handshake timeout), instead of hanging.
func TestRaftTLSAndPlainRefused(t *testing.T) {
	t.Parallel()
	ca := testcert.New(t)
	for _, dialerTLS := range []bool{false, true} {
		conf := tlsFor(t, ca, ca.Pool())
		var a, b *streamLayer
		if dialerTLS {
			a, b = newTLSLayer(t, "the-cluster-secret", conf), newTLSLayer(t, "the-cluster-secret", nil)
		} else {
			a, b = newTLSLayer(t, "the-cluster-secret", nil), newTLSLayer(t, "the-cluster-secret", conf)
		}
		got := accepted(b)
		start := time.Now()
		_, err := a.Dial(raft.ServerAddress(b.Addr().String()), 2*time.Second)
		if err == nil || !strings.Contains(err.Error(), "TLS") {
			t.Fatalf("TLS dialer %v: Dial: %v, want an error that names TLS", dialerTLS, err)
		}
		aerr := <-got
		if aerr == nil || !strings.Contains(aerr.Error(), "TLS") {
			t.Fatalf("TLS dialer %v: acceptor: %v, want an error that names TLS", dialerTLS, aerr)
		}
		if dialerTLS && !errors.Is(aerr, errRaftPeerTLS) {
			t.Fatalf("plain acceptor: %v, want errRaftPeerTLS", aerr)
		}
		if el := time.Since(start); el > handshakeTimeout/2 {
			t.Fatalf("TLS dialer %v: refused after %v", dialerTLS, el)
		}
		t.Logf("TLS dialer %v: dialer: %v; acceptor: %v", dialerTLS, err, aerr)
	}
}

// Accept returns a connection without waiting for its TLS handshake: a
// silent client holds up neither Accept nor the next peer, and its
// connection fails within the handshake timeout.
func TestRaftTLSAcceptDoesNotWait(t *testing.T) {
	t.Parallel()
	ca := testcert.New(t)
	a := newTLSLayer(t, "the-cluster-secret", tlsFor(t, ca, ca.Pool()))
	b := newTLSLayer(t, "the-cluster-secret", tlsFor(t, ca, ca.Pool()))
	silent, err := net.Dial("tcp", b.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, err := b.Accept()
		if err != nil {
			close(acc)
			return
		}
		acc <- c
	}()
	var sc net.Conn
	select {
	case sc = <-acc:
		if sc == nil {
			t.Fatal("Accept failed")
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Accept waits for the silent client's handshake")
	}
	defer sc.Close()
	if _, ok := sc.(*trackedConn).Conn.(*tls.Conn); !ok {
		t.Fatalf("accepted a %T, want a TLS connection", sc.(*trackedConn).Conn)
	}
	silentErr := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := sc.Read(make([]byte, 1))
		silentErr <- err
	}()
	// Another peer is served meanwhile.
	got := accepted(b)
	talk(t, a, b.Addr().String())
	if err := <-got; err != nil {
		t.Fatalf("acceptor: %v", err)
	}
	if err := <-silentErr; err == nil {
		t.Fatal("read from a silent client")
	} else if el := time.Since(start); el < handshakeTimeout-time.Second || el > handshakeTimeout+2*time.Second {
		t.Fatalf("the silent client's connection failed after %v (%v), want the handshake timeout %v", el, err, handshakeTimeout)
	}
}

// A 3-node cluster whose nodes have certificates elects a leader and
// applies commands over TLS; its raft ports speak TLS with the nodes'
// certificates.
func TestTCPClusterOverTLS(t *testing.T) {
	t.Parallel()
	ca := testcert.New(t)
	tc := newTCPClusterWith(t, 3, func(i int, c *Config) { c.TLS = tlsFor(t, ca, ca.Pool()) })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var o outcome
	tc.leader()
	for k := range 5 {
		if _, err := proposeRetry(t, tc.nodes, ctx, DedupCommand("c", uint64(k), fmt.Appendf(nil, "over-tls-%d", k)), &o); err != nil {
			t.Fatal(err)
		}
	}
	tc.converge("over-tls-4")
	for _, addr := range tc.addrs {
		d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 2 * time.Second}, Config: &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"}}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("TLS to the raft port %s: %v", addr, err)
		}
		c.Close()
	}
}

// Under valid TLS the secret still decides: a node with another secret is
// refused both ways.
func TestRaftTLSWrongSecretRefused(t *testing.T) {
	t.Parallel()
	ca := testcert.New(t)
	a := newTLSLayer(t, "the-cluster-secret", tlsFor(t, ca, ca.Pool()))
	b := newTLSLayer(t, "another-cluster-secret", tlsFor(t, ca, ca.Pool()))
	got := accepted(b)
	c, err := a.Dial(raft.ServerAddress(b.Addr().String()), 2*time.Second)
	if err == nil {
		c.Close()
		t.Fatal("a node with another secret was accepted")
	}
	if !errors.Is(err, errRaftAuth) {
		t.Fatalf("dial: %v, want errRaftAuth", err)
	}
	if err := <-got; !errors.Is(err, errRaftAuth) {
		t.Fatalf("acceptor: %v, want errRaftAuth", err)
	}
}

// The secret's handshake is bound to the TLS session: a relay that holds a
// certificate the cluster CA accepts for the dialed host, and forwards the
// handshake bytes unchanged between two TLS sessions of its own, fails it.
func TestRaftTLSRelayRefused(t *testing.T) {
	t.Parallel()
	ca := testcert.New(t)
	a := newTLSLayer(t, "the-cluster-secret", tlsFor(t, ca, ca.Pool()))
	b := newTLSLayer(t, "the-cluster-secret", tlsFor(t, ca, ca.Pool()))
	got := accepted(b)
	relayConf := tlsFor(t, ca, ca.Pool())
	ln, err := tls.Listen("tcp", "127.0.0.1:0", relayConf)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		in, err := ln.Accept()
		if err != nil {
			return
		}
		defer in.Close()
		out, err := tls.Dial("tcp", b.Addr().String(), &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"})
		if err != nil {
			return
		}
		defer out.Close()
		done := make(chan struct{}, 2)
		pipe := func(dst, src net.Conn) { io.Copy(dst, src); dst.Close(); done <- struct{}{} }
		go pipe(out, in)
		go pipe(in, out)
		<-done
		<-done
	}()
	c, err := a.Dial(raft.ServerAddress(ln.Addr().String()), 2*time.Second)
	if err == nil {
		c.Close()
		t.Fatal("a relay between two TLS sessions passed the handshake")
	}
	if !errors.Is(err, errRaftAuth) {
		t.Fatalf("dial through the relay: %v, want errRaftAuth", err)
	}
	if err := <-got; !errors.Is(err, errRaftAuth) && !errors.Is(err, io.EOF) {
		t.Fatalf("acceptor: %v, want errRaftAuth", err)
	}
	ln.Close()
	wg.Wait()
}
