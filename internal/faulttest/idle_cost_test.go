package faulttest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
//	MLOCK_IDLE_FAILOVER=1          then kill the cluster's leader: every session back on the survivors within its grace

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
// With MLOCK_IDLE_FAILOVER it then kills the cluster's leader (SIGKILL):
// every session it held connects to the next node with the same session,
// which must be resumed and its lock extended, within the grace (15 s); the
// others go on pinging, each ping answered.
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
	failover := os.Getenv("MLOCK_IDLE_FAILOVER") != ""
	if d, err := time.ParseDuration(os.Getenv("MLOCK_IDLE_MEASURE")); err == nil && d > 0 {
		window = d
	}
	bin := buildMlockd(t)
	limits := []string{"--max-conns", "60000", "--max-sessions", "60000", "--max-conns-per-ip", "-1",
		"--max-unauthenticated", "-1", "--max-unauthenticated-per-ip", "-1", "--session-grace", idleGrace.String()}
	for _, f := range strings.Split(spec, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 || n > 30000 {
			t.Fatalf("MLOCK_IDLE_SESSIONS: %q", f)
		}
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			c := newCluster(t, bin, clusterOptions{grace: idleGrace, workers: 0, extra: limits})
			// One mlockd holding n connections needs n files and more: past
			// the process's limit only the cluster is measured (its nodes
			// hold a third each, half after the kill of the leader).
			var cpuOne float64
			var rssOne, failOne int64
			var lim syscall.Rlimit
			if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil && uint64(n)+1000 > lim.Max {
				t.Logf("one mlockd not measured: %d sessions need more files than the process limit (%d)", n, lim.Max)
			} else {
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

				cpuOne, rssOne, _, failOne = idleRun(t, n, []string{addr}, c.tokens["obs"], window,
					func() []int { return []int{one.Process.Pid} }, nil, nil, nil)
			}
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
			var kill func()
			fo := &failoverStats{}
			if failover {
				kill = func() {
					if l := c.leader(); l != nil {
						l.kill()
					}
				}
			}
			cpuCl, rssCl, entries, failCl := idleRun(t, n, c.addrs(0), c.tokens["obs"], window, pids, applied, kill, fo)
			perSec := float64(entries) / window.Seconds()
			if failover {
				t.Logf("after a kill of the leader: %d sessions dropped, %d back on the survivors with their lock "+
					"(the last %v after the kill), %d lost (%v)", fo.dropped.Load(), fo.back.Load(),
					time.Duration(fo.latest.Load()).Round(time.Millisecond), fo.lost.Load(), fo.firstLost.Load())
				if fo.lost.Load() > 0 || fo.back.Load() != fo.dropped.Load() || fo.dropped.Load() == 0 {
					t.Errorf("%d sessions dropped by the kill, %d back, %d lost", fo.dropped.Load(), fo.back.Load(), fo.lost.Load())
				}
				if time.Duration(fo.latest.Load()) > idleGrace {
					t.Errorf("the last session was back %v after the kill, past the grace %v",
						time.Duration(fo.latest.Load()), idleGrace)
				}
			}
			one := "one mlockd not measured"
			ratio := "—"
			if cpuOne > 0 {
				one = fmt.Sprintf("one mlockd %.1f %% of a core, RSS %d MB", 100*cpuOne, rssOne>>20)
				ratio = fmt.Sprintf("%.2f", cpuCl/cpuOne)
			}
			t.Logf("%d idle sessions, pinging every %v, over %v: %s; "+
				"cluster (3 nodes) %.1f %% of a core (ratio %s), RSS %d MB (all nodes), %d log entries (%.2f/s); "+
				"unanswered pings: %d one, %d cluster",
				n, idlePing, window, one, 100*cpuCl, ratio, rssCl>>20, entries, perSec, failOne, failCl)
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

// failoverStats follows the sessions through a kill of the leader
// (idleRun's failover): the sessions whose connection dropped, those back
// on another node with their lock (resumed, and an extend of the lock
// answered), the latest of those times after the kill, and those that
// found their session or lock gone.
type failoverStats struct {
	killed         atomic.Int64 // the kill's time (Unix ns); 0 before it
	dropped, back  atomic.Int64
	lost           atomic.Int64
	latest         atomic.Int64 // ns after the kill
	firstLost      atomic.Value
	failoverActive atomic.Bool
}

// idleWorkerSessions is the most sessions one client process holds in
// idleRun: the process file limit here is 20 000 (hard), and a process
// holding 20 000 connections would reach it.
const idleWorkerSessions = 5000

// idleRun opens n sessions over addrs (round robin), each locking its own
// resource (ttl 60 s) and then pinging every idlePing, staggered; the
// sessions are spread over ceil(n/idleWorkerSessions) client processes (the
// test binary again, TestIdleWorker), so that none holds more than
// idleWorkerSessions connections. After a warm-up of one ping round it
// measures window: the CPU of the processes pids returns (cores), their RSS
// at the end (bytes), and the log entries applied meanwhile (applied: nil
// for one node). It returns the pings not answered within 10 s too. With
// kill set (a cluster), it then kills the leader and follows the sessions
// back (fo).
func idleRun(t *testing.T, n int, addrs []string, tok string, window time.Duration, pids func() []int,
	applied func() uint64, kill func(), fo *failoverStats) (cpu float64, rss int64, entries uint64, unanswered int64) {
	t.Helper()
	if fo == nil {
		fo = &failoverStats{}
	}
	start := time.Now().Add(time.Second)
	k := (n + idleWorkerSessions - 1) / idleWorkerSessions // none for 0 sessions: the idle servers alone
	workers := make([]*idleWorker, 0, k)
	defer func() {
		for _, w := range workers {
			w.stop(t)
		}
	}()
	for j := range k {
		lo, hi := j*n/k, (j+1)*n/k
		w, err := startIdleWorker(idleWorkerSpec{N: n, Lo: lo, Hi: hi, Addrs: addrs, Token: tok, Start: start.UnixNano()})
		if err != nil {
			t.Fatalf("client process %d: %v", j, err)
		}
		workers = append(workers, w)
	}
	sum := func() (s idleStat) {
		for _, w := range workers {
			x := w.snapshot()
			s.Ready += x.Ready
			s.Failed += x.Failed
			s.Dropped += x.Dropped
			s.Back += x.Back
			s.Lost += x.Lost
			s.Latest = max(s.Latest, x.Latest)
			if s.FirstErr == "" {
				s.FirstErr = x.FirstErr
			}
			if s.FirstLost == "" {
				s.FirstLost = x.FirstLost
			}
		}
		return s
	}
	all := func(cmd string) {
		for _, w := range workers {
			if err := w.do(cmd); err != nil {
				t.Fatalf("client process: %s: %v", cmd, err)
			}
		}
	}
	deadline := time.Now().Add(3 * time.Minute)
	for s := sum(); s.Ready < int64(n) && time.Now().Before(deadline) && s.Failed == 0; s = sum() {
		time.Sleep(100 * time.Millisecond) // polled: the sessions' setup
	}
	if s := sum(); s.Ready < int64(n) {
		t.Fatalf("%d of %d sessions set up (%d failed: %v)", s.Ready, n, s.Failed, s.FirstErr)
	}
	time.Sleep(idlePing) // fixed: a round of pings before the window
	all("reset")
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
	var each []string
	for _, p := range pids() {
		r := procRSS(p)
		rss += r
		each = append(each, fmt.Sprintf("%d MB", r>>20))
	}
	t.Logf("%d sessions over %d client processes: RSS per server process %s", n, k, strings.Join(each, ", "))
	if kill != nil {
		killed := time.Now().UnixNano()
		all("failover " + strconv.FormatInt(killed, 10))
		fo.killed.Store(killed)
		kill()
		// Every dropped session back or lost, within the grace and more.
		end := time.Now().Add(idleGrace + 15*time.Second)
		for time.Now().Before(end) {
			time.Sleep(200 * time.Millisecond) // polled: the sessions move on their own
			if s := sum(); s.Dropped > 0 && s.Back+s.Lost == s.Dropped &&
				time.Since(time.Unix(0, killed)) > 2*idlePing {
				break
			}
		}
	}
	for _, w := range workers {
		w.stop(t)
	}
	s := sum()
	if s.FirstErr != "" {
		t.Logf("first failure: %v", s.FirstErr)
	}
	fo.dropped.Store(s.Dropped)
	fo.back.Store(s.Back)
	fo.lost.Store(s.Lost)
	fo.latest.Store(s.Latest)
	if s.FirstLost != "" {
		fo.firstLost.Store(s.FirstLost)
	}
	return (c1 - c0) / window.Seconds(), rss, entries, s.Failed
}

// idleWorkerSpec is what one client process of idleRun runs: sessions
// Lo to Hi-1 of N, over Addrs, staggered from Start (Unix ns).
type idleWorkerSpec struct {
	N, Lo, Hi int
	Addrs     []string
	Token     string
	Start     int64
}

// idleStat is a client process's counts, as it writes them on its stdout
// (one JSON object a line).
type idleStat struct {
	Ready, Failed, Dropped, Back, Lost int64
	Latest                             int64 // ns from the kill to the last session back
	FirstErr, FirstLost                string
	Ack                                string // the command this line answers, if any
}

// idleWorker is a client process of idleRun, driven by lines on its stdin:
// "reset" (the unanswered pings counted from 0), "failover T" (the leader
// is killed at T, Unix ns: a dropped session moves to the next node) and
// "stop"; each answered by a line of its counts with Ack set.
type idleWorker struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	mu    sync.Mutex
	last  idleStat
	acks  chan string
	done  chan struct{}
	ended bool
}

func startIdleWorker(spec idleWorkerSpec) (*idleWorker, error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestIdleWorker$", "-test.count", "1", "-test.timeout", "0")
	cmd.Env = append(os.Environ(), "MLOCK_IDLE_WORKER="+string(b))
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	w := &idleWorker{cmd: cmd, in: in, acks: make(chan string, 4), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var s idleStat
			if json.Unmarshal(sc.Bytes(), &s) != nil {
				continue // the test framework's own lines
			}
			w.mu.Lock()
			w.last = s
			w.mu.Unlock()
			if s.Ack != "" {
				w.acks <- s.Ack
			}
		}
	}()
	return w, nil
}

func (w *idleWorker) snapshot() idleStat {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last
}

// do sends cmd and waits for its answer (at most a minute).
func (w *idleWorker) do(cmd string) error {
	if _, err := io.WriteString(w.in, cmd+"\n"); err != nil {
		return err
	}
	select {
	case a := <-w.acks:
		if a != strings.Fields(cmd)[0] {
			return fmt.Errorf("answered %q", a)
		}
		return nil
	case <-w.done:
		return errors.New("the process ended")
	case <-time.After(time.Minute):
		return errors.New("no answer in a minute")
	}
}

// stop ends the process's sessions and waits for it (its last counts kept);
// a second call does nothing.
func (w *idleWorker) stop(t *testing.T) {
	if w.ended {
		return
	}
	w.ended = true
	if err := w.do("stop"); err != nil {
		t.Errorf("client process: stop: %v", err)
		_ = w.cmd.Process.Kill()
	}
	_ = w.in.Close()
	<-w.done
	_ = w.cmd.Wait()
}

// TestIdleWorker is a client process of TestIdleSessionsCost (idleRun),
// run by it with MLOCK_IDLE_WORKER set; skipped without it.
func TestIdleWorker(t *testing.T) {
	env := os.Getenv("MLOCK_IDLE_WORKER")
	if env == "" {
		t.Skip("a client process of TestIdleSessionsCost")
	}
	var spec idleWorkerSpec
	if err := json.Unmarshal([]byte(env), &spec); err != nil || spec.N <= 0 || spec.Lo < 0 || spec.Hi > spec.N ||
		spec.Lo >= spec.Hi || len(spec.Addrs) == 0 {
		t.Fatalf("MLOCK_IDLE_WORKER: %q (%v)", env, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var failed, ready atomic.Int64
	var firstErr atomic.Value
	fo := &failoverStats{}
	start := time.Unix(0, spec.Start)
	var outMu sync.Mutex
	write := func(ack string) {
		s := idleStat{Ready: ready.Load(), Failed: failed.Load(), Dropped: fo.dropped.Load(), Back: fo.back.Load(),
			Lost: fo.lost.Load(), Latest: fo.latest.Load(), Ack: ack}
		if e, ok := firstErr.Load().(error); ok {
			s.FirstErr = e.Error()
		}
		if l, ok := fo.firstLost.Load().(string); ok {
			s.FirstLost = l
		}
		b, _ := json.Marshal(s)
		outMu.Lock()
		defer outMu.Unlock()
		_, _ = os.Stdout.Write(append(b, '\n'))
	}
	cmds := make(chan string)
	go func() {
		defer close(cmds)
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			cmds <- sc.Text()
		}
	}()
	for i := spec.Lo; i < spec.Hi; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			first := start.Add(time.Duration(i) * idlePing / time.Duration(spec.N))
			if err := idleSession(ctx, spec.Addrs, spec.Token, i, first, &ready, &failed, fo); err != nil {
				firstErr.CompareAndSwap(nil, err)
			}
		}()
		if k := i - spec.Lo; k%100 == 99 {
			// Connects in waves, at most 200 in their handshake at once
			// in this process: a busy machine must not time them out.
			dl := time.Now().Add(30 * time.Second)
			for ready.Load()+failed.Load() < int64(k+1-200) && time.Now().Before(dl) {
				time.Sleep(10 * time.Millisecond) // polled: the sessions' setup
			}
			write("")
		}
	}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			write("")
		case c, ok := <-cmds:
			f := strings.Fields(c)
			switch {
			case !ok || len(f) == 0 || f[0] == "stop":
				cancel()
				wg.Wait()
				write("stop")
				return
			case f[0] == "reset":
				failed.Store(0)
				write("reset")
			case f[0] == "failover" && len(f) == 2:
				ns, err := strconv.ParseInt(f[1], 10, 64)
				if err != nil {
					t.Fatalf("failover: %v", err)
				}
				fo.killed.Store(ns)
				fo.failoverActive.Store(true)
				write("failover")
			default:
				t.Fatalf("unknown command %q", c)
			}
		}
	}
}

// idleGrace is the servers' session grace in TestIdleSessionsCost.
const idleGrace = 15 * time.Second

// idleSession is one idle session: connect, lock, then a ping every
// idlePing from first, each answered within 10 s (else counted in failed).
// Once fo.failoverActive, a dropped connection connects to the next
// address with the same session, which must be resumed and its lock
// extended (counted in fo).
func idleSession(ctx context.Context, addrs []string, tok string, i int, first time.Time, ready, failed *atomic.Int64, fo *failoverStats) error {
	sid := fmt.Sprintf("idle-%d-%d", i, time.Now().UnixNano())
	at := i % len(addrs)
	var (
		nc  net.Conn // written under mu (read here without it)
		mu  sync.Mutex
		end bool // guarded by mu: ctx ended
	)
	setConn := func(c net.Conn) {
		mu.Lock()
		nc = c
		if end {
			c.Close()
		}
		mu.Unlock()
	}
	defer func() {
		if nc != nil {
			nc.Close()
		}
	}()
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		end = true
		if nc != nil {
			nc.Close()
		}
		mu.Unlock()
	})
	defer stop()
	var buf, rbuf []byte
	var last error
	// next returns the next frame.
	next := func() (string, bool) {
		_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		for {
			p, n, _, err := protocol.Next(rbuf, protocol.MaxFrameLimit)
			if err == nil && n > 0 {
				rbuf = rbuf[n:]
				return string(p), true
			}
			tmp := make([]byte, 512)
			m, err := nc.Read(tmp)
			if err != nil {
				last = fmt.Errorf("%w (after %v)", err, last)
				return "", false
			}
			rbuf = append(rbuf, tmp[:m]...)
		}
	}
	read := func(want string) (string, bool) {
		for {
			p, ok := next()
			if !ok {
				return "", false
			}
			if strings.HasPrefix(p, want) {
				return p, true
			}
			last = fmt.Errorf("%q while waiting for %q", p, want)
		}
	}
	send := func(fields ...string) bool {
		buf = protocol.Append(buf[:0], fields...)
		_ = nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
		_, err := nc.Write(buf)
		return err == nil
	}
	dial := func() (string, bool) {
		c, err := net.DialTimeout("tcp", addrs[at], 10*time.Second)
		if err != nil {
			last = err
			return "", false
		}
		setConn(c)
		rbuf = nil
		if ctx.Err() != nil {
			return "", false
		}
		if !send("connect", sid, "1.0", "auth=obs:"+tok) {
			return "", false
		}
		return read("connected")
	}
	var id string
	if _, ok := dial(); !ok || !send("lock", "1", fmt.Sprintf("idle:%d", i), "60000", "0", "0") {
		if ctx.Err() == nil {
			failed.Add(1)
		}
		return last
	}
	if p, ok := read("result 1 success "); ok {
		id = strings.Fields(p)[3]
	}
	if _, ok := read("locked " + id); id == "" || !ok {
		if ctx.Err() == nil {
			failed.Add(1)
		}
		return last
	}
	ready.Add(1)
	due := first
	for k := 2; ; k++ {
		for !due.After(time.Now()) {
			due = due.Add(idlePing)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Until(due)):
		}
		req := strconv.Itoa(k)
		if send("ping", req) {
			if _, ok := read("result " + req + " success pong"); ok {
				continue
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		if !fo.failoverActive.Load() {
			failed.Add(1)
			return last
		}
		// The node is gone (killed) or closed the connection: the next
		// one, the same session.
		fo.dropped.Add(1)
		nc.Close()
		lost := func(why string) error {
			fo.lost.Add(1)
			fo.firstLost.CompareAndSwap(nil, why)
			return nil
		}
		resumed := false
		for try := 0; try < 30 && ctx.Err() == nil; try++ {
			at = (at + 1) % len(addrs)
			p, ok := dial()
			if !ok {
				if nc != nil {
					nc.Close()
				}
				time.Sleep(200 * time.Millisecond) // fixed: the retry's pause
				continue
			}
			if !strings.HasPrefix(p, "connected 1.0 resumed") {
				return lost(fmt.Sprintf("session %s: %q", sid, p))
			}
			resumed = true
			break
		}
		if !resumed {
			return lost(fmt.Sprintf("session %s: no node took it back: %v", sid, last))
		}
		if !send("extend", "e"+req, id, "60000") {
			return lost(fmt.Sprintf("session %s: extend not sent", sid))
		}
		if p, ok := read("result e" + req + " "); !ok || !strings.HasPrefix(p, "result e"+req+" success") {
			return lost(fmt.Sprintf("session %s: extend answered %q (%v)", sid, p, last))
		}
		d := time.Now().UnixNano() - fo.killed.Load()
		for {
			old := fo.latest.Load()
			if d <= old || fo.latest.CompareAndSwap(old, d) {
				break
			}
		}
		fo.back.Add(1)
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
