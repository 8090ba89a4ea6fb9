package mlock_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/internal/proctest"
	"github.com/mlock-dev/mlock/server"
)

// readmeBlock returns the first fenced block of lang in section (a line
// "## ..." of README.md) of the README at root.
func readmeBlock(t *testing.T, root, section, lang string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "\n"+section+"\n")
	if i < 0 {
		t.Fatalf("README.md has no section %q", section)
	}
	s = s[i+len(section)+2:]
	if j := strings.Index(s, "\n## "); j >= 0 {
		s = s[:j]
	}
	open := "```" + lang + "\n"
	i = strings.Index(s, open)
	if i < 0 {
		t.Fatalf("README.md's section %q has no %s block", section, open)
	}
	s = s[i+len(open):]
	j := strings.Index(s, "```\n")
	if j < 0 {
		t.Fatalf("README.md's section %q: its %s block does not end", section, lang)
	}
	return s[:j]
}

// TestReadmeGoQuickStart runs README.md's "Quick start in Go" as written,
// as the body of a func(ctx context.Context) error in a program of its own
// (built by go run, against this module), with deduct a function that
// reports it ran. What the test changes, and only that: the server's
// address (the README's localhost:12340 becomes a test server's).
//
// The program must return nil, run deduct, and never wait out a lease of
// its own: the server counts no expiry and no timeout (the example once
// queued its Do behind its own lock until that lock's ttl ended, 5 s, then
// unlocked an expired lock), every lock it took is unlocked, and the run
// took less than the example's ttl (5 s).
func TestReadmeGoQuickStart(t *testing.T) {
	t.Parallel()
	root := proctest.ModuleRoot(t)
	code := readmeBlock(t, root, "## Quick start in Go", "go")
	uri := regexp.MustCompile(`mlock://localhost:12340\?([^"]*)`)
	if len(uri.FindAllString(code, -1)) != 1 {
		t.Fatalf("the quick start names mlock://localhost:12340 once: the test rewrites its address\n%s", code)
	}
	addr, _ := startServer(t, server.Config{QuietPeriod: -1}, "")
	code = uri.ReplaceAllString(code, "mlock://"+addr+"?$1")
	var body strings.Builder
	for line := range strings.SplitSeq(strings.TrimSuffix(code, "\n"), "\n") {
		if line != "" {
			body.WriteString("\t")
		}
		body.WriteString(line + "\n")
	}
	prog := `package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/mlock-dev/mlock"
)

var deducted int

// deduct stands for the README's work.
func deduct(ctx context.Context) error {
	deducted++
	return ctx.Err()
}

// quickStart is README.md's quick start, as written.
func quickStart(ctx context.Context) error {
` + body.String() + `}

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := quickStart(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "quick start:", err)
		os.Exit(1)
	}
	fmt.Println("deducted", deducted)
	_ = mlock.Version
}
`
	// Inside the module (so that it builds against this checkout), in the
	// directory git ignores for the tests' programs.
	base := filepath.Join(root, ".testbin", mlock.Version)
	if err := os.MkdirAll(base, 0o755); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(base, "readme-go-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(prog), 0o644); err != nil {
		t.Fatal(err)
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go is needed to build the README's program: %v", err)
	}
	rel, err := filepath.Rel(root, dir)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "quickstart")
	// -trimpath, as internal/proctest builds the programs the other tests
	// start: the same compiled packages (the standard library's too), from
	// go's cache, rather than a second compilation of them on a fresh cache.
	build := exec.Command(goBin, "build", "-trimpath", "-o", bin, "./"+filepath.ToSlash(rel))
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("the README's quick start does not build as written: %v\n%s\nthe program:\n%s", err, out, prog)
	}
	start := time.Now()
	out, err := exec.Command(bin).CombinedOutput()
	took := time.Since(start)
	if err != nil || string(out) != "deducted 1\n" {
		t.Fatalf("the README's quick start: %v, output %q; want deducted 1", err, out)
	}
	c, err := mlock.New("mlock://" + addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st, err := c.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.LockedCount != 2 || st.FinishedCount != 2 || st.ExpiredCount != 0 || st.TimeoutCount != 0 || st.CurrentLocks != 0 {
		t.Errorf("after the quick start: %d granted, %d unlocked, %d expired, %d timed out, %d live; want 2, 2, 0, 0, 0",
			st.LockedCount, st.FinishedCount, st.ExpiredCount, st.TimeoutCount, st.CurrentLocks)
	}
	if took >= 5*time.Second {
		t.Errorf("the quick start took %v: it waited for its own lease (ttl 5 s)", took)
	}
	t.Logf("the quick start ran in %v", took.Round(time.Millisecond))
}
