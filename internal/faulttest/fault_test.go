package faulttest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/internal/lease"
	"github.com/mlock-dev/mlock/internal/proctest"
)

// Environment:
//
//	MLOCK_FAULT_ROUNDS=N   fault rounds per kind (default: 2, issue cases 1)
//	MLOCK_FAULT_KEEP=DIR   copy every history log with violations to DIR

// kind is one fault scenario.
type kind struct {
	name    string
	backend string   // "mlockd" or "redis"
	modes   []string // worker modes, slot i runs modes[i%len]: client, execute, run
	slots   int      // concurrent workers
	ttl     time.Duration
	grace   time.Duration // mlockd --session-grace
	hold    time.Duration // critical section
	wait    time.Duration // a worker's longest wait for the lock
	rounds  int           // default rounds (MLOCK_FAULT_ROUNDS overrides)
	// checkWaiters: a worker waiting when the fault began (its request
	// queued on the server, see markQueued) must not give up with an error
	// (it held nothing: it asks again).
	checkWaiters bool
	fault        func(h *harness)
}

func kinds() []kind {
	const (
		ttl   = time.Second
		grace = time.Second
		hold  = 1500 * time.Millisecond
	)
	base := func(name string, f func(h *harness)) kind {
		return kind{name: name, backend: "mlockd", modes: []string{"client", "run"}, slots: 3,
			ttl: ttl, grace: grace, hold: hold, wait: 8 * time.Second, rounds: 2, fault: f}
	}
	ks := []kind{
		// The generic kinds: ttl 1 s, grace 1 s, sections of 1.5 s. The
		// restart comes before the holder's lease runs out.
		withWaiters(base("server-kill", func(h *harness) { h.serverKill(300 * time.Millisecond) })),
		base("server-stop", func(h *harness) { h.serverStop(3 * ttl) }),
		withModes(base("holder-stop", func(h *harness) { h.holderStop(3 * ttl) }), "client"),
		base("blackhole", func(h *harness) { h.blackhole(3 * ttl) }),
		base("cut", func(h *harness) { h.cutTwice(300 * time.Millisecond) }),
		base("delay", func(h *harness) { h.delay(100*time.Millisecond, 3*ttl) }),
		redis(base("redis-restart", func(h *harness) { h.serverKill(300 * time.Millisecond) })),

		// Issue 10, cases 1-3 and 6, scaled down.
		// 1: blackholed path, ttl 3 s, longer than the lease (25 s there).
		slow(base("issue1-blackhole", func(h *harness) { h.blackhole(5 * time.Second) })),
		// 1: SIGSTOP of mlockd longer than the lease.
		slow(base("issue1-server-stop", func(h *harness) { h.serverStop(5 * time.Second) })),
		// 2: connection down longer than the grace (grace 3 s, ttl 12 s
		// there; here grace 3 s, ttl 4 s, down 4.5 s). The holder's
		// section is under way when the connection goes down (the fault
		// comes at most ttl/2 after it started) and outlasts the grace
		// (5.5 > 2 + 3 s): the fault ends it, and the server has ended the
		// sessions 1.5 s before the clients can come back.
		func() kind {
			k := base("issue2-down-past-grace", func(h *harness) { h.down(4500 * time.Millisecond) })
			k.ttl, k.grace, k.hold, k.rounds = 4*time.Second, 3*time.Second, 5500*time.Millisecond, 1
			return k
		}(),
		// 3: kill -9 and restart 1-3 s later, within the holder's lease
		// (the kill comes at most ttl/2 + 0.3 s into a section: 2.8 + 1.5 s
		// down < 5 s); waiters must ask again. The grace is of seconds
		// too (3 s, as the other issue kinds; see slow): a holder believes
		// its lock until its last answer plus the shorter of ttl and grace,
		// so the generic 1 s grace left every holder a silence of 0.65 s
		// at most whatever the ttl, and under load (two go test -race ./...
		// at once) holders granted after the restart lost their locks
		// 0.6-1.4 s into their sections, beyond the fault. The fault still
		// bites: the restarted mlockd keeps no sessions (its data directory
		// holds the fencing tokens' high-water mark only), so the restart
		// ends the holder's and the waiters' sessions however long the
		// grace, and grants nothing for its quiet period (grace + 1 % +
		// 5 ms). The section (6 s) outlasts the kill's latest phase plus
		// the grace (2.8 + 3 s): the holder's belief ends before it,
		// learnt at the reconnect or run out, so the fault cuts the
		// section under way (with 4 s, one 2.75 s old at the kill ended
		// ok while the server was down). A waiter of the fault may then
		// wait up to about 30 s (8 s before the kill, 1.5 s down, the
		// quiet 3 s, three sections of 6 s ahead after the restart): the
		// wait of 40 s lets it reach its grant rather than time out.
		func() kind {
			k := withWaiters(base("issue3-restart", func(h *harness) { h.serverKill(1500 * time.Millisecond) }))
			k.ttl, k.grace, k.hold, k.wait, k.rounds, k.slots = 5*time.Second, 3*time.Second, 6*time.Second, 40*time.Second, 1, 3
			return k
		}(),
		// 6: Redis restart under a long lease (60 s, renewal at 20 s there):
		// a job shorter than the first renewal must still learn of it.
		func() kind {
			k := redis(base("issue6-redis-restart", func(h *harness) { h.serverKill(200 * time.Millisecond) }))
			k.ttl, k.hold, k.rounds = 6*time.Second, 2500*time.Millisecond, 1
			return k
		}(),
	}
	return ks
}

func withWaiters(k kind) kind { k.checkWaiters = true; return k }

func withModes(k kind, modes ...string) kind { k.modes = modes; return k }

func redis(k kind) kind {
	k.backend, k.modes = "redis", []string{"execute", "run"}
	return k
}

// slow is issue 10's case 1: a fault of 5 s, longer than the lease (ttl
// and grace 3 s), comes at most ttl/2 into a section of 5 s, which it
// outlasts: the fault ends the section.
//
// The issue kinds keep a grace and ttl of seconds, as the issue's own (the
// generic kinds keep 1 s): a holder keeps its lock through
// silences up to two thirds of the shorter (see stallExcuse), so at 3 s
// about 2 s, which the delays of a loaded machine (two go test -race ./...
// at once on two cores: load 12-20, each process held back at times for
// hundreds of milliseconds, along a chain of four processes: worker,
// proxy, server, worker) stay well inside; at 1 s (0.65 s), under that
// load, sections beyond the fault's were lost at their deadline.
func slow(k kind) kind {
	k.ttl, k.grace, k.hold, k.rounds = 3*time.Second, 3*time.Second, 5*time.Second, 1
	return k
}

// summary collects one row per kind for the table at the end.
var summary struct {
	mu   sync.Mutex
	rows []string
}

// TestFaults runs every fault kind at the same time (each has its own
// server, proxy and log; started from goroutines, so -parallel does not
// serialise them), beside the cluster tests, and logs a summary table.
func TestFaults(t *testing.T) {
	t.Parallel()
	binaries(t)
	t.Logf("redis-server: %q", bins.redis)
	sw := watchStalls(t)
	t.Cleanup(func() {
		summary.mu.Lock()
		defer summary.mu.Unlock()
		sort.Strings(summary.rows)
		var b strings.Builder
		fmt.Fprintf(&b, "\n%-24s %6s %7s %6s %8s %7s %6s  %s\n", "kind", "rounds", "grants", "lost", "overlaps", "tokens", "waiter", "result")
		for _, r := range summary.rows {
			b.WriteString(r)
		}
		t.Log(b.String())
	})
	var wg sync.WaitGroup
	for _, k := range kinds() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.Run(k.name, func(t *testing.T) { runKind(t, k, sw) })
		}()
	}
	wg.Wait()
}

// stallTick is the stall watch's sleep; stallMin the least lateness of a
// wake-up it records as a stall.
const (
	stallTick = 10 * time.Millisecond
	stallMin  = 100 * time.Millisecond
)

// stallWatch records when the test process was not run: a goroutine sleeps
// stallTick at a time, and a wake-up later than that by stallMin or more is
// a stall, from the sleep's start to the late wake-up. The proxies of the
// kinds run in this process, so a stall here holds back every forwarded
// byte; the workers and the servers are processes of their own on the
// same CPUs, which a starved machine holds back alike.
type stallWatch struct {
	mu   sync.Mutex
	list []stall // guarded by mu
	stop chan struct{}
	done chan struct{}
}

// stall is one, in Unix ns of the host clock (the history's).
type stall struct{ from, to int64 }

func watchStalls(t *testing.T) *stallWatch {
	w := &stallWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go w.run()
	t.Cleanup(func() { close(w.stop); <-w.done })
	return w
}

func (w *stallWatch) run() {
	defer close(w.done)
	tm := time.NewTimer(stallTick)
	defer tm.Stop()
	last := time.Now()
	for {
		select {
		case <-w.stop:
			return
		case <-tm.C:
		}
		now := time.Now()
		if now.Sub(last)-stallTick >= stallMin {
			w.mu.Lock()
			w.list = append(w.list, stall{from: last.UnixNano(), to: now.UnixNano()})
			w.mu.Unlock()
		}
		last = now
		tm.Reset(stallTick)
	}
}

// worst returns the longest part of a stall within [from, to] (0 if none)
// and how many stalls overlap it: a long stall that ended well before the
// window, or began just before its end, counts only for its part inside.
func (w *stallWatch) worst(from, to int64) (longest time.Duration, n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range w.list {
		if s.to >= from && s.from <= to {
			longest, n = max(longest, time.Duration(min(s.to, to)-max(s.from, from))), n+1
		}
	}
	return longest, n
}

func envRounds(def int) int {
	if n, err := strconv.Atoi(os.Getenv("MLOCK_FAULT_ROUNDS")); err == nil && n > 0 {
		return n
	}
	return def
}

// harness is one kind's run: its server (mlockd or Redis) behind a proxy,
// its workers and its log.
type harness struct {
	t    *testing.T
	k    kind
	dir  string
	log  *historyLog
	px   *proxy
	uri  string
	srvA []string // server command line
	addr string   // server's own address
	srv  *proc
	srvO *os.File // server output
	// stalls is the test process's own stall record (TestFaults's).
	stalls *stallWatch

	mu      sync.Mutex
	live    map[string]*proc // running workers by id; guarded by mu
	nextID  int              // guarded by mu
	paused  bool             // no new workers; guarded by mu
	waiters map[string]bool  // workers alive when a fault began
	queued  map[string]bool  // workers whose request the server held when it was killed (see markQueued)
	extra   sync.WaitGroup   // newcomers
}

func runKind(t *testing.T, k kind, sw *stallWatch) {
	h := &harness{t: t, k: k, dir: t.TempDir(), stalls: sw, live: map[string]*proc{}, waiters: map[string]bool{}, queued: map[string]bool{}}
	if k.backend == "redis" && bins.redis == "" {
		t.Skip("redis-server not in PATH")
	}
	h.log = newHistoryLog(t, filepath.Join(h.dir, "history.log"))
	o, err := os.Create(filepath.Join(h.dir, "server.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { o.Close() })
	h.srvO = o
	port := proctest.FreePort(t)
	h.addr = fmt.Sprintf("127.0.0.1:%d", port)
	switch k.backend {
	case "mlockd":
		h.srvA = []string{bins.mlockd, "--listen", h.addr, "--session-grace", k.grace.String(),
			"--data-dir", filepath.Join(h.dir, "data"), "--log-level", "warn"}
	case "redis":
		h.srvA = []string{bins.redis, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
			"--appendonly", "no", "--dir", h.dir, "--protected-mode", "yes"}
	}
	h.startServer()
	h.px = newProxy(t, h.addr)
	if k.backend == "redis" {
		h.uri = "redis://" + h.px.addr() + "/0"
	} else {
		h.uri = "mlock://" + h.px.addr()
	}

	rounds := envRounds(k.rounds)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range k.slots {
		wg.Add(1)
		go func() { defer wg.Done(); h.slot(stop, k.modes[i%len(k.modes)]) }()
	}
	noHolder := 0
	for r := range rounds {
		h.log.printf("round %d %d", now(), r+1)
		if !h.awaitHolder(5 * time.Second) {
			noHolder++
		}
		time.Sleep(time.Duration(rand.Int64N(int64(k.ttl / 2)))) // vary the phase
		h.mu.Lock()
		for w := range h.live {
			h.waiters[w] = true
		}
		h.mu.Unlock()
		k.fault(h)
		time.Sleep(k.hold + k.ttl + 500*time.Millisecond) // recover; let a late overlap show
	}
	close(stop)
	drained := make(chan struct{})
	go func() { wg.Wait(); h.extra.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(k.wait + k.hold + k.ttl + 5*time.Second):
		h.mu.Lock()
		ps := make([]*proc, 0, len(h.live))
		for _, p := range h.live {
			ps = append(ps, p)
		}
		h.mu.Unlock()
		for _, p := range ps {
			p.kill()
		}
		<-drained
	}
	h.report(rounds, noHolder)
}

// startServer starts (or restarts, on the same port) the server.
func (h *harness) startServer() {
	p, err := start(h.t, h.dir, h.srvO, h.srvA[0], h.srvA[1:]...)
	if err != nil {
		h.t.Fatal(err)
	}
	if err := waitDial(p, h.addr, h.k.backend == "redis"); err != nil {
		p.kill()
		h.t.Fatalf("%s: %v; output in %s", h.k.backend, err, h.srvO.Name())
	}
	h.srv = p
}

// slot runs workers one after another until stop.
func (h *harness) slot(stop <-chan struct{}, mode string) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		h.mu.Lock()
		paused := h.paused
		h.mu.Unlock()
		if paused {
			time.Sleep(20 * time.Millisecond) // poll interval (new workers held back)
			continue
		}
		p := h.spawn(mode)
		if p == nil {
			return
		}
		if h.reap(p) != "0" {
			time.Sleep(50 * time.Millisecond) // do not spin while the server is away
		}
	}
}

// reap waits for worker p to exit, logs it and returns its status.
func (h *harness) reap(p *proc) string {
	<-p.done
	status := p.status
	if p.killed.Load() {
		status = "killed"
	}
	h.log.printf("dead %s %d %s", p.wid, p.exited, status)
	h.mu.Lock()
	delete(h.live, p.wid)
	h.mu.Unlock()
	return status
}

// newcomer starts one worker besides the slots (one that arrives just as
// the fault ends).
func (h *harness) newcomer() {
	if p := h.spawn(h.k.modes[0]); p != nil {
		h.extra.Add(1)
		go func() { defer h.extra.Done(); h.reap(p) }()
	}
}

// spawn starts one worker in mode.
func (h *harness) spawn(mode string) *proc {
	h.mu.Lock()
	h.nextID++
	wid := fmt.Sprintf("w%d", h.nextID)
	h.mu.Unlock()
	k := h.k
	common := []string{"-res", "r", "-hold", k.hold.String(), "-log", h.log.path, "-id", wid}
	var name string
	var args []string
	switch mode {
	case "client", "execute":
		name = bins.worker
		args = append([]string{"-mode", mode, "-uri", h.uri, "-ttl", k.ttl.String(), "-timeout", k.wait.String()}, common...)
	case "run":
		name = bins.mlock
		killAfter := h.killAfter()
		args = append([]string{"run", "--uri", h.uri, "--ttl", k.ttl.String(), "--timeout", k.wait.String(),
			"--kill-after", killAfter.String(), "r", "--", bins.worker, "-mode", "exec"}, common...)
	}
	h.log.printf("spawn %s %d %s", wid, now(), mode)
	p, err := start(h.t, h.dir, nil, name, args...)
	if err != nil {
		h.t.Errorf("starting a worker: %v", err)
		return nil
	}
	p.wid = wid
	h.mu.Lock()
	h.live[wid] = p
	h.mu.Unlock()
	return p
}

// awaitHolder waits until some worker is in its critical section.
func (h *harness) awaitHolder(limit time.Duration) bool {
	return h.holder(limit) != nil
}

// holder returns a live worker in its critical section, waiting at most
// limit for one.
func (h *harness) holder(limit time.Duration) *proc {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if hist, err := h.log.read(); err == nil {
			for i := len(hist.sections) - 1; i >= 0; i-- {
				s := hist.sections[i]
				if s.how != "open" {
					continue
				}
				h.mu.Lock()
				p := h.live[s.wid]
				h.mu.Unlock()
				if p != nil {
					return p
				}
			}
		}
		time.Sleep(20 * time.Millisecond) // poll interval
	}
	return nil
}

// The faults. Each writes "fault" lines to the history around itself.

// serverKill kill -9s the server and restarts it on the same port after
// down. New workers are held back from just before the kill until the
// restart, so that every worker alive at the kill was holding or waiting;
// one newcomer is started at once after the restart.
func (h *harness) serverKill(down time.Duration) {
	h.mu.Lock()
	h.paused = true
	h.mu.Unlock()
	time.Sleep(300 * time.Millisecond) // fixed: workers started just before the kill settle into holding or waiting (no event across processes)
	h.mu.Lock()
	for w := range h.live {
		h.waiters[w] = true
	}
	h.mu.Unlock()
	h.markQueued(10 * time.Second)
	h.during(down, h.k.backend+" kill -9", h.srv.kill, h.k.backend+" restarted", h.startServer)
	h.newcomer()
	h.mu.Lock()
	h.paused = false
	h.mu.Unlock()
}

// markQueued records as queued the live workers once the server holds a
// request of every one (held or waiting: its currentLocks counts them all),
// waiting at most limit for it. A worker still starting (a busy machine can
// take longer than the settling pause to start a process) has asked for
// nothing: its first dial during the fault finds no server, and the client
// reports an unreachable server at once, as it should. Only a worker whose
// request the server had is held to asking again. If the count is not
// reached in time, no worker of this fault is recorded (logged).
func (h *harness) markQueued(limit time.Duration) {
	c, err := mlock.New("mlock://" + h.addr)
	if err != nil {
		h.t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	for {
		st, err := c.Status(ctx)
		h.mu.Lock()
		if err == nil && st.CurrentLocks >= len(h.live) {
			for w := range h.live {
				h.queued[w] = true
			}
			h.mu.Unlock()
			return
		}
		n := len(h.live)
		h.mu.Unlock()
		select {
		case <-ctx.Done():
			h.t.Logf("the server did not hold a request of each of the %d live workers within %v (status: %v): no waiter recorded for this fault", n, limit, err)
			return
		case <-time.After(20 * time.Millisecond): // poll interval
		}
	}
}

// during logs begin, runs on, and d later runs off and logs end: a fault
// that lasts d.
func (h *harness) during(d time.Duration, begin string, on func(), end string, off func()) {
	h.log.printf("fault %d %s", now(), begin)
	on()
	time.Sleep(d) // fixed: the fault's duration, the test's input (every fault but a single cut lasts a while)
	off()
	h.log.printf("fault %d %s", now(), end)
}

func (h *harness) serverStop(d time.Duration) {
	h.during(d, fmt.Sprintf("server SIGSTOP for %v", d), func() { h.srv.signal(syscall.SIGSTOP) },
		"server SIGCONT", func() { h.srv.signal(syscall.SIGCONT) })
}

// holderStop stops the process group of a worker in its critical section.
func (h *harness) holderStop(d time.Duration) {
	p := h.holder(3 * time.Second)
	if p == nil {
		h.log.printf("fault %d no holder to stop", now())
		return
	}
	h.during(d, fmt.Sprintf("holder %s SIGSTOP for %v", p.wid, d), func() { p.signal(syscall.SIGSTOP) },
		fmt.Sprintf("holder %s SIGCONT", p.wid), func() { p.signal(syscall.SIGCONT) })
}

func (h *harness) blackhole(d time.Duration) {
	h.during(d, fmt.Sprintf("proxy blackhole for %v", d), func() { h.px.setBlackhole(true) },
		"proxy forwards again", func() { h.px.setBlackhole(false) })
}

// cutTwice cuts every connection, and again gap later.
func (h *harness) cutTwice(gap time.Duration) {
	h.during(gap, "proxy cut", h.px.cut, "proxy cut", h.px.cut)
}

// down cuts every connection and refuses new ones for d.
func (h *harness) down(d time.Duration) {
	h.during(d, fmt.Sprintf("proxy down for %v", d), func() { h.px.setRefuse(true); h.px.cut() },
		"proxy up", func() { h.px.setRefuse(false) })
}

func (h *harness) delay(d, span time.Duration) {
	h.during(span, fmt.Sprintf("proxy delay %v for %v", d, span), func() { h.px.setDelay(d) },
		"proxy delay off", func() { h.px.setDelay(0) })
}

// stallNear describes the test process's stalls within a span (the
// shorter of ttl and grace) before the end of section s: what may have
// held back the answers whose absence ended it.
func (h *harness) stallNear(s *section) string {
	if s.end == 1<<63-1 {
		return ""
	}
	worst, n := h.stalls.worst(s.end-int64(h.span()), s.end)
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(" (%d stalls of this process in the span before, the longest %v)", n, worst.Round(time.Millisecond))
}

// checkEarly counts the sections that ended early (the holder lost its
// lock, or gave it up at its deadline) and bounds them: a fault cuts at most
// the sections under way, one per worker and round. A section that ended
// within a span (the shorter of ttl and grace) of a stall of this process
// at least stallExcuse long is counted apart (stalled) and not held to the
// bound: the stall alone explains it (see stallExcuse). It returns the
// violation, if any.
func (h *harness) checkEarly(hist *history, rounds int) (lost, stalled int, v *violation) {
	var early []string // the sections ended early, and their workers
	var earlyWids []string
	for _, s := range hist.sections {
		if s.how == "ok" {
			continue
		}
		lost++
		limit := h.stallExcuse(hist.modes[s.wid])
		if worst, _ := h.stalls.worst(s.end-int64(h.span()), s.end); s.end != 1<<63-1 && worst >= limit {
			stalled++
			h.t.Logf("section %s %s ended in a stall of this process of %v (at least %v explains it): not held to the bound",
				s.wid, hist.span(s), worst.Round(time.Millisecond), limit)
			continue
		}
		early = append(early, s.wid+" "+hist.span(s)+h.stallNear(s))
		if !slices.Contains(earlyWids, s.wid) {
			earlyWids = append(earlyWids, s.wid)
		}
	}
	if maxLost := rounds * h.k.slots; lost-stalled > maxLost {
		return lost, stalled, &violation{kind: "early", from: hist.origin, to: 1<<63 - 1, wids: earlyWids,
			msg: fmt.Sprintf("%d sections ended early (and %d in a stall), above the bound %d (a worker's per fault round): %s",
				lost-stalled, stalled, maxLost, strings.Join(early, "; "))}
	}
	return lost, stalled, nil
}

// span is the time within which a holder must hear from the server: the
// shorter of the ttl and (mlockd) the session grace.
func (h *harness) span() time.Duration {
	if h.k.backend == "redis" {
		return h.k.ttl
	}
	return min(h.k.ttl, h.k.grace)
}

// killAfter is mlock run's --kill-after for the kind: how long before the
// end of its lease it stops its command.
func (h *harness) killAfter() time.Duration { return max(h.k.ttl/10, 50*time.Millisecond) }

// stallExcuse is the shortest stall of this process that alone ends a
// section of a worker in mode early. The holder believes its lock until the
// send time of the last request answered (a renewal or a ping) plus the
// span less its margin (lease.Margin), and sends the next one at most a
// third of the span after that send; mlock run stops its command
// killAfter earlier still. Every byte between the workers and the server
// goes through the proxy, in this process: a stall of it at least 2/3 of
// the span less the margin (and killAfter, for mlock run) holds back every
// answer past the holder's deadline with no other delay. Shorter stalls
// are no excuse: such losses count against the bound. With the spans of
// the kinds (1-3 s), that is 0.55-1.97 s: a quiet machine stalls no
// process that long; a loaded one (load 30-60 on two cores: busy loops
// beside this package's tests) stalled this process for up to 2.4 s.
func (h *harness) stallExcuse(mode string) time.Duration {
	span := h.span()
	d := span*2/3 - lease.Margin(span)
	if mode == "run" {
		d -= h.killAfter()
	}
	return d
}

// report checks the history, logs the kind's counts and fails the test on a
// violation.
func (h *harness) report(rounds, noHolder int) {
	t := h.t
	hist, err := h.log.read()
	if err != nil {
		t.Fatalf("reading the history: %v", err)
	}
	var fenced time.Duration
	if h.k.backend == "redis" {
		// A Redis that lost its data cannot refuse a newcomer: the holder
		// must learn of it at its next renewal (every ttl/3), and its
		// token is below the newcomer's.
		fenced = h.k.ttl/3 + 250*time.Millisecond
	}
	vs := hist.check(fenced)
	// Grants short on arrival after a fault in their wait: at most one per
	// worker waiting when a fault began (each is granted once), plus one
	// newcomer per round.
	short, bound := hist.shortAfterFault(), len(h.waiters)+rounds
	if short > bound {
		vs = append(vs, violation{kind: "arrival", from: hist.origin, to: 1<<63 - 1,
			msg: fmt.Sprintf("%d grants short on arrival after a fault, above the bound %d", short, bound)})
	}
	if h.k.checkWaiters {
		for w := range h.queued {
			started := false
			for _, s := range hist.sections {
				started = started || s.wid == w
			}
			st := hist.exits[w]
			// 3: the Go client's wait failed; 125: mlock run's own error.
			if !started && (st == "3" || st == "125") {
				vs = append(vs, violation{kind: "waiter",
					msg:  fmt.Sprintf("worker %s (%s) was waiting when the fault began and gave up with exit status %s instead of asking again", w, hist.modes[w], st),
					from: hist.origin, to: 1<<63 - 1, wids: []string{w}})
			}
		}
	}
	grants := len(hist.sections)
	lost, stalled, early := h.checkEarly(hist, rounds)
	if early != nil {
		vs = append(vs, *early)
	}
	count := map[string]int{}
	for _, v := range vs {
		count[v.kind]++
	}
	result := "pass"
	if len(vs) > 0 {
		result = "FAIL"
	}
	if noHolder > 0 {
		result += fmt.Sprintf("; %d rounds without a holder", noHolder)
	}
	if stalled > 0 {
		result += fmt.Sprintf("; %d of the lost in a stall", stalled)
	}
	summary.mu.Lock()
	summary.rows = append(summary.rows, fmt.Sprintf("%-24s %6d %7d %6d %8d %7d %6d  %s\n",
		h.k.name, rounds, grants, lost, count["overlap"], count["token"], count["waiter"], result))
	summary.mu.Unlock()
	worst, nStalls := h.stalls.worst(hist.origin, now())
	t.Logf("%d rounds, %d grants, %d sections ended early (%d of them in a stall of this process), %d short on arrival after a fault (bound %d), violations: %d overlap, %d token, %d waiter, %d arrival; this process stalled %d times (>= %v) during the run, at most %v",
		rounds, grants, lost, stalled, short, bound, count["overlap"], count["token"], count["waiter"], count["arrival"], nStalls, stallMin, worst.Round(time.Millisecond))
	if grants == 0 {
		// The directory goes with the test: say here what the server and
		// the workers said.
		out, _ := os.ReadFile(h.srvO.Name())
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		lines = lines[max(0, len(lines)-40):]
		var exits []string
		for w, st := range hist.exits {
			exits = append(exits, w+"="+st)
		}
		sort.Strings(exits)
		t.Errorf("no worker ever held the lock; worker exits %v; the server's last lines:\n\t%s",
			exits, strings.Join(lines, "\n\t"))
	}
	if len(vs) == 0 {
		return
	}
	var b strings.Builder
	shown := 0
	for _, v := range vs {
		if shown == 3 {
			fmt.Fprintf(&b, "... and %d more\n", len(vs)-shown)
			break
		}
		shown++
		fmt.Fprintf(&b, "%s: %s\n%s", v.kind, v.msg, hist.excerpt(v, 30))
	}
	if keep := os.Getenv("MLOCK_FAULT_KEEP"); keep != "" {
		dst := filepath.Join(keep, fmt.Sprintf("%s-%d.log", h.k.name, time.Now().Unix()))
		if data, err := os.ReadFile(h.log.path); err == nil && os.MkdirAll(keep, 0o755) == nil && os.WriteFile(dst, data, 0o644) == nil {
			fmt.Fprintf(&b, "history: %s\n", dst)
		}
	}
	t.Errorf("%d violations:\n%s", len(vs), b.String())
}

// TestEarlyBound checks the bound on sections ended early: one per worker
// and round, except those that ended within a span of a stall of the test
// process long enough to end them alone (stallExcuse: 2/3 of the span less
// its margin, less mlock run's kill-after for its commands).
func TestEarlyBound(t *testing.T) {
	const s = int64(time.Second)
	// Four sections lost (one per second, each 0.5 s long), one kept; the
	// workers: w1-w3 the Go client, w4 mlock run.
	log := `
spawn w1 0 client
spawn w2 0 client
spawn w3 0 client
spawn w4 0 run
spawn w5 0 client
start r 1 1000000000 w1
end r 1 1500000000 w1 lost
start r 2 3000000000 w2
end r 2 3500000000 w2 lost
start r 3 5000000000 w3
end r 3 5500000000 w3 lost
start r 4 7000000000 w4
end r 4 7500000000 w4 term
start r 5 9000000000 w5
end r 5 9500000000 w5 ok
`
	for _, tc := range []struct {
		name    string
		stalls  []stall
		stalled int
		fail    bool
	}{
		{"no stall: 4 above the bound of 3", nil, 0, true},
		// w3 ended at 5.5 s: 0.7 s of the stall before it.
		{"a stall that ends a client's lock", []stall{{s*4 + 800*int64(time.Millisecond), s*5 + 700*int64(time.Millisecond)}}, 1, false},
		{"a stall too short for a client", []stall{{s*4 + 900*int64(time.Millisecond), s*5 + 600*int64(time.Millisecond)}}, 0, true},
		// w4 ended at 7.5 s: 0.6 s of the stall before it.
		{"a stall that ends mlock run's lease", []stall{{s*6 + 900*int64(time.Millisecond), s*7 + 600*int64(time.Millisecond)}}, 1, false},
		// 1.2 s long, but it began 0.2 s before w3's end.
		{"a long stall that began just before the end", []stall{{s*5 + 300*int64(time.Millisecond), s*6 + 500*int64(time.Millisecond)}}, 0, true},
		// After w3's end, and more than a span before w4's.
		{"a stall away from the ends", []stall{{s*5 + 600*int64(time.Millisecond), s*6 + 300*int64(time.Millisecond)}}, 0, true},
		// 2 s long, but only 0.6 s of it in w2's span and 0.4 s in w3's.
		{"a long stall mostly outside the spans", []stall{{s*2 + 900*int64(time.Millisecond), s*4 + 900*int64(time.Millisecond)}}, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hist, err := parseHistory(strings.NewReader(log))
			if err != nil {
				t.Fatal(err)
			}
			h := &harness{t: t, k: kind{backend: "mlockd", slots: 3, ttl: time.Second, grace: time.Second},
				stalls: &stallWatch{list: tc.stalls}}
			lost, stalled, v := h.checkEarly(hist, 1)
			if lost != 4 || stalled != tc.stalled || (v != nil) != tc.fail {
				t.Fatalf("lost %d, stalled %d, violation %v; want 4, %d, a violation: %v", lost, stalled, v, tc.stalled, tc.fail)
			}
		})
	}
}
