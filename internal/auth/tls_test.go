package auth

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/internal/testcert"
)

// echoServer serves cfg on loopback TCP: each connection, once its
// handshake is done, sends back what it receives. names receives
// VerifiedName of every completed handshake.
type echoServer struct {
	ln    net.Listener
	names chan string
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn // guarded by mu
}

func startEcho(t *testing.T, cfg *tls.Config) *echoServer {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := &echoServer{ln: ln, names: make(chan string, 16)}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer c.Close()
				tc := c.(*tls.Conn)
				tc.SetDeadline(time.Now().Add(10 * time.Second))
				if err := tc.Handshake(); err != nil {
					return
				}
				s.names <- VerifiedName(tc.ConnectionState())
				io.Copy(tc, tc)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func dial(t *testing.T, s *echoServer, cfg *tls.Config) (*tls.Conn, error) {
	t.Helper()
	c, err := tls.Dial("tcp", s.ln.Addr().String(), cfg)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return c, nil
}

// echo sends a line and reads it back.
func echo(c *tls.Conn, line string) error {
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return err
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if got != line+"\n" {
		return io.ErrUnexpectedEOF
	}
	return nil
}

func clientConfig(t *testing.T, ca *testcert.CA, certFile, keyFile string) *tls.Config {
	t.Helper()
	cfg := &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost"}
	if certFile != "" {
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg
}

// withClient is clientConfig with a certificate named name from issuer.
func withClient(t *testing.T, ca, issuer *testcert.CA, name string) *tls.Config {
	t.Helper()
	certFile, keyFile := issuer.Client(t, name)
	return clientConfig(t, ca, certFile, keyFile)
}

func TestServerConfigWithoutClientCA(t *testing.T) {
	ca := testcert.New(t)
	certFile, keyFile := ca.Server(t)
	cfg, r, err := ServerConfig(certFile, keyFile, "")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MinVersion != tls.VersionTLS12 || cfg.CipherSuites != nil || cfg.ClientAuth != tls.NoClientCert || cfg.ClientCAs != nil {
		t.Errorf("config: min %x, suites %v, client auth %v", cfg.MinVersion, cfg.CipherSuites, cfg.ClientAuth)
	}
	if r.Leaf() == nil || r.Leaf().Subject.CommonName != "127.0.0.1" {
		t.Errorf("Leaf = %v", r.Leaf())
	}
	s := startEcho(t, cfg)
	// A client certificate is not asked for, so it is not verified either.
	c, err := dial(t, s, withClient(t, ca, ca, "alice"))
	if err != nil {
		t.Fatal(err)
	}
	if err := echo(c, "hello"); err != nil {
		t.Fatal(err)
	}
	if name := <-s.names; name != "" {
		t.Errorf("VerifiedName = %q without a client CA", name)
	}
}

func TestServerConfigClientCertificates(t *testing.T) {
	ca := testcert.New(t)
	certFile, keyFile := ca.Server(t)
	cfg, _, err := ServerConfig(certFile, keyFile, ca.CertFile())
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ClientAuth != tls.VerifyClientCertIfGiven || cfg.ClientCAs == nil {
		t.Errorf("client auth %v", cfg.ClientAuth)
	}
	s := startEcho(t, cfg)

	t.Run("no certificate", func(t *testing.T) {
		c, err := dial(t, s, clientConfig(t, ca, "", ""))
		if err != nil {
			t.Fatal(err)
		}
		if err := echo(c, "x"); err != nil {
			t.Fatal(err)
		}
		if name := <-s.names; name != "" {
			t.Errorf("VerifiedName = %q", name)
		}
	})
	t.Run("certificate of the CA", func(t *testing.T) {
		c, err := dial(t, s, withClient(t, ca, ca, "worker-1"))
		if err != nil {
			t.Fatal(err)
		}
		if err := echo(c, "x"); err != nil {
			t.Fatal(err)
		}
		if name := <-s.names; name != "worker-1" {
			t.Errorf("VerifiedName = %q", name)
		}
	})
	t.Run("certificate of another CA", func(t *testing.T) {
		other := testcert.New(t)
		c, err := dial(t, s, withClient(t, ca, other, "admin"))
		if err == nil {
			// With TLS 1.3 the client learns of the refusal on its first read.
			err = echo(c, "x")
		}
		if err == nil {
			t.Fatal("a certificate of another CA was accepted")
		}
		if !strings.Contains(err.Error(), "unknown certificate authority") {
			t.Errorf("another CA: %v, want an unknown certificate authority error", err)
		}
		select {
		case name := <-s.names:
			t.Fatalf("the server completed a handshake: %q", name)
		default:
		}
	})
	t.Run("TLS 1.1", func(t *testing.T) {
		cfg := clientConfig(t, ca, "", "")
		cfg.MinVersion, cfg.MaxVersion = tls.VersionTLS10, tls.VersionTLS11
		_, err := dial(t, s, cfg)
		if err == nil {
			t.Fatal("TLS 1.1 accepted")
		}
		if !strings.Contains(err.Error(), "protocol version") {
			t.Errorf("TLS 1.1: %v, want a protocol version error", err)
		}
	})
}

func TestServerConfigErrors(t *testing.T) {
	ca := testcert.New(t)
	certFile, keyFile := ca.Server(t)
	otherCert, _ := ca.Server(t)
	dir := t.TempDir()
	noPEM := dir + "/empty.pem"
	if err := os.WriteFile(noPEM, []byte("not pem\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name                string
		cert, key, clientCA string
		want                string
	}{
		{"missing cert", dir + "/nope.pem", keyFile, "", "tls certificate"},
		{"missing key", certFile, dir + "/nope.pem", "", "tls key"},
		{"key of another cert", otherCert, keyFile, "", "does not match"},
		{"no pem", noPEM, keyFile, "", "tls certificate"},
		{"missing client CA", certFile, keyFile, dir + "/nope.pem", "tls client CA"},
		{"client CA without certificate", certFile, keyFile, noPEM, "no PEM certificate"},
	}
	for _, tt := range tests {
		cfg, r, err := ServerConfig(tt.cert, tt.key, tt.clientCA)
		if err == nil || cfg != nil || r != nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: ServerConfig = %v, %v, %v; want %q", tt.name, cfg, r, err, tt.want)
		}
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func peerSerial(t *testing.T, c *tls.Conn) string {
	t.Helper()
	return c.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

func TestReloadKeepsConnectionsAndServesTheNewCertificate(t *testing.T) {
	ca := testcert.New(t)
	dir := t.TempDir()
	certFile, keyFile := dir+"/cert.pem", dir+"/key.pem"
	c1, k1 := ca.Server(t)
	copyFile(t, c1, certFile)
	copyFile(t, k1, keyFile)
	cfg, r, err := ServerConfig(certFile, keyFile, "")
	if err != nil {
		t.Fatal(err)
	}
	s := startEcho(t, cfg)
	old, err := dial(t, s, clientConfig(t, ca, "", ""))
	if err != nil {
		t.Fatal(err)
	}
	if err := echo(old, "before"); err != nil {
		t.Fatal(err)
	}
	oldSerial := peerSerial(t, old)
	if oldSerial != r.Leaf().SerialNumber.String() {
		t.Fatal("Leaf is not the served certificate")
	}

	c2, k2 := ca.Server(t)
	copyFile(t, c2, certFile)
	copyFile(t, k2, keyFile)
	if err := r.Reload(); err != nil {
		t.Fatal(err)
	}
	if err := echo(old, "after"); err != nil {
		t.Fatalf("the established connection broke: %v", err)
	}
	fresh, err := dial(t, s, clientConfig(t, ca, "", ""))
	if err != nil {
		t.Fatal(err)
	}
	newSerial := peerSerial(t, fresh)
	if newSerial == oldSerial || newSerial != r.Leaf().SerialNumber.String() {
		t.Fatalf("a new handshake got serial %s (old %s)", newSerial, oldSerial)
	}

	// A failed reload keeps the pair in place.
	if err := os.WriteFile(keyFile, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.Reload(); err == nil {
		t.Fatal("Reload accepted a bad key")
	}
	copyFile(t, k1, keyFile) // the old key, which does not match the new cert
	if err := r.Reload(); err == nil {
		t.Fatal("Reload accepted a key of another certificate")
	}
	third, err := dial(t, s, clientConfig(t, ca, "", ""))
	if err != nil {
		t.Fatal(err)
	}
	if got := peerSerial(t, third); got != newSerial {
		t.Fatalf("after failed reloads the server serves %s, want %s", got, newSerial)
	}
	for _, c := range []*tls.Conn{old, fresh, third} {
		if err := echo(c, "end"); err != nil {
			t.Fatal(err)
		}
	}
}

func TestConcurrentReload(t *testing.T) {
	ca := testcert.New(t)
	certFile, keyFile := ca.Server(t)
	r, err := NewCertReloader(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for range 20 {
				if err := r.Reload(); err != nil {
					t.Error(err)
				}
			}
		}()
		go func() {
			defer wg.Done()
			for range 100 {
				if c, _ := r.GetCertificate(nil); c == nil || r.Leaf() == nil {
					t.Error("no certificate")
				}
			}
		}()
	}
	wg.Wait()
}

func TestCertName(t *testing.T) {
	tests := []struct {
		cert *x509.Certificate
		want string
	}{
		{nil, ""},
		{&x509.Certificate{}, ""},
		{&x509.Certificate{Subject: pkix.Name{CommonName: "alice"}, DNSNames: []string{"a.example"}}, "alice"},
		{&x509.Certificate{DNSNames: []string{"a.example", "b.example"}}, "a.example"},
	}
	for _, tt := range tests {
		if got := CertName(tt.cert); got != tt.want {
			t.Errorf("CertName = %q, want %q", got, tt.want)
		}
	}
	if got := VerifiedName(tls.ConnectionState{PeerCertificates: []*x509.Certificate{{Subject: pkix.Name{CommonName: "mallory"}}}}); got != "" {
		t.Errorf("VerifiedName of an unverified certificate = %q", got)
	}
}

// Reload reads the client CA file again: new handshakes verify client
// certificates against the new CAs, and a bad file keeps the old ones.
func TestReloadReadsTheClientCA(t *testing.T) {
	ca, next := testcert.New(t), testcert.New(t)
	certFile, keyFile := ca.Server(t)
	caFile := t.TempDir() + "/clients.pem"
	copyFile(t, ca.CertFile(), caFile)
	cfg, r, err := ServerConfig(certFile, keyFile, caFile)
	if err != nil {
		t.Fatal(err)
	}
	s := startEcho(t, cfg)
	handshake := func(clients *testcert.CA) (string, error) {
		c, err := dial(t, s, withClient(t, ca, clients, "worker-1"))
		if err == nil {
			err = echo(c, "x") // TLS 1.3: a refusal shows on the first read
		}
		if err != nil {
			return "", err
		}
		return <-s.names, nil
	}
	if name, err := handshake(ca); err != nil || name != "worker-1" {
		t.Fatalf("a certificate of the CA: %q, %v", name, err)
	}
	if _, err := handshake(next); err == nil {
		t.Fatal("a certificate of the next CA was accepted before the reload")
	}

	copyFile(t, next.CertFile(), caFile)
	if err := r.Reload(); err != nil {
		t.Fatal(err)
	}
	if name, err := handshake(next); err != nil || name != "worker-1" {
		t.Fatalf("after the reload, a certificate of the next CA: %q, %v", name, err)
	}
	if _, err := handshake(ca); err == nil {
		t.Fatal("after the reload, a certificate of the old CA was accepted")
	}

	if err := os.WriteFile(caFile, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.Reload(); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Fatalf("Reload of a bad client CA file: %v", err)
	}
	if name, err := handshake(next); err != nil || name != "worker-1" {
		t.Fatalf("after a failed reload the CAs in force changed: %q, %v", name, err)
	}
}
