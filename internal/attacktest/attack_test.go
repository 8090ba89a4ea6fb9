//go:build linux

package attacktest

import (
	"bufio"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
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

	"github.com/mlock-dev/mlock/internal/proctest"

	"go.uber.org/goleak"

	"github.com/mlock-dev/mlock/internal/protocol"
)

func TestMain(m *testing.M) {
	if os.Getenv("MLOCK_ATTACKER") != "" {
		os.Exit(attackerMain())
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

const (
	attackConns = 4000
	// What an attack may add to the healthy client's slowest connect, over
	// what it gets without one: the promise of a connect within a second.
	maxConnect = time.Second
	// maxPing is the longest wait for a ping's pong: every ping is answered
	// (the ping p99 is logged, a figure for docs/security.md, not asserted:
	// on a busy machine it measures the machine).
	maxPing = 5 * time.Second
	// maxGrowth is the bound of docs/security.md on what the pre-handshake
	// pool can make mlockd's resident memory grow by, with the defaults:
	// --max-unauthenticated (1000) connections of about 10.4 KB each, times
	// 3 for the garbage collector's headroom and the stacks and buffers of
	// evicted connections not yet reused.
	maxGrowth = 3 * 1000 * 10_400
)

// duration is how long each attack lasts.
func duration() time.Duration {
	if long() {
		return 30 * time.Second
	}
	return 4 * time.Second
}

func long() bool { return os.Getenv("MLOCK_ATTACK_LONG") != "" }

// authTimeout is mlockd's --auth-timeout in the tests: the default (5 s)
// in the long version; 3 s in the short one, so that within its 4 s every
// attacker connection is closed (at the end of its auth timeout, refused
// ones included) and opened again.
func authTimeout() time.Duration {
	if long() {
		return 5 * time.Second
	}
	return 3 * time.Second
}

// raiseNoFile raises the soft limit of open files to the hard limit (the
// servers started later inherit it), and skips the test if it stays below
// what the attack and the servers need.
func raiseNoFile(t *testing.T) {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			t.Fatal(err)
		}
	}
	if need := uint64(2*attackConns + 2000); lim.Cur < need {
		t.Skipf("open files limited to %d; the attack needs %d (raise the hard limit: ulimit -Hn)", lim.Cur, need)
	}
}

// programs is ./cmd/mlockd built without -race (see proctest.Programs).
var programs = proctest.NewPrograms("./cmd/mlockd")

func mlockdBin(t *testing.T) string {
	t.Helper()
	return programs.Paths(t)[0]
}

// proc is a running mlockd.
type proc struct {
	cmd  *exec.Cmd
	addr string
	log  string
}

// startMlockd starts bin with args listening on addr and waits until it
// accepts connections. It is killed by its process id when the test ends.
func startMlockd(t *testing.T, bin, dir, addr string, args ...string) *proc {
	t.Helper()
	logPath := filepath.Join(dir, "mlockd-"+strings.ReplaceAll(addr, ":", "-")+".log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, append([]string{"--listen", addr, "--log-level", "warn"}, args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, addr: addr, log: logPath}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		f.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("mlockd %s log (last 4 KB):\n%s", addr, tail(b, 4096))
		}
	})
	for deadline := time.Now().Add(15 * time.Second); ; {
		nc, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			nc.Close()
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("mlockd on %s did not start: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond) // poll interval
	}
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// rss returns the resident memory of process pid in bytes (Linux).
func rss(pid int) (int64, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmRSS")
}

// authFile writes an auth file with the principal app and returns its
// path and app's token.
func authFile(t *testing.T, dir string) (string, string) {
	t.Helper()
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	tok := hex.EncodeToString(b)
	sum := sha256.Sum256([]byte(tok))
	path := filepath.Join(dir, "auth")
	if err := os.WriteFile(path, []byte("app sha256:"+hex.EncodeToString(sum[:])+" prefix=*\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path, tok
}

// attackerMain is the attacker's process (this test binary with
// MLOCK_ATTACKER set): it holds and reopens MLOCK_ATTACK_CONNS connections
// to MLOCK_ATTACK_ADDR from the addresses of MLOCK_ATTACK_IPS (comma
// separated), half silent, half sending a connect without credentials,
// for MLOCK_ATTACK_FOR and until it has opened MLOCK_ATTACK_CONNS
// connections (at most attackMore longer), then prints how many it opened
// and how many dials failed, and exits attackTail later. It is a process
// of its own so that the healthy client, in the test's process, competes
// with it for the CPU as a client on another machine would not, but is not
// queued behind its goroutines; once every worker has dialled, it lowers
// its own priority (see lowerPriority).
func attackerMain() int {
	addr := os.Getenv("MLOCK_ATTACK_ADDR")
	ips := strings.Split(os.Getenv("MLOCK_ATTACK_IPS"), ",")
	n, err1 := strconv.Atoi(os.Getenv("MLOCK_ATTACK_CONNS"))
	d, err2 := time.ParseDuration(os.Getenv("MLOCK_ATTACK_FOR"))
	if err1 != nil || err2 != nil || addr == "" {
		fmt.Fprintln(os.Stderr, "attacker: bad settings")
		return 2
	}
	var opened, failed atomic.Uint64
	for i := range n {
		go attackWorker(addr, ips[i%len(ips)], i%2 == 1, i, &opened, &failed)
	}
	// Under way once every worker has dialled.
	for opened.Load()+failed.Load() < uint64(n) {
		time.Sleep(5 * time.Millisecond) // poll interval: the workers' counters
	}
	lowerPriority()
	fmt.Println(underWay)
	began := time.Now()
	time.Sleep(d) // fixed: the attack's least duration, the test's input
	// A count under a bound of minutes, not a rate: how fast a process at
	// a low priority opens connections measures the machine.
	for opened.Load() < uint64(n) && time.Since(began) < d+attackMore {
		time.Sleep(5 * time.Millisecond) // poll interval: the workers' counters
	}
	fmt.Printf("%d %d\n", opened.Load(), failed.Load())
	time.Sleep(attackTail) // fixed: the attack goes on while the test stops measuring
	return 0
}

const (
	// attackMore is how much longer than its duration an attack may last
	// to open its count of connections.
	attackMore = 2 * time.Minute
	// attackTail is how long the attack goes on after its counts.
	attackTail = 300 * time.Millisecond
)

// lowerPriority gives every thread of the process the nice value 10: an
// attacker on a machine of its own does not take the server's processor;
// here it shares the test's. Linux keeps a nice value per thread (a
// process id names its first thread only), and a thread started later
// takes its starter's. Before its first burst of dials it runs at the
// test's priority: at 10, beside a busy machine's other processes, it got
// too little of the CPU to dial 4 000 times in minutes.
func lowerPriority() {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		fmt.Fprintln(os.Stderr, "attacker priority:", err)
		return
	}
	for _, task := range tasks {
		if tid, err := strconv.Atoi(task.Name()); err == nil {
			if err := syscall.Setpriority(syscall.PRIO_PROCESS, tid, 10); err != nil {
				fmt.Fprintln(os.Stderr, "attacker priority:", err)
			}
		}
	}
}

// attackWorker holds one connection at a time and opens another as soon as
// the server closes it, for ever (its process exits).
func attackWorker(addr, ip string, connect bool, i int, opened, failed *atomic.Uint64) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 2 * time.Second}
	frame := protocol.Append(nil, "connect attacker-"+strconv.Itoa(i)+" 1.0")
	buf := make([]byte, 512)
	for {
		nc, err := d.Dial("tcp", addr)
		if err != nil {
			failed.Add(1)
			time.Sleep(20 * time.Millisecond) // the attacker's back-off after a failed dial
			continue
		}
		opened.Add(1)
		if connect {
			_, _ = nc.Write(frame)
		}
		for {
			if _, err := nc.Read(buf); err != nil {
				break
			}
		}
		nc.Close()
	}
}

// attacker is a running attacker process.
type attacker struct {
	cmd *exec.Cmd
	out attackerOutput
}

// underWay is the attacker's first line: every worker has dialled.
const underWay = "under way"

// attackerOutput is the attacker's standard output; underWay is closed
// when its first line has come, counted when its second (the counts) has.
type attackerOutput struct {
	mu       sync.Mutex
	b        strings.Builder
	underWay chan struct{}
	counted  chan struct{}
}

func (o *attackerOutput) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	lines := strings.Count(o.b.String(), "\n")
	o.b.Write(p)
	now := strings.Count(o.b.String(), "\n")
	if lines < 1 && now >= 1 && strings.HasPrefix(o.b.String(), underWay+"\n") {
		close(o.underWay)
	}
	if lines < 2 && now >= 2 {
		close(o.counted)
	}
	return len(p), nil
}

func (o *attackerOutput) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}

// attack starts an attacker process against addr from ips for at least d
// and until it has opened n connections.
func attack(t *testing.T, addr string, ips []string, n int, d time.Duration) *attacker {
	t.Helper()
	a := &attacker{cmd: exec.Command(os.Args[0], "-test.run=^$")}
	a.out.underWay, a.out.counted = make(chan struct{}), make(chan struct{})
	a.cmd.Env = append(os.Environ(), "MLOCK_ATTACKER=1", "MLOCK_ATTACK_ADDR="+addr, "MLOCK_ATTACK_IPS="+strings.Join(ips, ","),
		"MLOCK_ATTACK_CONNS="+strconv.Itoa(n), "MLOCK_ATTACK_FOR="+d.String())
	a.cmd.Stdout, a.cmd.Stderr = &a.out, os.Stderr
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if a.cmd.ProcessState == nil {
			_ = a.cmd.Process.Kill()
			_ = a.cmd.Wait()
		}
	})
	return a
}

// end waits for the attacker to finish and returns how many connections it
// opened and how many dials failed.
func (a *attacker) end(t *testing.T) (opened, failed uint64) {
	t.Helper()
	if err := a.cmd.Wait(); err != nil {
		t.Fatalf("attacker: %v", err)
	}
	if _, err := fmt.Sscan(strings.TrimPrefix(a.out.String(), underWay+"\n"), &opened, &failed); err != nil {
		t.Fatalf("attacker output %q: %v", a.out.String(), err)
	}
	return opened, failed
}

// healthy is what the healthy client saw during an attack.
type healthy struct {
	connects []time.Duration
	pings    []time.Duration
	errs     []string
}

// frameReader reads frames from a connection.
type frameReader struct {
	nc  net.Conn
	buf []byte
}

func (r *frameReader) next(by time.Time) (string, error) {
	_ = r.nc.SetReadDeadline(by)
	for {
		p, n, _, err := protocol.Next(r.buf, protocol.MaxFrameLimit)
		if err != nil {
			return "", err
		}
		if n > 0 {
			s := string(p)
			r.buf = r.buf[n:]
			return s, nil
		}
		var tmp [4096]byte
		m, err := r.nc.Read(tmp[:])
		r.buf = append(r.buf, tmp[:m]...)
		if err != nil {
			return "", err
		}
	}
}

// connectApp connects to addr as the principal app and returns the time to
// its connected.
func connectApp(addr, sid, tok string) (net.Conn, *frameReader, time.Duration, error) {
	t0 := time.Now()
	nc, err := net.DialTimeout("tcp", addr, 3*time.Second)
	if err != nil {
		return nil, nil, 0, err
	}
	r := &frameReader{nc: nc}
	if _, err := nc.Write(protocol.Append(nil, "connect "+sid+" 1.0 auth=app:"+tok)); err != nil {
		nc.Close()
		return nil, nil, 0, err
	}
	p, err := r.next(t0.Add(3 * time.Second))
	d := time.Since(t0)
	if err == nil && !strings.HasPrefix(p, "connected ") {
		err = fmt.Errorf("answer %q", p)
	}
	if err != nil {
		nc.Close()
		return nil, nil, d, err
	}
	return nc, r, d, nil
}

// measure runs the healthy client against addr until stop: a connection
// that pings without pause, and a connect every 100 ms.
func measure(addr, tok string, stop <-chan struct{}) *healthy {
	h := &healthy{}
	var mu sync.Mutex
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(h.errs) < 10 {
			h.errs = append(h.errs, fmt.Sprintf(format, args...))
		}
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		nc, r, _, err := connectApp(addr, "pinger", tok)
		if err != nil {
			fail("the pinging client's connect: %v", err)
			return
		}
		defer nc.Close()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			req := "p" + strconv.Itoa(i)
			t0 := time.Now()
			if _, err := nc.Write(protocol.Append(nil, "ping "+req)); err != nil {
				fail("ping: %v", err)
				return
			}
			p, err := r.next(t0.Add(maxPing))
			if err != nil || p != "result "+req+" success pong" {
				fail("ping %s: %q %v", req, p, err)
				return
			}
			mu.Lock()
			h.pings = append(h.pings, time.Since(t0))
			mu.Unlock()
		}
	}()
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			nc, _, d, err := connectApp(addr, "reconnect-"+strconv.Itoa(i), tok)
			mu.Lock()
			h.connects = append(h.connects, d)
			mu.Unlock()
			if err != nil {
				fail("connect %d after %v: %v", i, d, err)
				continue
			}
			nc.Close()
		}
	}()
	wg.Wait()
	return h
}

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// runAttack attacks target (whose process is pid) from ips while the
// healthy client measures, and checks what it saw and mlockd's memory.
func runAttack(t *testing.T, target string, pid int, tok string, ips []string) {
	t.Helper()
	// The machine's own latency, without the attack: the goal is what the
	// attack may add to it (a p99 over a second varies by tens of ms on a
	// busy machine, with or without an attack).
	// No attack of a test running beside this one is under way meanwhile.
	phases.enter(false)
	calm := make(chan struct{})
	time.AfterFunc(time.Second, func() { close(calm) })
	before := measure(target, tok, calm)
	// The memory of the server serving the healthy client (on a cluster
	// node its sessions go through the log), without the attack.
	base, err := rss(pid)
	phases.leave()
	if err != nil {
		t.Fatal(err)
	}
	connectGoal := percentile(before.connects, 1) + maxConnect
	t.Logf("under attack: every ping answered within %v, every connect within %v (without an attack, plus %v)",
		maxPing, connectGoal, maxConnect)
	phases.enter(true)
	defer phases.leave()
	began := time.Now()
	a := attack(t, target, ips, attackConns, duration())
	select {
	case <-a.out.underWay:
	case <-time.After(2 * time.Minute):
		// A bound of minutes: a machine busy with other tests (80 buyer
		// processes of the fenced sale, say) gave the attacker too little
		// of the CPU for 4 000 dials in 20 s.
		t.Fatalf("the attacker did not get under way: %q", a.out.String())
	}
	// The server has taken the first burst in: a connect dialled after
	// every attacker's is answered (the listener accepts in order).
	if nc, _, d, err := connectApp(target, "probe", tok); err != nil {
		t.Logf("a connect after the attack's first burst: %v after %v", err, d)
	} else {
		nc.Close()
	}
	stop := make(chan struct{})
	var peak atomic.Int64
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			if m, err := rss(pid); err == nil && m > peak.Load() {
				peak.Store(m)
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	var h *healthy
	done := make(chan struct{})
	go func() { h = measure(target, tok, stop); close(done) }()
	// The measurement window: the attack, from its first burst until it
	// has lasted duration() and opened its count of connections.
	select {
	case <-a.out.counted:
	case <-time.After(duration() + attackMore + time.Minute):
		t.Errorf("the attacker did not end within %v: %q", duration()+attackMore+time.Minute, a.out.String())
	}
	close(stop)
	<-done
	<-sampled
	opened, failed := a.end(t)
	lasted := time.Since(began)

	growth := peak.Load() - base
	t.Logf("without an attack: %d connects, max %v; %d pings, p50 %v, p99 %v", len(before.connects),
		percentile(before.connects, 1), len(before.pings), percentile(before.pings, 0.5), percentile(before.pings, 0.99))
	t.Logf("attack from %d address(es), %v: %d attacker connections opened (%.0f/s), %d dials failed; "+
		"healthy client: %d connects, max %v, p99 %v; %d pings, p50 %v, p99 %v, max %v; mlockd RSS %d MB idle, peak %d MB (+%.1f MB, bound %.1f MB)",
		len(ips), duration(), opened, float64(opened)/lasted.Seconds(), failed,
		len(h.connects), percentile(h.connects, 1), percentile(h.connects, 0.99),
		len(h.pings), percentile(h.pings, 0.5), percentile(h.pings, 0.99), percentile(h.pings, 1),
		base>>20, peak.Load()>>20, float64(growth)/1e6, float64(maxGrowth)/1e6)
	if nc, r, _, err := connectApp(target, "counter", tok); err == nil {
		_, _ = nc.Write(protocol.Append(nil, "status s"))
		if p, err := r.next(time.Now().Add(5 * time.Second)); err == nil {
			if i := strings.Index(p, `"limits":`); i >= 0 {
				t.Logf("mlockd's limits after the attack: %.700s", p[i:])
			}
		}
		nc.Close()
	}
	for _, e := range h.errs {
		t.Error(e)
	}
	if opened < attackConns {
		// The attacker goes on until it has (at most attackMore more).
		t.Errorf("the attacker opened only %d connections in %v", opened, lasted)
	}
	if len(h.connects) == 0 || percentile(h.connects, 1) > connectGoal {
		t.Errorf("healthy connects: %d, slowest %v; want each within %v", len(h.connects), percentile(h.connects, 1), connectGoal)
	}
	// Every ping was answered within maxPing (measure records any that was
	// not in h.errs); the pinger ran the whole window.
	if len(h.pings) == 0 {
		t.Errorf("healthy pings: none answered")
	}
	if growth > maxGrowth {
		t.Errorf("mlockd's resident memory grew by %d bytes under the attack; the documented bound is %d", growth, maxGrowth)
	}
}

// loopbacks returns 127.0.0.2 to 127.0.0.(1+n).
func loopbacks(n int) []string {
	var ips []string
	for i := range n {
		ips = append(ips, "127.0.0."+strconv.Itoa(2+i))
	}
	return ips
}

// phases keeps apart the calm seconds and the attacks of the two tests,
// which run side by side (each against its own servers; the long version,
// whose figures docs/security.md reports, runs them one after the other): a
// calm second, each goal's base, never overlaps an attack, while the calm
// seconds may overlap each other, and the attacks each other.
var phases phaseLock

// phaseLock is held by any number of holders of one phase at a time.
type phaseLock struct {
	mu     sync.Mutex
	cond   *sync.Cond
	attack bool // the phase of the holders, while n > 0
	n      int
}

// enter waits until no holder of the other phase is left, then holds p in
// the phase attack (true) or calm (false).
func (p *phaseLock) enter(attack bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cond == nil {
		p.cond = sync.NewCond(&p.mu)
	}
	for p.n > 0 && p.attack != attack {
		p.cond.Wait()
	}
	p.attack = attack
	p.n++
}

func (p *phaseLock) leave() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n--; p.n == 0 {
		p.cond.Broadcast()
	}
}

// parallel runs t beside the other attack test, except in the long version.
func parallel(t *testing.T) {
	if !long() {
		t.Parallel()
	}
}

// An attacker from one address, then one spread over 50, against one
// mlockd with an auth file and the default limits.
func TestAttackSingleNode(t *testing.T) {
	parallel(t)
	raiseNoFile(t)
	bin := mlockdBin(t)
	dir := t.TempDir()
	file, tok := authFile(t, dir)
	p := startMlockd(t, bin, dir, proctest.FreeAddr(t), "--auth-file", file, "--data-dir", "none", "--quiet-period", "0",
		"--auth-timeout", authTimeout().String())
	t.Run("one address", func(t *testing.T) { runAttack(t, p.addr, p.cmd.Process.Pid, tok, loopbacks(1)) })
	t.Run("50 addresses", func(t *testing.T) { runAttack(t, p.addr, p.cmd.Process.Pid, tok, loopbacks(50)) })
}

// The same attacks against one node (a follower) of a three-node cluster.
func TestAttackClusterNode(t *testing.T) {
	parallel(t)
	raiseNoFile(t)
	bin := mlockdBin(t)
	dir := t.TempDir()
	file, tok := authFile(t, dir)
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("attack-test-cluster-secret-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	type nodeAddrs struct{ id, client, raft string }
	var nodes []nodeAddrs
	var peers []string
	for i := range 3 {
		n := nodeAddrs{id: "n" + strconv.Itoa(i+1), client: proctest.FreeAddr(t), raft: proctest.FreeAddr(t)}
		nodes = append(nodes, n)
		peers = append(peers, n.id+"="+n.raft)
	}
	var procs []*proc
	for _, n := range nodes {
		nd := filepath.Join(dir, n.id)
		procs = append(procs, startMlockd(t, bin, dir, n.client, "--auth-file", file,
			"--cluster-id", n.id, "--raft-addr", n.raft, "--raft-dir", filepath.Join(nd, "raft"),
			"--data-dir", filepath.Join(nd, "data"), "--cluster-peers", strings.Join(peers, ","),
			"--cluster-secret-file", secret, "--auth-timeout", authTimeout().String()))
	}
	// Wait until the last node serves a session (the cluster has a leader).
	target := procs[2]
	for deadline := time.Now().Add(20 * time.Second); ; {
		nc, _, _, err := connectApp(target.addr, "probe", tok)
		if err == nil {
			nc.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cluster node does not serve: %v", err)
		}
		time.Sleep(100 * time.Millisecond) // poll interval
	}
	t.Run("one address", func(t *testing.T) { runAttack(t, target.addr, target.cmd.Process.Pid, tok, loopbacks(1)) })
	t.Run("50 addresses", func(t *testing.T) { runAttack(t, target.addr, target.cmd.Process.Pid, tok, loopbacks(50)) })
}
