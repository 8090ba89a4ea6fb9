package mlock_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/internal/proctest"
	"github.com/mlock-dev/mlock/internal/protocol"
)

// ---- a test PKI: a CA, a server certificate for 127.0.0.1 and localhost, a client certificate ----

type testPKI struct {
	pool                      *x509.CertPool
	server, client            tls.Certificate
	caFile, certFile, keyFile string // PEM files: the CA, the client's certificate and key
	srvCert, srvKey           string // PEM files: the server's certificate and key
}

func newPKI(t *testing.T) *testPKI {
	t.Helper()
	dir := t.TempDir()
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "mlock test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	leaf := func(serial int64, cn string, usage x509.ExtKeyUsage, server bool) (tls.Certificate, []byte, []byte) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
		if server {
			tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
			tmpl.DNSNames = []string{"localhost"}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, der, kder
	}
	p := &testPKI{pool: x509.NewCertPool()}
	p.pool.AddCert(ca)
	p.caFile = write("ca.pem", "CERTIFICATE", caDER)
	var cder, kder []byte
	p.server, cder, kder = leaf(2, "mlockd", x509.ExtKeyUsageServerAuth, true)
	p.srvCert = write("server.pem", "CERTIFICATE", cder)
	p.srvKey = write("server-key.pem", "EC PRIVATE KEY", kder)
	p.client, cder, kder = leaf(3, "orders", x509.ExtKeyUsageClientAuth, false)
	p.certFile = write("client.pem", "CERTIFICATE", cder)
	p.keyFile = write("client-key.pem", "EC PRIVATE KEY", kder)
	return p
}

// fakeTLSServer is like fakeServer, behind TLS, and serves its
// connections at the same time: fn gets each connection once its handshake
// succeeded (failed handshakes are dropped).
func fakeTLSServer(t *testing.T, cfg *tls.Config, fn func(c *tls.Conn, r *bufio.Reader)) string {
	ln, err := listenFresh(t)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				tc := tls.Server(c, cfg)
				c.SetDeadline(time.Now().Add(5 * time.Second))
				if err := tc.Handshake(); err != nil {
					return
				}
				c.SetDeadline(time.Time{})
				fn(tc, bufio.NewReader(tc))
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// drain reads what the client still sends, for a while, so that closing
// the connection does not reset it before the client read the answer.
func drain(c net.Conn) {
	c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	io.Copy(io.Discard, c)
}

// serveBasic answers connect and ping; it returns at the first other
// command or error. seen receives the connect frame's fields.
func serveBasic(c net.Conn, r *bufio.Reader, seen chan<- []string) {
	f, err := readCommand(r)
	if err != nil || f[0] != "connect" {
		return
	}
	if seen != nil {
		seen <- f
	}
	c.Write(protocol.Append(nil, "connected", "1.0", "new", "15000"))
	for {
		f, err := readCommand(r)
		if err != nil || f[0] != "ping" {
			return
		}
		c.Write(protocol.Append(nil, "result", f[1], "success", "pong"))
	}
}

const topSecret = "t0p-s3cret"

func noSecret(t *testing.T, what, s string) {
	t.Helper()
	if strings.Contains(s, topSecret) {
		t.Fatalf("%s shows the token: %s", what, s)
	}
}

// ---- URI ----

func TestParseURICredentialsAndTLS(t *testing.T) {
	pki := newPKI(t)
	notPEM := filepath.Join(t.TempDir(), "x.pem")
	os.WriteFile(notPEM, []byte("not a certificate"), 0o600)
	type want struct {
		name, token string
		tls         bool
		serverName  string
		roots       bool
		certs       int
	}
	for _, tc := range []struct {
		uri string
		w   want
	}{
		{"mlock://h", want{}},
		{"mlock://svc:" + topSecret + "@h:1", want{name: "svc", token: topSecret}},
		{"mlock://svc:a%40b%3Ac%2F@h", want{name: "svc", token: "a@b:c/"}}, // percent-decoded
		{"mlock://svc:a:b@h", want{name: "svc", token: "a:b"}},             // a token may hold ':'
		{"mlocks://h", want{tls: true}},
		{"mlocks://svc:x@h:7?ttl=5", want{name: "svc", token: "x", tls: true}},
		{"mlock://h?tls=1", want{tls: true}},
		{"mlock://h?tls=true", want{tls: true}},
		{"mlock://h?tls=0", want{}},
		{"mlock://h?tls-server-name=locks.example", want{tls: true, serverName: "locks.example"}},
		{"mlocks://h?tls-ca=" + pki.caFile, want{tls: true, roots: true}},
		{"mlocks://h?tls-cert=" + pki.certFile + "&tls-key=" + pki.keyFile, want{tls: true, certs: 1}},
	} {
		o, err := mlock.ParseURI(tc.uri)
		if err != nil {
			t.Errorf("ParseURI(%q): %v", tc.uri, err)
			continue
		}
		got := want{name: o.Name, token: string(o.Token), tls: o.TLS != nil}
		if o.TLS != nil {
			got.serverName, got.roots, got.certs = o.TLS.ServerName, o.TLS.RootCAs != nil, len(o.TLS.Certificates)
			if o.TLS.MinVersion != tls.VersionTLS12 {
				t.Errorf("ParseURI(%q): MinVersion %x", tc.uri, o.TLS.MinVersion)
			}
		}
		if got != tc.w {
			t.Errorf("ParseURI(%q) = %+v, want %+v", tc.uri, got, tc.w)
		}
	}
	for _, bad := range []string{
		"mlock://svc@h", "mlock://:" + topSecret + "@h", "mlock://svc:@h", "mlocks://h?tls=0",
		"mlock://h?tls=2", "mlock://h?tls-cert=" + pki.certFile, "mlock://h?tls-key=" + pki.keyFile,
		"mlock://h?tls-ca=/nonexistent/ca.pem", "mlock://h?tls-ca=" + notPEM,
		"mlock://h?tls-cert=" + notPEM + "&tls-key=" + pki.keyFile,
		"mlock://a%20b:" + topSecret + "@h", "mlock://svc:" + topSecret + "%20x@h",
		"mlock://svc:" + topSecret + "@h:x", "mlock://svc:" + topSecret + "%zz@h", "mlock://svc:" + topSecret,
		"mlock://svc:" + topSecret + "@h?color=red", "https://svc:" + topSecret + "@h",
	} {
		_, err := mlock.ParseURI(bad)
		if !errors.Is(err, mlock.ErrRequest) {
			t.Errorf("ParseURI(%q) = %v, want a request error", bad, err)
			continue
		}
		noSecret(t, "the error of ParseURI", err.Error())
	}
}

// The token is a Secret: formatting Options in any way does not show it.
func TestTokenDoesNotShow(t *testing.T) {
	o, err := mlock.ParseURI("mlocks://svc:" + topSecret + "@h")
	if err != nil {
		t.Fatal(err)
	}
	o.TLS = nil // a tls.Config does not encode as JSON
	for _, s := range []string{fmt.Sprintf("%v", o), fmt.Sprintf("%+v", o), fmt.Sprintf("%#v", o),
		fmt.Sprintf("%s %q %x", o.Token, o.Token, o.Token), fmt.Sprint(o.Token)} {
		noSecret(t, "fmt", s)
	}
	if !strings.Contains(fmt.Sprintf("%+v", o), "[REDACTED]") {
		t.Fatalf("%+v", o)
	}
	b, err := json.Marshal(struct {
		Name  string
		Token mlock.Secret
	}{o.Name, o.Token})
	if err != nil {
		t.Fatal(err)
	}
	noSecret(t, "JSON", string(b))
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("x", "token", o.Token, "options", o)
	slog.New(slog.NewTextHandler(&buf, nil)).Info("x", "token", o.Token, "options", o)
	noSecret(t, "slog", buf.String())
	if string(o.Token) != topSecret {
		t.Fatal("string(Token) must give the token")
	}
	if err := (&mlock.Options{Name: "svc"}).Validate(); !errors.Is(err, mlock.ErrRequest) {
		t.Fatalf("a name without a token: %v", err)
	}
	if err := (&mlock.Options{Token: "x"}).Validate(); !errors.Is(err, mlock.ErrRequest) {
		t.Fatalf("a token without a name: %v", err)
	}
	bad := mlock.Options{Name: "svc", Token: topSecret + " x"}
	if err := bad.Validate(); !errors.Is(err, mlock.ErrRequest) {
		t.Fatalf("a token with a space: %v", err)
	} else {
		noSecret(t, "Validate", err.Error())
	}
}

// ---- credentials on the wire ----

// Every connect, the first and each reconnect, carries the credentials as
// its fourth word; a client without credentials sends three.
func TestConnectCarriesCredentials(t *testing.T) {
	seen := make(chan []string, 8)
	n := 0
	addr := fakeServer(t, func(c net.Conn, r *bufio.Reader) {
		n++
		if n == 1 {
			// The first connection ends after its handshake and a ping.
			f, err := readCommand(r)
			if err != nil {
				return
			}
			seen <- f
			c.Write(protocol.Append(nil, "connected", "1.0", "new", "15000"))
			if f, err = readCommand(r); err == nil {
				c.Write(protocol.Append(nil, "result", f[1], "success", "pong"))
			}
			return
		}
		serveBasic(c, r, seen)
	})
	c := client(t, addr, mlock.Options{Name: "svc", Token: topSecret, MaxBackoff: 50 * time.Millisecond})
	ctx := ctxT(t)
	if err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	want := []string{"connect", c.SocketID(), "1.0", "auth=svc:" + topSecret}
	for i := range 2 {
		select {
		case f := <-seen:
			if strings.Join(f, " ") != strings.Join(want, " ") {
				t.Fatalf("connect %d = %q, want %q", i+1, f, want)
			}
		case <-time.After(3 * time.Second):
			t.Fatalf("no connect %d", i+1)
		}
	}
	if err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	c.Close()

	plain := client(t, addr, mlock.Options{})
	if err := plain.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if f := <-seen; len(f) != 3 {
		t.Fatalf("connect without credentials = %q", f)
	}
}

// ---- refusals ----

// attempts counts the connections a fake server accepts.
type attempts struct {
	mu sync.Mutex
	at []time.Time
}

func (a *attempts) add() {
	a.mu.Lock()
	a.at = append(a.at, time.Now())
	a.mu.Unlock()
}

func (a *attempts) get() []time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]time.Time(nil), a.at...)
}

// checkBackoff fails if the connection attempts came faster than half of
// maxBackoff apart (the jitter's least): no tight reconnect loop.
func checkBackoff(t *testing.T, at []time.Time, maxBackoff time.Duration) {
	t.Helper()
	if len(at) < 2 {
		t.Fatalf("%d connection attempts: the client does not retry", len(at))
	}
	for i := 1; i < len(at); i++ {
		if gap := at[i].Sub(at[i-1]); gap < maxBackoff/2-20*time.Millisecond {
			t.Fatalf("attempt %d came %v after the one before, want at least %v", i+1, gap, maxBackoff/2)
		}
	}
	t.Logf("%d attempts in %v", len(at), at[len(at)-1].Sub(at[0]))
}

// Each refusal of a connect reaches the caller at once, with the server's
// text and its cause, and the client retries at its longest backoff, not
// in a tight loop.
func TestRefusalsSurfaceAndBackOff(t *testing.T) {
	const maxBackoff = 400 * time.Millisecond
	for _, tc := range []struct {
		code  protocol.Code
		cause error
	}{
		{protocol.CodeAuthRequired, mlock.ErrAuth},
		{protocol.CodeAuthFailed, mlock.ErrAuth},
		{protocol.CodeAuthNotConfigured, mlock.ErrAuth},
		{protocol.CodeProtectedMode, mlock.ErrAuth},
		{protocol.CodeTooManyFromAddr, mlock.ErrRefused},
		{protocol.CodeTooManySessions, mlock.ErrRefused},
		{protocol.CodeTooManyConnections, mlock.ErrRefused},
		{protocol.CodeTLSRequired, mlock.ErrTLS},
	} {
		t.Run(tc.code.Text(), func(t *testing.T) {
			t.Parallel()
			var a attempts
			addr := fakeServer(t, func(c net.Conn, r *bufio.Reader) {
				a.add()
				if _, err := readCommand(r); err != nil {
					return
				}
				c.Write(protocol.AppendError(nil, tc.code))
			})
			c := client(t, addr, mlock.Options{Name: "svc", Token: topSecret, MaxBackoff: maxBackoff, DialTimeout: 3 * time.Second})
			ctx := ctxT(t)
			start := time.Now()
			err := c.Ping(ctx)
			took := time.Since(start)
			var me *mlock.Error
			if !errors.As(err, &me) || me.Type != mlock.TypeConnection || !errors.Is(err, tc.cause) {
				t.Fatalf("Ping = %v, want a connection error wrapping %v", err, tc.cause)
			}
			if !strings.Contains(me.Msg, tc.code.Text()) {
				t.Fatalf("Msg %q does not give the server's text %q", me.Msg, tc.code.Text())
			}
			if tc.code == protocol.CodeTLSRequired && !strings.Contains(me.Msg, "requires TLS (use mlocks://") {
				t.Fatalf("Msg %q", me.Msg)
			}
			noSecret(t, "the error", err.Error())
			if took > time.Second {
				t.Fatalf("the refusal took %v to reach the caller", took)
			}
			proctest.WaitFor(t, 10*time.Second, "three attempts", func() bool { return len(a.get()) >= 3 })
			c.Close()
			checkBackoff(t, a.get(), maxBackoff)
			// A call while refused gets the refusal at once, without waiting
			// for the next attempt: with a backoff of a minute (at least
			// half of it after the first attempt), a call that waited for
			// the next attempt would take 30 s, and there would be a second.
			slow := client(t, addr, mlock.Options{Name: "svc", Token: topSecret, MaxBackoff: time.Minute, DialTimeout: 3 * time.Second})
			if err := slow.Ping(ctx); !errors.Is(err, tc.cause) {
				t.Fatalf("Ping = %v, want %v", err, tc.cause)
			}
			before := len(a.get())
			start = time.Now()
			if err := slow.Ping(ctx); !errors.Is(err, tc.cause) || time.Since(start) > 10*time.Second || len(a.get()) != before {
				t.Fatalf("Ping while refused = %v after %v and %d more attempts, want the refusal at once, with no attempt",
					err, time.Since(start), len(a.get())-before)
			}
		})
	}
}

// A lock request waiting in a queue when the server starts refusing the
// client (its token was revoked) fails with the refusal: it does not wait
// forever for a connection that will not come.
func TestRefusalFailsAWaitingLock(t *testing.T) {
	n := 0
	queued := make(chan struct{}) // the client knows its lock is queued
	addr := fakeServer(t, func(c net.Conn, r *bufio.Reader) {
		n++
		if _, err := readCommand(r); err != nil {
			return
		}
		if n > 1 {
			c.Write(protocol.AppendError(nil, protocol.CodeAuthFailed))
			return
		}
		c.Write(protocol.Append(nil, "connected", "1.0", "new", "15000"))
		f, err := readCommand(r)
		if err != nil || f[0] != "lock" {
			return
		}
		c.Write(protocol.Append(nil, "result", f[1], "success", strings.Repeat("ab", 16))) // queued
		<-queued                                                                           // the connection stays up until the client read it
	})
	c := client(t, addr, mlock.Options{Name: "svc", Token: topSecret, MaxBackoff: 200 * time.Millisecond})
	ctx := ctxT(t)
	start := time.Now()
	errc := make(chan error, 1)
	go func() { _, err := c.Lock(ctx, "w", nil); errc <- err }()
	proctest.WaitFor(t, 10*time.Second, "the lock queued", func() bool { return c.KnownLocks() == 1 })
	close(queued)
	err := <-errc
	if !errors.Is(err, mlock.ErrAuth) || !errors.Is(err, mlock.ErrConnection) {
		t.Fatalf("Lock = %v, want the refusal", err)
	}
	t.Logf("failed after %v: %v", time.Since(start), err)
}

// Once the server accepts the credentials again (its auth file was fixed),
// the client connects by itself.
func TestRefusalThenAccepted(t *testing.T) {
	t.Parallel()
	var a attempts
	addr := fakeServer(t, func(c net.Conn, r *bufio.Reader) {
		a.add()
		if len(a.get()) <= 2 {
			if _, err := readCommand(r); err == nil {
				c.Write(protocol.AppendError(nil, protocol.CodeAuthFailed))
			}
			return
		}
		serveBasic(c, r, nil)
	})
	const maxBackoff = 300 * time.Millisecond
	c := client(t, addr, mlock.Options{Name: "svc", Token: topSecret, MaxBackoff: maxBackoff})
	ctx := ctxT(t)
	if err := c.Ping(ctx); !errors.Is(err, mlock.ErrAuth) {
		t.Fatalf("first Ping = %v", err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		err := c.Ping(ctx)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still refused: %v", err)
		}
		time.Sleep(50 * time.Millisecond) // poll interval
	}
	checkBackoff(t, a.get(), maxBackoff)
}

// ---- TLS ----

// TLS with a certificate from a CA given in the URI, and a client
// certificate (mTLS); the credentials go inside the TLS connection.
func TestTLSHandshake(t *testing.T) {
	pki := newPKI(t)
	type peer struct {
		connect []string
		cn      string
		version uint16
	}
	peers := make(chan peer, 4)
	addr := fakeTLSServer(t, &tls.Config{Certificates: []tls.Certificate{pki.server}, ClientCAs: pki.pool,
		ClientAuth: tls.VerifyClientCertIfGiven}, func(c *tls.Conn, r *bufio.Reader) {
		seen := make(chan []string, 1)
		go func() {
			st := c.ConnectionState()
			p := peer{connect: <-seen, version: st.Version}
			if len(st.PeerCertificates) > 0 {
				p.cn = st.PeerCertificates[0].Subject.CommonName
			}
			peers <- p
		}()
		serveBasic(c, r, seen)
		close(seen)
	})
	_, port, _ := net.SplitHostPort(addr)
	ctx := ctxT(t)

	uri := "mlocks://svc:" + topSecret + "@127.0.0.1:" + port + "?tls-ca=" + pki.caFile +
		"&tls-cert=" + pki.certFile + "&tls-key=" + pki.keyFile
	c, err := mlock.New(uri)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	p := <-peers
	if p.cn != "orders" || p.version < tls.VersionTLS12 || len(p.connect) != 4 || p.connect[3] != "auth=svc:"+topSecret {
		t.Fatalf("server saw %+v", p)
	}
	c2, err := mlock.New(uri)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if c2.SocketID() != c.SocketID() {
		t.Fatal("two clients of one URI do not share their session")
	}

	// Options.TLS, server name from the host ("localhost" is in the
	// certificate), no client certificate.
	o := clientOptions("localhost:"+port, mlock.Options{TLS: &tls.Config{RootCAs: pki.pool}})
	c3, err := mlock.NewClient(o)
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if err := c3.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if p := <-peers; p.cn != "" || len(p.connect) != 3 {
		t.Fatalf("server saw %+v", p)
	}
}

// A certificate the client does not trust, or that does not name the
// server, is refused at once with a TLS error; the client does not retry
// in a tight loop.
func TestTLSUntrustedCertificate(t *testing.T) {
	t.Parallel()
	pki := newPKI(t)
	var a attempts
	addr := fakeServer(t, func(c net.Conn, r *bufio.Reader) {
		a.add()
		tc := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{pki.server}})
		c.SetDeadline(time.Now().Add(2 * time.Second))
		tc.Handshake()
	})
	_, port, _ := net.SplitHostPort(addr)
	const maxBackoff = 400 * time.Millisecond
	for _, tc := range []struct {
		name string
		cfg  *tls.Config
	}{
		{"unknown CA", &tls.Config{}},
		{"wrong name", &tls.Config{RootCAs: pki.pool, ServerName: "other.example"}},
	} {
		// "At once": well before the DialTimeout a retrying client would
		// wait out (a bound on a loaded machine, not a latency target).
		const dialTimeout = 20 * time.Second
		c := client(t, "127.0.0.1:"+port, mlock.Options{TLS: tc.cfg, MaxBackoff: maxBackoff, DialTimeout: dialTimeout})
		start := time.Now()
		err := c.Ping(ctxT(t))
		var me *mlock.Error
		if !errors.As(err, &me) || !errors.Is(err, mlock.ErrTLS) || !strings.Contains(me.Msg, "does not verify") {
			t.Fatalf("%s: Ping = %v", tc.name, err)
		}
		var ve *tls.CertificateVerificationError
		if !errors.As(err, &ve) {
			t.Fatalf("%s: the x509 error is not in the chain: %v", tc.name, err)
		}
		if time.Since(start) > dialTimeout/4 {
			t.Fatalf("%s: took %v", tc.name, time.Since(start))
		}
		t.Logf("%s: %v", tc.name, err)
		// The client goes on trying, at its backoff.
		first := len(a.get()) - 1
		proctest.WaitFor(t, 10*time.Second, tc.name+": three attempts", func() bool { return len(a.get()) >= first+3 })
		c.Close()
		checkBackoff(t, a.get()[first:first+3], maxBackoff)
	}
}

// A TLS client against a plain server: the server's answer to the hello is
// not TLS, and the error says so.
func TestTLSClientPlainServer(t *testing.T) {
	t.Parallel()
	var a attempts
	addr := fakeServer(t, func(c net.Conn, r *bufio.Reader) {
		a.add()
		// What a plain server does with bytes that are not a frame.
		r.Peek(4)
		c.Write(protocol.AppendError(nil, protocol.CodeFrameTooLarge))
		drain(c)
	})
	const maxBackoff = 400 * time.Millisecond
	c := client(t, addr, mlock.Options{TLS: &tls.Config{}, MaxBackoff: maxBackoff, DialTimeout: 3 * time.Second})
	start := time.Now()
	err := c.Ping(ctxT(t))
	var me *mlock.Error
	if !errors.As(err, &me) || me.Type != mlock.TypeConnection || !errors.Is(err, mlock.ErrTLS) ||
		!strings.Contains(me.Msg, "does not speak TLS") {
		t.Fatalf("Ping = %v", err)
	}
	var rh tls.RecordHeaderError
	if !errors.As(err, &rh) {
		t.Fatalf("no tls.RecordHeaderError in %v", err)
	}
	if time.Since(start) > time.Second {
		t.Fatalf("took %v", time.Since(start))
	}
	t.Log(err)
	proctest.WaitFor(t, 10*time.Second, "three attempts", func() bool { return len(a.get()) >= 3 })
	checkBackoff(t, a.get(), maxBackoff)
}

// A plain client against a TLS server that does not answer in clear text
// (it sends a TLS alert): the error says the server speaks TLS.
func TestPlainClientTLSServer(t *testing.T) {
	addr := fakeServer(t, func(c net.Conn, r *bufio.Reader) {
		r.Peek(4)
		c.Write([]byte{0x15, 0x03, 0x01, 0x00, 0x02, 0x02, 0x46}) // alert: protocol version
		drain(c)
	})
	c := client(t, addr, mlock.Options{MaxBackoff: 400 * time.Millisecond, DialTimeout: 3 * time.Second})
	err := c.Ping(ctxT(t))
	var me *mlock.Error
	if !errors.As(err, &me) || !errors.Is(err, mlock.ErrTLS) || !strings.Contains(me.Msg, "mlocks://") {
		t.Fatalf("Ping = %v", err)
	}
	t.Log(err)
}

// ---- the registry ----

// Clients share a session only with the same address, credentials and TLS
// settings.
func TestSessionsSharedByCredentialsAndTLS(t *testing.T) {
	ln, err := listenFresh(t)
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens: the sessions try in the background
	_, port, _ := net.SplitHostPort(addr)
	mk := func(o mlock.Options) *mlock.Client {
		o.MaxBackoff = time.Second
		return client(t, addr, o)
	}
	cfg := &tls.Config{}
	plain := mk(mlock.Options{})
	same := func(a, b *mlock.Client) bool { return a.SocketID() == b.SocketID() }
	svc := mk(mlock.Options{Name: "svc", Token: "t1"})
	for _, tc := range []struct {
		name string
		a, b *mlock.Client
		same bool
	}{
		{"plain, plain", plain, mk(mlock.Options{}), true},
		{"plain, credentials", plain, svc, false},
		{"same credentials", svc, mk(mlock.Options{Name: "svc", Token: "t1"}), true},
		{"another token", svc, mk(mlock.Options{Name: "svc", Token: "t2"}), false},
		{"another name", svc, mk(mlock.Options{Name: "other", Token: "t1"}), false},
		{"plain, TLS", plain, mk(mlock.Options{TLS: cfg}), false},
		{"one tls.Config", mk(mlock.Options{TLS: cfg}), mk(mlock.Options{TLS: cfg}), true},
		{"two tls.Configs", mk(mlock.Options{TLS: cfg}), mk(mlock.Options{TLS: &tls.Config{}}), false},
		{"TLS with credentials", mk(mlock.Options{TLS: cfg}), mk(mlock.Options{TLS: cfg, Name: "svc", Token: "t1"}), false},
	} {
		if same(tc.a, tc.b) != tc.same {
			t.Errorf("%s: shared %v, want %v", tc.name, !tc.same, tc.same)
		}
	}
	fromURI := func(uri string) *mlock.Client {
		c, err := mlock.New(uri)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	u1, u2 := fromURI("mlocks://127.0.0.1:"+port), fromURI("mlocks://127.0.0.1:"+port)
	u3 := fromURI("mlocks://127.0.0.1:" + port + "?tls-server-name=x")
	if !same(u1, u2) || same(u1, u3) || same(u1, plain) {
		t.Errorf("URIs: shared %v %v %v", same(u1, u2), same(u1, u3), same(u1, plain))
	}
	// One socketId may not serve two sessions of one address.
	mk(mlock.Options{SocketID: "fixed", Name: "a", Token: "x"})
	if _, err := mlock.NewClient(clientOptions(addr, mlock.Options{SocketID: "fixed", Name: "b", Token: "x"})); !errors.Is(err, mlock.ErrRequest) {
		t.Fatalf("a socketId in two sessions: %v", err)
	}
	// Calls while nothing listens say why.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c := client(t, addr, mlock.Options{DialTimeout: 300 * time.Millisecond, Name: "u", Token: "v"})
	var me *mlock.Error
	if err := c.Ping(ctx); !errors.As(err, &me) || me.Type != mlock.TypeConnection || me.Err == nil {
		t.Fatalf("Ping with nothing listening = %v", err)
	}
}

// ---- admin commands and permissions ----

func TestEvictLocksPageAndForbidden(t *testing.T) {
	frames := make(chan []string, 16)
	addr := fakeServer(t, func(c net.Conn, r *bufio.Reader) {
		if f, err := readCommand(r); err != nil || f[0] != "connect" {
			return
		}
		c.Write(protocol.Append(nil, "connected", "1.0", "new", "15000"))
		for {
			f, err := readCommand(r)
			if err != nil {
				return
			}
			switch f[0] {
			case "evict":
				frames <- f
				c.Write(protocol.Append(nil, "result", f[1], "success", "2"))
			case "lock":
				c.Write(protocol.AppendFailed(nil, []byte(f[1]), protocol.CodeForbidden, f[2]))
			case "locks":
				frames <- f
				c.Write(protocol.Append(nil, "result", f[1], "success",
					`{"queues":[{"resource":"order:a","length":1,"entries":[{"lock":"","session":"","state":"held","position":0,"ageMs":1,"principal":"svc"}]}],"truncated":true,"next":"order:a"}`))
			case "ping":
				c.Write(protocol.Append(nil, "result", f[1], "success", "pong"))
			}
		}
	})
	c := client(t, addr, mlock.Options{Prefix: "order:"})
	bare := client(t, addr, mlock.Options{})
	ctx := ctxT(t)
	next := func() string {
		t.Helper()
		select {
		case f := <-frames:
			return strings.Join(append([]string{f[0]}, f[2:]...), " ") // without the request id
		case <-time.After(3 * time.Second):
			t.Fatal("no frame")
			return ""
		}
	}

	n, err := c.Evict(ctx, "a|b")
	if err != nil || n != 2 {
		t.Fatalf("Evict = %d, %v", n, err)
	}
	if f := next(); f != "evict order:a|order:b" {
		t.Fatalf("sent %q", f)
	}

	_, err = c.Lock(ctx, "x", nil)
	var me *mlock.Error
	if !errors.As(err, &me) || me.Type != mlock.TypeRequest || !errors.Is(err, mlock.ErrForbidden) || me.Resource != "order:x" {
		t.Fatalf("Lock = %#v", err)
	}

	for _, tc := range []struct {
		c      *mlock.Client
		prefix string
		limit  int
		after  string
		sent   string
	}{
		{c, "", 0, "", "locks order:"},
		{bare, "", 0, "", "locks"},
		{c, "p", 10, "", "locks order:p 10"},
		{c, "", 10, "order:k", "locks order: 10 order:k"},
		{bare, "", 0, "k", "locks | 0 k"},
		{bare, "", 5, "", "locks | 5"},
	} {
		ls, err := tc.c.LocksPage(ctx, tc.prefix, tc.limit, tc.after)
		if err != nil {
			t.Fatal(err)
		}
		if f := next(); f != tc.sent {
			t.Fatalf("LocksPage(%q, %d, %q) sent %q, want %q", tc.prefix, tc.limit, tc.after, f, tc.sent)
		}
		if ls.Next != "order:a" || ls.Queues[0].Entries[0].Principal != "svc" || ls.Queues[0].Length != 1 {
			t.Fatalf("decoded %+v", ls)
		}
	}
	if _, err := c.LocksPage(ctx, "", -1, ""); !errors.Is(err, mlock.ErrRequest) {
		t.Fatalf("negative limit: %v", err)
	}
	if _, err := c.LocksPage(ctx, "", 1, "a b"); !errors.Is(err, mlock.ErrRequest) {
		t.Fatalf("after with a space: %v", err)
	}
}
