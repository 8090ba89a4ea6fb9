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
}
