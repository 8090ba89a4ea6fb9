package main

import (
	"context"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/internal/auth"
	"github.com/mlock-dev/mlock/server"
	"github.com/mlock-dev/mlock/server/observe"
)

// startObserved runs a server with its HTTP endpoints; it returns the
// lock URI and the HTTP base URL.
func startObserved(t *testing.T) (string, string) {
	t.Helper()
	return startObservedWith(t, server.Config{})
}

// startObservedWith is startObserved with cfg (status rate and quiet
// period off).
func startObservedWith(t *testing.T, cfg server.Config) (string, string) {
	t.Helper()
	cfg.StatusRate, cfg.QuietPeriod = -1, -1
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { srv.Serve(ln); close(done) }()
	h := srv.HTTPHandler(observe.Options{})
	ts := httptest.NewServer(h)
	t.Cleanup(func() {
		ts.Close()
		h.Close()
		srv.Shutdown(context.Background())
		<-done
	})
	return "mlock://" + ln.Addr().String(), ts.URL
}

// mlock top shows the busiest resources with their holder and waiters,
// and the counts, from the JSON API and from the lock protocol alike.
func TestTop(t *testing.T) {
	t.Parallel()
	uri, base := startObserved(t)
	holder(t, uri, "orders:1", "alice")
	holder(t, uri, "stock:2", "carol")
	c, err := mlock.New(uri)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	waited := make(chan error, 1)
	go func() {
		_, err := c.Lock(ctx, "orders:1", &mlock.LockOptions{Owner: "bob"})
		waited <- err
	}()
	defer func() { cancel(); <-waited }()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) { // poll interval
		ls, err := c.Locks(context.Background(), "orders:")
		if err == nil && len(ls.Queues) == 1 && ls.Queues[0].Length == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("bob does not wait")
		}
	}
	for _, args := range [][]string{{"top", "--http", base}, {"top", "--uri", uri}} {
		out, errOut, code := runMlock(t, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errOut)
		}
		lines := strings.Split(out, "\n")
		var orders, stock int
		for i, l := range lines {
			f := strings.Fields(l)
			switch {
			case len(f) > 2 && f[0] == "orders:1":
				orders = i
				if f[1] != "2" || f[2] != "alice" || !strings.Contains(l, "#1 bob") {
					t.Errorf("%v: orders line %q", args, l)
				}
			case len(f) > 2 && f[0] == "stock:2":
				stock = i
				if f[1] != "1" || f[2] != "carol" {
					t.Errorf("%v: stock line %q", args, l)
				}
			}
		}
		if orders == 0 || stock < orders {
			t.Errorf("%v: want orders:1 then stock:2 (the longer queue first):\n%s", args, out)
		}
		if !strings.Contains(out, "locks: 2 held, 1 waiting") || !strings.Contains(out, "ready") {
			t.Errorf("%v: counts:\n%s", args, out)
		}
	}
	// A prefix keeps its resources only.
	out, _, code := runMlock(t, "top", "--http", base, "stock:")
	if code != 0 || strings.Contains(out, "orders:1") || !strings.Contains(out, "stock:2") {
		t.Errorf("top stock: exit %d:\n%s", code, out)
	}
	// Several refreshes.
	out, _, code = runMlock(t, "top", "--http", base, "-n", "2", "--interval", "100ms")
	if code != 0 || strings.Count(out, "the longest queues") != 2 {
		t.Errorf("top -n 2: exit %d:\n%s", code, out)
	}
}

func TestTopErrors(t *testing.T) {
	t.Parallel()
	if _, errOut, code := runMlock(t, "top", "--http", "http://"+refusedAddr(t)); code != exitError || !strings.Contains(errOut, "mlock top:") {
		t.Errorf("unreachable: exit %d %q", code, errOut)
	}
	for _, args := range [][]string{{"top", "a", "b"}, {"top", "--interval", "1ms"}, {"top", "-n", "-1"}} {
		if _, _, code := runMlock(t, args...); code != exitUsage {
			t.Errorf("%v: exit %d, want %d", args, code, exitUsage)
		}
	}
}

// From the lock protocol, whose status lists at most --status-limit
// resources, mlock top does not show that many as the number of resources
// held or waited for: it says "at least".
func TestTopProtocolCountsPastTheStatusLimit(t *testing.T) {
	t.Parallel()
	uri, base := startObservedWith(t, server.Config{StatusLimit: 2})
	for _, r := range []string{"a", "b", "c", "d"} {
		holder(t, uri, r, "o-"+r)
	}
	out, errOut, code := runMlock(t, "top", "--uri", uri)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "4 held, 0 waiting on at least 2 resources") {
		t.Fatalf("mlock top --uri with 4 resources held and a status limit of 2:\n%s", out)
	}
	out, errOut, code = runMlock(t, "top", "--http", base)
	if code != 0 || !strings.Contains(out, "4 held, 0 waiting on 4 resources") {
		t.Fatalf("mlock top --http: exit %d\n%s%s", code, out, errOut)
	}
}

// An explicit --uri is what mlock top reads, even with $MLOCK_HTTP set
// (the image sets it for mlockd): the variable is only a default for
// --http. Both flags at once are a usage error.
func TestTopExplicitURIWinsOverMLOCK_HTTP(t *testing.T) {
	t.Parallel()
	uri, base := startObserved(t)
	holder(t, uri, "orders:1", "alice")
	cmd := mlockCmd("top", "--uri", uri)
	cmd.Env = append(cmd.Env, "MLOCK_HTTP=http://"+refusedAddr(t))
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	if code := exitCodeOf(t, cmd.Run()); code != 0 || !strings.Contains(out.String(), "at "+uri) || !strings.Contains(out.String(), "orders:1") {
		t.Fatalf("mlock top --uri with MLOCK_HTTP set: exit %d\n%s%s", code, out.String(), errb.String())
	}
	if _, _, code := runMlock(t, "top", "--uri", uri, "--http", base); code != exitUsage {
		t.Errorf("--uri and --http: exit %d, want %d", code, exitUsage)
	}
}

// On a server with an auth file, mlock top reads the JSON API with an
// administrator's name and token in the URL (sent as Basic credentials),
// and never prints the token; without them it says the server refused.
func TestTopWithCredentials(t *testing.T) {
	t.Parallel()
	tok := auth.NewToken()
	line, err := auth.Line("ops", tok, "admin")
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "auth")
	if err := os.WriteFile(file, []byte(line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, base := startObservedWith(t, server.Config{AuthFile: file})
	withToken := strings.Replace(base, "http://", "http://ops:"+tok+"@", 1)
	out, errOut, code := runMlock(t, "top", "--http", withToken)
	if code != 0 || !strings.Contains(out, "locks: 0 held") || strings.Contains(out+errOut, tok) {
		t.Errorf("top with the admin's token: exit %d:\n%s\n%s", code, out, errOut)
	}
	other := auth.NewToken()
	wrong := strings.Replace(base, "http://", "http://ops:"+other+"@", 1)
	out, errOut, code = runMlock(t, "top", "--http", wrong)
	if code == 0 || !strings.Contains(errOut, "401") || strings.Contains(out+errOut, other) {
		t.Errorf("top with a wrong token: exit %d:\n%s\n%s", code, out, errOut)
	}
}

// An --http that names no JSON API is a usage error (exit 2), its
// credentials never shown.
func TestTopHTTPURLChecked(t *testing.T) {
	for _, c := range []struct{ raw, want string }{
		{"http://", "names no host"},
		{"http:///api", "names no host"},
		{"ftp://lock.internal", "the scheme must be http or https"},
		{"https://ops:SECRET@a b", "does not parse"},
		{"https://ops:SECRET@", "names no host"},
	} {
		out, errOut, code := runMlock(t, "top", "--http", c.raw, "-n", "1")
		if code != exitUsage || !strings.Contains(errOut, c.want) || strings.Contains(out+errOut, "SECRET") {
			t.Errorf("top --http %q: exit %d (want %d), want %q and no credentials:\n%s%s", c.raw, code, exitUsage, c.want, out, errOut)
		}
	}
	if err := checkHTTPURL("127.0.0.1:12341"); err != nil {
		t.Errorf("a host and port without a scheme: %v", err)
	}
}

// --http's value: a scheme added when none is given, the trailing slash
// dropped, the credentials redacted where it is shown, and the port probed
// for a refusal the scheme's when none is given.
func TestTopHTTPTarget(t *testing.T) {
	for _, c := range []struct {
		raw, base, where string
		addrs            []string
	}{
		{"127.0.0.1:12341/", "http://127.0.0.1:12341", "http://127.0.0.1:12341", []string{"127.0.0.1:12341"}},
		{"https://ops:TOKEN@lock.internal", "https://ops:TOKEN@lock.internal", "https://ops:xxxxx@lock.internal", []string{"lock.internal:443"}},
		{"http://[::1]", "http://[::1]", "http://[::1]", []string{"[::1]:80"}},
		{"http:///api", "http:///api", "http:///api", nil},
	} {
		base, where, addrs := httpTarget(c.raw)
		if base != c.base || where != c.where || !slices.Equal(addrs, c.addrs) {
			t.Errorf("httpTarget(%q) = %q, %q, %q; want %q, %q, %q", c.raw, base, where, addrs, c.base, c.where, c.addrs)
		}
	}
}
