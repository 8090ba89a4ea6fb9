package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/internal/proctest"
	"github.com/mlock-dev/mlock/internal/testenv"
	"github.com/mlock-dev/mlock/server"
	"github.com/mlock-dev/mlock/server/servertest"
)

// TestMain lets the test binary run as the mlock command.
func TestMain(m *testing.M) {
	if os.Getenv("MLOCK_TEST_MAIN") == "1" {
		main()
		return
	}
	testenv.WaitBound(24) // most tests wait for a server, a queue or a child process: the long ones start at once
	os.Exit(m.Run())
}

// release is the mlock command built without the race detector, as users
// run it.
var release = proctest.NewPrograms("./cmd/mlock")

// releaseCmd runs release: for the tests that start many runs, whose
// leases the race detector's CPU would starve on a busy machine.
func releaseCmd(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	return exec.Command(release.Paths(t)[0], args...)
}

func startServer(t *testing.T) string {
	// The tests poll locks freely: no listing rate (tested in server).
	addr, _ := servertest.Start(t, server.Config{StatusRate: -1}, "")
	return "mlock://" + addr
}

// mlockCmd runs the mlock command as a child process.
func mlockCmd(args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "MLOCK_TEST_MAIN=1")
	return cmd
}

func exitCodeOf(t *testing.T, err error) int {
	t.Helper()
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("not an exit: %v", err)
	}
	return ee.ExitCode()
}

func holder(t *testing.T, uri, res string, owner string) (*mlock.Client, *mlock.Lock) {
	t.Helper()
	c, err := mlock.New(uri)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	l, err := c.Lock(context.Background(), res, &mlock.LockOptions{Owner: owner})
	if err != nil {
		t.Fatal(err)
	}
	return c, l
}

func TestRunExitCodes(t *testing.T) {
	t.Parallel()
	uri := startServer(t)
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	notExec := filepath.Join(dir, "script.sh")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\ntouch "+marker+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		hold string // a resource held by someone else during the run
		want int
		ran  bool
	}{
		{"command's status", []string{"run", "--uri", uri, "job:a|job:b", "--", "sh", "-c", "touch " + marker + "; exit 7"}, "", 7, true},
		{"success", []string{"run", "--uri", uri, "--ttl", "5s", "job:a", "--", "touch", marker}, "", 0, true},
		{"skip if locked", []string{"run", "--uri", uri, "--skip-if-locked", "job:busy", "--", "touch", marker}, "job:busy", 0, false},
		{"timeout", []string{"run", "--uri", uri, "--timeout", "100ms", "job:busy2", "--", "touch", marker}, "job:busy2", exitNotTaken, false},
		{"tolerate", []string{"run", "--uri", uri, "--tolerate", "1", "job:busy3", "--", "touch", marker}, "job:busy3", 0, false},
		{"memory provider", []string{"run", "--uri", "memory:", "x", "--", "touch", marker}, "", 0, true},
		{"skip with --skip-exit", []string{"run", "--uri", uri, "--skip-if-locked", "--skip-exit", "3", "job:busy4", "--", "touch", marker}, "job:busy4", 3, false},
		{"no command", []string{"run", "--uri", uri, "job:a"}, "", exitUsage, false},
		{"resource with a space", []string{"run", "--uri", uri, "job:a b", "--", "touch", marker}, "", exitUsage, false},
		{"negative timeout", []string{"run", "--uri", uri, "--timeout", "-1s", "job:a", "--", "touch", marker}, "", exitUsage, false},
		{"owner with a space", []string{"run", "--uri", uri, "--owner", "cron 1", "job:a", "--", "touch", marker}, "", exitUsage, false},
		{"empty resource", []string{"run", "--uri", "memory:", "job:a||job:b", "--", "touch", marker}, "", exitUsage, false},
		{"bad flag", []string{"run", "--uri", uri, "--frobnicate", "job:a", "--", "touch", marker}, "", exitUsage, false},
		{"--skip-exit without --skip-if-locked", []string{"run", "--uri", uri, "--skip-exit", "3", "job:a", "--", "touch", marker}, "", exitUsage, false},
		{"command not found", []string{"run", "--uri", uri, "job:a", "--", filepath.Join(dir, "nope")}, "", exitNotFound, false},
		{"command not in PATH", []string{"run", "--uri", uri, "job:a", "--", "mlock-no-such-command"}, "", exitNotFound, false},
		{"command not executable", []string{"run", "--uri", uri, "job:a", "--", notExec}, "", exitNotExecutable, false},
		{"command is a directory", []string{"run", "--uri", uri, "job:a", "--", dir}, "", exitNotExecutable, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			os.Remove(marker)
			if tc.hold != "" {
				c, l := holder(t, uri, tc.hold, "")
				defer l.Unlock(context.Background())
				if tc.name == "tolerate" {
					// holder + one waiter: more than 1 entry, refused at once
					// The waiter waits longer than mlock run takes to start
					// on a loaded machine; it goes with its Client.
					go c.Lock(context.Background(), tc.hold, &mlock.LockOptions{Timeout: time.Minute})
					waitQueued(t, c, tc.hold, 2)
					tc.want = exitNotTaken
				}
			}
			var stderr bytes.Buffer
			cmd := mlockCmd(tc.args...)
			cmd.Stderr = &stderr
			code := exitCodeOf(t, cmd.Run())
			if code != tc.want {
				t.Fatalf("exit %d, want %d; stderr: %s", code, tc.want, stderr.String())
			}
			if _, err := os.Stat(marker); (err == nil) != tc.ran {
				t.Fatalf("command ran: %v, want %v", err == nil, tc.ran)
			}
		})
	}
}

func TestRunLostLockStopsTheCommand(t *testing.T) {
	t.Parallel()
	uri := startServer(t)
	admin, _ := holder(t, uri, "unrelated", "")
	cmd := mlockCmd("run", "--uri", uri, "--owner", "cron-1", "--kill-after", "2s", "nightly", "--", "sleep", "30")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitHeld(t, admin, "nightly")
	start := time.Now()
	if n, err := admin.ReleaseAll(context.Background(), "cron-1"); err != nil || n != 1 {
		t.Fatalf("ReleaseAll = %d, %v", n, err)
	}
	code := exitCodeOf(t, cmd.Wait())
	if code != exitLost {
		t.Fatalf("exit %d, want %d; stderr: %s", code, exitLost, stderr.String())
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the command was stopped after %v", d)
	}
	// One line, which names the reason: a release elsewhere, not an expiry.
	if got := stderr.String(); got != "mlock run: lock lost: released by its owner elsewhere (a release by owner, or an unlock by another holder of the same owner, such as a run with the same --owner); stopping the command\n" {
		t.Fatalf("stderr: %q", got)
	}
}

// A lost lock stops what the command started too: the shell's background
// child, which ignores SIGTERM, must be dead when mlock run exits.
func TestRunLostLockStopsTheWholeCommand(t *testing.T) {
	t.Parallel()
	uri := startServer(t)
	admin, _ := holder(t, uri, "unrelated", "")
	pidFile := filepath.Join(t.TempDir(), "child.pid")
	script := `trap "" TERM; sh -c 'trap "" TERM; sleep 30' & echo $! > ` + pidFile + `; wait`
	cmd := mlockCmd("run", "--uri", uri, "--owner", "cron-g", "--kill-after", "300ms", "nightly-g", "--", "sh", "-c", script)
	cmd.Stdin = nil // not a terminal: the command gets its own process group
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitHeld(t, admin, "nightly-g")
	var pid int
	for deadline := time.Now().Add(5 * time.Second); pid == 0; {
		if b, err := os.ReadFile(pidFile); err == nil {
			pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		}
		if time.Now().After(deadline) {
			t.Fatal("the command did not start its child")
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
	if _, err := admin.ReleaseAll(context.Background(), "cron-g"); err != nil {
		t.Fatal(err)
	}
	if code := exitCodeOf(t, cmd.Wait()); code != exitLost {
		t.Fatalf("exit %d, want %d", code, exitLost)
	}
	// The child is dead (or a zombie about to be reaped by init).
	for deadline := time.Now().Add(2 * time.Second); ; {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil || strings.Contains(string(b), ") Z ") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the command's child %d outlived mlock run", pid)
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
}

func TestRunForwardsSignals(t *testing.T) {
	t.Parallel()
	uri := startServer(t)
	admin, _ := holder(t, uri, "unrelated", "")
	trapped := filepath.Join(t.TempDir(), "trapped")
	cmd := mlockCmd("run", "--uri", uri, "sig", "--", "sh", "-c", `trap "exit 42" TERM; touch `+trapped+`; while :; do sleep 0.05; done`)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitHeld(t, admin, "sig")
	proctest.WaitFor(t, 5*time.Second, "the shell sets its trap", func() bool { _, err := os.Stat(trapped); return err == nil })
	cmd.Process.Signal(syscall.SIGTERM)
	if code := exitCodeOf(t, cmd.Wait()); code != 42 {
		t.Fatalf("exit %d, want the command's 42", code)
	}
	// The lock is released after the command ends.
	l, err := admin.TryLock(context.Background(), "sig", nil)
	if err != nil {
		t.Fatalf("lock left behind: %v", err)
	}
	l.Unlock(context.Background())
}

// waitHeld waits until res is held. The bound is long: a run started as a
// process of the race-enabled test binary, on a busy machine, may take
// seconds to get there.
func waitHeld(t *testing.T, c *mlock.Client, res string) {
	t.Helper()
	proctest.WaitFor(t, 30*time.Second, res+" held", func() bool {
		ls, err := c.Locks(context.Background(), res)
		return err == nil && len(ls.Queues) == 1 && len(ls.Queues[0].Entries) > 0 && ls.Queues[0].Entries[0].State == "held"
	})
}

// waitQueued waits until res's queue holds n entries.
func waitQueued(t *testing.T, c *mlock.Client, res string, n int) {
	t.Helper()
	proctest.WaitFor(t, 30*time.Second, fmt.Sprintf("%d entries in %s's queue", n, res), func() bool {
		ls, err := c.Locks(context.Background(), res)
		return err == nil && len(ls.Queues) == 1 && len(ls.Queues[0].Entries) == n
	})
}

func TestInspectCommands(t *testing.T) {
	t.Parallel()
	uri := startServer(t)
	holder(t, uri, "order:1|order:2", "w1")
	run := func(args ...string) (string, int) {
		var out, errb bytes.Buffer
		code := cli(args, &out, &errb)
		return out.String() + errb.String(), code
	}
	if out, code := run("ping", "--uri", uri); code != 0 || !strings.Contains(out, "pong") {
		t.Fatalf("ping: %d %s", code, out)
	}
	if out, code := run("status", "--uri", uri); code != 0 || !strings.Contains(out, "1 held, 0 waiting") {
		t.Fatalf("status: %d %s", code, out)
	}
	out, code := run("status", "--uri", uri, "--json")
	var st mlock.Status
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st.HeldLocks != 1 {
		t.Fatalf("status --json: %d %s", code, out)
	}
	if out, code := run("locks", "--uri", uri, "order:"); code != 0 || !strings.Contains(out, "order:2") || !strings.Contains(out, "w1") {
		t.Fatalf("locks: %d %s", code, out)
	}
	if out, code := run("evict", "--uri", uri); code != exitUsage || !strings.Contains(out, "missing argument") {
		t.Fatalf("evict without RESOURCES: %d %s", code, out)
	}
	if out, code := run("frobnicate"); code != exitUsage || out != "mlock: unknown command \"frobnicate\"\nRun 'mlock --help' for usage.\n" {
		t.Fatalf("unknown command: %d %q", code, out)
	}
	if _, code := run(); code != exitUsage {
		t.Fatal("no command")
	}
}

func TestBenchCommand(t *testing.T) {
	t.Parallel()
	uri := startServer(t)
	var out, errb bytes.Buffer
	// A count ends the run, not a short duration: a busy machine may
	// complete nothing in 400 ms.
	code := cli([]string{"bench", "--scenario", "shop", "--workers", "8", "--duration", "30s", "--count", "400", "--hold", "100us",
		"--json", uri, "--vs", "memory:"}, &out, &errb)
	if code != 0 {
		t.Fatalf("bench: %d %s", code, errb.String())
	}
	var doc struct {
		Results []struct {
			Target     string  `json:"target"`
			Ops        int64   `json:"ops"`
			Violations int64   `json:"violations"`
			Timeouts   int64   `json:"timeouts"`
			CPUKnown   bool    `json:"serverCpuKnown"`
			ClientCPU  bool    `json:"clientCpuKnown"`
			Rate       float64 `json:"opsPerSec"`
		} `json:"results"`
		Ratios map[string]float64 `json:"ratios"`
	}
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if len(doc.Results) != 2 || doc.Results[0].Ops == 0 || doc.Results[1].Ops == 0 || !doc.Results[0].CPUKnown ||
		doc.Results[1].CPUKnown || !doc.Results[0].ClientCPU || !doc.Results[1].ClientCPU ||
		doc.Ratios["opsPerSec"] == 0 || doc.Ratios["clientCpuPerOp"] == 0 {
		t.Fatalf("bench results: %s", out.String())
	}
	for _, r := range doc.Results {
		if r.Violations != 0 || r.Timeouts != 0 {
			t.Fatalf("%+v", r)
		}
	}
	if code := cli([]string{"bench", "--uri", "mlock://192.0.2.1:12340"}, &out, &errb); code != exitUsage {
		t.Fatal("a remote target needs --allow-remote (a usage error)")
	}
}

// A run killed outright (SIGKILL, the OOM killer) takes its command with
// it: the lock is no longer renewed, so the command must not outlive it and
// run beside the next holder.
func TestRunKilledTakesTheCommandWithIt(t *testing.T) {
	t.Parallel()
	if runtime.GOOS != "linux" {
		t.Skip("the parent-death signal is Linux's")
	}
	uri := startServer(t)
	admin, _ := holder(t, uri, "unrelated", "")
	pidFile := filepath.Join(t.TempDir(), "cmd.pid")
	cmd := mlockCmd("run", "--uri", uri, "killed", "--", "sh", "-c", `echo $$ > `+pidFile+`; exec sleep 30`)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitHeld(t, admin, "killed")
	var pid int
	for deadline := time.Now().Add(5 * time.Second); pid == 0; {
		if b, err := os.ReadFile(pidFile); err == nil {
			pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		}
		if time.Now().After(deadline) {
			t.Fatal("the command did not start")
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
	cmd.Process.Kill()
	cmd.Wait()
	for deadline := time.Now().Add(5 * time.Second); ; {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil || strings.Contains(string(b), ") Z ") {
			return
		}
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("the command %d outlived the killed mlock run", pid)
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
}

// A target that completes no operation (here a server in its quiet period,
// which grants nothing) measured nothing: bench says so and exits 125.
func TestBenchNothingMeasured(t *testing.T) {
	t.Parallel()
	addr, _ := servertest.Start(t, server.Config{QuietPeriod: time.Minute}, "")
	var out, errb bytes.Buffer
	code := cli([]string{"bench", "--scenario", "uncontended", "--workers", "2", "--duration", "300ms", "mlock://" + addr}, &out, &errb)
	if code != exitError || !strings.Contains(errb.String(), "no operation completed") {
		t.Fatalf("exit %d: %s%s", code, out.String(), errb.String())
	}
}
