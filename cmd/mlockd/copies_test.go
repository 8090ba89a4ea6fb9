package main

import (
	"os"
	"regexp"
	"strconv"
	"testing"

	"github.com/mlock-dev/mlock"
	lockingmlockd "github.com/mlock-dev/mlock/locking/mlockd"
	"github.com/mlock-dev/mlock/server"
)

// The clients copy two of the server's defaults, to use without asking
// it: the lease of a lock given none (the Go client's Options.TTL, the
// Node.js client's ttl option) and the longest lease (the mlockd locking
// provider's MaxExpire, "no expiry"). The copies are the server's.
func TestClientCopiesOfTheServerDefaults(t *testing.T) {
	if mlock.DefaultTTL != server.DefaultTTL {
		t.Errorf("mlock.DefaultTTL %v, the server's default lease %v", mlock.DefaultTTL, server.DefaultTTL)
	}
	if lockingmlockd.MaxExpire != server.DefaultMaxTTL {
		t.Errorf("locking/mlockd.MaxExpire %v, the server's longest lease %v", lockingmlockd.MaxExpire, server.DefaultMaxTTL)
	}
	const js = "../../js/packages/mlock/src/options.ts"
	src, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`ttl: o\.ttl === undefined \? (\d+) :`).FindSubmatch(src)
	if m == nil {
		t.Fatalf("%s: no default ttl (ttl: o.ttl === undefined ? N : ...) found", js)
	}
	if n, _ := strconv.ParseInt(string(m[1]), 10, 64); n != server.DefaultTTL.Milliseconds() {
		t.Errorf("%s: default ttl %d ms, the server's default lease %d ms", js, n, server.DefaultTTL.Milliseconds())
	}
}
