package server

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/internal/core"
	"github.com/mlock-dev/mlock/internal/datadir"
	"github.com/mlock-dev/mlock/internal/proctest"
)

// serve runs a server made by New(cfg) on 127.0.0.1:0; the returned stop
// shuts it down (with ctx's bound) and waits for Serve. The test's cleanup
// stops it too.
func serve(t *testing.T, cfg Config) (*Server, func() error) {
	t.Helper()
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := srv.Shutdown(ctx)
		if serr := <-done; serr != ErrServerClosed {
			t.Errorf("Serve returned %v", serr)
		}
		return err
	}
	t.Cleanup(func() { stop() })
	for srv.Addr() == nil {
		time.Sleep(time.Millisecond)
	}
	return srv, stop
}

// statusDoc reads the status document through the status command.
func (c *raw) statusDoc(req string) map[string]any {
	c.t.Helper()
	c.send("status " + req)
	f := c.expect("result " + req + " success *")
	var doc map[string]any
	if err := json.Unmarshal([]byte(f[3]), &doc); err != nil {
		c.t.Fatal(err)
	}
	return doc
}

// tryBusy asserts a try-lock on res is refused as busy.
func (c *raw) tryBusy(req, res string) {
	c.t.Helper()
	c.send("trylock " + req + " " + res + " 5000")
	if got := c.read(); !strings.HasPrefix(got, "result "+req+" failed resource is locked!") {
		c.t.Fatalf("trylock during the quiet period: got %q, want busy", got)
	}
}

// tryGranted asserts a try-lock on res is granted at once.
func (c *raw) tryGranted(req, res string) uint64 {
	c.t.Helper()
	c.send("trylock " + req + " " + res + " 5000")
	f := c.expect("result " + req + " success *")
	tok, err := strconv.ParseUint(c.locked(f[3]), 10, 64)
	if err != nil {
		c.t.Fatal(err)
	}
	return tok
}

func TestHandshakeAnnouncesGrace(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		grace time.Duration
		want  string
	}{{0, "15000"}, {2500 * time.Millisecond, "2500"}, {-1, "0"}} {
		srv := start(t, Config{SessionGrace: tc.grace})
		c := dialRaw(t, srv)
		c.send("connect g 1.0")
		c.expect("connected 1.0 new " + tc.want)
	}
}

func TestTokensSurviveRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	srv, stop := serve(t, Config{DataDir: dir})
	c := connected(t, srv, "tok")
	c.send("trylock 1 tok 5000")
	id := c.expect("result 1 success *")[3]
	first, _ := strconv.ParseUint(c.locked(id), 10, 64)
	c.send("unlock 2 " + id)
	c.expect("result 2 success done")
	mark := datadirMark(t, srv)
	if first >= mark {
		t.Fatalf("token %d not below the mark %d", first, mark)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	srv2, _ := serve(t, Config{DataDir: dir})
	c2 := connected(t, srv2, "tok")
	if tok := c2.tryGranted("1", "tok"); tok < mark {
		t.Fatalf("after restart token %d is below the mark %d: tokens may repeat", tok, mark)
	}
}

func datadirMark(t *testing.T, srv *Server) uint64 {
	t.Helper()
	if srv.dir == nil {
		t.Fatal("no data directory")
	}
	return srv.dir.TokenMark()
}

func TestSecondServerOnOneDataDirFails(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	serve(t, Config{DataDir: dir})
	_, err := New(Config{DataDir: dir})
	if !errors.Is(err, datadir.ErrInUse) {
		t.Fatalf("second server on one data directory: %v, want ErrInUse", err)
	}
}

func TestNewDataDirGrantsAtOnce(t *testing.T) {
	t.Parallel()
	srv, _ := serve(t, Config{DataDir: t.TempDir()})
	c := connected(t, srv, "fresh")
	c.tryGranted("1", "r")
	if q, ok := c.statusDoc("2")["quietUntil"]; ok {
		t.Fatalf("status shows quietUntil %v on a new data directory", q)
	}
}

func TestNoDataDirStartIsQuiet(t *testing.T) {
	t.Parallel()
	// The quiet period (the grace) outlasts the connect and the try on a
	// busy machine: nothing waits for its end.
	srv, _ := serve(t, Config{SessionGrace: 5 * time.Second})
	c := connected(t, srv, "nodir")
	c.tryBusy("1", "r")
	if _, ok := c.statusDoc("2")["quietUntil"]; !ok {
		t.Fatal("status does not show the quiet period")
	}
	// QuietPeriod < 0 turns it off.
	srv2, _ := serve(t, Config{QuietPeriod: -1})
	connected(t, srv2, "nodir").tryGranted("1", "r")
}

// quietGrace is the session grace of the tests that restart into a quiet
// period (the grace and its margin): long enough for a busy machine to
// restart and ask within it (1.5 s was not, once under load).
const quietGrace = 5 * time.Second

// quietRestart starts a server on dir and checks that it is quiet: a
// try-lock is refused, status shows the end of the quiet period, and a
// lock waits and is granted when it ends, not before.
func quietRestart(t *testing.T, cfg Config) {
	t.Helper()
	t0 := time.Now()
	srv, _ := serve(t, cfg)
	c := connected(t, srv, "after")
	c.tryBusy("1", "held")
	q, ok := c.statusDoc("2")["quietUntil"].(float64)
	if !ok {
		t.Fatal("status does not show quietUntil during the quiet period")
	}
	until := time.UnixMilli(int64(q))
	if until.Before(t0) || until.After(time.Now().Add(time.Minute)) {
		t.Fatalf("quietUntil %v out of range", until)
	}
	id := c.lock("3", "held 5000 0 0")
	c.locked(id)
	if now := time.Now(); now.Before(until.Add(-time.Millisecond)) {
		t.Fatalf("granted at %v, before the end of the quiet period %v", now, until)
	}
	if _, ok := c.statusDoc("4")["quietUntil"]; ok {
		t.Fatal("status still shows quietUntil after the quiet period")
	}
}

func TestCleanShutdownWithoutLocksIsNotQuiet(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	srv, stop := serve(t, Config{DataDir: dir})
	c := connected(t, srv, "a")
	id := c.lock("1", "r 5000 0 0")
	c.locked(id)
	c.send("unlock 2 " + id)
	c.expect("result 2 success done")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	c.expect("error server shutting down!")
	c.closed()

	srv2, _ := serve(t, Config{DataDir: dir})
	connected(t, srv2, "b").tryGranted("1", "r")
}

func TestShutdownHolderThatDoesNotCloseMakesNextStartQuiet(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := Config{DataDir: dir, SessionGrace: quietGrace, ShutdownWait: 300 * time.Millisecond}
	srv, stop := serve(t, cfg)
	holder := connected(t, srv, "holder")
	id := holder.lock("1", "held 60000 0 0")
	holder.locked(id)
	t0 := time.Now()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d < 250*time.Millisecond || d > 5*time.Second {
		t.Fatalf("Shutdown took %v, want about ShutdownWait", d)
	}
	holder.expect("expired " + id + " shutdown") // 1.0 clients read the first two words
	holder.expect("error server shutting down!")
	holder.closed() // closed by the server once the wait was over

	quietRestart(t, cfg)
}

func TestShutdownHolderThatClosesLeavesNoQuiet(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := Config{DataDir: dir, ShutdownWait: time.Minute}
	srv, stop := serve(t, cfg)
	holder := connected(t, srv, "holder")
	id := holder.lock("1", "held 60000 0 0")
	holder.locked(id)
	idle := connected(t, srv, "idle") // holds nothing: not waited for

	t0 := time.Now()
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	holder.expect("expired " + id + " shutdown") // 1.0 clients read the first two words
	holder.expect("error server shutting down!")
	idle.expect("error server shutting down!")
	idle.closed()
	holder.send("bye 2") // the client marked its locks lost
	holder.closed()      // and the server closes the connection
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d > 15*time.Second { // far below the ShutdownWait of a minute
		t.Fatalf("Shutdown took %v although the holder confirmed at once", d)
	}

	if b, err := os.ReadFile(filepath.Join(dir, "state")); err != nil || !strings.HasPrefix(string(b), "mlockd-state 1\nstatus clean\nquiet-until 0\n") {
		t.Fatalf("state file after a confirmed shutdown: %q, %v", b, err)
	}
	srv2, _ := serve(t, cfg)
	connected(t, srv2, "after").tryGranted("1", "held")
}

// TestShutdownHolderThatClosesWithoutByeMakesNextStartQuiet: a client that
// closes its connection during the shutdown without bye may have closed for
// its own reasons (a ping timeout, a proxy) without reading that its locks
// are gone: it still believes it holds them, so the next start is quiet.
// The wait ends when it closes, though: there is nothing more to wait for.
func TestShutdownHolderThatClosesWithoutByeMakesNextStartQuiet(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := Config{DataDir: dir, SessionGrace: quietGrace, ShutdownWait: time.Minute}
	srv, stop := serve(t, cfg)
	holder := connected(t, srv, "holder")
	id := holder.lock("1", "held 60000 0 0")
	holder.locked(id)
	confirmed := connected(t, srv, "confirmed")
	cid := confirmed.lock("1", "other 60000 0 0")
	confirmed.locked(cid)

	t0 := time.Now()
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	confirmed.expect("expired " + cid + " shutdown")
	confirmed.expect("error server shutting down!")
	confirmed.send("bye 2")
	confirmed.closed()
	// The holder's connection closes without bye, unread frames and all.
	time.Sleep(20 * time.Millisecond) // fixed: the shutdown's frames reach the holder's socket unread
	holder.nc.Close()
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d > 15*time.Second { // far below the ShutdownWait of a minute
		t.Fatalf("Shutdown took %v although every holder's connection had ended", d)
	}
	quietRestart(t, cfg)
}

// TestShutdownOriginalClientThatReadsAndClosesIsNotConfirmed: a 1.0 client
// never sends bye. One that reads its expired push and the error and then
// closes has still not confirmed: the close cannot say whether the program
// acted on what its runtime read (the original client ignores both), so the
// next start is quiet. The state file and the log say so in one word:
// "unconfirmed", with the time, never "clean".
func TestShutdownOriginalClientThatReadsAndClosesIsNotConfirmed(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var logs logBuffer
	cfg := Config{DataDir: dir, SessionGrace: quietGrace, ShutdownWait: time.Minute,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	srv, stop := serve(t, cfg)
	holder := connected(t, srv, "holder")
	id := holder.lock("1", "held 60000 0 0")
	holder.locked(id)

	t0 := time.Now()
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	holder.expect("expired " + id + " shutdown")
	holder.expect("error server shutting down!")
	holder.nc.Close() // everything read; no bye
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d > 15*time.Second { // far below the ShutdownWait of a minute
		t.Fatalf("Shutdown took %v although the holder's connection had ended", d)
	}
	b, err := os.ReadFile(filepath.Join(dir, "state"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) < 3 || lines[1] != "status unconfirmed" {
		t.Fatalf("state file after an unconfirmed shutdown:\n%s", b)
	}
	q, err := strconv.ParseInt(strings.TrimPrefix(lines[2], "quiet-until "), 10, 64)
	if err != nil || !time.Unix(0, q).After(time.Now()) {
		t.Fatalf("state file records no future quiet-until:\n%s", b)
	}
	if log := logs.String(); !strings.Contains(log, "shutdown recorded") || !strings.Contains(log, "status=unconfirmed") ||
		strings.Contains(log, "status=clean") || strings.Contains(log, "clean=") {
		t.Fatalf("the log does not say the shutdown was unconfirmed:\n%s", log)
	}
	quietRestart(t, cfg)
}

// TestByeOutsideShutdown: bye outside a shutdown closes the connection,
// without an answer; the session keeps its locks for its grace period, as
// after any other close.
func TestByeOutsideShutdown(t *testing.T) {
	t.Parallel()
	// Seconds: the try-lock below comes within the grace on a busy machine
	// (200 ms was missed once).
	srv := start(t, Config{SessionGrace: quietGrace})
	c := connected(t, srv, "byer")
	id := c.lock("1", "kept 60000 0 0")
	c.locked(id)
	c.send("bye 2")
	c.closed()
	other := connected(t, srv, "other")
	other.tryBusy("1", "kept") // the session is in its grace period
	w := other.lock("2", "kept 60000 0 0")
	other.locked(w) // granted when the grace ends
}

func TestShutdownWithSessionInGraceMakesNextStartQuiet(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := Config{DataDir: dir, SessionGrace: quietGrace, ShutdownWait: time.Minute}
	srv, stop := serve(t, cfg)
	holder := connected(t, srv, "holder")
	id := holder.lock("1", "held 60000 0 0")
	holder.locked(id)
	holder.nc.Close() // detached: its client may still believe it holds the lock
	for {
		n := 0
		srv.core().Batch(func(*core.Tx) { n = len(srv.conns) })
		if n == 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	t0 := time.Now()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d > 15*time.Second { // far below the ShutdownWait of a minute
		t.Fatalf("Shutdown waited %v with no connection to wait for", d)
	}
	quietRestart(t, cfg)
}

func TestShutdownTellsEveryConnection(t *testing.T) {
	t.Parallel()
	cfg := Config{DataDir: t.TempDir(), ShutdownWait: time.Minute}
	srv, stop := serve(t, cfg)
	holder := connected(t, srv, "holder")
	holder.locked(holder.lock("1", "held 60000 0 0"))
	late := dialRaw(t, srv) // accepted, not connected yet
	proctest.WaitFor(t, 10*time.Second, "the server accepts the late connection", func() bool {
		n := 0
		srv.batch(func(*core.Tx) { n = len(srv.conns) })
		return n == 2
	})
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	late.expect("error server shutting down!")
	late.closed()
	holder.read() // expired
	holder.expect("error server shutting down!")
	holder.nc.Close()
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
}

// logBuffer collects a server's log lines; safe for concurrent use.
type logBuffer struct{ proctest.Buffer }

func (l *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// TestCrashQuietUsesTheCrashedRunsPeriod: a run with a long session grace
// crashes; the next start, with a short grace, stays quiet for the crashed
// run's quiet period, since its clients may believe that long.
func TestCrashQuietUsesTheCrashedRunsPeriod(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	long := datadir.QuietPeriod(time.Minute)
	// The crashed run: its start recorded its quiet period, and it never
	// recorded an end.
	srv1, err := New(Config{DataDir: dir, SessionGrace: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	srv1.core().Close()
	srv1.dir.Close() // a crash: the directory's lock is released, nothing recorded
	close(srv1.markStop)

	var logs logBuffer
	t0 := time.Now()
	srv, _ := serve(t, Config{DataDir: dir, SessionGrace: 200 * time.Millisecond, Logger: logs.logger()})
	c := connected(t, srv, "after")
	c.tryBusy("1", "r")
	q, ok := c.statusDoc("2")["quietUntil"].(float64)
	if !ok {
		t.Fatal("status does not show quietUntil after a crash")
	}
	until := time.UnixMilli(int64(q))
	if until.Before(t0.Add(long-time.Second)) || until.After(time.Now().Add(long)) {
		t.Fatalf("quiet until %v (in %v), want the crashed run's %v", until, time.Until(until), long)
	}
	if !strings.Contains(logs.String(), "previous-run-quiet-period="+long.String()) {
		t.Fatalf("the log does not say the crashed run's period counts:\n%s", logs.String())
	}
}

func TestUnsafeSettingsAreLogged(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  Config
		want string // "" for no warning
	}{
		{Config{SessionGrace: 10 * time.Second, QuietPeriod: 2 * time.Second}, "quiet period is shorter than the session grace"},
		{Config{SessionGrace: 10 * time.Second, QuietPeriod: 10 * time.Second}, "quiet period is shorter than the session grace"},
		{Config{SessionGrace: 10 * time.Second, QuietPeriod: datadir.QuietPeriod(10 * time.Second)}, ""},
		{Config{SessionGrace: 10 * time.Second}, ""}, // the default
		{Config{SessionGrace: 10 * time.Second, QuietPeriod: -1}, "quiet period off: a start that may follow a crash grants at once"},
		{Config{SessionGrace: -1}, "session grace is negative"},                              // dropped at once
		{Config{SessionGrace: -1, QuietPeriod: time.Millisecond}, "quiet period is shorter"}, // below 5 ms, the safe one for grace 0
	} {
		var logs logBuffer
		tc.cfg.Logger = logs.logger()
		srv, err := New(tc.cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Shutdown(t.Context()); err != nil {
			t.Fatal(err)
		}
		got := logs.String()
		if tc.want == "" && (strings.Contains(got, "quiet period is shorter") || strings.Contains(got, "session grace is negative")) {
			t.Errorf("%+v: unexpected warning:\n%s", tc.cfg, got)
		}
		if tc.want != "" && !strings.Contains(got, tc.want) {
			t.Errorf("%+v: log lacks %q:\n%s", tc.cfg, tc.want, got)
		}
	}
}
