package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/internal/proctest"
	"github.com/mlock-dev/mlock/internal/testenv"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/internal/auth"
	"github.com/mlock-dev/mlock/internal/protocol"
	"github.com/mlock-dev/mlock/internal/testcert"
	"github.com/mlock-dev/mlock/server"
)

func TestApplyEnv(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:12340", "")
	grace := fs.Duration("session-grace", time.Second, "")
	limit := fs.Int("max-queue-len", 5, "")
	if err := fs.Parse([]string{"--max-queue-len", "7"}); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"MLOCK_LISTEN": "127.0.0.1:9", "MLOCK_SESSION_GRACE": "30s", "MLOCK_MAX_QUEUE_LEN": "99"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	fromEnv, err := applyEnv(fs, lookup)
	if err != nil {
		t.Fatal(err)
	}
	if fromEnv["listen"] != "MLOCK_LISTEN" || fromEnv["max-queue-len"] != "" {
		t.Fatalf("set from the environment: %v", fromEnv)
	}
	if *listen != "127.0.0.1:9" || *grace != 30*time.Second {
		t.Fatalf("env not applied: %s %v", *listen, *grace)
	}
	if *limit != 7 {
		t.Fatalf("a flag on the command line must win over the environment, got %d", *limit)
	}
	env["MLOCK_SESSION_GRACE"] = "soon"
	fs2 := flag.NewFlagSet("t", flag.ContinueOnError)
	fs2.Duration("session-grace", time.Second, "")
	if _, err := applyEnv(fs2, lookup); err == nil || err.Error() != `MLOCK_SESSION_GRACE="soon": want a duration such as 15s or 1m30s (see --session-grace)` {
		t.Fatalf("a bad environment value must be an error naming the variable and the value: %v", err)
	}
}

func TestRunRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{{"--log-format", "xml"}, {"--log-level", "loud"}, {"extra"}, {"--max-frame", "99999999"},
		{"--quiet-period", "-1s"}, {"--quiet-period", "soon"}, {"--shutdown-wait", "-2s"}} {
		if err := run(args, io.Discard, io.Discard); err == nil {
			t.Errorf("run(%q) succeeded", args)
		}
	}
}

// TestMain lets the test binary run as mlockd for TestSignalShutdown.
func TestMain(m *testing.M) {
	if os.Getenv("MLOCKD_TEST_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	testenv.WaitBound(8) // the runbook tests wait for processes and elections
	os.Exit(m.Run())
}

// mlockd runs this test binary as mlockd with args on a free loopback port
// and waits until it accepts connections. The process is killed when the
// test ends.
func mlockd(t *testing.T, args ...string) (*exec.Cmd, string) {
	t.Helper()
	cmd, addr, _ := mlockdLog(t, args...)
	return cmd, addr
}

// mlockdLog is mlockd that also returns its stderr.
func mlockdLog(t *testing.T, args ...string) (*exec.Cmd, string, *syncBuffer) {
	t.Helper()
	addr := proctest.FreeAddr(t) // never twice in this binary: tests start servers at once
	cmd := exec.Command(os.Args[0], append([]string{"--listen", addr}, args...)...)
	cmd.Env = append(os.Environ(), "MLOCKD_TEST_MAIN=1")
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("mlockd %v stderr:\n%s", args, stderr.String())
		}
	})
	for i := 0; ; i++ {
		nc, err := net.Dial("tcp", addr)
		if err == nil {
			nc.Close()
			break
		}
		if i > 500 {
			t.Fatalf("mlockd did not start: %v\n%s", err, stderr.String())
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
	return cmd, addr, &stderr
}

// syncBuffer is a buffer safe for the process's writer and the test.
type syncBuffer = proctest.Buffer

// client is a raw protocol client.
type client struct {
	t  *testing.T
	nc net.Conn
	r  *bufio.Reader
}

func dial(t *testing.T, addr, sid string) *client {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	c := &client{t: t, nc: nc, r: bufio.NewReader(nc)}
	c.send("connect", sid, "1.0")
	if got := c.read(); !strings.HasPrefix(got, "connected 1.0 new ") {
		t.Fatalf("handshake: %q", got)
	}
	return c
}

func (c *client) send(fields ...string) {
	c.t.Helper()
	if _, err := c.nc.Write(protocol.Append(nil, fields...)); err != nil {
		c.t.Fatal(err)
	}
}

func (c *client) read() string {
	c.t.Helper()
	_ = c.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	p, err := protocol.ReadFrame(c.r, nil, 1<<20)
	if err != nil {
		c.t.Fatalf("reading a frame: %v", err)
	}
	return strings.TrimSuffix(string(p), "\n")
}

// status asks for status as request req, decodes its JSON into doc and
// returns the JSON; an answer other than a success ends the test.
func (c *client) status(req string, doc any) string {
	c.t.Helper()
	c.send("status", req)
	got := c.read()
	js, ok := strings.CutPrefix(got, "result "+req+" success ")
	if !ok {
		c.t.Fatalf("status: %q", got)
	}
	if err := json.Unmarshal([]byte(js), doc); err != nil {
		c.t.Fatal(err)
	}
	return js
}

// quietUntil reads status and returns its quietUntil (zero if absent).
func (c *client) quietUntil() time.Time {
	c.t.Helper()
	var doc struct {
		QuietUntil int64 `json:"quietUntil"`
	}
	c.status("s", &doc)
	if doc.QuietUntil == 0 {
		return time.Time{}
	}
	return time.UnixMilli(doc.QuietUntil)
}

// lockHeld locks res and waits for the grant; it returns the lock id.
func (c *client) lockHeld(req, res string) string {
	c.t.Helper()
	c.send("lock", req, res, "60000", "0", "0")
	got := c.read()
	id, ok := strings.CutPrefix(got, "result "+req+" success ")
	if !ok {
		c.t.Fatalf("lock: %q", got)
	}
	if got := c.read(); !strings.HasPrefix(got, "locked "+id+" ") {
		c.t.Fatalf("want locked %s, got %q", id, got)
	}
	return id
}

func TestSignalShutdown(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cmd, addr := mlockd(t, "--data-dir", dir)
	c := dial(t, addr, "sig")
	id := c.lockHeld("1", "r")
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// The holder is told its lock is gone, then that the server stops; it
	// confirms with bye, so the shutdown is clean.
	if got := c.read(); got != "expired "+id+" shutdown" {
		t.Fatalf("want expired %s shutdown, got %q", id, got)
	}
	if got := c.read(); got != "error server shutting down!" {
		t.Fatalf("want the shutdown error, got %q", got)
	}
	c.send("bye", "2")
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("mlockd exited with %v, want 0", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("mlockd did not stop on SIGTERM")
	}
	_, addr = mlockd(t, "--data-dir", dir)
	c = dial(t, addr, "after")
	if q := c.quietUntil(); !q.IsZero() {
		t.Fatalf("quiet until %v after a clean shutdown", q)
	}
	c.lockHeld("1", "r")
}

func TestKillMakesNextStartQuiet(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cmd, addr := mlockd(t, "--data-dir", dir, "--session-grace", "1s")
	dial(t, addr, "holder").lockHeld("1", "r")
	if err := cmd.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	cmd.Wait()
	t0 := time.Now()
	_, addr = mlockd(t, "--data-dir", dir, "--session-grace", "1s")
	c := dial(t, addr, "after")
	c.send("trylock", "1", "r", "5000")
	if got := c.read(); !strings.HasPrefix(got, "result 1 failed resource is locked!") {
		t.Fatalf("trylock after a crash: %q, want busy", got)
	}
	q := c.quietUntil()
	if q.Before(t0.Add(900*time.Millisecond)) || q.After(time.Now().Add(2*time.Second)) {
		t.Fatalf("quietUntil %v, want about a second after the restart at %v", q, t0)
	}
	c.lockHeld("2", "r") // waits for the quiet period
	if now := time.Now(); now.Before(q.Add(-time.Millisecond)) {
		t.Fatalf("granted at %v, before the quiet period's end %v", now, q)
	}
	if q := c.quietUntil(); !q.IsZero() {
		t.Fatal("status still shows quietUntil after the quiet period")
	}
}

func TestNewDataDirIsNotQuiet(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "new")
	_, addr := mlockd(t, "--data-dir", dir)
	c := dial(t, addr, "first")
	if q := c.quietUntil(); !q.IsZero() {
		t.Fatalf("first start on a new directory quiet until %v", q)
	}
	c.lockHeld("1", "r")
	if _, err := os.Stat(filepath.Join(dir, "state")); err != nil {
		t.Fatalf("data directory not written: %v", err)
	}
}

// --quiet-period 0 turns the quiet period off, and says so: at every start
// (unsafe), and at a start after a crash, which grants at once (with
// --quiet-period 0 before the crash too, so that no period was recorded).
func TestQuietPeriodZeroTurnsItOff(t *testing.T) {
	t.Parallel()
	for _, before := range [][]string{nil, {"--quiet-period", "0"}} {
		dir := t.TempDir()
		cmd, addr, log := mlockdLog(t, append([]string{"--data-dir", dir}, before...)...)
		dial(t, addr, "holder").lockHeld("1", "r")
		cmd.Process.Kill()
		cmd.Wait()
		if off := strings.Contains(log.String(), "quiet period off"); off != (before != nil) {
			t.Errorf("first run %q: logged the quiet period off: %v\n%s", before, off, log)
		}
		_, addr, log = mlockdLog(t, "--data-dir", dir, "--quiet-period", "0")
		c := dial(t, addr, "after")
		if q := c.quietUntil(); !q.IsZero() {
			t.Fatalf("after a crash with --quiet-period 0 (first run %q): quiet until %v", before, q)
		}
		c.lockHeld("1", "r")
		for _, want := range []string{
			"quiet period off: a start that may follow a crash grants at once",
			"quiet period off: granting at once although a client of an earlier run may still believe it holds a lock (unsafe)\" reason=\"the previous run did not stop cleanly\"",
		} {
			if !strings.Contains(log.String(), want) {
				t.Errorf("first run %q: the log after the crash lacks %q:\n%s", before, want, log)
			}
		}
	}
}

func TestSecondMlockdOnOneDataDirFails(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	mlockd(t, "--data-dir", dir)
	err := run([]string{"--listen", "127.0.0.1:0", "--data-dir", dir}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second mlockd on one data directory: %v, want an error saying it is in use", err)
	}
}

func TestDataDirNoneStartsQuiet(t *testing.T) {
	t.Parallel()
	// The start says it is quiet, and why, in its log: a status read could
	// come after the quiet period on a busy machine.
	_, addr, log := mlockdLog(t, "--data-dir", "none", "--session-grace", "1s")
	for _, want := range []string{"granting nothing until", "no data directory: whether the previous run stopped cleanly is unknown"} {
		if !strings.Contains(log.String(), want) {
			t.Fatalf("a start without a data directory: the log lacks %q:\n%s", want, log)
		}
	}
	dial(t, addr, "nodir").lockHeld("1", "r") // granted when the quiet period ends
}

// A restart after a crash with a shorter --session-grace stays quiet for
// the crashed run's quiet period: its clients may believe that long.
func TestCrashQuietKeepsTheCrashedRunsPeriod(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cmd, addr := mlockd(t, "--data-dir", dir, "--session-grace", "5s")
	dial(t, addr, "holder").lockHeld("1", "r")
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	t0 := time.Now()
	_, addr = mlockd(t, "--data-dir", dir, "--session-grace", "200ms", "--quiet-period", "300ms")
	q := dial(t, addr, "after").quietUntil()
	if q.Before(t0.Add(4*time.Second)) || q.After(time.Now().Add(6*time.Second)) {
		t.Fatalf("quietUntil %v (in %v), want about 5 s after the restart", q, time.Until(q))
	}
}

// TestSIGHUPReloadsTheAuthFile: SIGHUP neither kills mlockd nor drops a
// lock; it reloads the auth file, so a principal added to it can connect,
// and a bad file keeps the previous principals.
func TestSIGHUPReloadsTheAuthFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "auth")
	tokA, tokB := auth.NewToken(), auth.NewToken()
	lineA, err := auth.Line("a", tokA, "prefix=a:")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte(lineA+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd, addr, stderr := mlockdLog(t, "--data-dir", "none", "--quiet-period", "0", "--auth-file", file)
	a := dialAuth(t, addr, "sa", "a:"+tokA)
	a.lockHeld("1", "a:x")
	if got := connectAuth(t, addr, "sb", "b:"+tokB); got != "error authentication failed!" {
		t.Fatalf("b before the reload: %q", got)
	}
	lineB, err := auth.Line("b", tokB, "prefix=b:")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte(lineA+"\n"+lineB+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	// The reload is asynchronous: retry b for a while.
	deadline := time.Now().Add(5 * time.Second)
	for connectAuth(t, addr, "sb", "b:"+tokB) != "connected 1.0 new 15000" {
		if time.Now().After(deadline) {
			t.Fatal("b still refused after SIGHUP")
		}
		time.Sleep(20 * time.Millisecond) // poll interval
	}
	// A broken file keeps the principals in force.
	if err := os.WriteFile(file, []byte("b plaintext-token prefix=b:\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, 5*time.Second, "the bad reload is logged", func() bool {
		return strings.Contains(stderr.String(), "reload failed; keeping the previous configuration")
	})
	if got := connectAuth(t, addr, "sb2", "b:"+tokB); got != "connected 1.0 new 15000" {
		t.Fatalf("b after a bad reload: %q", got)
	}
	// a's connection and lock lived through both signals.
	a.send("ping", "p")
	if got := a.read(); got != "result p success pong" {
		t.Fatalf("a after SIGHUP: %q", got)
	}
}

// TestListenBeyondLoopbackNeedsCredentials: without an auth file, client
// certificates or --insecure, mlockd refuses a lock port or an HTTP
// listener beyond loopback as a usage error: before it starts anything
// (no start-up line), exit 2, one line naming the flag (or the variable),
// the value and what to do, then the pointer to --help.
func TestListenBeyondLoopbackNeedsCredentials(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		env  []string
		args []string
		name string // the flag or variable the line names
	}{
		{nil, []string{"--listen", "0.0.0.0:0"}, "--listen 0.0.0.0:0"},
		{nil, []string{"--listen", ":0"}, "--listen :0"},
		{nil, []string{"--listen", "[::]:0"}, "--listen [::]:0"},
		{nil, []string{"--listen", "192.0.2.1:0"}, "--listen 192.0.2.1:0"},
		{[]string{"MLOCK_LISTEN=0.0.0.0:0"}, nil, "MLOCK_LISTEN 0.0.0.0:0"},
		{nil, []string{"--http", "0.0.0.0:0"}, "--http 0.0.0.0:0"},
		{[]string{"MLOCK_HTTP=0.0.0.0:0"}, nil, "MLOCK_HTTP 0.0.0.0:0"},
	} {
		stdout, stderr, code := runMlockd(t, c.env, append([]string{"--data-dir", "none"}, c.args...)...)
		lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
		if code != exitUsage || stdout != "" || len(lines) != 2 ||
			!strings.HasPrefix(lines[0], "mlockd: "+c.name+": beyond loopback") && !strings.HasPrefix(lines[0], "mlockd: "+c.name+": the HTTP listener") ||
			!strings.Contains(lines[0], "--insecure") || !strings.Contains(lines[0], "--auth-file") ||
			lines[1] != "Run 'mlockd --help' for usage." {
			t.Errorf("%v %q: exit %d, stdout %q, stderr %q; want exit 2 and one line naming %s, --auth-file and --insecure",
				c.env, c.args, code, stdout, stderr, c.name)
		}
	}
	// The server itself refuses such a listener too (for a host name, left
	// to it): an error, exit 1.
	var cfg server.Config
	cfg.Addr, cfg.DataDir, cfg.QuietPeriod = "0.0.0.0:0", "", -1
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	if err := srv.ListenAndServe(); err == nil || !strings.Contains(err.Error(), "--insecure") {
		t.Fatalf("server.ListenAndServe on 0.0.0.0 without credentials: %v, want a refusal naming --insecure", err)
	}
}

// connectAuth connects with credentials and returns the server's answer.
func connectAuth(t *testing.T, addr, sid, cred string) string {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c := &client{t: t, nc: nc, r: bufio.NewReader(nc)}
	c.send("connect", sid, "1.0", "auth="+cred)
	return c.read()
}

// dialAuth connects with credentials and keeps the connection.
func dialAuth(t *testing.T, addr, sid, cred string) *client {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	c := &client{t: t, nc: nc, r: bufio.NewReader(nc)}
	c.send("connect", sid, "1.0", "auth="+cred)
	if got := c.read(); !strings.HasPrefix(got, "connected 1.0 new ") {
		t.Fatalf("handshake: %q", got)
	}
	return c
}

// runMlockd runs this test binary as mlockd with args and the extra
// environment env, and returns its output and exit status.
func runMlockd(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(append(os.Environ(), "MLOCKD_TEST_MAIN=1"), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

// A bad flag, variable or setting is one line naming the flag (or the
// variable) and the value, then one line pointing to --help: exit 2,
// nothing on stdout, no usage dump.
func TestUsageErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		env  []string
		args []string
		want string
	}{
		{nil, []string{"--max-conns", "x"}, `--max-conns "x": want an integer`},
		{nil, []string{"--bogus"}, `flag provided but not defined: -bogus`},
		{nil, []string{"--insecure=maybe"}, `--insecure "maybe": want true or false`},
		{nil, []string{"--session-grace", "soon"}, `--session-grace "soon": want a duration such as 15s or 1m30s`},
		{nil, []string{"--quiet-period", "-1s"}, `--quiet-period "-1s": negative duration`},
		{nil, []string{"extra"}, `unexpected argument "extra"`},
		{nil, []string{"--log-format", "xml"}, `--log-format "xml": want text or json`},
		{[]string{"MLOCK_LOG_LEVEL=loud"}, nil, `MLOCK_LOG_LEVEL "loud": want debug, info, warn or error`},
		{[]string{"MLOCK_MAX_CONNS=abc"}, nil, `MLOCK_MAX_CONNS="abc": want an integer (see --max-conns)`},
		// server.Config.Validate's errors, with the flag or variable for the field
		{nil, []string{"--max-frame", "100000000"}, `--max-frame 100000000 is above 16777216`},
		{[]string{"MLOCK_MAX_FRAME=100000000"}, nil, `MLOCK_MAX_FRAME 100000000 is above 16777216`},
		{nil, []string{"--default-ttl", "2h", "--max-ttl", "1h"}, `--default-ttl 2h0m0s is above --max-ttl 1h0m0s`},
		{[]string{"MLOCK_MAX_TTL=1h"}, []string{"--default-ttl", "2h"}, `--default-ttl 2h0m0s is above MLOCK_MAX_TTL 1h0m0s`},
		{nil, []string{"--tls-cert", "x.pem"}, `--tls-cert and --tls-key go together`},
		{nil, []string{"--auth-timeout", "-1s"}, `--auth-timeout -1s is negative`},
	} {
		stdout, stderr, code := runMlockd(t, c.env, append([]string{"--data-dir", "none"}, c.args...)...)
		want := "mlockd: " + c.want + "\nRun 'mlockd --help' for usage.\n"
		if code != 2 || stderr != want || stdout != "" {
			t.Errorf("%v %q: exit %d, stdout %q, stderr %q; want exit 2 and %q", c.env, c.args, code, stdout, stderr, want)
		}
	}
}

func TestHelpAndVersion(t *testing.T) {
	t.Parallel()
	for _, arg := range []string{"--help", "-h"} {
		stdout, stderr, code := runMlockd(t, nil, arg)
		if code != 0 || stderr != "" || !strings.HasPrefix(stdout, "Usage: mlockd [flags]") ||
			!strings.Contains(stdout, "-max-conns int") || !strings.Contains(stdout, "SIGHUP") ||
			!strings.Contains(stdout, "'mlockd recover --help'") {
			t.Fatalf("%s: exit %d, stderr %q, stdout:\n%s", arg, code, stderr, stdout)
		}
	}
	stdout, stderr, code := runMlockd(t, nil, "--version")
	if code != 0 || stderr != "" || !strings.HasPrefix(stdout, "mlockd "+mlock.Version+" (go") {
		t.Fatalf("--version: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

// Every field of server.Config but Logger and Cluster is a setting of the
// server's table with its flag, of its field's type, defaulting to the
// setting's default; every flag is a setting's or one of mlockd's own.
func TestSettingFlagsMatchTheConfig(t *testing.T) {
	var cfg server.Config
	fs, _ := newFlagSet(&cfg)
	unwrapFlags(fs)
	byField := map[string]server.Setting{}
	byFlag := map[string]bool{}
	for _, s := range server.Settings() {
		byField[s.Field] = s
		if !s.NoFlag {
			byFlag[s.Name] = true
		}
	}
	typ := reflect.TypeOf(cfg)
	for i := range typ.NumField() {
		f := typ.Field(i)
		if f.Name == "Logger" || f.Name == "Cluster" {
			continue
		}
		s, ok := byField[f.Name]
		switch {
		case !ok:
			t.Errorf("server.Config.%s is not in the settings table", f.Name)
		case s.NoFlag || fs.Lookup(s.Name) == nil:
			t.Errorf("no flag --%s for Config.%s", s.Name, f.Name)
		case reflect.TypeOf(s.Ptr(&cfg)).Elem() != f.Type:
			t.Errorf("Config.%s is a %v, its setting's pointer a %T", f.Name, f.Type, s.Ptr(&cfg))
		case s.Default != nil && reflect.ValueOf(s.Ptr(&cfg)).Elem().Interface() != s.Default && f.Name != "DataDir":
			t.Errorf("--%s starts Config.%s at %v, want its default %v", s.Name, f.Name,
				reflect.ValueOf(s.Ptr(&cfg)).Elem().Interface(), s.Default)
		}
		if ok && s.Env() != envName(s.Name) {
			t.Errorf("--%s: variable %s, mlockd reads %s", s.Name, s.Env(), envName(s.Name))
		}
	}
	notConfig := map[string]bool{"log-level": true, "log-format": true, "shutdown-timeout": true, "cpu-profile": true, "version": true,
		"http": true, "http-pprof": true, "http-open-metrics": true}
	fs.VisitAll(func(f *flag.Flag) {
		if !byFlag[f.Name] && !notConfig[f.Name] && !clusterFlag(f.Name) {
			t.Errorf("flag --%s is neither a setting of the table nor one of mlockd's own", f.Name)
		}
	})
}

// clusterFlag reports whether a flag is one of a cluster node's
// (cluster.go), which set server.Config.Cluster.
func clusterFlag(name string) bool {
	return strings.HasPrefix(name, "cluster-") || strings.HasPrefix(name, "raft-")
}

// Config.Validate's errors name their settings, which mlockd names by flag
// or variable, as they were given.
func TestConfigErrorNamesFlagsAndVariables(t *testing.T) {
	for _, c := range []struct {
		cfg     server.Config
		fromEnv map[string]string
		want    string
	}{
		{server.Config{DefaultTTL: 2 * time.Hour, MaxTTL: time.Hour}, map[string]string{"max-ttl": "MLOCK_MAX_TTL"},
			"--default-ttl 2h0m0s is above MLOCK_MAX_TTL 1h0m0s"},
		{server.Config{TLSClientCAFile: "ca.pem"}, nil, "--tls-client-ca needs --tls-cert and --tls-key"},
		{server.Config{MaxTimeout: -time.Second}, map[string]string{"max-timeout": "MLOCK_MAX_TIMEOUT"}, "MLOCK_MAX_TIMEOUT -1s is negative"},
		{server.Config{Cluster: &server.ClusterConfig{DedupWindow: 1 << 31}}, nil, "Config.Cluster.DedupWindow 2147483648 is above 1073741824"},
	} {
		err := c.cfg.Validate()
		var ce *server.ConfigError
		if !errors.As(err, &ce) {
			t.Fatalf("%+v: Validate returned %v, want a *server.ConfigError", c.cfg, err)
		}
		if got := configError(err, c.fromEnv); got != c.want {
			t.Errorf("configError: %q, want %q", got, c.want)
		}
	}
	if got := configError(errors.New("server: other"), nil); got != "other" {
		t.Errorf("configError of another error: %q", got)
	}
}

// SIGHUP leaves a line in the log and mlockd running.
func TestSIGHUPIsLogged(t *testing.T) {
	t.Parallel()
	cmd, addr, stderr := mlockdLog(t, "--data-dir", "none", "--quiet-period", "0")
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(stderr.String(), "SIGHUP: reloading"); {
		if time.Now().After(deadline) {
			t.Fatalf("no log line for SIGHUP:\n%s", stderr.String())
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
	dial(t, addr, "after-hup").lockHeld("1", "r")
}

// --log-slow-wait 0 and --log-long-queue 0 turn those logs off, like the
// other 0 durations of mlockd's flags: the server's Config reads 0 as its
// default (1 s, 100), which logged what the operator asked not to, and at
// a threshold nobody gave. Unset, the defaults stay.
func TestLogThresholdsZeroMeansNever(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		env  map[string]string
	}{
		{args: []string{"--log-slow-wait", "0", "--log-long-queue", "0"}},
		{args: []string{"--log-slow-wait", "-1s", "--log-long-queue", "-3"}},
		{env: map[string]string{"MLOCK_LOG_SLOW_WAIT": "0s", "MLOCK_LOG_LONG_QUEUE": "0"}},
	} {
		var cfg server.Config
		fs, _ := newFlagSet(&cfg)
		if err := fs.Parse(c.args); err != nil {
			t.Fatal(err)
		}
		if _, err := applyEnv(fs, func(k string) (string, bool) { v, ok := c.env[k]; return v, ok }); err != nil {
			t.Fatal(err)
		}
		if cfg.LogSlowWait >= 0 || cfg.LogLongQueue >= 0 {
			t.Errorf("%q %v: LogSlowWait %v, LogLongQueue %d; want both negative (never)", c.args, c.env, cfg.LogSlowWait, cfg.LogLongQueue)
		}
	}
	var cfg server.Config
	fs, _ := newFlagSet(&cfg)
	if err := fs.Parse([]string{"--log-slow-wait", "250ms", "--log-long-queue", "7"}); err != nil {
		t.Fatal(err)
	}
	if cfg.LogSlowWait != 250*time.Millisecond || cfg.LogLongQueue != 7 {
		t.Errorf("LogSlowWait %v, LogLongQueue %d", cfg.LogSlowWait, cfg.LogLongQueue)
	}
	cfg = server.Config{}
	if _, _ = newFlagSet(&cfg); cfg.LogSlowWait != server.DefaultLogSlowWait || cfg.LogLongQueue != server.DefaultLogLongQueue {
		t.Errorf("defaults: LogSlowWait %v, LogLongQueue %d", cfg.LogSlowWait, cfg.LogLongQueue)
	}
	if err := run([]string{"--log-long-queue", "many"}, io.Discard, io.Discard); err == nil {
		t.Error("--log-long-queue many accepted")
	}
}

// With an auth file and a certificate, mlockd's HTTP listener speaks TLS
// with the lock port's certificate, answers 401 to /api/locks without an
// administrator's token and 200 with it; /healthz stays open.
func TestHTTPWithCredentialsAndTLS(t *testing.T) {
	t.Parallel()
	ca := testcert.New(t)
	certFile, keyFile := ca.Server(t)
	tok := auth.NewToken()
	line, err := auth.Line("ops", tok, "admin")
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "auth")
	if err := os.WriteFile(file, []byte(line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	httpAddr := proctest.FreeAddr(t)
	mlockd(t, "--data-dir", "none", "--quiet-period", "0", "--auth-file", file,
		"--tls-cert", certFile, "--tls-key", keyFile, "--http", httpAddr)
	client := &http.Client{Timeout: 5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"}}}
	get := func(path, bearer string) int {
		t.Helper()
		req, _ := http.NewRequest("GET", "https://"+httpAddr+path, nil)
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	for path, want := range map[string]int{"/api/locks": 401, "/metrics": 401, "/": 401, "/healthz": 200} {
		if got := get(path, ""); got != want {
			t.Errorf("%s without a token: %d, want %d", path, got, want)
		}
	}
	for _, path := range []string{"/api/locks", "/metrics", "/"} {
		if got := get(path, "ops:"+tok); got != 200 {
			t.Errorf("%s with the admin's token: %d", path, got)
		}
	}
	if res, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + httpAddr + "/healthz"); err == nil {
		res.Body.Close()
		if res.StatusCode == 200 {
			t.Error("the HTTP listener answers plain HTTP with TLS configured")
		}
	}
}
