//go:build unix

package jstest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/internal/pgtest"
	"github.com/mlock-dev/mlock/internal/proctest"

	"github.com/mlock-dev/mlock/internal/testenv"
)

// TestNodePackages runs the tests of js/package.json's test script
// against an mlockd built from this repository (MLOCKD_BIN): the client
// against real servers (single node, restarts, a cut connection, a 3-node cluster) and the Medusa provider in
// the real @medusajs/locking module, with @medusajs/locking-redis alongside
// when REDIS_URL is set (the differential suite: the same scenarios through
// both, side by side), and the fenced writes on a private PostgreSQL
// (internal/pgtest) named in MLOCK_TEST_PG_URL. Without node, npm or js/node_modules (npm ci in js/)
// it skips, except under CI=true, where they, and a missing REDIS_URL, fail
// it.
func TestNodePackages(t *testing.T) {
	t.Parallel() // beside TestReadmeSnippets: both mostly wait on node and their servers
	if testing.Short() {
		t.Skip("-short: skipping the Node.js packages' tests")
	}
	js, err := filepath.Abs(filepath.Join("..", "..", "js"))
	if err != nil {
		t.Fatal(err)
	}
	const why = "the Node.js packages' tests need it"
	testenv.LookPath(t, why, "node")
	testenv.LookPath(t, why, "npm")
	if _, err := os.Stat(filepath.Join(js, "node_modules")); err != nil {
		testenv.Missing(t, "js/node_modules missing (run npm ci in js/)", why)
	}

	// The differential suite runs @medusajs/locking-redis on a real Redis:
	// required in CI, like Node itself.
	if os.Getenv("REDIS_URL") == "" && testenv.Strict() {
		t.Fatal("REDIS_URL is not set: the differential suite (locking-redis against locking-mlock) is required in CI")
	}

	// The fence suite's PostgreSQL: required in CI, like Node itself;
	// without it that suite skips.
	var pgURL string
	if pgtest.Found() || testenv.Strict() {
		pgURL = pgtest.Start(t, "the Node.js fence suite needs it").URL
	}

	// The programs and the TypeScript build are independent: built side
	// by side.
	script, err := readTestScript(js)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	var bins []string
	built := make(chan error, 1)
	go func() {
		var err error
		bins, err = programs.Build()
		built <- err
	}()
	env := nodeEnv(js)
	if err := jsBuild.do(js, script.build); err != nil {
		<-built
		t.Fatal(err)
	}
	if err := <-built; err != nil {
		t.Fatal(err)
	}
	env = append(env, "MLOCKD_BIN="+bins[0], "MLOCK_CLI="+bins[1], "MLOCK_TEST_PG_URL="+pgURL)

	// Each test file in its own node process, every file at once (npm test
	// runs them one after the other; go test's -parallel would run only
	// GOMAXPROCS of them, and they mostly wait): every suite starts its own
	// servers on free ports, and only the differential suite uses Redis.
	type run struct {
		out []byte
		err error
	}
	runs := make([]chan run, len(script.files))
	for i, file := range script.files {
		runs[i] = make(chan run, 1)
		go func() {
			out, err := runGroup(ctx, js, env, "node", append(append([]string{"--test"}, fileTimeout(script.flags, fileLimit)...), file)...)
			runs[i] <- run{out, err}
		}()
	}
	for i, file := range script.files {
		r := <-runs[i] // waited for even if a subtest before failed: no process outlives the test
		t.Run(filepath.Base(file), func(t *testing.T) {
			if ctx.Err() != nil {
				t.Fatalf("node --test %s did not finish within the time allowed\n%s", file, r.out)
			}
			if r.err != nil {
				t.Fatalf("node --test %s: %v\n%s", file, r.err, r.out)
			}
			t.Logf("%s", r.out)
		})
	}
}

// fileLimit is the --test-timeout of a test file run here: node --test
// applies it to the file's whole run as well as to each test, and the
// script's (60 s, for npm test on a developer's machine) is a speed a
// busy machine does not keep (medusa-faults.test.js, 43 s alone, ran out of
// it beside the other files). Minutes still end a test that hangs, well
// within the 8 minutes of TestNodePackages.
const fileLimit = 5 * time.Minute

// fileTimeout returns flags with --test-timeout set to d.
func fileTimeout(flags []string, d time.Duration) []string {
	var out []string
	for _, f := range flags {
		if !strings.HasPrefix(f, "--test-timeout") {
			out = append(out, f)
		}
	}
	return append(out, "--test-timeout="+strconv.FormatInt(d.Milliseconds(), 10))
}

// programs are the server and the command line the Node.js tests run (see
// proctest.Programs).
var programs = proctest.NewPrograms("./cmd/mlockd", "./cmd/mlock")

// nodeEnv is the environment of the test script's steps: node_modules/.bin
// of js first on PATH, no colours.
func nodeEnv(js string) []string {
	return append(os.Environ(), "NO_COLOR=1", "PATH="+filepath.Join(js, "node_modules", ".bin")+string(os.PathListSeparator)+os.Getenv("PATH"))
}

// jsBuild runs the test script's build steps (tsc -b of the packages and
// the tests) once for the package's tests, which run side by side: the
// README's snippets import the packages' dist, which the build writes.
var jsBuild buildOnce

// buildOnce runs build steps once; every caller gets the first run's
// error.
type buildOnce struct {
	once sync.Once
	err  error
}

// do runs steps in js, one after the other, on its first call (at most 5
// minutes) and returns their error: the failed step and its output.
func (b *buildOnce) do(js string, steps []string) error {
	b.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		for _, step := range steps {
			if out, err := runGroup(ctx, js, nodeEnv(js), "sh", "-c", step); err != nil {
				b.err = fmt.Errorf("%s: %v\n%s", step, err, out)
				return
			}
		}
	})
	return b.err
}

// testScript is js/package.json's test script: "tsc -b PROJECTS... && node
// --test [flags] FILES..." (any number of build steps before node), read so
// that the script stays the one list of the build steps, node's flags and
// the test files.
type testScript struct {
	build []string // the steps before node, each a shell command
	flags []string // node's flags (--test-concurrency left out: one file per process)
	files []string
}

// readTestScript reads and splits js/package.json's test script.
func readTestScript(js string) (testScript, error) {
	b, err := os.ReadFile(filepath.Join(js, "package.json"))
	if err != nil {
		return testScript{}, err
	}
	var pkg struct {
		Scripts map[string]string `json:"scripts"`
	}
	if err := json.Unmarshal(b, &pkg); err != nil {
		return testScript{}, fmt.Errorf("js/package.json: %v", err)
	}
	return parseTestScript(pkg.Scripts["test"])
}

// parseTestScript splits a test script "STEP && ... && node --test [flags]
// FILES...".
func parseTestScript(script string) (testScript, error) {
	steps := strings.Split(script, " && ")
	last := strings.Fields(steps[len(steps)-1])
	if len(last) < 3 || last[0] != "node" || last[1] != "--test" {
		return testScript{}, fmt.Errorf("js/package.json: the test script %q does not end in node --test FILES", script)
	}
	sc := testScript{build: steps[:len(steps)-1]}
	for _, w := range last[2:] {
		switch {
		case strings.HasPrefix(w, "--test-concurrency"):
		case strings.HasPrefix(w, "-"):
			sc.flags = append(sc.flags, w)
		default:
			sc.files = append(sc.files, w)
		}
	}
	if len(sc.files) == 0 {
		return testScript{}, fmt.Errorf("js/package.json: the test script names no test file")
	}
	return sc, nil
}

// runGroup runs name with args in dir and returns its output. The process
// and those it starts (node's servers) share a process group: a timeout
// ends them all, by the group of the PID started here.
func runGroup(ctx context.Context, dir string, env []string, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir, cmd.Env = dir, env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.Bytes(), err
}

func TestParseTestScript(t *testing.T) {
	for _, c := range []struct {
		script string
		want   testScript
		err    bool
	}{
		{"npm run build && tsc -p test && node --test --test-concurrency=1 --test-timeout=60000 a.js b.js",
			testScript{build: []string{"npm run build", "tsc -p test"}, flags: []string{"--test-timeout=60000"}, files: []string{"a.js", "b.js"}}, false},
		{"node --test a.js", testScript{files: []string{"a.js"}}, false},
		{"", testScript{}, true},
		{"npm test", testScript{}, true},
		{"tsc && node --test --test-timeout=1", testScript{}, true},
	} {
		got, err := parseTestScript(c.script)
		if (err != nil) != c.err || !c.err && fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("parseTestScript(%q) = %+v, %v; want %+v, error %v", c.script, got, err, c.want, c.err)
		}
	}
}

func TestFileTimeout(t *testing.T) {
	for _, c := range []struct{ in, want []string }{
		{nil, []string{"--test-timeout=300000"}},
		{[]string{"--test-timeout=60000"}, []string{"--test-timeout=300000"}},
		{[]string{"--experimental-x", "--test-timeout=1", "--y"}, []string{"--experimental-x", "--y", "--test-timeout=300000"}},
	} {
		if got := fileTimeout(c.in, 5*time.Minute); fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("fileTimeout(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// FuzzParseTestScript: any script is split without a panic, and what it
// returns runs node on files only (a flag is never taken for a file).
func FuzzParseTestScript(f *testing.F) {
	f.Add("npm run build && tsc -p test && node --test --test-concurrency=1 --test-timeout=60000 a.js b.js")
	f.Add("node --test && node --test x")
	f.Fuzz(func(t *testing.T, script string) {
		sc, err := parseTestScript(script)
		if err != nil {
			return
		}
		if len(sc.files) == 0 {
			t.Fatalf("%q: no file and no error", script)
		}
		for _, file := range sc.files {
			if strings.HasPrefix(file, "-") {
				t.Fatalf("%q: flag %q taken for a file", script, file)
			}
		}
	})
}
