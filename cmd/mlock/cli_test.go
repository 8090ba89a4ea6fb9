package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/cmd/mlock/internal/bench"
	"github.com/mlock-dev/mlock/internal/auth"
	"github.com/mlock-dev/mlock/internal/proctest"
	"github.com/mlock-dev/mlock/server"
	"github.com/mlock-dev/mlock/server/servertest"
)

// runMlock runs the mlock command and returns its output and exit status:
// "mlock run" as a child process (it runs a command, forwards signals and
// exits with the command), every other command in this process through
// cli, what main runs before os.Exit (TestMainExitsWithTheCode checks that
// path): a child process of the race-enabled test binary costs the loaded
// machine far more than the command itself.
func runMlock(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	if len(args) > 0 && args[0] == "run" {
		return runMlockProcess(t, args...)
	}
	code = cli(withBusyTimeout(args), &out, &errb)
	return out.String(), errb.String(), code
}

// busyTimeout is the --timeout withBusyTimeout gives the commands that
// wait for a server's answer: their default, 5 s, is short for a
// race-enabled server in the test process on a busy machine.
const busyTimeout = "30s"

// withBusyTimeout returns args with --timeout busyTimeout put right after
// the command's name, for the commands that take it (ping, version, status,
// locks, evict, top, cluster status|join|remove). A --timeout of the test's
// own comes later and wins (flag keeps the last value): the tests of short
// timeouts give theirs.
func withBusyTimeout(args []string) []string {
	n := 0
	switch {
	case len(args) >= 1 && (args[0] == "ping" || args[0] == "version" || args[0] == "status" || args[0] == "locks" ||
		args[0] == "evict" || args[0] == "top"):
		n = 1
	case len(args) >= 2 && args[0] == "cluster" && (args[1] == "status" || args[1] == "join" || args[1] == "remove"):
		n = 2
	default:
		return args
	}
	return append(append(append([]string(nil), args[:n]...), "--timeout", busyTimeout), args[n:]...)
}

// runMlockProcess runs the mlock command as a child process and returns
// its output and exit status.
func runMlockProcess(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := mlockCmd(args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	code = exitCodeOf(t, cmd.Run())
	return out.String(), errb.String(), code
}

// The process exits with cli's status, and writes where cli writes: help
// on stdout, usage errors on stderr.
func TestMainExitsWithTheCode(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args   []string
		code   int
		stdout string // a prefix
		stderr string // a prefix
	}{
		{[]string{"--help"}, exitOK, "Usage:", ""},
		{nil, exitUsage, "", "Usage:"},
		{[]string{"status", "--no-such-flag"}, exitUsage, "", "mlock status: flag provided but not defined: -no-such-flag\n"},
		{[]string{"ping", "--uri", "mlock://" + refusedAddr(t), "--timeout", "2s"}, exitError, "", "mlock ping: "},
	} {
		stdout, stderr, code := runMlockProcess(t, c.args...)
		if code != c.code || !strings.HasPrefix(stdout, c.stdout) || !strings.HasPrefix(stderr, c.stderr) ||
			(c.stdout == "" && stdout != "") || (c.stderr == "" && stderr != "") {
			t.Errorf("mlock %v: exit %d, stdout %q, stderr %q; want exit %d, stdout %q..., stderr %q...",
				c.args, code, stdout, stderr, c.code, c.stdout, c.stderr)
		}
	}
}

// refusedAddr is a loopback address where nothing listens.
func refusedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// --help on every command prints the help on stdout and exits 0; a bad
// flag prints one line and a pointer to --help on stderr, and exits 2.
func TestHelpAndUsageErrors(t *testing.T) {
	t.Parallel()
	for _, cmd := range []string{"run", "status", "ping", "locks", "bench", "evict", "token", "version"} {
		for _, h := range []string{"--help", "-h"} {
			stdout, stderr, code := runMlock(t, cmd, h)
			if code != 0 || stderr != "" || !strings.HasPrefix(stdout, "Usage: mlock "+cmd) {
				t.Errorf("mlock %s %s: exit %d, stderr %q, stdout %q", cmd, h, code, stderr, stdout)
			}
		}
		stdout, stderr, code := runMlock(t, cmd, "--no-such-flag")
		want := "mlock " + cmd + ": flag provided but not defined: -no-such-flag\nRun 'mlock " + cmd + " --help' for usage.\n"
		if code != exitUsage || stderr != want || stdout != "" {
			t.Errorf("mlock %s --no-such-flag: exit %d, stdout %q, stderr %q", cmd, code, stdout, stderr)
		}
	}
	for _, args := range [][]string{{"--help"}, {"help"}, {"-h"}} {
		stdout, stderr, code := runMlock(t, args...)
		if code != 0 || stderr != "" || !strings.HasPrefix(stdout, "Usage:") {
			t.Errorf("mlock %v: exit %d, stderr %q", args, code, stderr)
		}
	}
	if stdout, _, code := runMlock(t, "help", "run"); code != 0 || !strings.HasPrefix(stdout, "Usage: mlock run") {
		t.Errorf("mlock help run: exit %d: %s", code, stdout)
	}
	if _, stderr, code := runMlock(t); code != exitUsage || !strings.HasPrefix(stderr, "Usage:") {
		t.Errorf("mlock: exit %d, stderr %q", code, stderr)
	}
	// A bad value is a usage error too.
	if _, stderr, code := runMlock(t, "run", "--ttl", "soon", "x", "--", "true"); code != exitUsage ||
		!strings.HasPrefix(stderr, `mlock run: invalid value "soon" for flag -ttl`) || strings.Count(stderr, "\n") != 2 {
		t.Errorf("run --ttl soon: exit %d, stderr %q", code, stderr)
	}
}

// Each command's help says what its --uri accepts: run and bench any lock
// provider, the others an mlock server.
func TestURIHelpPerCommand(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cmd       string
		providers bool
	}{{"run", true}, {"bench", true}, {"status", false}, {"ping", false}, {"locks", false}, {"evict", false}, {"version", false}} {
		stdout, _, _ := runMlock(t, c.cmd, "--help")
		i := strings.Index(stdout, "-uri string")
		if i < 0 {
			t.Fatalf("%s: no --uri in\n%s", c.cmd, stdout)
		}
		line := stdout[i:]
		line = line[:strings.Index(line, "(default")]
		if !strings.Contains(line, "mlock://") || !strings.Contains(line, "mlocks://") ||
			strings.Contains(line, "redis://") != c.providers || strings.Contains(line, "memory:") != c.providers {
			t.Errorf("%s: --uri help %q", c.cmd, line)
		}
	}
}

// --skip-if-locked --quiet prints nothing and exits --skip-exit; without
// --quiet the skip is told in one line.
func TestRunSkipQuiet(t *testing.T) {
	t.Parallel()
	uri := startServer(t)
	_, l := holder(t, uri, "cron:job", "other")
	defer l.Unlock(context.Background())
	marker := filepath.Join(t.TempDir(), "ran")
	stdout, stderr, code := runMlock(t, "run", "--uri", uri, "--skip-if-locked", "--quiet", "cron:job", "--", "touch", marker)
	if code != 0 || stdout != "" || stderr != "" {
		t.Fatalf("quiet skip: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	stdout, stderr, code = runMlock(t, "run", "--uri", uri, "--skip-if-locked", "--quiet", "--skip-exit", "99", "cron:job", "--", "touch", marker)
	if code != 99 || stdout != "" || stderr != "" {
		t.Fatalf("quiet skip, --skip-exit 99: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	_, stderr, code = runMlock(t, "run", "--uri", uri, "--skip-if-locked", "cron:job", "--", "touch", marker)
	if code != 0 || stderr != "mlock run: cron:job is locked: not running the command\n" {
		t.Fatalf("skip: exit %d, stderr %q", code, stderr)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the command ran")
	}
	// Errors still show with --quiet.
	_, stderr, code = runMlock(t, "run", "--uri", uri, "--skip-if-locked", "--quiet", "cron:job2", "--", filepath.Join(t.TempDir(), "nope"))
	if code != exitNotFound || !strings.Contains(stderr, "command not found") {
		t.Fatalf("quiet, command not found: exit %d, stderr %q", code, stderr)
	}
	if _, _, code := runMlock(t, "run", "--quiet", "--verbose", "x", "--", "true"); code != exitUsage {
		t.Fatalf("--quiet --verbose: exit %d", code)
	}
	if _, _, code := runMlock(t, "run", "--skip-if-locked", "--skip-exit", "256", "x", "--", "true"); code != exitUsage {
		t.Fatalf("--skip-exit 256: exit %d", code)
	}
}

// --verbose tells that the run waits, its place in the queue and who
// holds the lock, and when it got the lock.
func TestRunVerbose(t *testing.T) {
	t.Parallel()
	uri := startServer(t)
	_, l := holder(t, uri, "v:a", "the-holder")
	cmd := mlockCmd("run", "--uri", uri, "--verbose", "v:a|v:b", "--", "true")
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	const place = "mlock run: waiting for v:a|v:b: 1 ahead in v:a's queue (held by the-holder)"
	// The run is this test binary started as mlock: on a busy machine it
	// takes seconds to start.
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(stderr.String(), place); {
		if time.Now().After(deadline) {
			t.Fatalf("no place in the queue told:\n%s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond) // poll interval
	}
	l.Unlock(context.Background())
	if code := exitCodeOf(t, cmd.Wait()); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	lines := strings.Split(strings.TrimSuffix(stderr.String(), "\n"), "\n")
	got := regexp.MustCompile(`^mlock run: got v:a\|v:b at \d\d:\d\d:\d\d\.\d{3} after [0-9.]+m?s \(token \d+\); running the command$`)
	if len(lines) != 3 || lines[0] != "mlock run: waiting for v:a|v:b" || lines[1] != place || !got.MatchString(lines[2]) {
		t.Fatalf("stderr:\n%s", stderr.String())
	}
	// Without --verbose (and stderr not a terminal) nothing is said.
	_, stderr2, code := runMlock(t, "run", "--uri", uri, "v:a", "--", "true")
	if code != 0 || stderr2 != "" {
		t.Fatalf("exit %d, stderr %q", code, stderr2)
	}
	// A provider without queues tells the wait and the grant.
	_, stderr2, code = runMlock(t, "run", "--uri", "memory:", "--verbose", "m", "--", "true")
	if code != 0 || !strings.HasPrefix(stderr2, "mlock run: got m at ") {
		t.Fatalf("memory: exit %d, stderr %q", code, stderr2)
	}
}

// On a terminal, mlock run tells its progress without --verbose (not with
// --quiet), and bench shows a progress line.
func TestTerminalProgress(t *testing.T) {
	t.Parallel()
	script, err := exec.LookPath("script")
	if err != nil {
		t.Skip("needs script(1) for a terminal")
	}
	uri := startServer(t)
	inTerminal := func(args ...string) string {
		t.Helper()
		line := "exec " + shellQuote(os.Args[0])
		for _, a := range args {
			line += " " + shellQuote(a)
		}
		cmd := exec.Command(script, "-qec", line, "/dev/null")
		cmd.Env = append(os.Environ(), "MLOCK_TEST_MAIN=1")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
		return strings.ReplaceAll(string(out), "\r", "")
	}
	if out := inTerminal("run", "--uri", uri, "tty", "--", "true"); !strings.Contains(out, "mlock run: got tty at ") {
		t.Fatalf("run on a terminal: %q", out)
	}
	if out := inTerminal("run", "--uri", uri, "--quiet", "tty", "--", "true"); strings.Contains(out, "mlock run:") {
		t.Fatalf("run --quiet on a terminal: %q", out)
	}
	out := inTerminal("bench", "--duration", "1200ms", "--workers", "2", "memory:")
	if !regexp.MustCompile(`memory:  \d+ ops in [0-9.]+m?s \(\d+/s\)`).MatchString(out) || strings.Contains(out, "memory::") {
		t.Fatalf("bench progress on a terminal: %q", out)
	}
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// ping fails at once, naming the cause, when nothing listens; --timeout
// bounds the wait for a server that does not answer.
func TestPingRefusedAndTimeout(t *testing.T) {
	t.Parallel()
	addr := refusedAddr(t)
	start := time.Now()
	stdout, stderr, code := runMlock(t, "ping", "--uri", "mlock://"+addr)
	if code != exitError || stdout != "" || stderr != "mlock ping: server unreachable: "+addr+": connection refused\n" {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("a refused ping took %v", d)
	}
	// run fails as fast, with the same line.
	_, stderr, code = runMlock(t, "run", "--uri", "mlock://"+addr, "x", "--", "true")
	if code != exitError || stderr != "mlock run: server unreachable: "+addr+": connection refused\n" {
		t.Fatalf("run: exit %d, stderr %q", code, stderr)
	}
	// So do the Redis and etcd providers, also with a --timeout shorter than
	// their clients' own retries: unreachable (125) in one line, not a lock
	// not taken in time (124), and nothing from the clients' own logs.
	for _, uri := range []string{"redis://" + addr + "/0", "etcd://" + addr} {
		_, stderr, code = runMlock(t, "run", "--uri", uri, "--timeout", "300ms", "x", "--", "true")
		if code != exitError || stderr != "mlock run: server unreachable: "+addr+": connection refused\n" {
			t.Fatalf("run --uri %s: exit %d, stderr %q", uri, code, stderr)
		}
	}
	// bench says so too, rather than blaming the CPU probe.
	for _, uri := range []string{"mlock://" + addr, "redis://" + addr + "/0", "etcd://" + addr} {
		_, stderr, code = runMlock(t, "bench", "--duration", "100ms", uri)
		if code != exitError || !strings.Contains(stderr, "server unreachable") || !strings.Contains(stderr, "connection refused") {
			t.Fatalf("bench %s: exit %d, stderr %q", uri, code, stderr)
		}
	}
	// A server that accepts and never answers.
	silent := silentServer(t)
	start = time.Now()
	_, stderr, code = runMlock(t, "ping", "--uri", "mlock://"+silent, "--timeout", "400ms")
	d := time.Since(start)
	if code != exitError || !strings.HasPrefix(stderr, "mlock ping: ") || strings.Count(stderr, "\n") != 1 ||
		strings.Contains(stderr, "mlock: ") {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	if d > 3*time.Second {
		t.Fatalf("ping --timeout 400ms took %v", d)
	}
	if _, _, code := runMlock(t, "ping", "--timeout", "0s"); code != exitUsage {
		t.Fatalf("--timeout 0: exit %d", code)
	}
}

// --version prints this command's version; "mlock version" the server's
// too.
func TestVersion(t *testing.T) {
	t.Parallel()
	stdout, stderr, code := runMlock(t, "--version")
	if code != 0 || stderr != "" || !strings.HasPrefix(stdout, "mlock "+mlock.Version+" (go") {
		t.Fatalf("--version: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	uri := startServer(t)
	stdout, stderr, code = runMlock(t, "version", "--uri", uri)
	want := "server: mlockd " + mlock.Version + " at " + uri + "\n"
	if code != 0 || stderr != "" || !strings.HasPrefix(stdout, "client: mlock "+mlock.Version+" (go") || !strings.HasSuffix(stdout, want) {
		t.Fatalf("version: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	addr := refusedAddr(t)
	stdout, stderr, code = runMlock(t, "version", "--uri", "mlock://"+addr)
	if code != exitError || !strings.HasPrefix(stdout, "client: mlock ") ||
		stderr != "mlock version: server unreachable: "+addr+": connection refused\n" {
		t.Fatalf("version of nothing: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

// Errors are one line, without "mlock: mlock:".
func TestErrorsAreOneLine(t *testing.T) {
	t.Parallel()
	uri := startServer(t)
	_, l := holder(t, uri, "busy", "")
	defer l.Unlock(context.Background())
	for _, args := range [][]string{
		{"run", "--uri", uri, "--timeout", "50ms", "busy", "--", "true"},
		{"run", "--uri", uri, "--tolerate", "1", "--timeout", "50ms", "busy", "--", "true"},
		{"evict", "--uri", uri, "bad name"},
		{"locks", "--uri", uri, "bad prefix"},
		{"status", "--uri", "redis://127.0.0.1:1"},
	} {
		_, stderr, code := runMlock(t, args...)
		if code == 0 || strings.Count(stderr, "\n") != 1 || strings.Contains(stderr, "mlock: mlock") ||
			strings.Contains(stderr, ": mlock: ") {
			t.Errorf("%q: exit %d, stderr %q", args, code, stderr)
		}
	}
}

func TestHuman(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		d    time.Duration
		want string
	}{
		{72749 * time.Microsecond, "72.7ms"}, {950, "950ns"}, {812 * time.Microsecond, "812µs"},
		{1500, "1.5µs"}, {1234 * time.Millisecond, "1.23s"}, {2 * time.Second, "2s"}, {0, "0ns"},
		{100 * time.Millisecond, "100ms"}, {9999 * time.Microsecond, "10ms"}, {999600 * time.Nanosecond, "1ms"},
		{999499 * time.Microsecond, "999ms"}, {999500 * time.Microsecond, "1s"},
	} {
		if got := human(c.d); got != c.want {
			t.Errorf("human(%v) = %q, want %q", c.d, got, c.want)
		}
	}
	if got := progressLine("memory:", 792, 1200*time.Millisecond); got != "memory:  792 ops in 1.2s (660/s)" {
		t.Errorf("progress line %q", got)
	}
}

// bench's tables fit 100 columns and print latencies in human units.
func TestBenchTables(t *testing.T) {
	t.Parallel()
	uri := startServer(t)
	// A count, not a short duration, ends the run: a busy machine may
	// complete nothing in 400 ms.
	stdout, stderr, code := runMlock(t, "bench", "--scenario", "hotkey", "--workers", "4", "--duration", "30s", "--count", "200", uri, "--vs", "memory:")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, line := range strings.Split(stdout, "\n") {
		if n := utf8.RuneCountInString(line); n > 100 {
			t.Errorf("%d columns: %q", n, line)
		}
	}
	for _, want := range []string{"HANDOFF P50", "JAIN", "VIOLATIONS", "SRV CPU/OP"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("no %s in\n%s", want, stdout)
		}
	}
	if !regexp.MustCompile(`\d(\.\d+)?(ns|µs|ms|s)\s`).MatchString(stdout) || regexp.MustCompile(`\d{4,}µs`).MatchString(stdout) {
		t.Errorf("latencies not in human units:\n%s", stdout)
	}
	// The same with a long target name (results made up).
	var b bytes.Buffer
	r := bench.Result{Target: "redis://127.0.0.1:6379/0", Scenario: "hotkey", Workers: 8, Ops: 1234567, Rate: 246913,
		P50: 72749 * time.Microsecond, P99: 812 * time.Millisecond, Max: 3 * time.Second, HandoffP50: 40 * time.Microsecond,
		HandoffP99: 1200 * time.Microsecond, Jain: 0.999, FIFO: 1, Timeouts: 12345, Errors: 12, CPUKnown: true,
		CPUPerOp: 15 * time.Microsecond, ClientCPUKnown: true, ClientCPUPerOp: 22 * time.Microsecond}
	r2 := r
	r2.Target = "mlock://127.0.0.1:12340"
	printResults(&b, []bench.Result{r2, r})
	for _, line := range strings.Split(b.String(), "\n") {
		if n := utf8.RuneCountInString(line); n > 100 {
			t.Errorf("%d columns: %q", n, line)
		}
	}
	if !strings.Contains(b.String(), "72.7ms") {
		t.Errorf("no 72.7ms in\n%s", b.String())
	}
}

// syncBuffer is a buffer safe for a process's writer and the test.
type syncBuffer = proctest.Buffer

// A lock released elsewhere is told apart from an expired one.
func TestLossText(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		want string
	}{
		{&mlock.Error{Type: mlock.TypeLost, Msg: "lock released by its owner", Err: mlock.ErrReleased},
			"released by its owner elsewhere (a release by owner, or an unlock by another holder of the same owner, such as a run with the same --owner)"},
		{&mlock.Error{Type: mlock.TypeLost, Msg: "lock evicted by an administrator", Err: mlock.ErrReleased},
			"evicted by an administrator"},
		{&mlock.Error{Type: mlock.TypeLost, Msg: "lock expired", Err: mlock.ErrExpired}, "expired"},
		{&mlock.Error{Type: mlock.TypeLost, Msg: "lease ran out without word from the server", Err: mlock.ErrExpired},
			"expired: lease ran out without word from the server"},
		{&mlock.Error{Type: mlock.TypeLost, Msg: "lock expired, or released by its owner", Err: mlock.ErrExpired},
			"expired, or released by its owner elsewhere (the server does not say which)"},
		{&mlock.Error{Type: mlock.TypeLost, Msg: "server shutting down", Err: mlock.ErrSessionLost},
			"the server is shutting down (it ends every lock it holds)"},
		{&mlock.Error{Type: mlock.TypeLost, Msg: "session lost", Err: mlock.ErrSessionLost}, "the session was lost"},
	} {
		if got := lossText(c.err); got != c.want {
			t.Errorf("lossText(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}

// mlock cluster: its help, usage errors, and a single server, which is no
// cluster node (status lists it as such and exits 125; join and remove get
// the server's refusal). A real cluster is exercised in internal/faulttest.
func TestClusterCommand(t *testing.T) {
	t.Parallel()
	if stdout, stderr, code := runMlock(t, "cluster", "--help"); code != 0 || stderr != "" || !strings.HasPrefix(stdout, "Usage:\n  mlock cluster status") {
		t.Errorf("cluster --help: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	for _, args := range [][]string{{"cluster"}, {"cluster", "grow"}, {"cluster", "join", "a"}, {"cluster", "remove"}, {"cluster", "status", "x"}} {
		if _, stderr, code := runMlock(t, args...); code != exitUsage || strings.Count(stderr, "\n") != 2 {
			t.Errorf("%v: exit %d, stderr %q", args, code, stderr)
		}
	}
	uri := startServer(t)
	stdout, stderr, code := runMlock(t, "cluster", "status", "--uri", uri)
	if code != exitError || !strings.Contains(stdout, "not a cluster node") || !strings.Contains(stdout, "no leader known") ||
		stderr != "mlock cluster status: no leader known\n" {
		t.Errorf("cluster status of a single server: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	_, stderr, code = runMlock(t, "cluster", "remove", "--uri", uri, "b")
	if code != exitError || stderr != "mlock cluster remove: request error: not a cluster node!\n" {
		t.Errorf("cluster remove on a single server: exit %d, stderr %q", code, stderr)
	}
}

// TestURITokenNotShown: the token of --uri (or of $MLOCK_URI, its default)
// is a secret: neither the help nor the output of the inspection commands
// or of bench shows it.
func TestURITokenNotShown(t *testing.T) {
	t.Parallel()
	token := auth.NewToken()
	line, err := auth.Line("orders", token, "admin")
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "auth")
	if err := os.WriteFile(file, []byte(line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, _ := servertest.Start(t, server.Config{AuthFile: file, StatusRate: -1}, "")
	uri := "mlock://orders:" + token + "@" + addr
	check := func(what, out string) {
		t.Helper()
		if strings.Contains(out, token) {
			t.Errorf("%s shows the token:\n%s", what, out)
		}
	}
	for _, args := range [][]string{{"ping"}, {"version"}, {"status"}, {"bench", "--duration", "30s", "--count", "50", "--workers", "1"}} {
		stdout, stderr, code := runMlock(t, append(args, "--uri", uri)...)
		if code != 0 {
			t.Errorf("%s: exit %d, stderr %q", args[0], code, stderr)
		}
		check(args[0], stdout+stderr)
	}
	// A URI that does not parse: the error does not quote it.
	bad := "mlock://orders:" + token + "%zz@" + addr
	for _, args := range [][]string{{"run", "--uri", bad, "r", "--", "true"}, {"bench", "--uri", bad}, {"ping", "--uri", bad}} {
		stdout, stderr, code := runMlock(t, args...)
		if code == 0 {
			t.Errorf("%s with a malformed URI: exit 0", args[0])
		}
		check(args[0]+" with a malformed URI", stdout+stderr)
	}
	cmd := mlockCmd("ping", "--help")
	cmd.Env = append(cmd.Env, "MLOCK_URI="+uri)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("ping --help: %v", err)
	}
	check("ping --help", string(out))
}

// mlock token prints the token and the auth-file line on stdout, and the
// reminder that the token is shown once on stderr (docs/security.md): the
// line, put in an auth file, lets the token in.
func TestToken(t *testing.T) {
	t.Parallel()
	stdout, stderr, code := runMlock(t, "token", "orders", "prefix=order:", "prefix=product:")
	if code != 0 || stderr != "(give it to the client; it is shown once)\n" {
		t.Fatalf("mlock token: exit %d, stderr %q", code, stderr)
	}
	lines := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "token: ") ||
		!regexp.MustCompile(`^orders sha256:[0-9a-f]{64} prefix=order: prefix=product:$`).MatchString(lines[1]) {
		t.Fatalf("mlock token: stdout %q, want the token and the auth-file line", stdout)
	}
	token := strings.TrimPrefix(lines[0], "token: ")
	file := filepath.Join(t.TempDir(), "auth")
	if err := os.WriteFile(file, []byte(lines[1]+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, _ := servertest.Start(t, server.Config{AuthFile: file}, "")
	if _, stderr, code := runMlock(t, "ping", "--uri", "mlock://orders:"+token+"@"+addr); code != 0 {
		t.Fatalf("ping with the new token: exit %d, stderr %q", code, stderr)
	}
	if _, stderr, code := runMlock(t, "ping", "--uri", "mlock://orders:"+token+"x@"+addr); code == 0 {
		t.Fatalf("ping with a wrong token: exit 0, stderr %q", stderr)
	}
	if stdout, _, code := runMlock(t, "token", "orders"); code != exitUsage || stdout != "" {
		t.Fatalf("mlock token without a right: exit %d, stdout %q", code, stdout)
	}
}
