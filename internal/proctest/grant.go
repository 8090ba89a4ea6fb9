package proctest

import (
	"testing"
	"time"
)

// GrantAgain waits for a server that refused lock requests (a broken
// disk, say) to grant again. cycle asks for a lock and frees it, and
// returns the token granted, or why the request was refused. GrantAgain
// calls it every pause until a request is granted, for at most timeout (in
// whole seconds), after which the test fails ("still refused 30 s after
// <after>: <why>"). It fails the test unless the token granted is above
// last, and returns it.
func GrantAgain(t testing.TB, timeout, pause time.Duration, after string, last uint64, cycle func() (token uint64, why string)) uint64 {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		tok, why := cycle()
		if why == "" {
			if tok <= last {
				t.Fatalf("token %d after %d", tok, last)
			}
			return tok
		}
		if time.Now().After(deadline) {
			t.Fatalf("still refused %d s after %s: %q", timeout/time.Second, after, why)
		}
		time.Sleep(pause)
	}
}
