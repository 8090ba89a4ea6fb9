package bench

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mlock-dev/mlock/internal/testenv"
	"github.com/mlock-dev/mlock/locking"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestJain(t *testing.T) {
	tests := []struct {
		in   []int64
		want float64
	}{
		{[]int64{5, 5, 5, 5}, 1},
		{[]int64{8, 0, 0, 0}, 0.25},
		{[]int64{3, 1}, 0.8},
		{[]int64{0, 0}, 0},
	}
	for _, tc := range tests {
		if got := Jain(tc.in); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("Jain(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestPercentiles(t *testing.T) {
	var d []time.Duration
	for i := 100; i >= 1; i-- {
		d = append(d, time.Duration(i))
	}
	p50, p99, mx := Percentiles(d)
	if p50 != 51 || p99 != 100 || mx != 100 {
		t.Fatalf("p50 %v p99 %v max %v", p50, p99, mx)
	}
}

// careless grants every Acquire at once: the safety checker must see it.
type careless struct{ locking.Provider }

func (careless) Acquire(context.Context, []string, locking.AcquireOptions) (locking.Lease, error) {
	return locking.Lease{}, nil
}
func (careless) Release(context.Context, []string, locking.ReleaseOptions) (bool, error) {
	return true, nil
}

func TestSafetyCheckerFindsAPlantedViolation(t *testing.T) {
	// Ended by a count (a bound of seconds behind it), however slow the machine.
	cfg := Config{Scenario: "hotkey", Workers: 4, Duration: 30 * time.Second, Count: 400, Hold: time.Millisecond}
	res, err := Run(context.Background(), cfg, Target{Name: "careless", Provider: careless{}})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Violations == 0 {
		t.Fatal("two holders of one key at once went unnoticed")
	}
	mem := locking.NewMemory()
	defer mem.Close()
	res, err = Run(context.Background(), cfg, Target{Name: "memory", Provider: mem})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Violations != 0 || res[0].Ops == 0 {
		t.Fatalf("memory: %+v", res[0])
	}
}

func TestScenariosOnMemory(t *testing.T) {
	a, b := locking.NewMemory(), locking.NewMemory()
	defer a.Close()
	defer b.Close()
	ctx := context.Background()
	for _, sc := range Scenarios {
		t.Run(sc, func(t *testing.T) {
			cfg := Config{Scenario: sc, Workers: 4, Duration: 300 * time.Millisecond, Round: 100 * time.Millisecond}
			ta, tb := Target{Name: "a", Provider: a}, Target{Name: "b", Provider: b}
			if sc == "readheavy" {
				ta, tb = Target{Name: "a", RW: memoryRW(false)}, Target{Name: "b", RW: memoryRW(true)}
			}
			res, err := Run(ctx, cfg, ta, tb)
			if err != nil {
				t.Fatal(err)
			}
			// Jain's index and the FIFO share are measured on timestamps (a
			// goroutine a busy machine holds up between its timestamp and
			// its request counts as overtaken): their values are tested on
			// constructed histories (TestFairnessHistories), and here only
			// their range, which holds on any machine once grants are counted.
			for _, r := range res {
				if r.Ops == 0 || r.Violations != 0 || r.Errors != 0 || r.Timeouts != 0 || r.Elapsed < 250*time.Millisecond {
					t.Fatalf("%s: %+v", r.Target, r)
				}
				if r.P50 == 0 || r.P99 < r.P50 || r.Max < r.P99 {
					t.Fatalf("%s latencies: %+v", r.Target, r)
				}
				if r.CPUKnown || !r.ClientCPUKnown || r.ClientCPU <= 0 || r.ClientCPUPerOp <= 0 {
					t.Fatalf("%s CPU: in-process, the client's is known and the server's not: %+v", r.Target, r)
				}
				if sc == "hotkey" && !(r.Jain >= 1/float64(cfg.Workers) && r.Jain <= 1 && r.FIFO >= 0 && r.FIFO <= 1) { // NaN fails
					t.Fatalf("%s: Jain's index within [1/workers, 1] and the FIFO share within [0, 1]: %+v", r.Target, r)
				}
			}
		})
	}
}

func TestCountBoundsTheRun(t *testing.T) {
	m := locking.NewMemory()
	defer m.Close()
	cfg := Config{Scenario: "uncontended", Workers: 4, Duration: 10 * time.Second, Count: 500}
	start := time.Now()
	res, err := Run(context.Background(), cfg, Target{Name: "m", Provider: m})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Ops < 500 || res[0].Ops >= 500+4 {
		t.Fatalf("ops %d, want 500 (+ at most one per worker)", res[0].Ops)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatal("the count did not end the run")
	}
}

func TestConfigAndLoopback(t *testing.T) {
	if _, err := (Config{Scenario: "nope"}).withDefaults(); err == nil {
		t.Fatal("unknown scenario")
	}
	if _, err := (Config{Scenario: "shop", Duration: time.Hour}).withDefaults(); err == nil {
		t.Fatal("duration cap")
	}
	c, _ := (Config{Scenario: "shop"}).withDefaults()
	if c.Workers != 32 || c.Hold != time.Millisecond || c.SKUs != 1000 || c.Zipf != 1.1 || c.MaxOrder != 5 {
		t.Fatalf("shop defaults %+v", c)
	}
	if _, _, err := Open(context.Background(), "mlock://192.0.2.1:12340", false); err == nil {
		t.Fatal("a non-loopback target needs --allow-remote")
	}
	for _, h := range []string{"127.0.0.1", "localhost", "::1"} {
		if err := checkLoopback(h); err != nil {
			t.Errorf("%s: %v", h, err)
		}
	}
}

// Every target is opened with locking.Open; servers report their CPU: Redis
// through INFO, in both the provider's mode and Medusa's.
func TestOpenRedisTargets(t *testing.T) {
	t.Parallel() // waits on the network, beside the CPU-bound runs on memory
	u := os.Getenv("REDIS_URL")
	if u == "" {
		t.Skip("REDIS_URL is not set")
	}
	sep := "?"
	if strings.Contains(u, "?") {
		sep = "&"
	}
	ns := fmt.Sprintf("benchtest:%x:", rand.Uint32())
	ctx := context.Background()
	var targets []Target
	for _, raw := range []string{u + sep + "namespace=" + ns, u + sep + "mode=medusa&namespace=m" + ns} {
		tg, closeT, err := Open(ctx, raw, false)
		if err != nil {
			t.Fatal(err)
		}
		defer closeT()
		targets = append(targets, tg)
	}
	cfg := Config{Scenario: "uncontended", Workers: 2, Duration: 30 * time.Second, Count: 40, Round: 100 * time.Millisecond} // ended by a count
	res, err := Run(ctx, cfg, targets...)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.Ops == 0 || r.Errors != 0 || r.Violations != 0 || !r.CPUKnown || r.CPUPerOp <= 0 || !r.ClientCPUKnown || r.ClientCPUPerOp <= 0 {
			t.Fatalf("%s: %+v", r.Target, r)
		}
	}
	if _, _, err := Open(ctx, "redis://127.0.0.1:1/0", false); err == nil {
		t.Fatal("a Redis that does not answer")
	}
}

func TestOpenMemory(t *testing.T) {
	tg, closeT, err := Open(context.Background(), "memory:", false)
	if err != nil {
		t.Fatal(err)
	}
	defer closeT()
	if _, ok := tg.Provider.(*locking.Memory); !ok || tg.ServerCPU != nil {
		t.Fatalf("memory: target %+v", tg)
	}
}

func TestParseProcessCPU(t *testing.T) {
	page := "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n" +
		"# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total_other 9\nprocess_cpu_seconds_total 12.34\n"
	if d, ok := parseProcessCPU(strings.NewReader(page)); !ok || d != 12340*time.Millisecond {
		t.Fatalf("parseProcessCPU = %v, %v", d, ok)
	}
	for _, bad := range []string{"", "process_cpu_seconds_total x\n", "process_cpu_seconds_total -1\n"} {
		if _, ok := parseProcessCPU(strings.NewReader(bad)); ok {
			t.Errorf("parseProcessCPU(%q) succeeded", bad)
		}
	}
	if _, _, err := Open(context.Background(), "etcd://127.0.0.1:2379,192.0.2.1:2379", false); err == nil ||
		!strings.Contains(err.Error(), "loopback") {
		t.Fatalf("an etcd list with a non-loopback host: %v", err)
	}
}

// etcd:// targets are opened with locking.Open and report etcd's CPU (its
// /metrics); every scenario runs on them without errors or violations.
func TestOpenEtcdTarget(t *testing.T) {
	t.Parallel() // waits on the network, beside the CPU-bound runs on memory
	e := testenv.Getenv(t, "ETCD_ENDPOINTS", "the etcd target test needs an etcd (start etcd and set ETCD_ENDPOINTS)")
	ctx := context.Background()
	tg, closeT, err := Open(ctx, fmt.Sprintf("etcd://%s?prefix=benchtest/%x/", e, rand.Uint32()), false)
	if err != nil {
		t.Fatal(err)
	}
	defer closeT()
	for _, sc := range Scenarios {
		if sc == "readheavy" {
			continue // shared locks: etcd has no read/write lock target (see OpenRW)
		}
		// Ended by a count (a bound of seconds behind it): a busy machine's
		// etcd may take longer than a short run for its first operation.
		cfg := Config{Scenario: sc, Workers: 4, Duration: 30 * time.Second, Count: 40, Round: 150 * time.Millisecond}
		res, err := Run(ctx, cfg, tg)
		if err != nil {
			t.Fatal(err)
		}
		r := res[0]
		if r.Ops == 0 || r.Errors != 0 || r.Violations != 0 || !r.CPUKnown || r.ServerCPU <= 0 || !r.ClientCPUKnown {
			t.Fatalf("%s: %+v", sc, r)
		}
	}
}

// With --vs, the first grant of a round comes after the other target's
// round, not after a release: it is no hand-off. A slow target (few grants a
// round) would otherwise show the round's length as its hand-off p99. Every
// other grant of a round follows a release in it: a hand-off. The rounds end
// on a count of grants (a bound of seconds behind it), so that each has some.
func TestHandoffNotAcrossRounds(t *testing.T) {
	m := locking.NewMemory()
	defer m.Close()
	cfg, err := Config{Scenario: "hotkey", Workers: 3, Hold: 100 * time.Microsecond}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	r := newRun(Target{Name: "m", Provider: m}, cfg)
	var want int64
	for round := range 3 {
		before := r.ops
		r.cfg.Count = before + 20
		if err := r.round(context.Background(), 30*time.Second); err != nil {
			t.Fatal(err)
		}
		if r.ops < before+20 {
			t.Fatalf("round %d: %d grants, want 20 at least", round, r.ops-before)
		}
		want += r.ops - before - 1
	}
	if int64(len(r.handoff)) != want || r.viol != 0 || r.errs != 0 || r.timeout != 0 {
		t.Fatalf("%d grants in 3 rounds, %d hand-offs (want %d), %d violations, %d errors, %d timeouts",
			r.ops, len(r.handoff), want, r.viol, r.errs, r.timeout)
	}
	// Every request was answered, and every grant counted for fairness.
	if r.fair.granted != r.ops || len(r.fair.waitFrom) != 0 {
		t.Fatalf("%d grants, %d counted for fairness, %d requests unanswered", r.ops, r.fair.granted, len(r.fair.waitFrom))
	}
}

// carelessRW grants every lock at once: its readers and writers overlap.
func carelessRW(context.Context, string, bool) (func(context.Context) error, error) {
	return func(context.Context) error { return nil }, nil
}

func TestReadHeavySafetyAndWriters(t *testing.T) {
	// Ended by a count (a bound of seconds behind it): 400 operations, one
	// in ten a write, have none with a chance of 0.9^400.
	cfg := Config{Scenario: "readheavy", Workers: 8, Duration: 30 * time.Second, Count: 400, Hold: time.Millisecond}
	res, err := Run(context.Background(), cfg, Target{Name: "careless", RW: carelessRW}, Target{Name: "memory", RW: memoryRW(false)})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Violations == 0 {
		t.Fatal("overlapping readers and writers went unnoticed")
	}
	if m := res[1]; m.Violations != 0 || m.Writes == 0 || m.Writes >= m.Ops || m.WriteP99 < m.WriteP50 {
		t.Fatalf("memory: %+v", m)
	}
	if _, err := Run(context.Background(), cfg, Target{Name: "provider", Provider: locking.NewMemory()}); err == nil {
		t.Fatal("a provider target in the readheavy scenario")
	}
}

func TestOpenRW(t *testing.T) {
	ctx := context.Background()
	for _, bad := range []string{"etcd://127.0.0.1:2379", "x:redis://127.0.0.1:6379/0", "mlock://192.0.2.1:12340"} {
		if _, _, err := OpenRW(ctx, bad, false); err == nil {
			t.Fatalf("OpenRW(%s) succeeded", bad)
		}
	}
	u := os.Getenv("REDIS_URL")
	if u == "" {
		t.Skip("REDIS_URL is not set")
	}
	tg, closeT, err := OpenRW(ctx, u, false)
	if err != nil {
		t.Fatal(err)
	}
	defer closeT()
	// Ended by a count (a bound of seconds behind it): 200 operations, one
	// in ten a write, have none with a chance of 0.9^200.
	cfg := Config{Scenario: "readheavy", Workers: 4, Duration: 30 * time.Second, Count: 200, Hold: 200 * time.Microsecond}
	res, err := Run(ctx, cfg, tg)
	if err != nil {
		t.Fatal(err)
	}
	if r := res[0]; r.Ops == 0 || r.Errors != 0 || r.Violations != 0 || r.Writes == 0 || !r.CPUKnown {
		t.Fatalf("redis read/write lock: %+v", r)
	}
}
