// Package bench is the load generator behind "mlock bench": three scenarios
// (uncontended, hotkey, shop) run against any locking provider opened with
// locking.Open, and a fourth (readheavy: shared and exclusive locks) against
// targets opened with OpenRW, with latency, fairness, safety and CPU accounting: the
// server's CPU and the load generator's own (client) CPU per operation. Two
// targets can be run interleaved, in rounds, so that a noisy machine affects
// both alike.
package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mlock-dev/mlock/locking"
)

// Target is what a scenario locks.
type Target struct {
	// Name labels the target in results (its URL).
	Name string
	// Provider takes and releases the locks (every scenario but readheavy).
	Provider locking.Provider
	// RW takes the locks of the readheavy scenario.
	RW RWLock
	// ServerCPU returns the lock server's total CPU time so far, or false
	// when it cannot be known (the in-process memory provider).
	ServerCPU func(ctx context.Context) (time.Duration, bool)
}

// Config describes a run. Zero fields take the defaults shown.
type Config struct {
	Scenario string        // "uncontended", "hotkey", "shop" or "readheavy"
	Workers  int           // default 8 (shop: 32)
	Duration time.Duration // per target; default 5 s, at most 10 min
	Count    int64         // stop after this many operations per target; 0: no limit
	Hold     time.Duration // time a lock is held; default 0 (shop: 1 ms)
	SKUs     int           // shop: default 1000
	Zipf     float64       // shop: popularity exponent, default 1.1
	MaxOrder int           // shop: SKUs per order, 1..MaxOrder, default 5
	Timeout  time.Duration // longest wait for one lock; default 5 s
	HotKeys  int           // readheavy: keys, each op picks one at random; default 2
	Reads    float64       // readheavy: share of shared (read) locks, default 0.9
	Round    time.Duration // length of one interleaved round; default 1 s
	// Progress, if set, is called about twice a second with the operations
	// done so far in the current target.
	Progress func(target string, ops int64, elapsed time.Duration)
}

// FIFOSlack is how much longer another worker must have been waiting for a
// grant to count as out of FIFO order: requests sent within it may reach the
// server in either order.
const FIFOSlack = 2 * time.Millisecond

// Scenarios lists the scenario names.
var Scenarios = []string{"uncontended", "hotkey", "shop", "readheavy"}

func (c Config) withDefaults() (Config, error) {
	if !slices.Contains(Scenarios, c.Scenario) {
		return c, fmt.Errorf("bench: unknown scenario %q (want one of %v)", c.Scenario, Scenarios)
	}
	if c.Workers <= 0 {
		c.Workers = 8
		if c.Scenario == "shop" {
			c.Workers = 32
		}
	}
	if c.Duration <= 0 {
		c.Duration = 5 * time.Second
	}
	if c.Duration > 10*time.Minute {
		return c, errors.New("bench: --duration is capped at 10m")
	}
	if c.Hold == 0 && (c.Scenario == "shop" || c.Scenario == "readheavy") {
		c.Hold = time.Millisecond
	}
	if c.HotKeys <= 0 {
		c.HotKeys = 2
	}
	if c.Reads <= 0 || c.Reads > 1 {
		c.Reads = 0.9
	}
	if c.Hold < 0 {
		c.Hold = 0
	}
	if c.SKUs <= 0 {
		c.SKUs = 1000
	}
	if c.Zipf <= 1 {
		c.Zipf = 1.1
	}
	if c.MaxOrder <= 0 {
		c.MaxOrder = 5
	}
	c.MaxOrder = min(c.MaxOrder, c.SKUs)
	if c.Timeout <= 0 {
		c.Timeout = 5 * time.Second
	}
	if c.Round <= 0 {
		c.Round = time.Second
	}
	c.Round = min(c.Round, c.Duration)
	return c, nil
}

// Result is one target's outcome.
type Result struct {
	Target   string        `json:"target"`
	Scenario string        `json:"scenario"`
	Workers  int           `json:"workers"`
	Ops      int64         `json:"ops"` // cycles, grants or orders
	Elapsed  time.Duration `json:"elapsedNs"`
	Rate     float64       `json:"opsPerSec"`
	P50      time.Duration `json:"p50Ns"` // acquire latency (hotkey: wait)
	P99      time.Duration `json:"p99Ns"`
	Max      time.Duration `json:"maxNs"`
	// Writes (readheavy) counts the exclusive grants, and WriteP50 to
	// WriteMax their waits: no writer starvation keeps them bounded.
	Writes     int64         `json:"writes,omitempty"`
	WriteP50   time.Duration `json:"writeP50Ns,omitempty"`
	WriteP99   time.Duration `json:"writeP99Ns,omitempty"`
	WriteMax   time.Duration `json:"writeMaxNs,omitempty"`
	HandoffP50 time.Duration `json:"handoffP50Ns,omitempty"` // hotkey: release called -> next grant
	HandoffP99 time.Duration `json:"handoffP99Ns,omitempty"`
	Jain       float64       `json:"jain,omitempty"` // hotkey: fairness of grants over workers
	// FIFO (hotkey) is the share of grants that went to the longest
	// waiter: a grant counts as out of order when another worker had been
	// waiting for it more than FIFOSlack longer.
	FIFO       float64       `json:"fifo,omitempty"`
	Timeouts   int64         `json:"timeouts"`
	Errors     int64         `json:"errors"`
	Violations int64         `json:"violations"` // two holders of one key at once
	CPUKnown   bool          `json:"serverCpuKnown"`
	ServerCPU  time.Duration `json:"serverCpuNs"`
	CPUPerOp   time.Duration `json:"serverCpuPerOpNs"`
	// Client CPU is this process's own CPU time (user + system, all its
	// goroutines) while the target's rounds ran: the load generator with
	// the provider's client. For the in-process memory provider it
	// includes the lock engine.
	ClientCPUKnown bool          `json:"clientCpuKnown"`
	ClientCPU      time.Duration `json:"clientCpuNs"`
	ClientCPUPerOp time.Duration `json:"clientCpuPerOpNs"`
	FirstError     string        `json:"firstError,omitempty"`
}

// sample holds one worker's latencies in a round.
type sample struct {
	lat, handoff, wlat []time.Duration
}

// run accumulates one target's rounds.
type run struct {
	t       Target
	cfg     Config
	ops     int64
	elapsed time.Duration
	lat     []time.Duration
	handoff []time.Duration
	wlat    []time.Duration // readheavy: waits of the writers
	waitMu  sync.Mutex      // serializes fair
	fair    *fairness       // hotkey: the order of requests and grants
	timeout int64
	errs    int64
	viol    int64
	cpu     time.Duration
	cpuOK   bool
	ccpu    time.Duration // client CPU
	ccpuOK  bool
	first   error
	holders []atomic.Int32 // per key: worker+1 holding it, 0 free
	release atomic.Int64   // hotkey: when the last release was called (ns)
}

// Run runs cfg against each target, interleaved in rounds, and returns one
// Result per target.
func Run(ctx context.Context, cfg Config, targets ...Target) ([]Result, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	for _, t := range targets {
		if (cfg.Scenario == "readheavy") != (t.RW != nil) {
			return nil, fmt.Errorf("bench: target %s does not fit the scenario %s (readheavy targets come from OpenRW)", t.Name, cfg.Scenario)
		}
	}
	runs := make([]*run, len(targets))
	for i, t := range targets {
		runs[i] = newRun(t, cfg)
	}
	for ctx.Err() == nil {
		active := false
		for _, r := range runs {
			if r.elapsed >= cfg.Duration || (cfg.Count > 0 && r.ops >= cfg.Count) {
				continue
			}
			active = true
			if err := r.round(ctx, min(cfg.Round, cfg.Duration-r.elapsed)); err != nil {
				return nil, err
			}
		}
		if !active {
			break
		}
	}
	out := make([]Result, len(runs))
	for i, r := range runs {
		out[i] = r.result()
	}
	return out, ctx.Err()
}

// newRun returns the run of cfg (with its defaults) against t.
func newRun(t Target, cfg Config) *run {
	keys := cfg.SKUs
	switch cfg.Scenario {
	case "uncontended":
		keys = cfg.Workers
	case "hotkey":
		keys = 1
	case "readheavy":
		keys = cfg.HotKeys
	}
	return &run{t: t, cfg: cfg, fair: newFairness(cfg.Workers), holders: make([]atomic.Int32, keys),
		cpuOK: t.ServerCPU != nil, ccpuOK: true}
}

// round runs the workers for d.
func (r *run) round(ctx context.Context, d time.Duration) error {
	var cpu0 time.Duration
	if r.cpuOK {
		var ok bool
		if cpu0, ok = r.t.ServerCPU(ctx); !ok {
			r.cpuOK = false
		}
	}
	ccpu0, ok := processCPU()
	r.ccpuOK = r.ccpuOK && ok
	// A hand-off is measured within a round: the first grant of a round
	// follows the other targets' rounds, not a release.
	r.release.Store(0)
	rctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	samples := make([]sample, r.cfg.Workers)
	var ops atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for w := range r.cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(w)*7919 + time.Now().UnixNano()))
			var zipf *rand.Zipf
			if r.cfg.Scenario == "shop" {
				zipf = rand.NewZipf(rng, r.cfg.Zipf, 1, uint64(r.cfg.SKUs-1))
			}
			owner := "bench-" + strconv.Itoa(w)
			s := &samples[w]
			idx := make([]int, 0, r.cfg.MaxOrder)
			keys := make([]string, 0, r.cfg.MaxOrder)
			for rctx.Err() == nil {
				if r.cfg.Count > 0 && r.ops+ops.Load() >= r.cfg.Count {
					return
				}
				if r.cfg.Scenario == "readheavy" {
					if r.cycleRW(rctx, w, rng, s) {
						ops.Add(1)
					}
					continue
				}
				idx = r.pick(idx[:0], w, rng, zipf)
				keys = keys[:0]
				for _, i := range idx {
					keys = append(keys, keyName(r.cfg.Scenario, i))
				}
				if !r.cycle(rctx, w, owner, idx, keys, s) {
					continue
				}
				ops.Add(1)
			}
		}()
	}
	progressDone := make(chan struct{})
	if r.cfg.Progress == nil {
		close(progressDone)
	} else {
		go func() {
			defer close(progressDone)
			t := time.NewTicker(500 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-rctx.Done():
					return
				case <-t.C:
					r.cfg.Progress(r.t.Name, r.ops+ops.Load(), r.elapsed+time.Since(start))
				}
			}
		}()
	}
	wg.Wait()
	cancel() // the workers stopped early when Count was reached
	<-progressDone
	ccpu1, ok := processCPU()
	r.ccpuOK = r.ccpuOK && ok
	r.ccpu += ccpu1 - ccpu0
	r.elapsed += time.Since(start)
	r.ops += ops.Load()
	for _, s := range samples {
		r.lat = append(r.lat, s.lat...)
		r.handoff = append(r.handoff, s.handoff...)
		r.wlat = append(r.wlat, s.wlat...)
	}
	if r.cpuOK {
		if cpu1, ok := r.t.ServerCPU(ctx); ok {
			r.cpu += cpu1 - cpu0
		} else {
			r.cpuOK = false
		}
	}
	return nil
}

func keyName(scenario string, i int) string {
	switch scenario {
	case "hotkey":
		return "bench:hot"
	case "uncontended":
		return "bench:own:" + strconv.Itoa(i)
	case "readheavy":
		return "bench:rw:" + strconv.Itoa(i)
	}
	return "bench:sku:" + strconv.Itoa(i)
}

// pick chooses the key indexes of one operation.
func (r *run) pick(idx []int, w int, rng *rand.Rand, zipf *rand.Zipf) []int {
	switch r.cfg.Scenario {
	case "uncontended":
		return append(idx, w)
	case "hotkey":
		return append(idx, 0)
	}
	n := 1 + rng.Intn(r.cfg.MaxOrder)
	for len(idx) < n {
		k := int(zipf.Uint64())
		if !slices.Contains(idx, k) {
			idx = append(idx, k)
		}
	}
	return idx
}

// cycle acquires, checks safety, holds and releases once; it reports
// whether the cycle completed.
func (r *run) cycle(ctx context.Context, w int, owner string, idx []int, keys []string, s *sample) bool {
	actx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	t0 := time.Now()
	hot := r.cfg.Scenario == "hotkey"
	if hot {
		r.waitMu.Lock()
		r.fair.request(w, t0)
		r.waitMu.Unlock()
	}
	_, err := r.t.Provider.Acquire(actx, keys, locking.AcquireOptions{OwnerID: owner, Expire: r.cfg.Timeout + time.Minute, AwaitQueue: true})
	cancel()
	granted := time.Now()
	if hot {
		r.waitMu.Lock()
		r.fair.done(w, err == nil)
		r.waitMu.Unlock()
	}
	if err != nil {
		if ended(ctx) {
			return false // the round ended
		}
		if errors.Is(err, locking.ErrTimeout) {
			atomic.AddInt64(&r.timeout, 1)
		} else {
			if atomic.AddInt64(&r.errs, 1) == 1 {
				r.first = err
			}
		}
		return false
	}
	s.lat = append(s.lat, granted.Sub(t0))
	for _, i := range idx {
		if !r.holders[i].CompareAndSwap(0, int32(w+1)) {
			atomic.AddInt64(&r.viol, 1)
		}
	}
	if hot {
		if rel := r.release.Load(); rel != 0 {
			s.handoff = append(s.handoff, max(0, time.Duration(granted.UnixNano()-rel)))
		}
	}
	if r.cfg.Hold > 0 {
		hold(r.cfg.Hold)
	}
	for _, i := range idx {
		r.holders[i].CompareAndSwap(int32(w+1), 0)
	}
	if hot {
		r.release.Store(time.Now().UnixNano())
	}
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.Timeout)
	if ok, err := r.t.Provider.Release(rctx, keys, locking.ReleaseOptions{OwnerID: owner}); err != nil || !ok {
		if atomic.AddInt64(&r.errs, 1) == 1 {
			r.first = fmt.Errorf("release: ok=%v err=%v", ok, err)
		}
	}
	rcancel()
	return true
}

func (r *run) result() Result {
	res := Result{Target: r.t.Name, Scenario: r.cfg.Scenario, Workers: r.cfg.Workers, Ops: r.ops, Elapsed: r.elapsed,
		Timeouts: r.timeout, Errors: r.errs, Violations: r.viol, CPUKnown: r.cpuOK}
	if r.first != nil {
		res.FirstError = r.first.Error()
	}
	if r.elapsed > 0 {
		res.Rate = float64(r.ops) / r.elapsed.Seconds()
	}
	res.P50, res.P99, res.Max = Percentiles(r.lat)
	res.Writes = int64(len(r.wlat))
	res.WriteP50, res.WriteP99, res.WriteMax = Percentiles(r.wlat)
	if r.cfg.Scenario == "hotkey" {
		res.HandoffP50, res.HandoffP99, _ = Percentiles(r.handoff)
		res.Jain, res.FIFO = r.fair.jain(), r.fair.fifo()
	}
	if r.cpuOK {
		res.ServerCPU = r.cpu
		if r.ops > 0 {
			res.CPUPerOp = r.cpu / time.Duration(r.ops)
		}
	}
	if r.ccpuOK {
		res.ClientCPUKnown, res.ClientCPU = true, r.ccpu
		if r.ops > 0 {
			res.ClientCPUPerOp = r.ccpu / time.Duration(r.ops)
		}
	}
	return res
}

// Percentiles returns the 50th and 99th percentiles and the maximum of d
// (which it sorts).
func Percentiles(d []time.Duration) (p50, p99, maxd time.Duration) {
	if len(d) == 0 {
		return 0, 0, 0
	}
	slices.Sort(d)
	return d[len(d)/2], d[min(len(d)-1, len(d)*99/100)], d[len(d)-1]
}

// Jain returns Jain's fairness index of xs: 1 when all are equal, 1/n when
// one has everything.
func Jain(xs []int64) float64 {
	var sum, sq float64
	for _, x := range xs {
		sum += float64(x)
		sq += float64(x) * float64(x)
	}
	if sq == 0 {
		return 0
	}
	return sum * sum / (float64(len(xs)) * sq)
}

// Ratio returns a/b, or NaN when b is 0.
func Ratio(a, b float64) float64 {
	if b == 0 {
		return math.NaN()
	}
	return a / b
}

// cycleRW is one readheavy operation: a random hot key, shared with
// probability Reads, else exclusive; acquire, check, hold, release. A key's
// holders count in holders: readers up, a writer -1; a writer with anyone
// else, or a reader with a writer, is a violation.
func (r *run) cycleRW(ctx context.Context, w int, rng *rand.Rand, s *sample) bool {
	i := rng.Intn(r.cfg.HotKeys)
	shared := rng.Float64() < r.cfg.Reads
	key := keyName("readheavy", i)
	actx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	t0 := time.Now()
	unlock, err := r.t.RW(actx, key, shared)
	cancel()
	wait := time.Since(t0)
	if err != nil {
		if ended(ctx) {
			return false // the round ended
		}
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, locking.ErrTimeout) {
			atomic.AddInt64(&r.timeout, 1)
		} else if atomic.AddInt64(&r.errs, 1) == 1 {
			r.first = err
		}
		return false
	}
	s.lat = append(s.lat, wait)
	h := &r.holders[i]
	if shared {
		if h.Add(1) <= 0 {
			atomic.AddInt64(&r.viol, 1)
		}
	} else {
		s.wlat = append(s.wlat, wait)
		if !h.CompareAndSwap(0, -1) {
			atomic.AddInt64(&r.viol, 1)
		}
	}
	if r.cfg.Hold > 0 {
		hold(r.cfg.Hold)
	}
	if shared {
		h.Add(-1)
	} else {
		h.CompareAndSwap(-1, 0)
	}
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.Timeout)
	if err := unlock(rctx); err != nil && atomic.AddInt64(&r.errs, 1) == 1 {
		r.first = fmt.Errorf("release: %w", err)
	}
	rcancel()
	return true
}

// ended reports whether the round of ctx ended: ctx is done, or its
// deadline passed and its timer has not run yet (a server given the
// deadline may answer first).
func ended(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}
