package proctest

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
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

// GrantUntilRefused calls cycle (as GrantAgain does) at most max times,
// until a request is refused, and returns the last token granted (last
// when none was) and the refusal ("" when none was refused). The tokens
// granted must grow from last, else the test fails. each, when not nil, is
// called after each grant with its token.
func GrantUntilRefused(t testing.TB, max int, last uint64, cycle func() (token uint64, why string), each func(token uint64)) (uint64, string) {
	t.Helper()
	for range max {
		tok, why := cycle()
		if why != "" {
			return last, why
		}
		if tok <= last {
			t.Fatalf("token %d after %d", tok, last)
		}
		last = tok
		if each != nil {
			each(tok)
		}
	}
	return last, ""
}

// TokenMark reads the token high-water mark a server keeps in its data
// directory dir (the file token-mark: one decimal number); a file that is
// missing or holds no number fails the test.
func TokenMark(t testing.TB, dir string) uint64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "token-mark"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
