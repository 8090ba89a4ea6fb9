package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/internal/auth"
	"github.com/mlock-dev/mlock/internal/testcert"
)

// tlsServer starts a server with a certificate of ca for 127.0.0.1.
func tlsServer(t testing.TB, ca *testcert.CA, cfg Config) *Server {
	t.Helper()
	cfg.TLSCertFile, cfg.TLSKeyFile = ca.Server(t)
	return start(t, cfg)
}

// clientTLS returns the configuration of a client that trusts ca and, if
// name is not empty, presents a client certificate of ca named name.
func clientTLS(t testing.TB, ca *testcert.CA, name string) *tls.Config {
	t.Helper()
	cfg := &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"}
	if name != "" {
		cfg.Certificates = []tls.Certificate{keyPair(t, ca, name)}
	}
	return cfg
}

func keyPair(t testing.TB, ca *testcert.CA, name string) tls.Certificate {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(ca.Client(t, name))
	if err != nil {
		t.Fatal(err)
	}
	return pair
}

// dialTLS dials srv and completes a TLS handshake with cfg.
func dialTLS(t testing.TB, srv *Server, cfg *tls.Config) (*raw, *tls.Conn) {
	t.Helper()
	tc, err := tryTLS(srv, cfg)
	if err != nil {
		t.Fatalf("TLS handshake: %v", err)
	}
	t.Cleanup(func() { tc.Close() })
	return &raw{t: t, nc: tc}, tc
}

// tryTLS dials srv and runs a TLS handshake with cfg.
func tryTLS(srv *Server, cfg *tls.Config) (*tls.Conn, error) {
	d := &net.Dialer{Timeout: 10 * time.Second}
	nc, err := d.Dial("tcp", srv.Addr().String())
	if err != nil {
		return nil, err
	}
	tc := tls.Client(nc, cfg)
	_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
	if err := tc.Handshake(); err != nil {
		nc.Close()
		return nil, err
	}
	_ = tc.SetDeadline(time.Time{})
	return tc, nil
}

// leafSerial returns the serial of the certificate in a PEM file.
func leafSerial(t testing.TB, certFile string) *big.Int {
	t.Helper()
	b, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM", certFile)
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert.SerialNumber
}

func copyFile(t testing.TB, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestTLSHandshakeAndCommands(t *testing.T) {
	t.Parallel()
	ca := testcert.New(t)
	// The default auth timeout (seconds): the client's handshake and
	// connect come within it on a busy machine.
	srv := tlsServer(t, ca, Config{})

	c, tc := dialTLS(t, srv, clientTLS(t, ca, ""))
	if v := tc.ConnectionState().Version; v < tls.VersionTLS12 {
		t.Fatalf("TLS version %x", v)
	}
	c.send("connect tls1 1.0")
	c.expect("connected 1.0 new *")
	id := c.lock("1", "tls:x 10000 0 0")
	c.locked(id)
	c.unlock("2", id)
	c.ping("3")

	t.Run("plain client", func(t *testing.T) {
		p := dialRaw(t, srv)
		p.send("connect plain 1.0")
		p.expect("error TLS required!")
		p.closed()
	})
	t.Run("TLS 1.1", func(t *testing.T) {
		cfg := clientTLS(t, ca, "")
		cfg.MinVersion, cfg.MaxVersion = tls.VersionTLS10, tls.VersionTLS11
		if tc, err := tryTLS(srv, cfg); err == nil {
			tc.Close()
			t.Fatal("a TLS 1.1 handshake succeeded")
		} else {
			t.Logf("TLS 1.1 refused: %v", err)
		}
	})
	t.Run("untrusted server certificate", func(t *testing.T) {
		if tc, err := tryTLS(srv, clientTLS(t, testcert.New(t), "")); err == nil {
			tc.Close()
			t.Fatal("a client that trusts another CA accepted the server")
		}
	})
	t.Run("silent client", func(t *testing.T) {
		// The handshake is bounded by the auth timeout (here 300 ms, on a
		// server of its own): the connection ends within seconds.
		short := tlsServer(t, ca, Config{AuthTimeout: 300 * time.Millisecond})
		began := time.Now()
		s := dialRaw(t, short)
		if _, err := s.next(10 * time.Second); err == nil || time.Since(began) > 5*time.Second {
			t.Fatalf("a silent connection: %v after %v", err, time.Since(began))
		}
	})
	c.ping("4")
}

func TestTLSClientCertificates(t *testing.T) {
	t.Parallel()
	ca := testcert.New(t)
	tok := auth.NewToken()
	srv := tlsServer(t, ca, Config{
		TLSClientCAFile: ca.CertFile(),
		AuthFile: writeAuthFile(t,
			"svc - prefix=s: cert",
			authLine(t, "A", tok, "prefix=a:"),
			authLine(t, "tokenonly", auth.NewToken(), "prefix=t:"),
		),
	})

	t.Run("certificate names the principal", func(t *testing.T) {
		c, _ := dialTLS(t, srv, clientTLS(t, ca, "svc"))
		c.send("connect svc-1 1.0")
		c.expect("connected 1.0 new *")
		c.locked(c.lock("1", "s:x 10000 0 0"))
		c.send("lock 2 a:x 10000 0 0")
		c.expect("result 2 failed permission denied! a:x")
	})
	t.Run("certificate of a principal without cert", func(t *testing.T) {
		c, _ := dialTLS(t, srv, clientTLS(t, ca, "tokenonly"))
		c.send("connect t-1 1.0")
		c.expect("error authentication failed!")
		c.closed()
	})
	t.Run("certificate of no principal", func(t *testing.T) {
		c, _ := dialTLS(t, srv, clientTLS(t, ca, "stranger"))
		c.send("connect st-1 1.0")
		c.expect("error authentication failed!")
		c.closed()
	})
	t.Run("certificate of an unknown CA", func(t *testing.T) {
		cfg := clientTLS(t, ca, "")
		cfg.Certificates = []tls.Certificate{keyPair(t, testcert.New(t), "svc")}
		tc, err := tryTLS(srv, cfg)
		if err == nil {
			// TLS 1.3: the client learns of the refusal on its first read.
			defer tc.Close()
			c := &raw{t: t, nc: tc}
			c.send("connect evil 1.0")
			var p string
			if p, err = c.next(3 * time.Second); err == nil {
				t.Fatalf("a certificate of an unknown CA got %q", p)
			}
		}
		t.Logf("refused: %v", err)
	})
	t.Run("token without certificate", func(t *testing.T) {
		c, _ := dialTLS(t, srv, clientTLS(t, ca, ""))
		c.send("connect a-1 1.0 auth=A:" + tok)
		c.expect("connected 1.0 new *")
		c.locked(c.lock("1", "a:x 10000 0 0"))
	})
	t.Run("neither", func(t *testing.T) {
		c, _ := dialTLS(t, srv, clientTLS(t, ca, ""))
		c.send("connect n-1 1.0")
		c.expect("error authentication required!")
		c.closed()
	})
}

func TestTLSReloadKeepsConnections(t *testing.T) {
	t.Parallel()
	ca := testcert.New(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	cert1, key1 := ca.Server(t)
	copyFile(t, cert1, certFile)
	copyFile(t, key1, keyFile)
	srv := start(t, Config{TLSCertFile: certFile, TLSKeyFile: keyFile})

	old, tc := dialTLS(t, srv, clientTLS(t, ca, ""))
	old.send("connect old 1.0")
	old.expect("connected 1.0 new *")
	id := old.lock("1", "r 10000 0 0")
	old.locked(id)
	serial1 := tc.ConnectionState().PeerCertificates[0].SerialNumber
	if serial1.Cmp(leafSerial(t, cert1)) != 0 {
		t.Fatal("the server does not serve its certificate")
	}

	cert2, key2 := ca.Server(t)
	copyFile(t, cert2, certFile)
	copyFile(t, key2, keyFile)
	if err := srv.Reload(); err != nil {
		t.Fatal(err)
	}
	old.ping("2")
	old.send("extend 3 " + id + " 10000")
	old.expect("result 3 success *")

	fresh, tc2 := dialTLS(t, srv, clientTLS(t, ca, ""))
	serial2 := tc2.ConnectionState().PeerCertificates[0].SerialNumber
	if serial2.Cmp(leafSerial(t, cert2)) != 0 || serial2.Cmp(serial1) == 0 {
		t.Fatalf("after the reload a new handshake sees serial %v, want %v (was %v)", serial2, leafSerial(t, cert2), serial1)
	}
	fresh.send("connect fresh 1.0")
	fresh.expect("connected 1.0 new *")

	// A bad certificate file keeps the current one.
	if err := os.WriteFile(certFile, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := srv.Reload(); err == nil {
		t.Fatal("Reload accepted a bad certificate")
	}
	_, tc3 := dialTLS(t, srv, clientTLS(t, ca, ""))
	if s := tc3.ConnectionState().PeerCertificates[0].SerialNumber; s.Cmp(serial2) != 0 {
		t.Fatalf("after a failed reload the server serves serial %v, want %v", s, serial2)
	}
	old.ping("4")
	fresh.ping("1")
}

func TestGoClientOverTLS(t *testing.T) {
	t.Parallel()
	ca := testcert.New(t)
	tok := auth.NewToken()
	srv := tlsServer(t, ca, Config{
		TLSClientCAFile: ca.CertFile(),
		AuthFile: writeAuthFile(t,
			"svc - prefix=s: cert",
			authLine(t, "A", tok, "prefix=a:"),
		),
	})
	port := srv.Addr().(*net.TCPAddr).Port
	plain := start(t, Config{})
	plainPort := plain.Addr().(*net.TCPAddr).Port

	use := func(t *testing.T, uri string, allowed, refused string) {
		t.Helper()
		c, err := mlock.New(uri)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // seconds: a busy machine
		defer cancel()
		l, err := c.Lock(ctx, allowed, &mlock.LockOptions{TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if refused != "" {
			_, err := c.Lock(ctx, refused, &mlock.LockOptions{TTL: 10 * time.Second})
			if err == nil || !strings.Contains(err.Error(), "permission denied") {
				t.Fatalf("lock %s: %v, want permission denied", refused, err)
			}
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("token", func(t *testing.T) {
		use(t, fmt.Sprintf("mlocks://A:%s@127.0.0.1:%d?tls-ca=%s", tok, port, ca.CertFile()), "a:x", "s:x")
	})
	t.Run("tls=1", func(t *testing.T) {
		use(t, fmt.Sprintf("mlock://A:%s@127.0.0.1:%d?tls=1&tls-ca=%s", tok, port, ca.CertFile()), "a:y", "")
	})
	t.Run("client certificate", func(t *testing.T) {
		cert, key := ca.Client(t, "svc")
		use(t, fmt.Sprintf("mlocks://127.0.0.1:%d?tls-ca=%s&tls-cert=%s&tls-key=%s", port, ca.CertFile(), cert, key), "s:x", "a:x")
	})
	t.Run("TLS client, plain server", func(t *testing.T) {
		c, err := mlock.New(fmt.Sprintf("mlocks://127.0.0.1:%d?tls-ca=%s", plainPort, ca.CertFile()))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		err = c.Ping(ctx)
		if err == nil {
			t.Fatal("a TLS client talked to a plain server")
		}
		t.Logf("TLS client, plain server: %v", err)
	})
	t.Run("plain client, TLS server", func(t *testing.T) {
		c, err := mlock.New(fmt.Sprintf("mlock://A:%s@127.0.0.1:%d", tok, port))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // seconds: a busy machine
		defer cancel()
		err = c.Ping(ctx)
		if err == nil || !strings.Contains(err.Error(), "TLS") {
			t.Fatalf("a plain client against a TLS server: %v, want an error that names TLS", err)
		}
		t.Logf("plain client, TLS server: %v", err)
	})
}

// TestGoClientLocksPage: the client's paged listing reaches the server's
// paging, without a prefix too.
func TestGoClientLocksPage(t *testing.T) {
	t.Parallel()
	srv := start(t, Config{})
	c, err := mlock.New(fmt.Sprintf("mlock://127.0.0.1:%d", srv.Addr().(*net.TCPAddr).Port))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // seconds: a busy machine
	defer cancel()
	for _, r := range []string{"pg:1", "pg:2", "pg:3"} {
		if _, err := c.Lock(ctx, r, &mlock.LockOptions{TTL: 10 * time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	for _, prefix := range []string{"pg:", ""} {
		var seen []string
		after := ""
		for range 5 {
			ls, err := c.LocksPage(ctx, prefix, 2, after)
			if err != nil {
				t.Fatalf("LocksPage(%q, 2, %q): %v", prefix, after, err)
			}
			for _, q := range ls.Queues {
				seen = append(seen, q.Resource)
			}
			if after = ls.Next; after == "" {
				break
			}
		}
		if strings.Join(seen, " ") != "pg:1 pg:2 pg:3" {
			t.Errorf("paging with prefix %q saw %q", prefix, seen)
		}
	}
}

// TestCertPrincipalUnreachableByName: with client certificates and no auth
// file, a client without a certificate (the anonymous principal, on
// loopback) cannot reach a certificate principal's session or owner by
// spelling its scoped name.
func TestCertPrincipalUnreachableByName(t *testing.T) {
	t.Parallel()
	ca := testcert.New(t)
	srv := tlsServer(t, ca, Config{TLSClientCAFile: ca.CertFile()})
	svc, _ := dialTLS(t, srv, clientTLS(t, ca, "svc"))
	svc.send("connect abc 1.0")
	svc.expect("connected 1.0 new *")
	id := svc.lock("1", "x 10000 0 0 o")
	svc.locked(id)

	anon, _ := dialTLS(t, srv, clientTLS(t, ca, "anon"))
	anon.send("connect svc\x00abc 1.0")
	if got := anon.read(); got != "error invalid socketId!" {
		t.Errorf("a socketId spelling a scoped name: got %q, want the refusal", got)
	}
	svc.ping("2") // not taken over

	anon, _ = dialTLS(t, srv, clientTLS(t, ca, "anon"))
	anon.send("connect anon 1.0")
	anon.expect("connected 1.0 new *")
	anon.send("release 1 svc\x00o x")
	anon.expect("result 1 failed invalid owner!")
	anon.send("releaseall 2 svc\x00o")
	anon.expect("result 2 failed invalid owner!")
	anon.send("renew 3 svc\x00o x 1")
	anon.expect("result 3 failed invalid owner!")
	anon.send("lock 4 x 1000 0 0 svc\x00o")
	anon.expect("result 4 failed invalid owner!")
	svc.quiet()
	svc.send("extend 3 " + id + " 10000")
	svc.expect("result 3 success *")
}

// TestClientCAWithoutAuthFileNeedsACertificate: a server whose credentials
// are client certificates accepts clients that present one; a client
// without, on loopback too, is no principal: it gets neither the anonymous
// administrator's rights nor the details of the unframed status.
func TestClientCAWithoutAuthFileNeedsACertificate(t *testing.T) {
	t.Parallel()
	ca := testcert.New(t)
	srv := tlsServer(t, ca, Config{TLSClientCAFile: ca.CertFile()})
	svc, _ := dialTLS(t, srv, clientTLS(t, ca, "svc"))
	svc.send("connect svc-secret-sid 1.0")
	svc.expect("connected 1.0 new *")
	svc.locked(svc.lock("1", "svc-resource 10000 0 0 svc-owner"))

	anon, _ := dialTLS(t, srv, clientTLS(t, ca, ""))
	anon.send("connect anon 1.0")
	if got := anon.read(); got != "error authentication required!" {
		t.Errorf("a loopback client without a certificate: got %q, want authentication required", got)
		anon.send("evict 1 svc-resource")
		t.Logf("its evict: %q", anon.read())
	}

	plain, _ := dialTLS(t, srv, clientTLS(t, ca, ""))
	plain.nc.Write([]byte("status\n"))
	_ = plain.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, _ := io.ReadAll(plain.nc)
	text := string(b)
	if !strings.Contains(text, "currentLocks: 1") {
		t.Fatalf("plain status lacks the counters:\n%s", text)
	}
	for _, secret := range []string{"svc-resource", "svc-owner", "svc-secret-sid"} {
		if strings.Contains(text, secret) {
			t.Errorf("the unframed status of a client without a certificate shows %q", secret)
		}
	}
}
