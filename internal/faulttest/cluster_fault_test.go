package faulttest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/internal/lease"
)

// Environment:
//
//	MLOCK_CLUSTER_FAULT_ROUNDS=N   fault rounds (default 8)
//	MLOCK_CLUSTER_FAULT_KEEP=DIR   copy the history and the nodes' logs to DIR on a violation

// The workload.
const (
	workers    = 6
	ttl        = 2 * time.Second        // lease of every lock
	grace      = 3 * time.Second        // the servers' --session-grace
	waitLimit  = 4 * time.Second        // a lock's wait timeout (server side)
	callLimit  = 10 * time.Second       // a call's context
	downFor    = 800 * time.Millisecond // a killed node stays down this long
	pauseFor   = 2 * time.Second        // SIGSTOP to SIGCONT (elections take ~1 s)
	loadBefore = 1 * time.Second        // load before each fault
	settle     = 500 * time.Millisecond // load after the cluster is healthy again
)

var resources = []string{"ct:r0", "ct:r1", "ct:r2"}

// faultKinds are run in turn, one per round.
var faultKinds = []string{"kill-leader", "kill-follower", "kill-client-node", "stop-leader"}

func clusterEnvRounds(def int) int {
	if n, err := strconv.Atoi(os.Getenv("MLOCK_CLUSTER_FAULT_ROUNDS")); err == nil && n > 0 {
		return n
	}
	return def
}

// TestClusterFaults runs the workload on a 3-node cluster of real mlockd
// processes and injects one fault per round (see the package
// documentation), then checks safety, linearizability and availability.
func TestClusterFaults(t *testing.T) {
	t.Parallel() // its own cluster; TestFailover runs alongside
	if runtime.GOOS != "linux" {
		t.Skipf("SKIPPED: the cluster fault test needs Linux (signals, process groups); this is %s", runtime.GOOS)
	}
	rounds := clusterEnvRounds(8)
	bin := buildMlockd(t)
	c := newCluster(t, bin, clusterOptions{grace: grace, workers: workers})
	h := newClusterHistory()

	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	clients := startWorkers(t, ctx, &wg, c, h, workers)
	stopWorkers := loadStopper(t, stop, &wg, clients, "workers did not stop within %v", nil)
	t.Cleanup(stopWorkers)

	elapsed := runRounds(t, c, h, rounds, faultKinds, loadBefore, settle, func(r int) *mlock.Client { return clients[r%workers] })
	stopWorkers()
	c.stopAll()

	ops, grants, events := h.snapshot()
	report(t, c, rounds, elapsed, ops, grants, events)
}

// runRounds runs rounds fault rounds: round r (from 1) waits load (the
// load before the fault), injects kinds[(r-1)%len(kinds)] with runFault,
// probing with probe(r), and waits settle. The first round that fails is
// marked on t and ends the rounds. It returns the time the rounds took.
func runRounds(t *testing.T, c *cluster, h *clusterHistory, rounds int, kinds []string, load, settle time.Duration, probe func(r int) *mlock.Client) time.Duration {
	t.Helper()
	start := time.Now()
	for r := 1; r <= rounds; r++ {
		kind := kinds[(r-1)%len(kinds)]
		time.Sleep(load) // fixed: load before the fault, the test's input
		if err := runFault(c, h, probe(r), r, kind); err != nil {
			t.Errorf("round %d (%s): %v\n%s", r, kind, err, c.logTails())
			break
		}
		time.Sleep(settle) // fixed: the cluster settles after the fault, the test's input
	}
	return time.Since(start)
}

// waitLoad waits at most limit for the load's goroutines in wg, whose
// context is cancelled, to end. If they have not, it marks the test failed
// with failf (a format of one verb, given limit) and, when kill is not nil,
// calls kill and waits at most callLimit more.
func waitLoad(t *testing.T, wg *sync.WaitGroup, limit time.Duration, failf string, kill func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(limit):
		t.Errorf(failf, limit)
		if kill != nil {
			kill()
			select {
			case <-done:
			case <-time.After(callLimit):
			}
		}
	}
}

// loadStopper returns a function that stops the load once (later calls do
// nothing): it cancels the load's context (stop), waits for its goroutines
// in wg as waitLoad does with a limit of 2*callLimit, failf and kill, and
// closes the clients.
func loadStopper(t *testing.T, stop context.CancelFunc, wg *sync.WaitGroup, clients []*mlock.Client, failf string, kill func()) func() {
	stopped := false
	return func() {
		if stopped {
			return
		}
		stopped = true
		stop()
		waitLoad(t, wg, 2*callLimit, failf, kill)
		for _, cl := range clients {
			cl.Close()
		}
	}
}

// runFault injects one fault of kind and waits (at most 20 s) for the
// cluster to be healthy again.
func runFault(c *cluster, h *clusterHistory, probe *mlock.Client, round int, kind string) error {
	ev := func(what string, n *node) {
		h.addEvent(event{T: h.now(), Round: round, Kind: kind, What: what, Node: n.id})
	}
	victim := pickVictim(c, probe, kind, victimWait)
	if victim == nil {
		return fmt.Errorf("no node to fault after %v (leader %v)", victimWait, c.leader())
	}
	// The fault: begin, its duration, end.
	begin, on, d, end, off := "stop", func() { victim.signal(syscall.SIGSTOP) }, pauseFor,
		"cont", func() error { victim.signal(syscall.SIGCONT); return nil }
	if kind != "stop-leader" {
		begin, on, d, end, off = "kill", victim.kill, downFor, "restart", func() error {
			if err := c.start(victim); err != nil {
				return fmt.Errorf("restarting %s: %v", victim.id, err)
			}
			return nil
		}
	}
	ev(begin, victim)
	on()
	time.Sleep(d) // fixed: the fault's duration, the test's input
	ev(end, victim)
	if err := off(); err != nil {
		return err
	}
	l, err := c.waitHealthy(20 * time.Second)
	if err != nil {
		return err
	}
	ev("healthy, leader", l)
	return nil
}

// victimWait bounds pickVictim's wait. The cluster was healthy when the
// round began, but on a starved machine (two cores at load 20, -race) a
// node's status can take longer than leader's 500 ms, and a client can be
// between two connections: one look named no node.
const victimWait = 20 * time.Second

// pickVictim returns the node a fault of kind hits (the leader, a live
// follower, or the node probe is connected to), asking again until one is
// found or wait has passed (nil then).
func pickVictim(c *cluster, probe *mlock.Client, kind string, wait time.Duration) *node {
	deadline := time.Now().Add(wait)
	for {
		var victim *node
		switch kind {
		case "kill-leader", "stop-leader":
			victim = c.leader()
		case "kill-follower":
			if l := c.leader(); l != nil {
				for _, n := range c.nodes {
					if n != l && n.up() {
						victim = n
						break
					}
				}
			}
		case "kill-client-node":
			victim = c.byAddr(probe.Node())
			if victim == nil {
				// Not connected at this instant: ask, which connects.
				cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				_ = probe.Ping(cctx)
				cancel()
				victim = c.byAddr(probe.Node())
			}
		}
		if victim != nil || !time.Now().Before(deadline) {
			return victim
		}
		time.Sleep(50 * time.Millisecond) // poll interval (status is rate-limited)
	}
}

// startWorkers starts n workers (runWorker) on c, each with its own
// client (one principal, one session), until ctx ends; wg counts them. The
// clients start on different nodes; every other one stays there (a
// follower's clients: forwarding), the others move to the leader the node
// names. With 4 workers or more, the last shares the client of the one two
// before it, which stays on its node: two workers' requests on one
// connection of a follower, which it forwards behind each other
// (pipelined).
func startWorkers(t *testing.T, ctx context.Context, wg *sync.WaitGroup, c *cluster, h *clusterHistory, n int) []*mlock.Client {
	t.Helper()
	clients := make([]*mlock.Client, n)
	for i := range n {
		if i == n-1 && n >= 4 && i%2 == 1 {
			clients[i] = clients[i-2]
			break
		}
		cl, err := mlock.NewClient(mlock.Options{Addrs: c.addrs(i), StayOnNode: i%2 == 1, Name: fmt.Sprintf("w%d", i),
			Token: mlock.Secret(c.tokens[fmt.Sprintf("w%d", i)]), TTL: ttl, Timeout: waitLimit,
			DialTimeout: 2 * time.Second, MaxBackoff: 300 * time.Millisecond, PingInterval: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		clients[i] = cl
	}
	for i, cl := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runWorker(ctx, h, i, cl)
		}()
	}
	return clients
}

// runWorker locks a random resource, holds it for a while with extends,
// and unlocks it, until ctx ends (or 100000 rounds), recording everything.
func runWorker(ctx context.Context, h *clusterHistory, w int, c *mlock.Client) {
	rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
	for n := 0; n < 100000 && ctx.Err() == nil; n++ {
		res := resources[rng.IntN(len(resources))]
		hd := h.newHandle()
		lctx, cancel := context.WithTimeout(ctx, callLimit)
		o := op{Worker: w, Kind: opLock, Res: res, Handle: hd, Node: c.Node(), Call: h.now()}
		l, err := c.Lock(lctx, res, &mlock.LockOptions{TTL: ttl, Timeout: waitLimit})
		cancel()
		o.Return, o.Observed = h.now(), h.now()
		o.Outcome = classify(err)
		if err != nil {
			o.Err = errKind(err)
			o.AtStop = ctx.Err() != nil
			if o.Outcome == resUnknown {
				o.Return = never
			}
			h.add(o)
			sleepCtx(ctx, time.Duration(10+rng.IntN(40))*time.Millisecond)
			continue
		}
		o.Token = l.Token()
		h.add(o)
		holdLock(ctx, h, w, c, l, o, rng)
		sleepCtx(ctx, time.Duration(rng.IntN(30))*time.Millisecond)
	}
}

// holdLock holds l (granted by lock) for 50-450 ms with 0-2 extends, then
// unlocks it, and records the grant's belief interval.
func holdLock(ctx context.Context, h *clusterHistory, w int, c *mlock.Client, l *mlock.Lock, lock op, rng *rand.Rand) {
	g := grant{Worker: w, Res: lock.Res, Handle: lock.Handle, Token: lock.Token, Call: lock.Call, Start: lock.Return}
	// The sampler follows the Deadline (it moves later with extends and
	// answers) and notes when the loss is seen.
	var leaseEnd, lostAt atomic.Int64
	sample := func() {
		if d := l.Deadline(); !d.IsZero() {
			if t := h.at(d); t > leaseEnd.Load() {
				leaseEnd.Store(t)
			}
		}
	}
	sample()
	g.Arrival = leaseEnd.Load()
	sctx, sstop := context.WithCancel(context.Background())
	sdone := make(chan struct{})
	go func() {
		defer close(sdone)
		tk := time.NewTicker(5 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-l.Lost():
				lostAt.Store(h.now())
				return
			case <-tk.C:
				sample()
			}
		}
	}()
	hold := time.Duration(50+rng.IntN(400)) * time.Millisecond
	extends := rng.IntN(3)
	if rng.IntN(10) == 0 {
		// Overrun: hold past the lease without extending; the client loses
		// the lock at its Deadline, the server frees it at expiry.
		hold, extends = ttl+300*time.Millisecond, 0
	}
	holdEnd := time.Now().Add(hold)
	for k := extends; k > 0 && time.Now().Before(holdEnd); k-- {
		sleepCtx(ctx, time.Until(holdEnd)/time.Duration(k+1))
		if l.Err() != nil {
			break
		}
		ectx, cancel := context.WithTimeout(context.Background(), callLimit)
		o := op{Worker: w, Kind: opExtend, Res: lock.Res, Handle: lock.Handle, Node: c.Node(), Call: h.now()}
		_, err := l.Extend(ectx, ttl)
		cancel()
		o.Return, o.Observed = h.now(), h.now()
		o.Outcome = classify(err)
		if err != nil {
			o.Err = errKind(err)
			if o.Outcome == resUnknown {
				o.Return = never
			}
		}
		sample()
		h.add(o)
	}
	sleepCtx(ctx, time.Until(holdEnd))
	sample()
	lostBefore := l.Err() != nil
	uctx, cancel := context.WithTimeout(context.Background(), callLimit)
	o := op{Worker: w, Kind: opUnlock, Res: lock.Res, Handle: lock.Handle, Node: c.Node(), Call: h.now()}
	err := l.Unlock(uctx)
	cancel()
	o.Return, o.Observed = h.now(), h.now()
	o.Outcome = classify(err)
	if err != nil {
		o.Err = errKind(err)
		if o.Outcome == resUnknown {
			o.Return = never
		}
	}
	// Lost before the unlock was sent: the loss is the lease's end, and the
	// unlock does nothing. Lost while the unlock was on its way (a fault
	// outlasted the lease; an unlock called after the Deadline, before the
	// client's timer gave the lock up): the unlock may have been applied,
	// freeing the lock at any time from its call on, or not, and the lease
	// ended it. Its outcome is unknown. (A retried unlock called before the
	// Deadline that finds the lock gone succeeds: see mlock's Lock.Unlock.)
	sample()
	lostOnTheWay := err != nil && strings.HasPrefix(o.Err, string(mlock.TypeLost)) && leaseEnd.Load() <= o.Return
	switch {
	case lostBefore:
		o.Outcome = resSkip
		o.Return = o.Observed
	case lostOnTheWay:
		o.Outcome = resUnknown
		o.Return = never
	}
	h.add(o)
	sstop()
	<-sdone
	g.LeaseEnd = leaseEnd.Load()
	g.End, g.Why = beliefEnd(o.Call, g.LeaseEnd, lostAt.Load())
	h.addGrant(g)
}

// beliefEnd returns the end of a grant's belief interval, as checkSafety
// counts it, and why: the earlier of its unlock's call and the latest
// Deadline seen, both read exactly on this process's monotonic clock (the
// Deadline is the client's own time.Time; the unlock's call is read before
// Unlock is called). A loss the holder heard of before its Deadline (seen
// at lostAt, 0: none) ended its belief earlier but does not end the
// interval: the sampler sees the loss late, by its own wake-up, while the
// next grant may come at once; and in this workload (no owners, no
// evictions) the server may free a lock before its holder's Deadline only
// through that holder's unlock: the client gives a lost lock back at its
// Deadline, never before. A grant before the Deadline of a holder that did
// not unlock is a violation, whatever the holder was told.
func beliefEnd(unlockCall, leaseEnd, lostAt int64) (int64, string) {
	end, why := unlockCall, "unlock"
	if leaseEnd < end {
		end, why = leaseEnd, "deadline"
	}
	if lostAt != 0 && lostAt < end {
		why = fmt.Sprintf("lost at %.6fs, before its %s", float64(lostAt)/1e9, why)
	}
	return end, why
}

func sleepCtx(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// report logs the statistics and fails the test on any violation.
func report(t *testing.T, c *cluster, rounds int, elapsed time.Duration, ops []op, grants []grant, events []event) {
	var b strings.Builder
	fmt.Fprintf(&b, "%d rounds in %v, %d operations, %d grants, %d faults\n", rounds, elapsed.Round(time.Millisecond), len(ops), len(grants), len(events))

	// Operations by kind and outcome, and the failures by cause.
	counts := map[string]int{}
	causes := map[string]int{}
	failed := 0
	for _, o := range ops {
		if o.AtStop {
			counts[o.Kind+" "+o.Outcome+" (at the end)"]++
			continue
		}
		counts[o.Kind+" "+o.Outcome]++
		if o.Outcome != resOK && o.Outcome != resSkip {
			failed++
			causes[o.Kind+" "+o.Outcome+" "+o.Err]++
		}
	}
	fmt.Fprintf(&b, "operations:")
	for _, k := range sortedKeys(counts) {
		fmt.Fprintf(&b, "  %s %d", k, counts[k])
	}
	fmt.Fprintf(&b, "\nfailed requests: %d\n", failed)
	for _, k := range sortedKeys(causes) {
		fmt.Fprintf(&b, "\t%5d  %s\n", causes[k], k)
	}

	// Availability per fault kind, from the kill or the stop: the time to
	// the next grant, and the time until every request in flight at the
	// fault (called before, not answered yet) had its answer, or its error.
	type avail struct{ next, inflight []time.Duration }
	byKind := map[string]*avail{}
	var grantsByRet []op
	for _, o := range ops {
		if o.Kind == opLock && o.Outcome == resOK {
			grantsByRet = append(grantsByRet, o)
		}
	}
	sort.Slice(grantsByRet, func(i, j int) bool { return grantsByRet[i].Return < grantsByRet[j].Return })
	var lines []string
	for _, e := range events {
		if e.What != "kill" && e.What != "stop" {
			continue
		}
		a := byKind[e.Kind]
		if a == nil {
			a = &avail{}
			byKind[e.Kind] = a
		}
		next := time.Duration(-1)
		for _, o := range grantsByRet {
			if o.Return >= e.T {
				next = time.Duration(o.Return - e.T)
				break
			}
		}
		if next >= 0 {
			a.next = append(a.next, next)
		}
		inflight, n := time.Duration(0), 0
		for _, o := range ops {
			if o.Call <= e.T && o.Observed > e.T && !o.AtStop {
				n++
				inflight = max(inflight, time.Duration(o.Observed-e.T))
			}
		}
		if n > 0 {
			a.inflight = append(a.inflight, inflight)
		}
		lines = append(lines, fmt.Sprintf("\tround %2d %-16s %s of %s: next grant %v; %d requests in flight, all answered after %v",
			e.Round, e.Kind, e.What, e.Node, next.Round(time.Millisecond), n, inflight.Round(time.Millisecond)))
	}
	fmt.Fprintf(&b, "availability (from the kill or stop):\n")
	var allNext, allIn []time.Duration
	for _, k := range sortedKeys(byKind) {
		a := byKind[k]
		allNext, allIn = append(allNext, a.next...), append(allIn, a.inflight...)
		fmt.Fprintf(&b, "\t%-16s n=%2d  next grant p50 %v p99 %v  in-flight answered p50 %v p99 %v\n", k, len(a.next),
			percentile(a.next, 50).Round(time.Millisecond), percentile(a.next, 99).Round(time.Millisecond),
			percentile(a.inflight, 50).Round(time.Millisecond), percentile(a.inflight, 99).Round(time.Millisecond))
	}
	fmt.Fprintf(&b, "\t%-16s n=%2d  next grant p50 %v p99 %v  in-flight answered p50 %v p99 %v\n", "all", len(allNext),
		percentile(allNext, 50).Round(time.Millisecond), percentile(allNext, 99).Round(time.Millisecond),
		percentile(allIn, 50).Round(time.Millisecond), percentile(allIn, 99).Round(time.Millisecond))
	b.WriteString(strings.Join(lines, "\n") + "\n")

	// The checks.
	vs, empty := checkSafety(grants)
	short, faulty := checkArrivals(grants, events)
	fmt.Fprintf(&b, "arrival: %d grants believed for less than %v on arrival after a wait without a fault, %d after one "+
		"(bound: %d, a wait per worker and fault)\n", len(short), lease.MinUsable(min(ttl, grace)), faulty, workers*rounds)
	vs = append(vs, short...)
	if faulty > workers*rounds {
		vs = append(vs, clusterViolation{kind: "arrival", msg: fmt.Sprintf("%d grants short on arrival after a fault, above the bound %d",
			faulty, workers*rounds)})
	}
	t0 := time.Now()
	lin := checkLinearizable(ops, grants, 2*time.Minute)
	fmt.Fprintf(&b, "safety: %d violations (%d grants already past their Deadline when answered); linearizability: %d violations (checked in %v)\n",
		len(vs), empty, len(lin), time.Since(t0).Round(time.Millisecond))
	t.Log(b.String())
	vs = append(vs, lin...)
	for _, v := range vs {
		t.Errorf("%s: %s\n%s", v.kind, v.msg, excerpt(ops, events, v.res, v.from, v.to, int64(3*time.Second), 80))
	}
	if len(vs) > 0 {
		keep(t, c, ops, grants, events)
	}
}

// keep copies the history and the nodes' logs to MLOCK_CLUSTER_FAULT_KEEP.
func keep(t *testing.T, c *cluster, ops []op, grants []grant, events []event) {
	dir := os.Getenv("MLOCK_CLUSTER_FAULT_KEEP")
	if dir == "" {
		return
	}
	dir = filepath.Join(dir, time.Now().Format("20060102-150405"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Log(err)
		return
	}
	var b strings.Builder
	for _, e := range events {
		fmt.Fprintf(&b, "FAULT %s\n", e)
	}
	for _, o := range ops {
		fmt.Fprintf(&b, "OP %s\n", o)
	}
	for _, g := range grants {
		fmt.Fprintf(&b, "GRANT %s\n", g)
	}
	_ = os.WriteFile(filepath.Join(dir, "history.txt"), []byte(b.String()), 0o644)
	for _, n := range c.nodes {
		data, _ := os.ReadFile(filepath.Join(n.dir, "mlockd.log"))
		_ = os.WriteFile(filepath.Join(dir, n.id+".log"), data, 0o644)
	}
	t.Logf("history and logs kept in %s", dir)
}
