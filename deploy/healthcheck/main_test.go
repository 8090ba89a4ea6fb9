package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	code := http.StatusOK
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(code) }))
	defer ts.Close()
	if err := check(ts.URL + "/healthz"); err != nil {
		t.Fatalf("200: %v", err)
	}
	code = http.StatusServiceUnavailable
	if err := check(ts.URL + "/healthz"); err == nil || !strings.Contains(err.Error(), "503") {
		t.Fatalf("503: %v", err)
	}
	ts.Close()
	if err := check(ts.URL + "/healthz"); err == nil {
		t.Fatal("nothing listening: no error")
	}
	// mlockd's HTTP listener over TLS, with a certificate for other names.
	secure := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	defer secure.Close()
	if err := check(secure.URL + "/healthz"); err != nil {
		t.Fatalf("https: %v", err)
	}
}

// Without an argument the probe follows MLOCK_HTTP, so that an image run
// with another --http address is not reported unhealthy; a wildcard host
// is probed on loopback.
func TestProbeURL(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
		err  string
	}{
		{args: []string{"http://x:1/healthz"}, env: map[string]string{"MLOCK_HTTP": "0.0.0.0:9"}, want: "http://x:1/healthz"},
		{want: "http://127.0.0.1:12341/healthz"},
		{env: map[string]string{"MLOCK_HTTP": "0.0.0.0:9100"}, want: "http://127.0.0.1:9100/healthz"},
		{env: map[string]string{"MLOCK_HTTP": ":9100"}, want: "http://127.0.0.1:9100/healthz"},
		{env: map[string]string{"MLOCK_HTTP": "[::]:9100"}, want: "http://[::1]:9100/healthz"},
		{env: map[string]string{"MLOCK_HTTP": "10.1.2.3:9100"}, want: "http://10.1.2.3:9100/healthz"},
		{env: map[string]string{"MLOCK_HTTP": "0.0.0.0:9100", "MLOCK_TLS_CERT": "/etc/mlockd/cert.pem"}, want: "https://127.0.0.1:9100/healthz"},
		{env: map[string]string{"MLOCK_HTTP": ""}, err: "MLOCK_HTTP is empty"},
		{env: map[string]string{"MLOCK_HTTP": "nonsense"}, err: "MLOCK_HTTP"},
	} {
		got, err := probeURL(c.args, func(k string) (string, bool) { v, ok := c.env[k]; return v, ok })
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%v %v: %q, %v; want an error with %q", c.args, c.env, got, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%v %v: %q, %v; want %q", c.args, c.env, got, err, c.want)
		}
	}
}
