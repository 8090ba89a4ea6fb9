package faulttest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/internal/proctest"
	"github.com/mlock-dev/mlock/internal/testenv"
)

// The previous release: the tag, and its commit for a clone without tags.
const (
	prevTag    = "v0.1.0"
	prevCommit = "1fa2ca2"
)

// The rolling-upgrade run. MLOCK_UPGRADE_LONG=1 runs the long one.
type upgradePlan struct {
	loadBefore int           // load on the old cluster before the first replacement: grants to the workers
	mixedFor   time.Duration // load on a mixed cluster after each replacement but the last
	restarts   int           // rounds of restarting every node, one at a time, on the new build
	holders    int           // mlock run holders, half of HEAD's mlock, half of the previous release's
}

func upgradePlanFromEnv() upgradePlan {
	if on, _ := strconv.ParseBool(os.Getenv("MLOCK_UPGRADE_LONG")); on {
		return upgradePlan{loadBefore: 150, mixedFor: 60 * time.Second, restarts: 3, holders: 4}
	}
	return upgradePlan{loadBefore: 25, mixedFor: 3 * time.Second, restarts: 1, holders: 2}
}

// build is one build's programs and where they come from.
type build struct {
	mlockd, mlock string
	desc          string // version and commit
}

// TestRollingUpgrade starts a 3-node cluster on the previous release's
// mlockd, puts the workload of TestClusterFaults and `mlock run` holders
// (HEAD's mlock and the previous release's) on it, replaces one node at a
// time with HEAD's mlockd (SIGTERM, then the new program on the same
// directories and addresses), then restarts every node once more, one at a
// time. While old and new builds run side by side the cluster version must
// stay 1 (the new builds write no format 2 command, and the old ones never
// meet one they cannot decode); once the last node runs the new build it
// must reach 2. The whole history is checked as TestClusterFaults checks
// its own (safety, linearizability with porcupine); a failed request is
// allowed only when its own timeout elapsed (or a lock found lost near a
// fault, see failedRequests), and every `mlock run` must
// exit 0 (a lost lock only near a fault, once per holder and round: see
// holderLease), its commands never overlapping, their fencing tokens
// increasing.
//
// The previous release is the tag v0.1.0, or its commit 1fa2ca2 in a clone
// without tags; without either (a shallow clone) the test is skipped, or
// fails under CI=true.
func TestRollingUpgrade(t *testing.T) {
	t.Parallel() // its own cluster
	if runtime.GOOS != "linux" {
		t.Skipf("SKIPPED: the rolling-upgrade test needs Linux (signals, process groups); this is %s", runtime.GOOS)
	}
	if testing.Short() {
		t.Skip("-short: builds the previous release")
	}
	plan := upgradePlanFromEnv()
	oldB, newB := buildUpgradePair(t)
	t.Logf("old build: %s", oldB.desc)
	t.Logf("new build: %s", newB.desc)

	nw := workers + plan.holders // principals: the workers', then the holders'
	c := newCluster(t, oldB.mlockd, clusterOptions{grace: grace, workers: nw})
	for _, n := range c.nodes {
		st, err := n.status(2 * time.Second)
		if err != nil || st.Cluster == nil {
			t.Fatalf("%s: status: %v", n.id, err)
		}
		if st.Cluster.LogFormat != 0 || st.Cluster.Version != 0 {
			t.Fatalf("%s announces log format %d, cluster version %d: not the previous release (it announces none)",
				n.id, st.Cluster.LogFormat, st.Cluster.Version)
		}
	}
	h := newClusterHistory()
	start := time.Now()

	// The Go workers.
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	clients := startWorkers(t, ctx, &wg, c, h, workers)

	// The mlock run holders, all on one resource. At the end each finishes
	// its run; hard ends those still running 20 s later (SIGKILL by pid).
	hard, hardStop := context.WithCancel(context.Background())
	defer hardStop()
	hd := t.TempDir()
	runs := &holderRuns{}
	for k := range plan.holders {
		bin := newB.mlock
		if k%2 == 1 {
			bin = oldB.mlock
		}
		name := fmt.Sprintf("w%d", workers+k)
		uri := fmt.Sprintf("mlock://%s:%s@%s", name, c.tokens[name], strings.Join(c.addrs(k), ","))
		wg.Add(1)
		go func() {
			defer wg.Done()
			runHolderLease(ctx, hard, runs, bin, uri, hd, holderScriptStopped, k, holderLease...)
		}()
	}
	stopLoad := loadStopper(t, stop, &wg, clients, "the load did not stop within %v: the mlock run still running are killed", hardStop)
	t.Cleanup(stopLoad)

	round := 0
	replace := func(n *node, bin, kind string) {
		t.Helper()
		round++
		if err := c.replace(h, n, bin, newB.mlock, round, kind); err != nil {
			stopLoad()
			t.Fatalf("round %d (%s of %s): %v\n%s", round, kind, n.id, err, c.logTails())
		}
	}

	proctest.WaitFor(t, time.Minute, fmt.Sprintf("%d grants on the old cluster", plan.loadBefore), func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.grants) >= plan.loadBefore
	})
	for i, n := range c.nodes {
		replace(n, newB.mlockd, "upgrade")
		if i == len(c.nodes)-1 {
			break
		}
		// Mixed: the version stays 1 on every new node for as long as the
		// load runs. Halfway, the leader is restarted on its own build, so
		// that the leadership moves between the builds.
		mixed := func(d time.Duration) int {
			checks := 0
			for deadline := time.Now().Add(d); time.Now().Before(deadline); checks++ {
				if err := c.checkVersions(i+1, 1); err != nil {
					stopLoad()
					t.Fatalf("mixed cluster (%d of %d nodes upgraded): %v", i+1, len(c.nodes), err)
				}
				time.Sleep(250 * time.Millisecond) // the check's interval: status has no event to wait on
			}
			return checks
		}
		checks := mixed(plan.mixedFor / 2)
		was := c.leader()
		if was == nil {
			stopLoad()
			t.Fatalf("mixed cluster: no leader\n%s", c.logTails())
		}
		wasBin := oldB.mlockd
		if c.index(was) <= i {
			wasBin = newB.mlockd
		}
		replace(was, wasBin, "mixed-leader-restart")
		checks += mixed(plan.mixedFor - plan.mixedFor/2)
		now, nowID := c.leader(), "none"
		if now != nil {
			nowID = now.id
		}
		t.Logf("mixed cluster, %d of %d nodes on the new build: cluster version 1 on every new node, %d checks in %v; "+
			"leader %s (%s build) restarted, leader now %s (%s build)", i+1, len(c.nodes), checks, plan.mixedFor,
			was.id, c.buildOf(was, i), nowID, c.buildOf(now, i))
	}
	// Every member reads this build's formats now: each says so within
	// 10 s, and the leader raises the version.
	upgradedAt := time.Now()
	var verr error
	proctest.WaitFor(t, 30*time.Second, fmt.Sprintf("cluster version %d on every node", headLogFormat), func() bool {
		verr = c.checkVersions(len(c.nodes), headLogFormat)
		return verr == nil
	})
	t.Logf("cluster version %d on every node %v after the last node was upgraded", headLogFormat, time.Since(upgradedAt).Round(time.Millisecond))
	for r := range plan.restarts {
		for _, n := range c.nodes {
			replace(n, newB.mlockd, fmt.Sprintf("restart-%d", r+1))
			if err := c.checkVersions(len(c.nodes), headLogFormat); err != nil {
				t.Errorf("after restarting %s: %v", n.id, err)
			}
		}
	}
	time.Sleep(settle) // fixed: load after the last restart, the test's input
	elapsed := time.Since(start)
	stopLoad()
	c.stopAll()

	// The old nodes never met a command they could not decode.
	c.checkLogs(t, "does not decode")

	ops, grants, events := h.snapshot()
	report(t, c, round, elapsed, ops, grants, events)
	failedRequests(t, ops, events)
	runs.check(t, hd, h, events)
}

// checkLogs fails t if a node's log holds any of unread (the words of a
// log command it could not read), or says it fenced a member: no member of
// this build is taken for one that cannot read the cluster version
// (docs/cluster.md, "Stale members").
func (c *cluster) checkLogs(t *testing.T, unread ...string) {
	t.Helper()
	for _, n := range c.nodes {
		data, _ := os.ReadFile(filepath.Join(n.dir, "mlockd.log"))
		for _, w := range unread {
			if strings.Contains(string(data), w) {
				t.Errorf("%s met a log command it could not read (%q):\n%s", n.id, w, c.logTails())
			}
		}
		if strings.Contains(string(data), "a member cannot read what the cluster writes") ||
			strings.Contains(string(data), "a forwarded command refused") {
			t.Errorf("%s fenced a member:\n%s", n.id, c.logTails())
		}
	}
}

// index returns n's position in c.nodes (the order of the upgrade).
func (c *cluster) index(n *node) int {
	return slices.Index(c.nodes, n)
}

// buildOf names n's build while the nodes up to c.nodes[last] run the new
// one.
func (c *cluster) buildOf(n *node, last int) string {
	if n == nil {
		return "none"
	}
	if c.index(n) <= last {
		return "new"
	}
	return "old"
}

// replace stops n with SIGTERM, starts bin on its directories and
// addresses, and waits until n has caught up with the leader and the
// cluster is healthy.
func (c *cluster) replace(h *clusterHistory, n *node, bin, cli string, round int, kind string) error {
	ev := func(what string, id string) {
		h.addEvent(event{T: h.now(), Round: round, Kind: kind, What: what, Node: id})
	}
	ev("stop", n.id)
	t0 := time.Now()
	if err := n.terminate(15 * time.Second); err != nil {
		return err
	}
	stopped := time.Since(t0)
	ev("start", n.id)
	c.bin = bin
	if err := c.start(n); err != nil {
		return fmt.Errorf("starting %s: %v", n.id, err)
	}
	l, err := c.waitHealthy(20 * time.Second)
	if err != nil {
		return err
	}
	index, vs, err := c.waitCaughtUp(cli, n, 20*time.Second)
	if err != nil {
		return err
	}
	ev("healthy, leader", l.id)
	c.t.Logf("round %d %s: %s stopped by SIGTERM in %v, started, caught up with leader %s at index %d %v after the stop; %s",
		round, kind, n.id, stopped.Round(time.Millisecond), l.id, index, time.Since(t0).Round(time.Millisecond), versions(vs))
	return nil
}

// terminate sends SIGTERM to n's process and waits (at most d) for its
// exit; a process still running then is killed, and that is an error.
func (n *node) terminate(d time.Duration) error {
	n.mu.Lock()
	done := n.done
	n.mu.Unlock()
	if done == nil || !n.signal(syscall.SIGTERM) {
		return fmt.Errorf("%s is not running", n.id)
	}
	select {
	case <-done:
		return nil
	case <-time.After(d):
		n.kill()
		return fmt.Errorf("%s did not exit within %v of SIGTERM", n.id, d)
	}
}

// statusView is one node's entry in `mlock cluster status --json`.
type statusView struct {
	Addr    string               `json:"addr"`
	Cluster *mlock.StatusCluster `json:"cluster"`
	Lag     *uint64              `json:"lag"`
	Error   string               `json:"error"`
}

// clusterStatus runs `mlock cluster status --json` (cli is the mlock
// program) on every node, as the obs principal.
func (c *cluster) clusterStatus(cli string) ([]statusView, error) {
	uri := fmt.Sprintf("mlock://obs:%s@%s", c.tokens["obs"], strings.Join(c.addrs(0), ","))
	cmd := exec.Command(cli, "cluster", "status", "--json", "--timeout", "2s", "--uri", uri)
	cmd.Env = proctest.CleanEnv()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("mlock cluster status: %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	var vs []statusView
	if err := json.Unmarshal(out, &vs); err != nil {
		return nil, fmt.Errorf("mlock cluster status --json: %v: %s", err, out)
	}
	return vs, nil
}

// waitCaughtUp runs `mlock cluster status` until it exits 0 (every node
// answered, a leader is known) and n has applied the leader's commit index
// of its first answer; it returns that index and the last answer.
func (c *cluster) waitCaughtUp(cli string, n *node, d time.Duration) (uint64, []statusView, error) {
	deadline := time.Now().Add(d)
	var want uint64
	for {
		vs, err := c.clusterStatus(cli)
		if err == nil {
			for _, v := range vs {
				if want == 0 && v.Cluster != nil && v.Cluster.Role == "leader" {
					want = v.Cluster.CommitIndex
				}
			}
			for _, v := range vs {
				if want != 0 && v.Cluster != nil && v.Cluster.ID == n.id && v.Cluster.AppliedIndex >= want {
					return want, vs, nil
				}
			}
		}
		if time.Now().After(deadline) {
			return 0, nil, fmt.Errorf("%s has not applied index %d within %v (%v)", n.id, want, d, err)
		}
		time.Sleep(100 * time.Millisecond) // poll interval: status has no event to wait on
	}
}

// versions summarises an answer of mlock cluster status: each node's
// cluster version and log format ("-": not announced, the previous
// release).
func versions(vs []statusView) string {
	dash := func(n int) string {
		if n == 0 {
			return "-"
		}
		return strconv.Itoa(n)
	}
	var b []string
	for _, v := range vs {
		if v.Cluster != nil {
			b = append(b, fmt.Sprintf("%s version %s format %s", v.Cluster.ID, dash(v.Cluster.Version), dash(v.Cluster.LogFormat)))
		}
	}
	return strings.Join(b, ", ")
}

// headLogFormat is the highest log format this build reads (server's
// logFormat): 2 typed requests, 3 locks with deadlines, 4 the builds that
// apply a rollback's lowering.
const headLogFormat = 4

// checkVersions asks every node for its status: the first upgraded ones
// must say they read log format headLogFormat and run at cluster version want; the
// others (the previous release) announce neither. The leader, if new,
// must list the formats its members said.
func (c *cluster) checkVersions(upgraded, want int) error {
	for i, n := range c.nodes {
		st, err := n.status(2 * time.Second)
		if err != nil || st.Cluster == nil {
			return fmt.Errorf("%s: status: %v", n.id, err)
		}
		cl := st.Cluster
		if cl.Halted != "" {
			return fmt.Errorf("%s halted: %s", n.id, cl.Halted)
		}
		if i >= upgraded {
			if cl.LogFormat != 0 {
				return fmt.Errorf("%s (previous release) says it reads log format %d", n.id, cl.LogFormat)
			}
			continue
		}
		if cl.LogFormat != headLogFormat {
			return fmt.Errorf("%s (new build) says it reads log format %d, want %d", n.id, cl.LogFormat, headLogFormat)
		}
		if cl.Version != want {
			return fmt.Errorf("%s: cluster version %d, want %d (%d of %d nodes upgraded)", n.id, cl.Version, want, upgraded, len(c.nodes))
		}
	}
	return nil
}

// failedRequests fails the test on a failed request of the workers whose
// own timeout did not elapse: a lock whose wait timed out on the server
// (timeout) or whose context ended (ctx-deadline) may fail, and a held
// lock may be found lost (an extend or unlock answered lost, or an unlock
// whose lease ran out on its way) near a fault, once per worker and round (the lease is 2 s: a failover, whose in-flight
// requests were answered up to 3.5 s after the stop on a busy machine, can
// outlast it), nothing else.
func failedRequests(t *testing.T, ops []op, events []event) {
	windows := faultWindows(events, holderLossNear)
	used := map[[2]int]bool{} // worker, round: its loss near the round's fault
	var timedOut, other int
	for _, o := range ops {
		if o.AtStop || o.Outcome == resOK || o.Outcome == resSkip {
			continue
		}
		if o.Kind == opLock && (o.Outcome == resFail && strings.HasPrefix(o.Err, string(mlock.TypeTimeout)) ||
			strings.Contains(o.Err, "ctx-deadline")) {
			timedOut++
			continue
		}
		// An unlock whose lease ran out while it was on its way (a
		// failover longer than what was left of the lease) has an
		// unknown outcome: it is the same loss, bounded the same way.
		lostUnlock := o.Kind == opUnlock && o.Outcome == resUnknown && strings.HasPrefix(o.Err, string(mlock.TypeLost))
		if (o.Kind == opExtend || o.Kind == opUnlock) && o.Outcome == resLost || lostUnlock {
			end := o.Return
			if lostUnlock {
				end = o.Observed
			}
			if round, ok := windows.first(o.Call, end, func(round int) bool {
				return !used[[2]int{o.Worker, round}]
			}); ok {
				used[[2]int{o.Worker, round}] = true
				t.Logf("lock found lost near round %d's fault: %v", round, o)
				continue
			}
		}
		other++
		if other <= 20 {
			t.Errorf("failed request, its own timeout not elapsed: %v", o)
		}
	}
	t.Logf("failed requests: %d whose own timeout elapsed, %d locks found lost near a fault (bound: one per worker "+
		"and round), %d others", timedOut, len(used), other)
	if other > 20 {
		t.Errorf("... %d failed requests in all, their own timeout not elapsed", other)
	}
}

// holderRuns records the mlock run holders' runs.
type holderRuns struct {
	mu   sync.Mutex
	runs []holderRun // guarded by mu
}

type holderRun struct {
	holder int
	exit   int
	start  time.Time
	took   time.Duration
	out    string
}

// The rolling tests' holders: holderLease is their lease, holderLossNear
// how long after a round's cluster is healthy again a loss (a holder's, or
// a worker's lock found lost) still counts as the round's fault,
// holderExitLost mlock run's exit status of a lost lock.
//
// A lease of 6 s outlasts a failover (the in-flight requests of a stopped
// leader were answered up to 3.5 s later on a busy machine): with 2 s, an
// unlock sent as the command ended was answered after the lease ran out
// (exit 75: mlock run took that for a loss; the previous release's still
// does). --kill-after 200ms (sh and sleep die at SIGTERM) keeps the lead
// at 300 ms, so the session grace (3 s) leaves 2.665 s after each answer
// before the lock is given up. A run can still lose its lock while a node
// is stopped and the cluster elects a leader (no answer for longer than
// that): allowed near a fault, once per holder and round; never away from
// one.
var holderLease = []string{"--ttl", "6s", "--kill-after", "200ms"}

const (
	holderLossNear = 2 * grace
	holderLookBack = 6 * time.Second // holderLease's ttl: a loss follows its cause by less
	holderExitLost = 75
)

// holderScriptStopped is the command of the `mlock run` holders: it fails
// (exit 3) if another holder's command is inside, appends its fencing
// token to $D/tokens, and leaves when it is stopped (SIGTERM: mlock run
// found its lock lost), as a job should: the next holder's command must
// not find it inside.
const holderScriptStopped = `mkdir "$D/held" || exit 3; trap 'rmdir "$D/held"; exit 143' TERM; echo "$MLOCK_TOKEN" >> "$D/tokens"; ` +
	`sleep 0.2 & wait $!; rmdir "$D/held"`

// runHolder runs `mlock run` of script on upg:cron in a loop until ctx
// ends (a run is killed only when hard ends).
func runHolder(ctx, hard context.Context, runs *holderRuns, bin, uri, dir, script string, k int) {
	runHolderLease(ctx, hard, runs, bin, uri, dir, script, k, "--ttl", "2s")
}

// runHolderLease is runHolder with the lease flags of mlock run given.
func runHolderLease(ctx, hard context.Context, runs *holderRuns, bin, uri, dir, script string, k int, lease ...string) {
	for ctx.Err() == nil {
		args := append([]string{"run", "--uri", uri}, lease...)
		args = append(args, "--timeout", "60s",
			"--owner", fmt.Sprintf("holder-%d-%d", k, time.Now().UnixNano()), "upg:cron", "--", "sh", "-c", script)
		cmd := exec.CommandContext(hard, bin, args...)
		cmd.Env = append(proctest.CleanEnv(), "D="+dir)
		t0 := time.Now()
		out, err := cmd.CombinedOutput()
		r := holderRun{holder: k, start: t0, took: time.Since(t0), out: strings.TrimSpace(string(out))}
		var ee *exec.ExitError
		switch {
		case err == nil:
		case errors.As(err, &ee):
			r.exit = ee.ExitCode()
		default:
			r.exit, r.out = -1, err.Error()
		}
		runs.mu.Lock()
		runs.runs = append(runs.runs, r)
		runs.mu.Unlock()
	}
}

// check requires every run to have exited 0, but for a lost lock (exit
// holderExitLost, "lock lost") during a fault's window, at most once per
// holder and round (see holderLease), and the tokens its commands wrote to
// increase strictly.
func (hr *holderRuns) check(t *testing.T, dir string, h *clusterHistory, events []event) {
	hr.mu.Lock()
	defer hr.mu.Unlock()
	windows := faultWindows(events, holderLossNear)
	used := map[[2]int]bool{} // holder, round: its loss near the round's fault
	bad := 0
	var longest time.Duration
	for _, r := range hr.runs {
		longest = max(longest, r.took)
		if r.exit == 0 {
			continue
		}
		if r.exit == holderExitLost && strings.Contains(r.out, "lock lost") {
			// The loss came at most a lease before the run's end (the
			// last answer was at most that long before it): only that
			// part of the run, not its wait for the lock, meets a fault.
			end := r.start.Add(r.took)
			from := r.start
			if b := end.Add(-holderLookBack); b.After(from) {
				from = b
			}
			if round, ok := windows.first(h.at(from), h.at(end), func(round int) bool {
				return !used[[2]int{r.holder, round}]
			}); ok {
				used[[2]int{r.holder, round}] = true
				t.Logf("mlock run of holder %d lost its lock near round %d's fault after %v: %s",
					r.holder, round, r.took.Round(time.Millisecond), r.out)
				continue
			}
		}
		bad++
		t.Errorf("mlock run of holder %d exited %d after %v: %s", r.holder, r.exit, r.took.Round(time.Millisecond), r.out)
	}
	lines := hr.tokens(t, dir)
	t.Logf("mlock run: %d runs, %d lost their lock near a fault (bound: one per holder and round), %d other exits "+
		"non-zero, longest %v; %d commands ran, their tokens increasing",
		len(hr.runs), len(used), bad, longest.Round(time.Millisecond), lines)
	if len(hr.runs) == 0 {
		t.Error("no mlock run completed")
	}
}

// faultWindow is a round's fault, from its first event until near after
// the cluster was healthy again (for ever if it never was).
type faultWindow struct {
	round    int
	from, to int64
}

type faultWindowList []faultWindow

// faultWindows returns the window of each round of events, in order.
func faultWindows(events []event, near time.Duration) faultWindowList {
	var ws faultWindowList
	for _, e := range events {
		if len(ws) == 0 || ws[len(ws)-1].round != e.Round {
			ws = append(ws, faultWindow{round: e.Round, from: e.T, to: 1<<63 - 1})
		}
		if strings.HasPrefix(e.What, "healthy") {
			ws[len(ws)-1].to = e.T + int64(near)
		}
	}
	return ws
}

// first returns the round of the first window that overlaps [from, to]
// and that ok accepts.
func (ws faultWindowList) first(from, to int64, ok func(round int) bool) (int, bool) {
	for _, w := range ws {
		if from <= w.to && to >= w.from && ok(w.round) {
			return w.round, true
		}
	}
	return 0, false
}

// faultWindows spans each round from its first event to near after its
// "healthy" event (for ever without one), and first finds the first
// window a span overlaps that its filter accepts.
func TestFaultWindows(t *testing.T) {
	events := []event{
		{T: 10, Round: 1, What: "stop"}, {T: 12, Round: 1, What: "start"}, {T: 20, Round: 1, What: "healthy, leader"},
		{T: 40, Round: 2, What: "stop"}, {T: 45, Round: 2, What: "start"},
	}
	ws := faultWindows(events, 5)
	if want := (faultWindowList{{1, 10, 25}, {2, 40, 1<<63 - 1}}); !slices.Equal(ws, want) {
		t.Fatalf("faultWindows = %v, want %v", ws, want)
	}
	all := func(int) bool { return true }
	for _, tc := range []struct {
		from, to int64
		ok       func(int) bool
		round    int
		found    bool
	}{
		{0, 9, all, 0, false},                                 // before every fault
		{5, 10, all, 1, true},                                 // ends at the stop
		{25, 30, all, 1, true},                                // starts at the window's end
		{26, 39, all, 0, false},                               // between two windows
		{20, 50, all, 1, true},                                // across both: the first
		{20, 50, func(r int) bool { return r != 1 }, 2, true}, // the first is used
		{100, 200, all, 2, true},                              // the round that never healed
	} {
		round, found := ws.first(tc.from, tc.to, tc.ok)
		if round != tc.round || found != tc.found {
			t.Errorf("first(%d, %d) = %d, %v; want %d, %v", tc.from, tc.to, round, found, tc.round, tc.found)
		}
	}
}

// buildUpgradePair builds the previous release's mlockd and mlock and
// HEAD's, each once per test.
func buildUpgradePair(t *testing.T) (old, cur build) {
	t.Helper()
	git := testenv.LookPath(t, "the rolling-upgrade test builds the previous release from git", "git")
	root := proctest.ModuleRoot(t)
	rev, ref := "", ""
	for _, r := range []string{prevTag, prevCommit} {
		out, err := exec.Command(git, "-C", root, "rev-parse", "--verify", "-q", r+"^{commit}").Output()
		if err == nil {
			rev, ref = strings.TrimSpace(string(out)), r
			break
		}
	}
	if rev == "" {
		testenv.Missing(t, fmt.Sprintf("neither the tag %s nor the commit %s is in the repository (a shallow clone?)", prevTag, prevCommit),
			"the rolling-upgrade test builds the previous release")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if out, err := exec.Command(git, "-C", root, "worktree", "add", "--detach", src, rev).CombinedOutput(); err != nil {
		t.Fatalf("git worktree add %s: %v\n%s", rev, err, out)
	}
	defer func() {
		if out, err := exec.Command(git, "-C", root, "worktree", "remove", "--force", src).CombinedOutput(); err != nil {
			t.Errorf("git worktree remove: %v\n%s", err, out)
		}
	}()
	oldDir := filepath.Join(dir, "old")
	// -trimpath: the source directory (a new one each run) is then no part
	// of go's cache keys, so a run after the first links what it compiled.
	cmd := exec.Command("go", "build", "-trimpath", "-o", oldDir+string(filepath.Separator), "./cmd/mlockd", "./cmd/mlock")
	cmd.Dir = src
	cmd.Env = append(proctest.CleanEnv(), "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building %s: %v\n%s", rev, err, out)
	}
	old = build{mlockd: filepath.Join(oldDir, "mlockd"), mlock: filepath.Join(oldDir, "mlock")}
	bins := programs.Paths(t)
	cur = build{mlockd: bins[0], mlock: bins[1]}
	head := "HEAD"
	if out, err := exec.Command(git, "-C", root, "rev-parse", "HEAD").Output(); err == nil {
		head = strings.TrimSpace(string(out))
	}
	if out, err := exec.Command(git, "-C", root, "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(out) > 0 {
		head += " with uncommitted changes"
	}
	old.desc, cur.desc = describe(t, old.mlockd, rev+" ("+ref+")"), describe(t, cur.mlockd, head+" (HEAD)")
	return old, cur
}

// describe returns what bin --version prints and the commit it was built
// from (git's: the builds may not stamp it, -buildvcs=false).
func describe(t *testing.T, bin, commit string) string {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatalf("%s --version: %v", bin, err)
	}
	return strings.TrimSpace(string(out)) + ", commit " + commit
}
