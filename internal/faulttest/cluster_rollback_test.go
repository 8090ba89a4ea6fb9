package faulttest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/internal/proctest"
)

// TestRollingRollback is the supported rollback of docs/cluster.md
// ("Rollback"), step by step under the load of TestRollingUpgrade (the Go
// workers through every node, `mlock run` holders of both releases'
// mlock): a cluster of the previous release (v0.1.0) is upgraded one node
// at a time to this build and reaches cluster version 4; `mlock cluster
// rollback --dry-run --to 1`, then `--to 1`, lower it to 1 and pin it; once
// a node says it is ready (rollbackReady) it is replaced by v0.1.0, one at
// a time, while the cluster serves; then each is replaced by this build
// again, the version stays 1 (pinned) until `mlock cluster rollback
// --cancel` raises it to 4. The whole history is checked as
// TestRollingUpgrade checks its own: porcupine finds it linearizable, no
// request fails but those whose own timeout elapsed (and locks found lost
// near a fault, within the bound of failedRequests), every `mlock run`
// exits 0 (or loses its lock near a fault, within the bound of
// holderRuns.check), their commands never overlap and see increasing fencing tokens;
// and no node (v0.1.0's above all, which would skip it and diverge) logs a
// command it could not decode, and none fences a member.
func TestRollingRollback(t *testing.T) {
	t.Parallel() // its own cluster
	if runtime.GOOS != "linux" {
		t.Skipf("SKIPPED: the rollback test needs Linux (signals, process groups); this is %s", runtime.GOOS)
	}
	if testing.Short() {
		t.Skip("-short: builds the previous release")
	}
	const (
		holders  = 2
		mixedFor = 3 * time.Second // load on each mixed cluster of the rollback
	)
	oldB, newB := buildUpgradePair(t)
	t.Logf("old build: %s", oldB.desc)
	t.Logf("new build: %s", newB.desc)
	nw := workers + holders
	c := newCluster(t, oldB.mlockd, clusterOptions{grace: grace, workers: nw})
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
			runHolderLease(ctx, hard, runs, bin, uri, hd, holderScriptStopped, k, holderLease...)
		}()
	}
	stopped := false
	stopLoad := func() {
		if stopped {
			return
		}
		stopped = true
		stop()
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(2 * callLimit):
			t.Errorf("the load did not stop within %v: the mlock run still running are killed", 2*callLimit)
			hardStop()
			select {
			case <-done:
			case <-time.After(callLimit):
			}
		}
		for _, cl := range clients {
			cl.Close()
		}
	}
	t.Cleanup(stopLoad)
	fatal := func(format string, args ...any) {
		t.Helper()
		stopLoad()
		t.Fatalf(format+"\n%s", append(args, c.logTails())...)
	}
	round := 0
	replace := func(n *node, bin, kind string) {
		t.Helper()
		round++
		if err := c.replace(h, n, bin, newB.mlock, round, kind); err != nil {
			fatal("round %d (%s of %s): %v", round, kind, n.id, err)
		}
	}
	old := map[*node]bool{}
	for _, n := range c.nodes {
		old[n] = true
	}
	proctest.WaitFor(t, time.Minute, "25 grants on the old cluster", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.grants) >= 25
	})

	// The upgrade (TestRollingUpgrade's steps).
	for _, n := range c.nodes {
		replace(n, newB.mlockd, "upgrade")
		old[n] = false
	}
	var verr error
	proctest.WaitFor(t, 30*time.Second, fmt.Sprintf("cluster version %d on every node", headLogFormat), func() bool {
		verr = c.checkRollback(old, headLogFormat, false, false)
		return verr == nil
	})

	// The rollback: checked, then made.
	doc := rollbackRunbook(t)
	out, err := c.rollback(newB.mlock, "--dry-run", "--to", "1")
	if err != nil || out != "the cluster version can be lowered to 1 now" {
		fatal("mlock cluster rollback --dry-run --to 1: %q, %v", out, err)
	}
	doc.prints(t, out)
	if err := c.checkRollback(old, headLogFormat, false, false); err != nil {
		fatal("after the dry run: %v", err)
	}
	out, err = c.rollback(newB.mlock, "--to", "1")
	if err != nil || !strings.HasPrefix(out, "cluster version lowered to 1 and pinned") {
		fatal("mlock cluster rollback --to 1: %q, %v", out, err)
	}
	doc.prints(t, out)
	loweredAt := time.Now()
	proctest.WaitFor(t, 30*time.Second, "cluster version 1, pinned, on every node", func() bool {
		verr = c.checkRollback(old, 1, true, false)
		return verr == nil
	})
	for i, n := range c.nodes {
		// Step: wait until the node says it is ready, then replace it.
		proctest.WaitFor(t, 30*time.Second, n.id+" ready for the previous release", func() bool {
			verr = c.checkRollback(map[*node]bool{n: false}, 1, true, true)
			return verr == nil
		})
		if i == 0 {
			t.Logf("%s ready for the previous release %v after the lowering", n.id, time.Since(loweredAt).Round(time.Millisecond))
		}
		replace(n, oldB.mlockd, "rollback")
		old[n] = true
		if i == 0 {
			// The cancel is refused while a member runs the previous
			// release (it says nothing of its formats), and changes nothing.
			// Asked of the previous release as the leader (it can win
			// the election after its restart: its log is as long as
			// any), the cancel is refused as a request it does not know,
			// which names no member; the node is then restarted on its
			// build until this build leads, as an operator would.
			restarts := 0
			proctest.WaitFor(t, 90*time.Second, "the cancel refused, naming "+n.id, func() bool {
				out, err = c.rollback(newB.mlock, "--cancel")
				if err == nil {
					fatal("mlock cluster rollback --cancel with %s on the previous release: %q", n.id, out)
				}
				if strings.Contains(err.Error(), "member "+n.id+" has not said") {
					return true
				}
				if c.leader() == n && restarts < 3 {
					restarts++
					t.Logf("the cancel refused by %s, the previous release, as the leader (%v): restarted", n.id, err)
					replace(n, oldB.mlockd, "rollback-leader-restart")
				}
				return false
			})
			t.Logf("cancel refused: %v", err)
			doc.prints(t, err.Error()[strings.Index(err.Error(), "member "):])
		}
		checks := 0
		for deadline := time.Now().Add(mixedFor); time.Now().Before(deadline); checks++ {
			if err := c.checkRollback(old, 1, true, false); err != nil {
				fatal("mixed cluster (%d of %d nodes rolled back): %v", i+1, len(c.nodes), err)
			}
			time.Sleep(250 * time.Millisecond) // the check's interval: status has no event to wait on
		}
		t.Logf("mixed cluster, %d of %d nodes back on the previous release: version 1 pinned on every node of this build, %d checks in %v",
			i+1, len(c.nodes), checks, mixedFor)
	}
	time.Sleep(mixedFor) // fixed: load on the cluster of the previous release alone, the test's input

	// Forward again: the version stays 1, pinned, until the cancel.
	for _, n := range c.nodes {
		replace(n, newB.mlockd, "forward")
		old[n] = false
		if err := c.checkRollback(old, 1, true, false); err != nil {
			fatal("forward, after %s: %v", n.id, err)
		}
	}
	var cerr error
	proctest.WaitFor(t, 30*time.Second, "mlock cluster rollback --cancel accepted", func() bool {
		out, cerr = c.rollback(newB.mlock, "--cancel")
		return cerr == nil
	})
	doc.prints(t, out)
	proctest.WaitFor(t, 30*time.Second, fmt.Sprintf("cluster version %d, not pinned, on every node", headLogFormat), func() bool {
		verr = c.checkRollback(old, headLogFormat, false, false)
		return verr == nil
	})
	time.Sleep(settle) // fixed: load after the last step, the test's input
	elapsed := time.Since(start)
	stopLoad()
	c.stopAll()

	c.checkLogs(t, "does not decode", "stops applying the log")
	ops, grants, events := h.snapshot()
	report(t, c, round, elapsed, ops, grants, events)
	failedRequests(t, ops, events)
	runs.check(t, hd, h, events)
}

// TestRollbackRefused: on a cluster of this build at version 4, the
// rollback is refused, with the reason, while a member cannot apply the
// lowering (stopped: the leader's heartbeats to it fail), and for a version
// other than 1; nothing changes. With the member back it is accepted.
func TestRollbackRefused(t *testing.T) {
	t.Parallel() // its own cluster
	if runtime.GOOS != "linux" {
		t.Skipf("SKIPPED: needs Linux (signals, process groups); this is %s", runtime.GOOS)
	}
	bins := programs.Paths(t)
	c := newCluster(t, bins[0], clusterOptions{grace: grace, workers: 1})
	none := map[*node]bool{}
	var verr error
	proctest.WaitFor(t, 30*time.Second, fmt.Sprintf("cluster version %d on every node", headLogFormat), func() bool {
		verr = c.checkRollback(none, headLogFormat, false, false)
		return verr == nil
	})
	if out, err := c.rollback(bins[1], "--to", "2"); err == nil || !strings.Contains(err.Error(), "only version 1") {
		t.Fatalf("rollback --to 2: %q, %v; want refused", out, err)
	}
	l := c.waitLeader(15 * time.Second)
	if l == nil {
		t.Fatalf("no leader\n%s", c.logTails())
	}
	var down *node
	for _, n := range c.nodes {
		if n != l {
			down = n
			break
		}
	}
	if err := down.terminate(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	up := map[*node]bool{}
	for _, n := range c.nodes {
		if n != down {
			up[n] = false
		}
	}
	var out string
	var err error
	proctest.WaitFor(t, 30*time.Second, "the rollback refused with "+down.id+" down", func() bool {
		out, err = c.rollback(bins[1], "--dry-run", "--to", "1")
		return err != nil && strings.Contains(err.Error(), "member "+down.id+" is not reached")
	})
	out, err = c.rollback(bins[1], "--to", "1")
	if err == nil || !strings.Contains(err.Error(), "member "+down.id+" is not reached") ||
		!strings.Contains(err.Error(), "every member must apply the lowering") {
		t.Fatalf("rollback with %s down: %q, %v; want refused, naming it", down.id, out, err)
	}
	t.Logf("refused: %v", err)
	rollbackRunbook(t).prints(t, "member "+down.id+" is not reached (its heartbeats fail): every member must apply the lowering (start it, or remove it, then ask again)")
	// Nothing changed: asked until every node answers its status (a node on
	// a starved machine may not within one status's 2 s), a wrong version
	// fails at once.
	proctest.WaitFor(t, 30*time.Second, "every node's status after the refusals", func() bool {
		verr = c.checkRollback(up, headLogFormat, false, false)
		if verr != nil && !strings.Contains(verr.Error(), ": status: ") {
			t.Fatalf("after the refusals: %v", verr)
		}
		return verr == nil
	})
	if err := c.start(down); err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, 30*time.Second, "the rollback accepted with "+down.id+" back", func() bool {
		out, err = c.rollback(bins[1], "--to", "1")
		return err == nil
	})
	proctest.WaitFor(t, 30*time.Second, "cluster version 1, pinned, on every node", func() bool {
		verr = c.checkRollback(none, 1, true, false)
		return verr == nil
	})
}

// rollback runs `cli cluster rollback args...` through every node as the
// administrator ops; it returns its output, or an error with its exit code
// and what it printed on stderr.
func (c *cluster) rollback(cli string, args ...string) (string, error) {
	uri := fmt.Sprintf("mlock://ops:%s@%s", c.tokens["ops"], strings.Join(c.addrs(0), ","))
	cmd := exec.Command(cli, append([]string{"cluster", "rollback", "--timeout", "20s", "--uri", uri}, args...)...)
	cmd.Env = proctest.CleanEnv()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return strings.TrimSpace(string(out)), fmt.Errorf("exit %d: %s", ee.ExitCode(), strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), err
}

// checkRollback asks each node of nodes (a node of the previous release:
// true) for its status: a node of the previous release announces no
// format; one of this build reads headLogFormat, runs at cluster version
// want, pinned as pinned says, and (ready) says it is ready for the
// previous release.
func (c *cluster) checkRollback(nodes map[*node]bool, want int, pinned, ready bool) error {
	for _, n := range c.nodes {
		prev, ok := nodes[n]
		if !ok && len(nodes) > 0 && len(nodes) < len(c.nodes) {
			continue // not asked
		}
		st, err := n.status(2 * time.Second)
		if err != nil || st.Cluster == nil {
			return fmt.Errorf("%s: status: %v", n.id, err)
		}
		cl := st.Cluster
		switch {
		case cl.Halted != "":
			return fmt.Errorf("%s halted: %s", n.id, cl.Halted)
		case prev && cl.LogFormat != 0:
			return fmt.Errorf("%s (previous release) says it reads log format %d", n.id, cl.LogFormat)
		case prev:
		case cl.LogFormat != headLogFormat:
			return fmt.Errorf("%s (this build) says it reads log format %d, want %d", n.id, cl.LogFormat, headLogFormat)
		case cl.Version != want || cl.Pinned != pinned:
			return fmt.Errorf("%s: cluster version %d (pinned %v), want %d (pinned %v)", n.id, cl.Version, cl.Pinned, want, pinned)
		case ready && !cl.RollbackReady:
			return fmt.Errorf("%s: not ready for the previous release", n.id)
		}
	}
	return nil
}

// runbook is the "Rollback" section of docs/cluster.md, its spaces folded.
type runbook string

// rollbackRunbook reads the runbook the tests check the builds against.
func rollbackRunbook(t *testing.T) runbook {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(proctest.ModuleRoot(t), "docs", "cluster.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	i := strings.Index(doc, "\n## Rollback\n")
	if i < 0 {
		t.Fatal(`docs/cluster.md has no section "Rollback"`)
	}
	doc = doc[i+1:]
	if j := strings.Index(doc[1:], "\n## "); j >= 0 {
		doc = doc[:j+1]
	}
	return runbook(strings.Join(strings.Fields(doc), " "))
}

// prints fails the test unless the runbook quotes what a build printed
// (its spaces folded; a node's id may differ: the runbook's is c).
func (r runbook) prints(t *testing.T, printed string) {
	t.Helper()
	p := strings.Join(strings.Fields(printed), " ")
	for _, id := range []string{"n1", "n2", "n3"} {
		p = strings.ReplaceAll(p, "member "+id+" ", "member c ")
	}
	if !strings.Contains(string(r), p) {
		t.Errorf("docs/cluster.md's Rollback runbook does not quote what the build prints: %q", p)
	}
}
