package mlock_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
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
