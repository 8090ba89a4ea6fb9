package server

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/internal/auth"
	"github.com/mlock-dev/mlock/internal/testcert"
	"github.com/mlock-dev/mlock/server/observe"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// httpGet gets url with the headers given ("Name: value") and returns the
// status, the body and the response's headers.
func httpGet(t testing.TB, client *http.Client, url string, headers ...string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ": ")
		req.Header.Set(k, v)
	}
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, string(b), res.Header
}

// On a server with an auth file the HTTP endpoints but /healthz and
// /readyz are for administrators: a bearer token or Basic credentials of an
// admin principal, from its from= networks; /metrics opens with
// OpenMetrics and still scrapes with the token.
func TestHTTPNeedsAnAdministrator(t *testing.T) {
	t.Parallel()
	tk := tokens{a: auth.NewToken(), b: auth.NewToken(), admin: auth.NewToken()}
	srv := start(t, Config{AuthFile: writeAuthFile(t,
		authLine(t, "A", tk.a, "prefix=a:"),
		authLine(t, "ops", tk.admin, "admin"),
		authLine(t, "far", tk.b, "admin", "from=10.0.0.0/8"),
	)})
	a := connectAs(t, srv, "a1", "A", tk.a)
	a.locked(a.lock("1", "a:secret-resource 60000 0 0 alice"))
	h := srv.HTTPHandler(observe.Options{})
	ts := httptest.NewServer(h)
	t.Cleanup(func() { ts.Close(); h.Close() })
	c := ts.Client()

	refused := map[string][]string{
		"nothing":           nil,
		"a principal":       {"Authorization: Bearer A:" + tk.a},
		"a wrong token":     {"Authorization: Bearer ops:" + auth.NewToken()},
		"a token alone":     {"Authorization: Bearer " + tk.admin},
		"another's address": {"Authorization: Bearer far:" + tk.b},
		"basic of A":        {"Authorization: Basic " + basic("A", tk.a)},
	}
	for _, path := range []string{"/", "/api/locks", "/api/status", "/api/view", "/metrics", "/page/app.js"} {
		for what, hdr := range refused {
			code, body, hd := httpGet(t, c, ts.URL+path, hdr...)
			if code != http.StatusUnauthorized || strings.Contains(body, "secret-resource") {
				t.Errorf("%s with %s: %d %q", path, what, code, body)
			}
			if got := hd.Values("WWW-Authenticate"); len(got) != 2 || !strings.HasPrefix(got[0], "Basic ") {
				t.Errorf("%s: WWW-Authenticate %q, want a Basic and a Bearer challenge", path, got)
			}
		}
		for what, hdr := range map[string]string{
			"bearer": "Authorization: Bearer ops:" + tk.admin,
			"basic":  "Authorization: Basic " + basic("ops", tk.admin),
		} {
			if code, body, _ := httpGet(t, c, ts.URL+path, hdr); code != http.StatusOK {
				t.Errorf("%s with the admin's %s: %d %q", path, what, code, body)
			}
		}
	}
	if code, body, _ := httpGet(t, c, ts.URL+"/api/locks", "Authorization: Bearer ops:"+tk.admin); !strings.Contains(body, "a:secret-resource") {
		t.Errorf("the admin's /api/locks: %d %q", code, body)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if code, body, _ := httpGet(t, c, ts.URL+path); code != http.StatusOK {
			t.Errorf("%s without credentials: %d %q", path, code, body)
		}
	}
	// Prometheus scrapes with the token (authorization: credentials_file).
	_, body, _ := httpGet(t, c, ts.URL+"/metrics", "Authorization: Bearer ops:"+tk.admin)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil || fams["mlock_locks_held"] == nil {
		t.Fatalf("/metrics with the token does not parse as Prometheus text (%v): %.200s", err, body)
	}

	open := srv.HTTPHandler(observe.Options{OpenMetrics: true})
	ots := httptest.NewServer(open)
	t.Cleanup(func() { ots.Close(); open.Close() })
	if code, _, _ := httpGet(t, ots.Client(), ots.URL+"/metrics"); code != http.StatusOK {
		t.Errorf("/metrics with OpenMetrics: %d", code)
	}
	if code, _, _ := httpGet(t, ots.Client(), ots.URL+"/api/locks"); code != http.StatusUnauthorized {
		t.Errorf("/api/locks with OpenMetrics: %d, want 401", code)
	}
}

func basic(name, token string) string {
	r, _ := http.NewRequest("GET", "http://x/", nil)
	r.SetBasicAuth(name, token)
	return strings.TrimPrefix(r.Header.Get("Authorization"), "Basic ")
}

// Over TLS, with the lock listener's certificate and client CAs, a client
// certificate of an admin principal opens the endpoints; another's does
// not. A reload of the client CA reaches the HTTP listener too.
func TestHTTPOverTLSWithClientCertificate(t *testing.T) {
	t.Parallel()
	ca, next := testcert.New(t), testcert.New(t)
	caFile := t.TempDir() + "/clients.pem"
	copyFile(t, ca.CertFile(), caFile)
	srv := tlsServer(t, ca, Config{TLSClientCAFile: caFile, AuthFile: writeAuthFile(t,
		"opscert - admin cert",
		"svc - prefix=s: cert",
	)})
	h := srv.HTTPHandler(observe.Options{})
	ts := httptest.NewUnstartedServer(h)
	ts.TLS = srv.TLSConfig().Clone()
	ts.StartTLS()
	t.Cleanup(func() { ts.Close(); h.Close() })
	client := func(cfg *tls.Config) *http.Client {
		return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
	}
	url := ts.URL
	if code, _, _ := httpGet(t, client(clientTLS(t, ca, "opscert")), url+"/api/locks"); code != http.StatusOK {
		t.Errorf("an admin's certificate: %d", code)
	}
	if code, _, _ := httpGet(t, client(clientTLS(t, ca, "svc")), url+"/api/locks"); code != http.StatusUnauthorized {
		t.Errorf("a certificate of a principal that does not administer: %d", code)
	}
	if code, _, _ := httpGet(t, client(clientTLS(t, ca, "")), url+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz over TLS: %d", code)
	}

	// The client CA changes: after Reload the next CA's certificates are
	// verified on the HTTP listener and on the lock port, the old one's no
	// longer.
	copyFile(t, next.CertFile(), caFile)
	if err := srv.Reload(); err != nil {
		t.Fatal(err)
	}
	withNext := clientTLS(t, ca, "")
	withNext.Certificates = []tls.Certificate{keyPair(t, next, "opscert")}
	if code, _, _ := httpGet(t, client(withNext), url+"/api/locks"); code != http.StatusOK {
		t.Errorf("after the reload, the next CA's admin certificate: %d", code)
	}
	withNext.Certificates = []tls.Certificate{keyPair(t, next, "svc")}
	c, _ := dialTLS(t, srv, withNext)
	c.send("connect svc-1 1.0")
	c.expect("connected 1.0 new *")
	if tc, err := tryTLS(srv, clientTLS(t, ca, "svc")); err == nil {
		// TLS 1.3: the client learns of the refusal on its first read.
		old := &raw{t: t, nc: tc}
		old.send("connect svc-2 1.0")
		if p, err := old.next(3 * time.Second); err == nil {
			t.Fatalf("after the reload, a certificate of the old CA got %q", p)
		}
		tc.Close()
	}
}

// FuzzHTTPAdmin: whatever the Authorization header, HTTPAdmin never panics
// and accepts exactly the administrator's credentials (bearer or Basic).
func FuzzHTTPAdmin(f *testing.F) {
	tok := "fuzz-admin-token"
	file := writeAuthFile(f, authLine(f, "ops", tok, "admin"), authLine(f, "A", "fuzz-a-token", "prefix=a:"))
	srv, err := New(Config{AuthFile: file, QuietPeriod: -1})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	for _, h := range []string{"", "Bearer ops:" + tok, "Bearer ops:", "Bearer :", "Bearer " + tok, "Basic " + basic("ops", tok),
		"Basic !!!", "Basic " + basic("A", "fuzz-a-token"), "bearer ops:" + tok, "Bearer  ops:" + tok + " ", "Bearer ops:" + tok + ":x"} {
		f.Add(h, "127.0.0.1:5")
	}
	f.Fuzz(func(t *testing.T, header, remote string) {
		r := httptest.NewRequest("GET", "/api/locks", nil)
		r.RemoteAddr = remote
		if header != "" {
			r.Header.Set("Authorization", header)
		}
		got := srv.HTTPAdmin(r)
		want := false
		if name, token, ok := r.BasicAuth(); ok {
			want = name == "ops" && token == tok
		} else if cred, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
			want = strings.TrimSpace(cred) == "ops:"+tok
		}
		if got != want {
			t.Fatalf("HTTPAdmin(%q) = %v, want %v", header, got, want)
		}
	})
}
