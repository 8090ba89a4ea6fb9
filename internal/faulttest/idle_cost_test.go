package faulttest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/internal/proctest"
	"github.com/mlock-dev/mlock/internal/protocol"
)

// Environment:
//
//	MLOCK_IDLE_SESSIONS=N[,N...]   run TestIdleSessionsCost with N sessions (skipped without it)
//	MLOCK_IDLE_MEASURE=D           the measured window (default 20s)

// idlePing is how often an idle session pings (an idle Go client holding a
// lock of ttl 60 s with a grace of 15 s pings every 5 s).
const idlePing = 5 * time.Second

// TestIdleSessionsCost measures what idle sessions cost: N sessions, each
// its own connection holding one lock (ttl 60 s) and pinging every 5 s, on
// one mlockd and then spread over a 3-node cluster; over the measured
// window, the servers' CPU (user + system, all processes) and RSS, and the
// cluster's log entries per second. It requires every ping answered and at
// most 5 entries per second on the cluster; the CPU is reported as the
// cluster's ratio to one node's, measured in the same run (docs/benchmarks.md).
//
//	MLOCK_IDLE_SESSIONS=2000 go test ./internal/faulttest/ -run TestIdleSessionsCost -v -count=1
func TestIdleSessionsCost(t *testing.T) {
	spec := os.Getenv("MLOCK_IDLE_SESSIONS")
	if spec == "" {
		t.Skip("a measurement: set MLOCK_IDLE_SESSIONS=2000 (or a list, 1000,10000) to run it")
	}
	if runtime.GOOS != "linux" {
		t.Skipf("SKIPPED: it reads /proc; this is %s", runtime.GOOS)
	}
	window := 20 * time.Second
	if d, err := time.ParseDuration(os.Getenv("MLOCK_IDLE_MEASURE")); err == nil && d > 0 {
		window = d
	}
	bin := buildMlockd(t)
	limits := []string{"--max-conns", "60000", "--max-sessions", "60000", "--max-conns-per-ip", "-1",
		"--max-unauthenticated", "-1", "--max-unauthenticated-per-ip", "-1", "--session-grace", "15s"}
	for _, f := range strings.Split(spec, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 || n > 30000 {
			t.Fatalf("MLOCK_IDLE_SESSIONS: %q", f)
		}
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			c := newCluster(t, bin, clusterOptions{grace: 15 * time.Second, workers: 0, extra: limits})
			auth := filepath.Join(c.dir, "auth")
			addr := proctest.FreeAddr(t)
			one := exec.Command(bin, append([]string{"--listen", addr, "--auth-file", auth, "--status-rate", "-1",
				"--data-dir", filepath.Join(c.dir, "one"),
				"--log-level", "warn"}, limits...)...)
			one.Env = proctest.CleanEnv()
			one.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			oneLog, err := os.Create(filepath.Join(c.dir, "one.log"))
			if err != nil {
				t.Fatal(err)
			}
			one.Stdout, one.Stderr = oneLog, oneLog
			if err := one.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = one.Process.Kill(); _, _ = one.Process.Wait() })
			waitListening(t, addr)

			cpuOne, rssOne, _, failOne := idleRun(t, n, []string{addr}, c.tokens["obs"], window,
				func() []int { return []int{one.Process.Pid} }, nil)
			pids := func() []int {
				var ps []int
				for _, nd := range c.nodes {
					nd.mu.Lock()
					if nd.cmd != nil {
						ps = append(ps, nd.cmd.Process.Pid)
					}
					nd.mu.Unlock()
				}
				return ps
			}
			applied := func() uint64 {
				var m uint64
				for _, nd := range c.nodes {
					if st, err := nd.status(2 * time.Second); err == nil && st.Cluster != nil {
						m = max(m, st.Cluster.AppliedIndex)
					}
				}
				return m
			}
			cpuCl, rssCl, entries, failCl := idleRun(t, n, c.addrs(0), c.tokens["obs"], window, pids, applied)
			perSec := float64(entries) / window.Seconds()
			t.Logf("%d idle sessions, pinging every %v, over %v: one mlockd %.1f %% of a core, RSS %d MB; "+
				"cluster (3 nodes) %.1f %% of a core (ratio %.2f), RSS %d MB (all nodes), %d log entries (%.2f/s); "+
				"unanswered pings: %d one, %d cluster",
				n, idlePing, window, 100*cpuOne, rssOne>>20, 100*cpuCl, cpuCl/cpuOne, rssCl>>20, entries, perSec, failOne, failCl)
			if failOne > 0 || failCl > 0 {
				t.Errorf("unanswered pings: %d on one node, %d on the cluster", failOne, failCl)
			}
			if perSec > 5 {
				t.Errorf("%.2f log entries per second from idle sessions, want at most 5", perSec)
			}
		})
	}
}

func waitListening(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if nc, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
			nc.Close()
			return
		}
		time.Sleep(20 * time.Millisecond) // poll interval
	}
	t.Fatalf("nothing listens on %s", addr)
}

// idleRun opens n sessions over addrs (round robin), each locking its own
// resource (ttl 60 s) and then pinging every idlePing, staggered; after a
// warm-up of one ping round it measures window: the CPU of the processes
// pids returns (cores), their RSS at the end (bytes), and the log entries
// applied meanwhile (applied: nil for one node). It returns the pings not
// answered within 10 s too.
func idleRun(t *testing.T, n int, addrs []string, tok string, window time.Duration, pids func() []int,
	applied func() uint64) (cpu float64, rss int64, entries uint64, unanswered int64) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var failed, ready atomic.Int64
	var firstErr atomic.Value
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := idleSession(ctx, addrs[i%len(addrs)], tok, i, start.Add(time.Duration(i)*idlePing/time.Duration(n)), &ready, &failed); err != nil {
				firstErr.CompareAndSwap(nil, err)
			}
		}()
		if i%200 == 199 {
			time.Sleep(50 * time.Millisecond) // fixed: connects in waves, not 20 000 at once
		}
	}
	deadline := time.Now().Add(2 * time.Minute)
	for ready.Load() < int64(n) && time.Now().Before(deadline) && failed.Load() == 0 {
		time.Sleep(100 * time.Millisecond) // polled: the sessions' setup
	}
	if ready.Load() < int64(n) {
		cancel()
		wg.Wait()
		t.Fatalf("%d of %d sessions set up (%d failed: %v)", ready.Load(), n, failed.Load(), firstErr.Load())
	}
	time.Sleep(idlePing) // fixed: a round of pings before the window
	failed.Store(0)
	c0 := procCPU(t, pids())
	var a0 uint64
	if applied != nil {
		a0 = applied()
	}
	time.Sleep(window) // fixed: the measured window, the measurement's input
	c1 := procCPU(t, pids())
	if applied != nil {
		entries = applied() - a0
	}
	for _, p := range pids() {
		rss += procRSS(p)
	}
	unanswered = failed.Load()
	cancel()
	wg.Wait()
	return (c1 - c0) / window.Seconds(), rss, entries, unanswered
}

// idleSession is one idle session: connect, lock, then a ping every
// idlePing from first, each answered within 10 s (else counted in failed).
func idleSession(ctx context.Context, addr, tok string, i int, first time.Time, ready, failed *atomic.Int64) error {
	nc, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		failed.Add(1)
		return err
	}
	defer nc.Close()
	go func() { <-ctx.Done(); nc.Close() }()
	buf := make([]byte, 0, 256)
	var rbuf []byte
	var last error
	read := func(want string) bool {
		_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		for {
			p, n, _, err := protocol.Next(rbuf, protocol.MaxFrameLimit)
			if err == nil && n > 0 {
				rbuf = rbuf[n:]
				if strings.HasPrefix(string(p), want) {
					return true
				}
				last = fmt.Errorf("%q while waiting for %q", p, want)
				continue
			}
			tmp := make([]byte, 512)
			m, err := nc.Read(tmp)
			if err != nil {
				last = fmt.Errorf("%w (after %v) waiting for %q", err, last, want)
				return false
			}
			rbuf = append(rbuf, tmp[:m]...)
		}
	}
	send := func(fields ...string) bool {
		buf = protocol.Append(buf[:0], fields...)
		_ = nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
		_, err := nc.Write(buf)
		return err == nil
	}
	if !send("connect", fmt.Sprintf("idle-%d-%d", i, time.Now().UnixNano()), "1.0", "auth=obs:"+tok) || !read("connected") ||
		!send("lock", "1", fmt.Sprintf("idle:%d", i), "60000", "0", "0") || !read("locked") {
		if ctx.Err() == nil {
			failed.Add(1)
		}
		return last
	}
	ready.Add(1)
	next := first
	for k := 2; ; k++ {
		for !next.After(time.Now()) {
			next = next.Add(idlePing)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Until(next)):
		}
		req := strconv.Itoa(k)
		if !send("ping", req) || !read("result "+req+" success pong") {
			if ctx.Err() == nil {
				failed.Add(1)
				return last
			}
			return nil
		}
	}
}

// procCPU returns the user + system CPU seconds of the processes.
func procCPU(t *testing.T, pids []int) float64 {
	t.Helper()
	var s float64
	for _, p := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
		u, _ := strconv.ParseFloat(f[11], 64)
		k, _ := strconv.ParseFloat(f[12], 64)
		s += (u + k) / 100 // clock ticks (USER_HZ 100)
	}
	return s
}

// procRSS returns the resident set of a process in bytes.
func procRSS(p int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			f := strings.Fields(l)
			if len(f) >= 2 {
				kb, _ := strconv.ParseInt(f[1], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}
