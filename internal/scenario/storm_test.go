//go:build linux

package scenario

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/internal/proctest"
	"github.com/mlock-dev/mlock/internal/protocol"
)

// stormPrograms is the storm scenario's worker (testdata/storm).
var stormPrograms = proctest.NewPrograms("./internal/scenario/testdata/storm")

// stormSources are the loopback addresses the storm's sessions come from
// (Linux routes all of 127.0.0.0/8 to lo).
var stormSources = []string{"127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"}

// TestStorm is the reconnect storm: sessions from four loopback addresses,
// each holding or waiting for a lock (two sessions per resource), see
// their server go away, and all connect again at once: one mlockd
// restarted (SIGTERM, then started again), and the leader of a 3-node
// cluster killed (SIGKILL). The storm must be ridden out with no refused
// (or evicted) handshake and no overlap; on the cluster, every session
// comes back within its grace with its lock or its place in the queue (no
// session new, no lock lost). Then every session releases: each waiter is
// granted and releases in turn. The test logs the time from the storm
// until every session is back.
//
// Short version (CI): 4 workers of 50 sessions; MLOCK_SCENARIO_LONG=1: 4
// of 500 (2 000 sessions).
func TestStorm(t *testing.T) {
	// Not parallel: its hundreds of sessions would load the machine under
	// the other scenarios, which check times believed.
	if testing.Short() {
		t.Skip("-short: skipping the user-scenario suite")
	}
	perSource, limit := 50, 90*time.Second
	if os.Getenv("MLOCK_SCENARIO_LONG") == "1" {
		perSource, limit = 500, 5*time.Minute
	}
	raiseOpenFiles(t, uint64(4*perSource*3+1000))
	mlockd := build(t).mlockd
	worker := stormPrograms.Paths(t)[0]
	t.Run("single", func(t *testing.T) {
		dir := t.TempDir()
		addr := proctest.FreeAddr(t)
		args := []string{"--data-dir", filepath.Join(dir, "data"), "--session-grace", "5s"}
		d := startDaemon(t, mlockd, dir, "mlockd", addr, args...)
		runStorm(t, worker, dir, []string{addr}, perSource, limit, false, func() {
			// A restart: the server tells its holders it is going, and
			// every session is new on the next one.
			_ = syscall.Kill(d.cmd.Process.Pid, syscall.SIGTERM)
			select {
			case <-d.done:
			case <-time.After(15 * time.Second):
				t.Errorf("mlockd did not stop on SIGTERM")
			}
			startDaemon(t, mlockd, dir, "mlockd-again", addr, args...)
		})
	})
	t.Run("cluster", func(t *testing.T) {
		tg := startCluster(t, mlockd)
		leader := clusterLeader(t, tg)
		// Every session starts on the leader: all of them connect again
		// at once when it is killed.
		addrs := []string{tg.daemons[leader].addr}
		for i, d := range tg.daemons {
			if i != leader {
				addrs = append(addrs, d.addr)
			}
		}
		runStorm(t, worker, t.TempDir(), addrs, perSource, limit, true, func() { tg.daemons[leader].stop() })
	})
}

// raiseOpenFiles raises the soft limit of open files to the hard limit if
// it is below need (the servers started later inherit it), and skips the
// test if the hard limit is below need.
func raiseOpenFiles(t *testing.T, need uint64) {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur < need && lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			t.Fatal(err)
		}
	}
	if lim.Cur < need {
		t.Skipf("open files limited to %d; the storm needs %d (raise the hard limit: ulimit -Hn)", lim.Cur, need)
	}
}

// leads asks the node at addr (its status, within 1 s) whether it leads its
// cluster; a status that fails or names another role is false. The error
// is the client's: an address it cannot take.
func leads(addr string) (bool, error) {
	c, err := mlock.New("mlock://" + addr + "?stay-on-node=1")
	if err != nil {
		return false, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	st, err := c.Status(ctx)
	cancel()
	c.Close()
	return err == nil && st.Cluster != nil && st.Cluster.Role == "leader", nil
}

// clusterLeader returns the index of the cluster's leader.
func clusterLeader(t *testing.T, tg *target) int {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		for i, d := range tg.daemons {
			ok, err := leads(d.addr)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				return i
			}
		}
		time.Sleep(100 * time.Millisecond) // poll interval
	}
	t.Fatalf("no leader:\n%s", tg.logTails())
	return -1
}

// stormWorker is one running storm worker.
type stormWorker struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   string
	done  chan struct{} // closed when the process has exited
	err   error         // its exit, once done is closed
}

// runStorm starts one worker of perSource sessions per source address
// against addrs, waits until every session holds or waits for its lock,
// runs storm, waits until every session is back, releases them all and
// checks the shared log. kept: every session must come back resumed, with
// what it held.
func runStorm(t *testing.T, bin, dir string, addrs []string, perSource int, limit time.Duration, kept bool, storm func()) {
	t.Helper()
	logPath := filepath.Join(dir, "storm.log")
	total := perSource * len(stormSources)
	var workers []*stormWorker
	for i, ip := range stormSources {
		w := &stormWorker{out: filepath.Join(dir, "worker-"+strconv.Itoa(i)+".out"), done: make(chan struct{})}
		f, err := os.Create(w.out)
		if err != nil {
			t.Fatal(err)
		}
		w.cmd = exec.Command(bin, "-addrs", strings.Join(addrs, ","), "-from", ip, "-name", "w"+strconv.Itoa(i),
			"-n", strconv.Itoa(perSource), "-log", logPath)
		w.cmd.Env = proctest.CleanEnv()
		w.cmd.Stdout, w.cmd.Stderr = f, f
		if w.stdin, err = w.cmd.StdinPipe(); err != nil {
			t.Fatal(err)
		}
		if err := w.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		f.Close()
		go func() {
			w.err = w.cmd.Wait()
			close(w.done)
		}()
		t.Cleanup(func() {
			select {
			case <-w.done:
			default:
				_ = syscall.Kill(w.cmd.Process.Pid, syscall.SIGKILL)
				<-w.done
			}
		})
		workers = append(workers, w)
	}
	deadline := time.Now().Add(limit)
	waitLog(t, logPath, deadline, "every session holding or waiting", func(ev []stormEvent) bool {
		return count(ev, "ready") == total && count(ev, "grant") == total/2
	})
	began := time.Now().UnixNano()
	storm()
	waitLog(t, logPath, deadline, "every session back", func(ev []stormEvent) bool {
		back := map[string]bool{}
		for _, e := range ev {
			if e.kind == "back" && e.at >= began {
				back[e.sid] = true
			}
		}
		return len(back) == total
	})
	ev := readStorm(t, logPath)
	var last int64
	for _, e := range ev {
		if e.kind == "back" && e.at >= began {
			last = max(last, e.at)
		}
	}
	for _, w := range workers {
		w.stdin.Close()
	}
	for i, w := range workers {
		select {
		case <-w.done:
			if w.err != nil {
				out, _ := os.ReadFile(w.out)
				t.Errorf("worker %d: %v\n%s", i, w.err, out)
			}
		case <-time.After(time.Until(deadline)):
			t.Fatalf("worker %d did not finish within %v", i, limit)
		}
	}
	ev = readStorm(t, logPath)
	r := checkStorm(ev, kept)
	t.Logf("%d sessions from %d addresses on %d node(s): all back %v after the storm; %d reconnections (%d resumed, %d new); "+
		"%d refused handshakes, %d locks lost, %d overlaps, %d tokens out of order, %d released, %d errors",
		total, len(stormSources), len(addrs), time.Duration(last-began).Round(time.Millisecond), r.back, r.resumed, r.new,
		r.refused, r.lost, r.overlaps, r.tokens, r.done, r.errors)
	t.Logf("drops by why: %v", r.drops)
	for _, p := range r.problems {
		t.Error(p)
	}
	if r.refused != 0 || r.overlaps != 0 || r.tokens != 0 || r.done != total || r.errors != 0 {
		t.Errorf("want 0 refused, 0 overlaps, 0 tokens out of order, 0 errors and %d released", total)
	}
	if kept && (r.new != 0 || r.lost != 0) {
		t.Errorf("%d sessions new and %d locks lost after the storm; want every session resumed with its lock", r.new, r.lost)
	}
}

// stormEvent is one line of the storm's log.
type stormEvent struct {
	kind, sid string
	at        int64
	args      []string
}

func readStorm(t *testing.T, path string) []stormEvent {
	t.Helper()
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var ev []stormEvent
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		w := strings.Fields(sc.Text())
		if len(w) < 3 {
			t.Fatalf("storm log: %q", sc.Text())
		}
		at, err := strconv.ParseInt(w[2], 10, 64)
		if err != nil {
			t.Fatalf("storm log: %q", sc.Text())
		}
		ev = append(ev, stormEvent{kind: w[0], sid: w[1], at: at, args: w[3:]})
	}
	slices.SortStableFunc(ev, func(a, b stormEvent) int { return int(a.at - b.at) })
	return ev
}

func count(ev []stormEvent, kind string) int {
	n := 0
	for _, e := range ev {
		if e.kind == kind {
			n++
		}
	}
	return n
}

// waitLog waits until cond holds of the log, failing at deadline.
func waitLog(t *testing.T, path string, deadline time.Time, what string, cond func([]stormEvent) bool) {
	t.Helper()
	for {
		ev := readStorm(t, path)
		if cond(ev) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not %s in time: %d ready, %d grants, %d back, %d refused, %d errors", what,
				count(ev, "ready"), count(ev, "grant"), count(ev, "back"), count(ev, "refused"), count(ev, "error"))
		}
		time.Sleep(100 * time.Millisecond) // poll interval
	}
}

// stormResult are the counts of checkStorm.
type stormResult struct {
	back, resumed, new, refused, lost, overlaps, tokens, done, errors int
	problems                                                          []string
	drops                                                             map[string]int // by why
}

// checkStorm counts the log's events and checks every resource's believed
// holds: a session believes its lock from a grant line (a resumed one's
// included) to the next drop, loss or release line of it; two sessions'
// holds of one resource must not overlap, and fencing tokens must increase
// from one holder to the next.
//
// kept: a loss is a problem (on one server a restart ends every session:
// its holders are told, and ask again).
func checkStorm(ev []stormEvent, kept bool) stormResult {
	r := stormResult{drops: map[string]int{}}
	type hold struct {
		sid        string
		start, end int64
		token      uint64
	}
	open := map[string]*hold{} // by session
	holds := map[string][]*hold{}
	res := map[string]string{}
	end := func(sid string, at int64) {
		if h := open[sid]; h != nil {
			h.end = at
			delete(open, sid)
		}
	}
	for _, e := range ev {
		switch e.kind {
		case "grant":
			tok, _ := strconv.ParseUint(e.args[0], 10, 64)
			h := &hold{sid: e.sid, start: e.at, end: -1, token: tok}
			open[e.sid] = h
			res[e.sid] = e.args[1]
			holds[e.args[1]] = append(holds[e.args[1]], h)
		case "drop", "release":
			end(e.sid, e.at)
			if e.kind == "drop" {
				r.drops[strings.Join(e.args, " ")]++
			}
		case "loss":
			end(e.sid, e.at)
			r.lost++
			if kept && r.lost <= 5 {
				r.problems = append(r.problems, fmt.Sprintf("lock lost: %s %v", e.sid, e.args))
			}
		case "back":
			r.back++
			if len(e.args) > 0 && e.args[0] == "resumed" {
				r.resumed++
			} else {
				r.new++
			}
		case "refused":
			r.refused++
			if r.refused <= 5 {
				r.problems = append(r.problems, fmt.Sprintf("handshake refused: %s %v", e.sid, e.args))
			}
		case "done":
			r.done++
		case "error":
			r.errors++
			if r.errors <= 5 {
				r.problems = append(r.problems, fmt.Sprintf("error: %s %v", e.sid, e.args))
			}
		}
	}
	for name, hs := range holds {
		for i := 1; i < len(hs); i++ {
			prev, h := hs[i-1], hs[i]
			if prev.sid == h.sid {
				continue // believed again after a resume
			}
			if prev.end < 0 || prev.end > h.start {
				r.overlaps++
				if r.overlaps <= 5 {
					r.problems = append(r.problems, fmt.Sprintf("%s: %s's hold (token %d) overlaps %s's (token %d)", name, prev.sid, prev.token, h.sid, h.token))
				}
			}
			if h.token <= prev.token {
				r.tokens++
				r.problems = append(r.problems, fmt.Sprintf("%s: token %d after %d", name, h.token, prev.token))
			}
		}
	}
	return r
}

// TestStormWorkerUnlockLost is the storm worker's unlock whose connection
// ends before the answer, as a cluster node ends a connection whose request
// it could not commit within 5 s (a starved machine): the worker connects
// again, is resumed (the server announces the lock again, which is not
// believed again) and sends the unlock again. answer is the second unlock's
// answer: "lock not exist!" (the first took effect) and "done" both end
// the session; the worker exits 0 with one release and one done, no error,
// and its drop line says the server closed the connection.
func TestStormWorkerUnlockLost(t *testing.T) {
	for _, answer := range []string{"failed lock not exist!", "success done"} {
		t.Run(strings.Fields(answer)[1], func(t *testing.T) {
			worker := stormPrograms.Paths(t)[0]
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			served := make(chan error, 1)
			go func() { served <- serveUnlockLost(ln, answer) }()
			logPath := filepath.Join(t.TempDir(), "storm.log")
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, worker, "-addrs", ln.Addr().String(), "-name", "wx", "-n", "1", "-log", logPath)
			cmd.Env = proctest.CleanEnv()
			cmd.Stdin = strings.NewReader("") // released at once: unlocked once granted
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Errorf("worker: %v\n%s", err, out)
			}
			ln.Close() // a server still waiting for a connection ends
			if err := <-served; err != nil {
				t.Errorf("server: %v", err)
			}
			ev := readStorm(t, logPath)
			var lines []string
			for _, e := range ev {
				lines = append(lines, e.kind+" "+strings.Join(e.args, " "))
			}
			said := slices.Contains(lines, "drop closed by the server") // the drop says why
			if count(ev, "error") != 0 || count(ev, "release") != 1 || count(ev, "done") != 1 || count(ev, "grant") != 1 || !said {
				t.Errorf("log: want 1 grant, 1 release, a drop closed by the server, 1 done and no error:\n%s", strings.Join(lines, "\n"))
			}
		})
	}
}

// serveUnlockLost serves the worker of TestStormWorkerUnlockLost: a
// session granted L1 (token 7); the unlock of its first connection is
// unanswered (the connection closed); the second connection resumes the
// session, announces L1 again, and answers the unlock with answer.
func serveUnlockLost(ln net.Listener, answer string) error {
	script := [][2]string{ // what is read (its first words), what is written ("" closes)
		{"connect wx-0", "connected 1.0 new 15000"},
		{"lock", "result REQ success L1|locked L1 1 7"},
		{"extend", "result REQ success 1"},
		{"unlock", ""},
		{"connect wx-0", "connected 1.0 resumed 15000|locked L1 1 7"},
		{"unlock", "result REQ " + answer},
	}
	var nc net.Conn
	var buf []byte
	for _, step := range script {
		if nc == nil {
			_ = ln.(*net.TCPListener).SetDeadline(time.Now().Add(20 * time.Second))
			c, err := ln.Accept()
			if err != nil {
				return err
			}
			nc, buf = c, nil
			defer c.Close()
			_ = nc.SetDeadline(time.Now().Add(20 * time.Second))
		}
		var p []byte
		for {
			f, n, _, err := protocol.Next(buf, protocol.MaxFrameLimit)
			if err != nil {
				return err
			}
			if n > 0 {
				p, buf = f, buf[n:]
				break
			}
			tmp := make([]byte, 4096)
			m, err := nc.Read(tmp)
			if err != nil {
				return fmt.Errorf("reading %q: %v", step[0], err)
			}
			buf = append(buf, tmp[:m]...)
		}
		if !strings.HasPrefix(string(p), step[0]) {
			return fmt.Errorf("read %q, want %q", p, step[0])
		}
		if step[1] == "" {
			nc.Close()
			nc = nil
			continue
		}
		req := strings.Fields(string(p))[1] // REQ in what is written
		for _, w := range strings.Split(strings.ReplaceAll(step[1], "REQ", req), "|") {
			if _, err := nc.Write(protocol.Append(nil, w)); err != nil {
				return err
			}
		}
	}
	return nil
}
