package faulttest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/internal/proctest"
)

// TestStaleMemberFenced puts a follower of a cluster at the raised version
// back on the previous release (v0.1.0, which reads log format 1 only and
// skips the commands it cannot decode, serving its clients from the state it
// diverged into), under the load of TestRollingUpgrade. It must be fenced:
// every node refuses its raft connections (its handshake says the previous
// release's version), so it is sent nothing of the log and can never be
// elected, and the leader, whose heartbeats it refuses, shows why in its
// status (or, had it reached the leader, the leader would refuse its
// forwarded commands and make it a nonvoter). The leader is then restarted,
// so that an election runs with the stale node in the cluster; then the stale
// node is put back on this build and must be a voter again. Checked as
// TestRollingUpgrade checks its history: no lock granted twice, no fencing
// token repeated or going back (the Go workers, porcupine, and the `mlock
// run` holders of both releases' mlock: their commands never overlap, their
// tokens increase). Requests through the stale node may fail; none may
// succeed wrongly.
func TestStaleMemberFenced(t *testing.T) {
	t.Parallel() // its own cluster
	if runtime.GOOS != "linux" {
		t.Skipf("SKIPPED: the stale-member test needs Linux (signals, process groups); this is %s", runtime.GOOS)
	}
	if testing.Short() {
		t.Skip("-short: builds the previous release")
	}
	oldB, newB := buildUpgradePair(t)
	t.Logf("old build: %s", oldB.desc)
	t.Logf("new build: %s", newB.desc)
	const holders = 2
	nw := workers + holders
	c := newCluster(t, newB.mlockd, clusterOptions{grace: grace, workers: nw})
	var verr error
	proctest.WaitFor(t, 30*time.Second, fmt.Sprintf("cluster version %d on every node", headLogFormat), func() bool {
		verr = c.checkVersions(len(c.nodes), headLogFormat)
		return verr == nil
	})

	h := newClusterHistory()
	start := time.Now()
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	clients := startWorkers(t, ctx, &wg, c, h, workers)
	hard, hardStop := context.WithCancel(context.Background())
	defer hardStop()
	hd := t.TempDir()
	runs := &holderRuns{}
	for k := range holders {
		bin := newB.mlock
		if k%2 == 1 {
			bin = oldB.mlock
		}
		name := fmt.Sprintf("w%d", workers+k)
		uri := fmt.Sprintf("mlock://%s:%s@%s", name, c.tokens[name], strings.Join(c.addrs(k), ","))
		wg.Add(1)
		go func() {
			defer wg.Done()
			runHolder(ctx, hard, runs, bin, uri, hd, holderScriptStopped, k)
		}()
	}
	stopLoad := loadStopper(t, stop, &wg, clients, "the load did not stop within %v: the mlock run still running are killed", hardStop)
	t.Cleanup(stopLoad)
	ev := func(what, id string) { h.addEvent(event{T: h.now(), Round: 1, Kind: "stale", What: what, Node: id}) }
	fail := func(format string, args ...any) {
		t.Helper()
		stopLoad()
		t.Fatalf(format+"\n%s", append(args, c.logTails())...)
	}

	proctest.WaitFor(t, time.Minute, "25 grants at the raised version", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.grants) >= 25
	})

	// A follower goes back to the previous release.
	l := c.waitLeader(15 * time.Second)
	if l == nil {
		fail("no leader")
	}
	var stale *node
	for _, n := range c.nodes {
		if n != l {
			stale = n
			break
		}
	}
	ev("stop", stale.id)
	if err := stale.terminate(15 * time.Second); err != nil {
		fail("%v", err)
	}
	ev("start previous release", stale.id)
	c.bin = oldB.mlockd
	if err := c.start(stale); err != nil {
		fail("starting %s on the previous release: %v", stale.id, err)
	}
	t0 := time.Now()
	// A client of the stale node alone, and an mlock run: neither may be
	// granted anything (any grant there went through the stale node).
	pinned, err := mlock.NewClient(mlock.Options{Addrs: []string{stale.addr}, Name: "obs",
		Token: mlock.Secret(c.tokens["obs"]), TTL: ttl, DialTimeout: 2 * time.Second,
		MaxBackoff: 300 * time.Millisecond, PingInterval: time.Second})
	if err != nil {
		fail("%v", err)
	}
	defer pinned.Close()
	pinnedErrs := map[string]int{}
	for range 3 {
		lctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		l, err := pinned.Lock(lctx, resources[0], &mlock.LockOptions{TTL: ttl, Timeout: time.Second})
		cancel()
		if err == nil {
			t.Errorf("the stale node %s granted a lock (token %d)", stale.id, l.Token())
			continue
		}
		pinnedErrs[err.Error()]++
	}
	t.Logf("a client of the stale node alone: %v", pinnedErrs)
	runURI := fmt.Sprintf("mlock://obs:%s@%s", c.tokens["obs"], stale.addr)
	ran := filepath.Join(hd, "pinned-ran")
	cmd := exec.Command(newB.mlock, "run", "--uri", runURI, "--ttl", "2s", "--timeout", "3s", "upg:cron", "--",
		"sh", "-c", `echo ran > "$R"`)
	cmd.Env = append(proctest.CleanEnv(), "R="+ran)
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Errorf("mlock run through the stale node alone exited 0: %s", out)
	}
	if _, serr := os.Stat(ran); serr == nil {
		t.Errorf("mlock run through the stale node alone ran its command")
	}
	t.Logf("mlock run through the stale node alone: %v: %s", err, strings.TrimSpace(string(out)))
	// The leader fences it: a nonvoter, shown stale, within a few seconds
	// (its first forwarded command is refused; at most formatFresh plus
	// announceGrace if it had no client).
	var why string
	fenced := func(want bool) func() bool {
		return func() bool {
			l := c.leader()
			if l == nil || l == stale {
				return false
			}
			st, err := l.status(time.Second)
			if err != nil || st.Cluster == nil {
				return false
			}
			for _, p := range st.Cluster.Peers {
				if p.ID == stale.id {
					why = fmt.Sprintf("%s, failing %v: %s", p.Suffrage, p.Failing, p.Stale)
					if want {
						// Refused at the raft handshake (the leader's heartbeats
						// fail), or a nonvoter (fenceStale): never elected.
						return p.Stale != "" && (p.Failing || p.Suffrage == "Nonvoter")
					}
					return p.Stale == "" && p.Suffrage == "Voter"
				}
			}
			return false
		}
	}
	proctest.WaitFor(t, 45*time.Second, stale.id+" fenced by the leader", fenced(true))
	t.Logf("%s (previous release) fenced %v after its start: %s", stale.id, time.Since(t0).Round(time.Millisecond), why)
	ev("fenced", stale.id)
	if testing.Verbose() {
		data, _ := os.ReadFile(filepath.Join(stale.dir, "mlockd.log"))
		var lines []string
		for _, l := range strings.Split(string(data), "\n") {
			if !strings.Contains(l, "does not decode") {
				lines = append(lines, l)
			}
		}
		t.Logf("the stale node's log, but the commands it skipped:\n%s", strings.Join(lines[max(0, len(lines)-60):], "\n"))
	}
	time.Sleep(3 * time.Second) // fixed: load with the stale node in the cluster, the test's input

	// An election with the stale node in the cluster: it must not win.
	l = c.waitLeader(15 * time.Second)
	if l == nil || l == stale {
		fail("leader %v with %s stale", l, stale.id)
	}
	ev("stop leader", l.id)
	if err := l.terminate(15 * time.Second); err != nil {
		fail("%v", err)
	}
	c.bin = newB.mlockd
	if err := c.start(l); err != nil {
		fail("starting %s: %v", l.id, err)
	}
	ev("leader restarted", l.id)
	proctest.WaitFor(t, 30*time.Second, "a leader after the restart, "+stale.id+" still fenced", fenced(true))
	time.Sleep(3 * time.Second) // fixed: load, the test's input
	if nl := c.leader(); nl == stale {
		fail("the stale node %s leads", stale.id)
	}

	// Back on this build: a voter again.
	ev("stop", stale.id)
	if err := stale.terminate(15 * time.Second); err != nil {
		fail("%v", err)
	}
	if err := c.start(stale); err != nil {
		fail("starting %s on this build: %v", stale.id, err)
	}
	ev("start this build", stale.id)
	t0 = time.Now()
	proctest.WaitFor(t, 30*time.Second, stale.id+" a voter again", fenced(false))
	t.Logf("%s (this build again) a voter %v after its start", stale.id, time.Since(t0).Round(time.Millisecond))
	proctest.WaitFor(t, 30*time.Second, fmt.Sprintf("cluster version %d on every node after %s came back", headLogFormat, stale.id), func() bool {
		verr = c.checkVersions(len(c.nodes), headLogFormat)
		return verr == nil
	})
	time.Sleep(settle) // fixed: load after the last change, the test's input
	elapsed := time.Since(start)
	stopLoad()
	c.stopAll()

	// The stale node was sent nothing of the log: every node refused its
	// raft connections (and said so), and it refused theirs. Nothing was
	// refused silently.
	data, _ := os.ReadFile(filepath.Join(stale.dir, "mlockd.log"))
	if n := strings.Count(string(data), "does not decode"); n > 0 {
		t.Errorf("%s (previous release) was sent %d log commands it could not decode", stale.id, n)
	}
	refusedLogged := false
	for _, n := range c.nodes {
		if n == stale {
			continue
		}
		data, _ := os.ReadFile(filepath.Join(n.dir, "mlockd.log"))
		refusedLogged = refusedLogged || strings.Contains(string(data), "a raft peer of a build that cannot read the cluster's log")
	}
	if !refusedLogged {
		t.Error("no node logged that it refused the stale node's raft connections")
	}

	ops, grants, events := h.snapshot()
	// What the stale node's clients were told.
	errs := map[string]int{}
	for _, o := range ops {
		if o.Node == stale.addr && o.Outcome != resOK && o.Outcome != resSkip && !o.AtStop {
			errs[o.Kind+" "+o.Outcome+" "+o.Err]++
		}
	}
	t.Logf("failed requests of the clients on %s: %v", stale.id, errs)
	report(t, c, 1, elapsed, ops, grants, events)
	runs.checkSafe(t, hd)
}

// checkSafe requires that the holders' commands never overlapped (exit 3)
// and that the tokens they wrote increase strictly; a run may fail
// otherwise (its node could not serve it).
func (hr *holderRuns) checkSafe(t *testing.T, dir string) {
	hr.mu.Lock()
	defer hr.mu.Unlock()
	exits := map[int]int{}
	for _, r := range hr.runs {
		exits[r.exit]++
		if r.exit != 0 {
			t.Logf("mlock run of holder %d exited %d after %v: %s", r.holder, r.exit, r.took.Round(time.Millisecond), r.out)
		}
		if r.exit == 3 {
			t.Errorf("mlock run of holder %d: its command found another holder's inside: %s", r.holder, r.out)
		}
	}
	lines := hr.tokens(t, dir)
	t.Logf("mlock run: %d runs, exit codes %v; %d commands ran, their tokens increasing", len(hr.runs), exits, lines)
	if exits[0] == 0 {
		t.Error("no mlock run succeeded")
	}
}

// tokens checks that the fencing tokens the holders' commands wrote to
// dir/tokens increase strictly, and returns how many there are.
func (hr *holderRuns) tokens(t *testing.T, dir string) int {
	data, err := os.ReadFile(filepath.Join(dir, "tokens"))
	if err != nil {
		t.Fatalf("the holders' tokens: %v", err)
	}
	var last uint64
	lines := strings.Fields(string(data))
	for i, s := range lines {
		var tok uint64
		if _, err := fmt.Sscan(s, &tok); err != nil || tok <= last {
			t.Errorf("holder token %d: %q after %d: not increasing", i, s, last)
		}
		last = tok
	}
	return len(lines)
}
