package mlock_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/server"
)

// The client against the real server with an auth file and TLS.
func TestAgainstServerWithAuthAndTLS(t *testing.T) {
	pki := newPKI(t)
	hash := func(tok string) string { h := sha256.Sum256([]byte(tok)); return "sha256:" + hex.EncodeToString(h[:]) }
	authFile := filepath.Join(t.TempDir(), "auth")
	os.WriteFile(authFile, []byte(strings.Join([]string{
		"orders " + hash("orders-tok") + " prefix=order: cert",
		"ops " + hash("ops-tok") + " admin",
	}, "\n")+"\n"), 0o600)
	addr, _ := startServer(t, server.Config{AuthFile: authFile,
		TLSCertFile: pki.srvCert, TLSKeyFile: pki.srvKey, TLSClientCAFile: pki.caFile}, "")
	_, port := splitPort(addr)
	ctx := ctxT(t)
	uri := func(userinfo string) string {
		return "mlocks://" + userinfo + "127.0.0.1:" + port + "?tls-ca=" + pki.caFile
	}
	open := func(u string) *mlock.Client {
		o, err := mlock.ParseURI(u)
		if err != nil {
			t.Fatal(err)
		}
		o.MaxBackoff = 300 * time.Millisecond
		o.DialTimeout = time.Second
		c, err := mlock.NewClient(o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	orders := open(uri("orders:orders-tok@"))
	ops := open(uri("ops:ops-tok@"))
	l, err := orders.Lock(ctx, "order:1", nil)
	if err != nil {
		t.Fatal(err)
	}
	var me *mlock.Error
	if _, err := orders.Lock(ctx, "stock:1", nil); !errors.As(err, &me) || !errors.Is(err, mlock.ErrForbidden) || me.Resource != "stock:1" {
		t.Fatalf("a resource outside the prefixes: %v", err)
	}
	if _, err := orders.Lock(ctx, "order:2", nil); err != nil {
		t.Fatal(err)
	}
	for _, prefix := range []string{"order:", ""} { // "": sent as "|"
		ls, err := ops.LocksPage(ctx, prefix, 1, "")
		if err != nil {
			t.Fatal(err)
		}
		if len(ls.Queues) != 1 || ls.Queues[0].Resource != "order:1" || ls.Queues[0].Entries[0].Principal != "orders" || ls.Next != "order:1" {
			t.Errorf("locks %q, first page = %+v", prefix, ls)
			continue
		}
		if ls, err = ops.LocksPage(ctx, prefix, 1, ls.Next); err != nil || len(ls.Queues) != 1 || ls.Queues[0].Resource != "order:2" || ls.Next != "" {
			t.Errorf("locks %q, second page = %+v, %v", prefix, ls, err)
		}
	}
	if n, err := ops.Evict(ctx, "order:1"); err != nil || n != 1 {
		t.Fatalf("Evict = %d, %v", n, err)
	}
	select {
	case <-l.Lost():
		if !errors.Is(l.Err(), mlock.ErrLost) {
			t.Fatalf("evicted: %v", l.Err())
		}
	case <-time.After(3 * time.Second):
		t.Fatal("the evicted holder was not told")
	}
	if _, err := orders.Evict(ctx, "order:1"); !errors.Is(err, mlock.ErrForbidden) {
		t.Fatalf("Evict by a non-admin: %v", err)
	}

	// By client certificate: the certificate's name is the principal.
	byCert := open(uri("") + "&tls-cert=" + pki.certFile + "&tls-key=" + pki.keyFile)
	if l, err := byCert.Lock(ctx, "order:9", nil); err != nil {
		t.Fatalf("by certificate: %v", err)
	} else {
		l.Unlock(ctx)
	}
	if _, err := byCert.Lock(ctx, "stock:9", nil); !errors.Is(err, mlock.ErrForbidden) {
		t.Fatalf("by certificate, outside the prefixes: %v", err)
	}

	for _, tc := range []struct {
		uri   string
		cause error
		text  string
	}{
		{uri("orders:wrong@"), mlock.ErrAuth, "authentication failed!"},
		{uri(""), mlock.ErrAuth, "authentication required!"},
		{"mlock://orders:orders-tok@127.0.0.1:" + port, mlock.ErrTLS, "requires TLS"},
	} {
		err := open(tc.uri).Ping(ctx)
		if !errors.As(err, &me) || !errors.Is(err, tc.cause) || !strings.Contains(me.Msg, tc.text) {
			t.Errorf("%s: Ping = %v", tc.uri, err)
		}
		if strings.Contains(err.Error(), "-tok") {
			t.Errorf("the error shows the token: %v", err)
		}
	}

	plainAddr, _ := startServer(t, server.Config{}, "")
	_, plainPort := splitPort(plainAddr)
	err = open("mlocks://127.0.0.1:" + plainPort + "?tls-ca=" + pki.caFile).Ping(ctxT(t))
	if !errors.Is(err, mlock.ErrTLS) {
		t.Errorf("TLS to a plain server: %v", err)
	}
	t.Logf("TLS to a plain server: %v", err)
	err = open("mlock://x:y@127.0.0.1:" + plainPort).Ping(ctxT(t))
	if !errors.Is(err, mlock.ErrAuth) {
		t.Errorf("credentials to a server without authentication: %v", err)
	}
}

func splitPort(addr string) (string, string) {
	h, p, _ := net.SplitHostPort(addr)
	return h, p
}

// A client certificate whose issuer is not among the server's client CAs
// is not sent (Go's TLS client sends none the server's request does not
// accept): the server answers "authentication required!", and the error
// says that the certificate was not accepted and where to look.
func TestClientCertificateOfAnotherCA(t *testing.T) {
	t.Parallel()
	pki := newPKI(t)
	addr, _ := startServer(t, server.Config{TLSCertFile: pki.srvCert, TLSKeyFile: pki.srvKey, TLSClientCAFile: pki.caFile}, "")
	// A self-signed certificate: its issuer is no CA the server knows.
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "stranger"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	for _, c := range []struct {
		name  string
		certs []tls.Certificate
		hint  bool
	}{{"another CA's certificate", []tls.Certificate{cert}, true}, {"no certificate", nil, false}} {
		cl, err := mlock.NewClient(mlock.Options{Addrs: []string{addr}, DialTimeout: 5 * time.Second,
			TLS: &tls.Config{RootCAs: pki.pool, Certificates: c.certs}})
		if err != nil {
			t.Fatal(err)
		}
		err = cl.Ping(ctxT(t))
		cl.Close()
		var me *mlock.Error
		if !errors.As(err, &me) || !errors.Is(err, mlock.ErrAuth) || !strings.HasPrefix(me.Msg, "authentication required!") {
			t.Fatalf("%s: Ping = %v, want authentication required!", c.name, err)
		}
		if hint := strings.Contains(me.Msg, "the client certificate was not accepted: is its issuer among the server's client CAs"); hint != c.hint {
			t.Errorf("%s: %q: the hint on the certificate is there: %v, want %v", c.name, me.Msg, hint, c.hint)
		}
	}
}
