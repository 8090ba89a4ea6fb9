package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/internal/proctest"
	"github.com/mlock-dev/mlock/server"
	"github.com/mlock-dev/mlock/server/servertest"
)

// The command gets MLOCK_TOKEN, MLOCK_RESOURCES and, when the provider
// reports it, MLOCK_EXPIRES_AT; inherited values are replaced; the lock id
// is never passed.
func TestRunEnvironment(t *testing.T) {
	t.Parallel()
	uri := startServer(t)
	admin, _ := holder(t, uri, "unrelated", "")
	targets := []struct {
		uri     string
		expires bool
	}{{uri, true}, {"memory:", false}}
	if u := os.Getenv("REDIS_URL"); u != "" {
		targets = append(targets, struct {
			uri     string
			expires bool
		}{u, true})
	}
	for _, tg := range targets {
		dir := t.TempDir()
		out, envDump, idFile := filepath.Join(dir, "out"), filepath.Join(dir, "env"), filepath.Join(dir, "id")
		script := `printf '%s\n%s\n%s\n' "$MLOCK_TOKEN" "$MLOCK_RESOURCES" "${MLOCK_EXPIRES_AT-none}" > ` + out +
			`; env > ` + envDump
		if tg.uri == uri {
			// While the command runs, note (part of) the lock's id as the server lists it.
			script += `; while [ ! -s ` + idFile + ` ]; do sleep 0.01; done`
		}
		start := time.Now()
		cmd := mlockCmd("run", "--uri", tg.uri, "--ttl", "20s", "env:a|env:b", "--", "sh", "-c", script)
		cmd.Env = append(cmd.Env, "MLOCK_TOKEN=inherited", "MLOCK_EXPIRES_AT=inherited")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		var lockID string
		if tg.uri == uri {
			waitHeld(t, admin, "env:a")
			ls, err := admin.Locks(context.Background(), "env:a")
			if err != nil || len(ls.Queues) != 1 || len(ls.Queues[0].Entries) == 0 {
				t.Fatalf("locks %+v, %v", ls, err)
			}
			lockID = ls.Queues[0].Entries[0].Lock // a part of the lock id
			if len(lockID) < 8 {
				t.Fatalf("lock %q", lockID)
			}
			os.WriteFile(idFile, []byte(lockID), 0o600)
		}
		if code := exitCodeOf(t, cmd.Wait()); code != 0 {
			t.Fatalf("%s: exit %d: %s", tg.uri, code, stderr.String())
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
		if len(lines) != 3 {
			t.Fatalf("%s: output %q", tg.uri, b)
		}
		token, err := strconv.ParseUint(lines[0], 10, 64)
		if tg.uri == "memory:" || strings.HasPrefix(tg.uri, "mlock:") || strings.HasPrefix(tg.uri, "redis:") {
			if err != nil || token == 0 {
				t.Fatalf("%s: MLOCK_TOKEN %q", tg.uri, lines[0])
			}
		}
		if lines[1] != "env:a|env:b" {
			t.Fatalf("%s: MLOCK_RESOURCES %q", tg.uri, lines[1])
		}
		if !tg.expires {
			if lines[2] != "none" {
				t.Fatalf("%s: MLOCK_EXPIRES_AT %q, want it unset", tg.uri, lines[2])
			}
		} else {
			ms, err := strconv.ParseInt(lines[2], 10, 64)
			at := time.UnixMilli(ms)
			if err != nil || at.Before(start.Add(19*time.Second)) || at.After(time.Now().Add(21*time.Second)) {
				t.Fatalf("%s: MLOCK_EXPIRES_AT %q, want about 20s from the start", tg.uri, lines[2])
			}
		}
		env, _ := os.ReadFile(envDump)
		if strings.Contains(string(env), "inherited") {
			t.Fatalf("%s: inherited values passed on:\n%s", tg.uri, env)
		}
		if lockID != "" && strings.Contains(string(env), lockID) {
			t.Fatalf("%s: the lock id %s is in the environment:\n%s", tg.uri, lockID, env)
		}
	}
}

// --kill-after must be at most ttl/4; left to its default it is clamped to
// ttl/4; a ttl too short for the lead (kill-after + 100ms below ttl/2) is
// refused. Refusals are usage errors.
func TestRunKillAfterAgainstTTL(t *testing.T) {
	// Not parallel: its bounds leave milliseconds for a round trip.
	for _, c := range []struct {
		ttl, kill time.Duration
		given     bool
		wantKill  time.Duration
		wantLead  time.Duration
		ok        bool
	}{
		{60 * time.Second, 10 * time.Second, false, 10 * time.Second, 10100 * time.Millisecond, true},
		{2 * time.Second, 10 * time.Second, false, 500 * time.Millisecond, 600 * time.Millisecond, true},
		{2 * time.Second, 500 * time.Millisecond, true, 500 * time.Millisecond, 600 * time.Millisecond, true},
		{2 * time.Second, 501 * time.Millisecond, true, 0, 0, false},
		{300 * time.Millisecond, 10 * time.Second, false, 0, 0, false}, // 75ms + 100ms is not below 150ms
		{time.Second, -time.Second, true, 0, 0, false},
	} {
		kill := c.kill
		lead, err := leadOf(c.ttl, &kill, c.given)
		if (err == nil) != c.ok || (c.ok && (kill != c.wantKill || lead != c.wantLead)) {
			t.Errorf("ttl %v kill-after %v (given %v): kill %v lead %v err %v", c.ttl, c.kill, c.given, kill, lead, err)
		}
	}
	marker := filepath.Join(t.TempDir(), "ran")
	var stderr bytes.Buffer
	code := cli([]string{"run", "--uri", "memory:", "--ttl", "2s", "--kill-after", "1s", "x", "--", "touch", marker}, &stderr, &stderr)
	if code != exitUsage || !strings.Contains(stderr.String(), "ttl/4") {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the command ran")
	}
	if code := cli([]string{"run", "--uri", "memory:", "--ttl", "2s", "x", "--", "touch", marker}, &stderr, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
}

// blackhole is a TCP proxy that can stop forwarding while keeping its
// connections open: both ends are alive, nothing gets through.
type blackhole struct {
	ln    net.Listener
	dead  atomic.Bool
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func newBlackhole(t *testing.T, target string) *blackhole {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackhole{ln: ln}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			b.mu.Lock()
			b.conns = append(b.conns, c, s)
			b.mu.Unlock()
			b.wg.Add(2)
			go b.pipe(c, s)
			go b.pipe(s, c)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		b.mu.Lock()
		for _, c := range b.conns {
			c.Close()
		}
		b.mu.Unlock()
		b.wg.Wait()
	})
	return b
}

func (b *blackhole) pipe(dst, src net.Conn) {
	defer b.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			dst.Close()
			return
		}
		if !b.dead.Load() {
			dst.Write(buf[:n])
		}
	}
}

// The lead: when renewals stop getting through (a blackholed path), the
// command, which ignores SIGTERM, is SIGKILLed and dead before the server's
// lease of the lock ends, that is before anyone else can be granted it.
func TestRunLeadKillsBeforeTheLeaseEnds(t *testing.T) {
	// Not parallel: its bounds leave milliseconds for a round trip.
	uri := startServer(t)
	admin, _ := holder(t, uri, "unrelated", "")
	proxy := newBlackhole(t, strings.TrimPrefix(uri, "mlock://"))
	pidfile := filepath.Join(t.TempDir(), "pid")
	const ttl, killAfter = 2 * time.Second, 300 * time.Millisecond
	cmd := mlockCmd("run", "--uri", "mlock://"+proxy.ln.Addr().String(), "--ttl", ttl.String(),
		"--kill-after", killAfter.String(), "lead", "--", "sh", "-c", `trap "" TERM; echo $$ > `+pidfile+`; exec sleep 30`)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	waitHeld(t, admin, "lead")
	// The command runs (its grant came through the proxy) before the path
	// is cut.
	var pid int
	for start := time.Now(); pid == 0; {
		b, _ := os.ReadFile(pidfile)
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		if time.Since(start) > 10*time.Second {
			t.Fatal("the command did not start")
		}
		time.Sleep(5 * time.Millisecond) // poll interval
	}
	// A lower bound of the end of the lease on the server: the time a
	// listing was sent plus the ttl left it shows. The longer its round
	// trip, the lower the bound (a busy machine's took hundreds of ms), so
	// the highest of five is kept; each is a lower bound, as an extend only
	// moves the end later.
	var leaseEnd time.Time
	for range 5 {
		sent := time.Now()
		ls, err := admin.Locks(context.Background(), "lead")
		if err != nil || len(ls.Queues) != 1 || ls.Queues[0].Entries[0].TTLLeftMs == nil {
			t.Fatalf("locks %+v, %v", ls, err)
		}
		if end := sent.Add(time.Duration(*ls.Queues[0].Entries[0].TTLLeftMs) * time.Millisecond); end.After(leaseEnd) {
			leaseEnd = end
		}
	}
	proxy.dead.Store(true)
	var died time.Time
	for {
		if processGone(pid) {
			died = time.Now()
			break
		}
		if time.Now().After(leaseEnd.Add(5 * time.Second)) {
			t.Fatal("the command was never killed")
		}
		time.Sleep(2 * time.Millisecond) // poll interval
	}
	if died.After(leaseEnd) {
		t.Fatalf("the command died %v after the server's lease ended", died.Sub(leaseEnd))
	}
	// SIGTERM was ignored: it died of the SIGKILL, kill-after after the
	// loss, which came kill-after + 100ms (+ the margin) before the end.
	if early := leaseEnd.Sub(died); early > killMargin+ttl/100+5*time.Millisecond+250*time.Millisecond {
		t.Fatalf("the command died %v before the lease ended: too early", early)
	}
	if code := exitCodeOf(t, cmd.Wait()); code != exitLost {
		t.Fatalf("exit %d, want %d; stderr: %s", code, exitLost, stderr.String())
	}
	t.Logf("dead %v before the server's lease ended", leaseEnd.Sub(died))
}

// processGone reports whether process pid no longer runs: it has exited
// and was reaped, or it is a zombie (killed; mlock run reaps it when it is
// next scheduled, which on a busy machine may be a while later). Where
// /proc does not say, only a reaped process counts.
func processGone(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return true
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && (b[i+2] == 'Z' || b[i+2] == 'X')
}

// A waiting run whose server restarts asks again (it held nothing) instead
// of failing: it gets the lock from the new server and runs the command.
func TestRunWaitSurvivesServerRestart(t *testing.T) {
	t.Parallel()
	addr, stop := servertest.Start(t, server.Config{}, "")
	uri := "mlock://" + addr
	holder(t, uri, "restart", "")
	marker := filepath.Join(t.TempDir(), "ran")
	cmd := mlockCmd("run", "--uri", uri, "--timeout", "30s", "restart", "--", "touch", marker)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	admin, err := mlock.New(uri)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	deadline := time.Now().Add(20 * time.Second) // a process on a busy machine: seconds
	// the run waits in the queue
	for {
		ls, err := admin.Locks(context.Background(), "restart")
		if err == nil && len(ls.Queues) == 1 && len(ls.Queues[0].Entries) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the run is not waiting: %+v, %v", ls, err)
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
	stop()
	servertest.Start(t, server.Config{}, addr)
	if code := exitCodeOf(t, cmd.Wait()); code != 0 {
		t.Fatalf("exit %d, want 0; stderr: %s", code, stderr.String())
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatal("the command did not run")
	}
}

// The lead is checked against the session grace too, not only the ttl: the
// client believes a lock held at most grace - margin after the last answer
// on its session, and the watchdog declares the loss the lead before that,
// so it must renew (each renewal is an answer) often enough. With a grace of
// 12 s, --ttl 40s and --kill-after 8.5s, the lock is believed held 11.875 s
// after each answer, the loss would be declared 3.275 s after it (lead
// 8.6 s), and pings come every grace/3 = 4 s, renewals every ttl/3 = 13.3 s:
// renewing only on the ttl's cadence lost the lock before the first ping.
// The watchdog renews every third of the time left (about every 1.1 s
// here), and a 13 s command, longer than the grace, runs to its end.
//
// The numbers keep that point (the loss comes sooner after an answer than
// the next ping) while a renewal may be answered up to about 2 s late:
// with a grace of 3 s and --kill-after 2s (a loss 865 ms after an answer),
// a run beside a second race-enabled test suite on two cores (load 18) was
// stalled past it and lost its session.
//
// The defaults show the same arithmetic: grace 15 s (14.845 s believed),
// ttl 60 s, kill-after 10 s (lead 10.1 s): the loss came 4.745 s after the
// last answer with pings every 5 s, so a 12 s command was stopped after
// about 4.75 s; now renewals come about every 1.6 s.
func TestRunLeadAgainstTheGrace(t *testing.T) {
	// Parallel, with the mlock command built without the race detector.
	t.Parallel()
	addr, _ := servertest.Start(t, server.Config{SessionGrace: 12 * time.Second}, "")
	uri := "mlock://" + addr
	cmd := releaseCmd(t, "run", "--uri", uri, "--ttl", "40s", "--kill-after", "8500ms", "grace", "--", "sleep", "13")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	if code := exitCodeOf(t, cmd.Wait()); code != 0 {
		t.Fatalf("exit %d after %v, want 0; stderr: %s", code, time.Since(start), stderr.String())
	}
	if d := time.Since(start); d < 13*time.Second {
		t.Fatalf("the command ended after %v", d)
	}
}

// A --kill-after that leaves no time under the server's session grace is
// refused as a usage error once the grace is known (after the first answer,
// before the lock is asked for), with the rule and the value that fits; the
// command does not run and the lock stays free.
func TestRunKillAfterAgainstTheGrace(t *testing.T) {
	// Not parallel: its bounds leave milliseconds for a round trip.
	addr, _ := servertest.Start(t, server.Config{SessionGrace: 3 * time.Second}, "")
	uri := "mlock://" + addr
	marker := filepath.Join(t.TempDir(), "ran")
	var stderr bytes.Buffer
	code := cli([]string{"run", "--uri", uri, "--ttl", "20s", "--kill-after", "2900ms", "refused", "--", "touch", marker}, &stderr, &stderr)
	want := "mlock run: --kill-after 2.9s is too long for the server's session grace 3s: kill-after + 200ms must be " +
		"below the grace less its drift margin (1% + 5ms), 2.965s; use --kill-after 2.764s or less\n"
	if code != exitUsage || stderr.String() != want {
		t.Fatalf("exit %d: %q, want exit %d: %q", code, stderr.String(), exitUsage, want)
	}
	// The value it names fits.
	stderr.Reset()
	if code := cli([]string{"run", "--uri", uri, "--ttl", "20s", "--kill-after", "2764ms", "fits", "--", "true"}, &stderr, &stderr); code != 0 {
		t.Fatalf("--kill-after 2.764s: exit %d: %s", code, stderr.String())
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the command ran")
	}
	c, err := mlock.New(uri)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.TryLock(context.Background(), "refused", nil)
	if err != nil {
		t.Fatalf("the lock was not given back: %v", err)
	}
	l.Unlock(context.Background())
}

// runCommand stopped for a loss returns an error that is errLostLock and
// wraps the loss (the context's cause).
func TestRunCommandNamesTheLoss(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancelCause(context.Background())
	loss := errors.New("test: the lease ran out")
	sigc := make(chan os.Signal, 1)
	var stderr bytes.Buffer
	errc := make(chan error, 1)
	started := filepath.Join(t.TempDir(), "started")
	go func() {
		errc <- runCommand(ctx, []string{"sh", "-c", "touch " + started + "; exec sleep 30"}, os.Environ(), sigc, 100*time.Millisecond, &stderr)
	}()
	proctest.WaitFor(t, 10*time.Second, "the command starts", func() bool { _, err := os.Stat(started); return err == nil })
	cancel(loss)
	select {
	case err := <-errc:
		if !errors.Is(err, errLostLock) || !errors.Is(err, loss) {
			t.Fatalf("runCommand = %v; want errLostLock wrapping %v", err, loss)
		}
		if !strings.Contains(stderr.String(), loss.Error()) {
			t.Fatalf("stderr: %s", stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the command was not stopped")
	}
}

// A lock lost on a provider (here Redis: the key deleted under the run) is
// said once on stderr, when the command is stopped, as on mlock://.
func TestRunProviderLossSaidOnce(t *testing.T) {
	t.Parallel()
	u := os.Getenv("REDIS_URL")
	if u == "" {
		t.Skip("REDIS_URL is not set: no Redis to lose a lock on")
	}
	o, err := goredis.ParseURL(u)
	if err != nil {
		t.Fatal(err)
	}
	rdb := goredis.NewClient(o)
	defer rdb.Close()
	key := "mlock-cli-loss-" + strconv.Itoa(os.Getpid())
	cmd := mlockCmd("run", "--uri", u, "--ttl", "3s", key, "--", "sleep", "30")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for deadline := time.Now().Add(5 * time.Second); ; {
		if n, _ := rdb.Exists(ctx, "medusa_lock:"+key).Result(); n == 1 {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("the lock was never taken")
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
	rdb.Del(ctx, "medusa_lock:"+key)
	if code := exitCodeOf(t, cmd.Wait()); code != exitLost {
		t.Fatalf("exit %d, want %d; stderr: %s", code, exitLost, stderr.String())
	}
	if got := stderr.String(); strings.Count(got, "\n") != 1 || !strings.HasPrefix(got, "mlock run: lock lost: ") ||
		!strings.HasSuffix(got, "; stopping the command\n") {
		t.Fatalf("stderr %q, want one line that says the loss and the stop", got)
	}
}

// A lock lost before the command starts (its lease declared lost while
// mlock run got ready, say) does not start the command only to stop it:
// the command never runs, and the loss is said and returned.
func TestRunCommandNotStartedAfterLoss(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancelCause(context.Background())
	loss := errors.New("test: the lease ran out")
	cancel(loss)
	marker := filepath.Join(t.TempDir(), "ran")
	var stderr bytes.Buffer
	err := runCommand(ctx, []string{"touch", marker}, os.Environ(), make(chan os.Signal, 1), time.Second, &stderr)
	if !errors.Is(err, errLostLock) || !errors.Is(err, loss) {
		t.Fatalf("runCommand = %v; want errLostLock wrapping %v", err, loss)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the command ran after the lock was lost")
	}
	if got := stderr.String(); got != "mlock run: lock lost: "+loss.Error()+"; not running the command\n" {
		t.Fatalf("stderr %q", got)
	}
}

// Without --kill-after, mlock run fits the default to the server's session
// grace (a quarter of it), so the plain command works on a server with a
// short grace.
func TestRunDefaultKillAfterFitsAShortGrace(t *testing.T) {
	// Not parallel: its bounds leave milliseconds for a round trip.
	addr, _ := servertest.Start(t, server.Config{SessionGrace: 2 * time.Second}, "")
	var stderr bytes.Buffer
	if code := cli([]string{"run", "--uri", "mlock://" + addr, "--ttl", "8s", "job", "--", "true"}, &stderr, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	stderr.Reset()
	// A grace too short for any kill-after says to lengthen the grace.
	short, _ := servertest.Start(t, server.Config{SessionGrace: 200 * time.Millisecond}, "")
	code := cli([]string{"run", "--uri", "mlock://" + short, "--ttl", "8s", "job", "--", "true"}, &stderr, &stderr)
	if code != exitError || !strings.Contains(stderr.String(), "give the server a longer --session-grace") {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
}

// A clean shutdown of the server while the command runs stops the command
// and says so: exit 75, "the server is shutting down".
func TestRunServerShutdownNamesIt(t *testing.T) {
	t.Parallel()
	addr, stop := servertest.Start(t, server.Config{}, "")
	cmd := mlockCmd("run", "--uri", "mlock://"+addr, "--ttl", "10s", "sd", "--", "sleep", "30")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	c, err := mlock.New("mlock://" + addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitHeld(t, c, "sd")
	stop()
	code := exitCodeOf(t, cmd.Wait())
	if code != exitLost || !strings.Contains(stderr.String(), "lock lost: the server is shutting down") {
		t.Fatalf("exit %d, want %d: %s", code, exitLost, stderr.String())
	}
}

// The queue of separate mlock run processes is far longer than the ttl:
// every run gets a lock it can use, runs its command whole, and no two
// commands overlap (the reproduction of a lock lost on arrival).
func TestRunQueueLongerThanTheTTL(t *testing.T) {
	// Its cases side by side, each on its own server, each run the mlock
	// command built without the race detector. Both queues are 12 s long
	// (10 runs of 1.2 s, 20 of 600 ms), three times the ttl of 4 s: the
	// last runs wait for three leases to be taken and given back. With
	// --kill-after 200ms (sh and sleep die at SIGTERM) the lead is 300 ms:
	// a lease is believed held 3.655 s after the send of its last renewal,
	// renewed every 1.333 s, so a renewal may be answered more than 2 s
	// late. With ttls of 1 s and 1.5 s (queues of 300 ms commands) runs
	// beside a second race-enabled test suite on two cores (load 18) got no
	// renewal answered in time, gave their lock up (as they must: no lock
	// is held past its end) and exited 75.
	t.Parallel()
	for _, tc := range []struct {
		n   int
		cmd string // the command's length, a sleep
	}{{10, "1.2"}, {20, "0.6"}} {
		t.Run(fmt.Sprintf("%dx%ss", tc.n, tc.cmd), func(t *testing.T) {
			t.Parallel()
			runQueue(t, tc.n, "4s", tc.cmd)
		})
	}
}

// runQueue starts n mlock run processes with ttl at once on one resource,
// each running a command of sleep seconds, and checks that all exit 0
// with their command run whole, one at a time.
func runQueue(t *testing.T, n int, ttl, sleep string) {
	uri := startServer(t)
	dir := t.TempDir()
	log := filepath.Join(dir, "sections")
	cmds := make([]*exec.Cmd, n)
	outs := make([]*bytes.Buffer, n)
	for i := range cmds {
		script := fmt.Sprintf(`echo "start %d $(date +%%s%%N)" >> %s; sleep %s; echo "end %d $(date +%%s%%N)" >> %s`, i, log, sleep, i, log)
		// --timeout: the last run waits the whole queue, 12 s, longer on a
		// busy machine.
		cmds[i] = releaseCmd(t, "run", "--uri", uri, "--ttl", ttl, "--kill-after", "200ms", "--timeout", "120s",
			"hot", "--", "sh", "-c", script)
		outs[i] = &bytes.Buffer{}
		cmds[i].Stderr = outs[i]
		if err := cmds[i].Start(); err != nil {
			t.Fatal(err)
		}
		defer cmds[i].Process.Kill()
	}
	for i, cmd := range cmds {
		if code := exitCodeOf(t, cmd.Wait()); code != 0 {
			t.Errorf("run %d: exit %d: %s", i, code, outs[i])
		}
	}
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	type ev struct {
		at    int64
		start bool
	}
	var evs []ev
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		at, _ := strconv.ParseInt(f[2], 10, 64)
		evs = append(evs, ev{at, f[0] == "start"})
	}
	if len(evs) != 2*n {
		t.Fatalf("%d section lines, want %d:\n%s", len(evs), 2*n, b)
	}
	slices.SortFunc(evs, func(a, b ev) int { return cmp.Compare(a.at, b.at) })
	in := 0
	for _, e := range evs {
		if e.start {
			in++
		} else {
			in--
		}
		if in > 1 {
			t.Fatalf("two commands ran at once:\n%s", b)
		}
	}
}

// A lock found expired only after its command exited 0 within the lease
// (the unlock, sent as the command ended, answered after the lease ran
// out: a failover of seconds) is not a lost lock: the command ran whole
// under it, and the run exits 0, not exitLost. Seen in the rolling-upgrade
// test: a run exited 75 ("lock lost: expired") after its command ran
// whole. A loss while the command ran, a lock no longer believed held when
// it ended, a release, an eviction and a shutdown still count as losses.
func TestRunExpiredAfterTheCommand(t *testing.T) {
	t.Parallel()
	expired := &mlock.Error{Type: mlock.TypeLost, Msg: "lock expired", Err: mlock.ErrExpired}
	ranOut := &mlock.Error{Type: mlock.TypeLost, Msg: "lease ran out without word from the server", Err: mlock.ErrExpired}
	old := &mlock.Error{Type: mlock.TypeLost, Msg: "lock expired or released", Err: mlock.ErrExpired}
	released := &mlock.Error{Type: mlock.TypeLost, Msg: "lock released", Err: mlock.ErrReleased}
	shutdown := &mlock.Error{Type: mlock.TypeLost, Msg: "server shutting down", Err: mlock.ErrSessionLost}
	stopped := &lostError{cause: expired}
	for _, tc := range []struct {
		name      string
		err, job  error
		heldAtEnd bool
		want      bool
	}{
		{"the unlock found it expired", expired, nil, true, true},
		{"the watchdog's end after the exit", ranOut, nil, true, true},
		{"no loss", nil, nil, true, false},
		{"not believed held at the end", expired, nil, false, false},
		{"the command was stopped", expired, stopped, true, false},
		{"the command failed", expired, exitCode(3), true, false},
		{"released", released, nil, true, false},
		{"expired or released (1.0 server)", old, nil, true, false},
		{"the server shut down", shutdown, nil, true, false},
		{"not a loss", &mlock.Error{Type: mlock.TypeConnection, Err: mlock.ErrExpired}, nil, true, false},
	} {
		if got := expiredAfterTheCommand(tc.err, tc.job, tc.heldAtEnd); got != tc.want {
			t.Errorf("%s: expiredAfterTheCommand = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// The lock's own record of its loss (Lock.Err) overrides an unlock's "lock
// expired": a release, an eviction or the session lost, learned from the
// server while the unlock was on its way, keeps the run's exit at exitLost.
func TestRunLostOtherwise(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"not lost", nil, false},
		{"its lease ended", &mlock.Error{Type: mlock.TypeLost, Msg: "lock expired", Err: mlock.ErrExpired}, false},
		{"released by its owner", &mlock.Error{Type: mlock.TypeLost, Msg: "lock released by its owner", Err: mlock.ErrReleased}, true},
		{"evicted", &mlock.Error{Type: mlock.TypeLost, Msg: "lock evicted by an administrator", Err: mlock.ErrReleased}, true},
		{"the session lost", &mlock.Error{Type: mlock.TypeLost, Msg: "session lost", Err: mlock.ErrSessionLost}, true},
	} {
		if got := lostOtherwise(tc.err); got != tc.want {
			t.Errorf("%s: lostOtherwise = %v, want %v", tc.name, got, tc.want)
		}
	}
}
