package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/mlock-dev/mlock/cmd/mlock/internal/bench"
)

func cmdBench(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("bench")
	uri := uriFlag(fs, "target when URL is not given: mlock://, mlocks://, redis://host:port/db (?mode=medusa: Medusa's scripts), etcd://host:port[,host:port], memory:")
	var cfg bench.Config
	fs.StringVar(&cfg.Scenario, "scenario", "uncontended", "uncontended, hotkey, shop or readheavy")
	fs.IntVar(&cfg.Workers, "workers", 0, "concurrent workers (default 8; shop 32)")
	fs.DurationVar(&cfg.Duration, "duration", 5*time.Second, "run time per target (at most 10m)")
	fs.Int64Var(&cfg.Count, "count", 0, "stop after this many operations per target (0: no limit)")
	fs.DurationVar(&cfg.Hold, "hold", 0, "time each lock is held (default 0; shop and readheavy 1ms)")
	fs.IntVar(&cfg.HotKeys, "keys", 2, "readheavy: hot keys")
	fs.Float64Var(&cfg.Reads, "reads", 0.9, "readheavy: share of shared (read) locks")
	fs.IntVar(&cfg.SKUs, "skus", 1000, "shop: number of SKUs")
	fs.Float64Var(&cfg.Zipf, "zipf", 1.1, "shop: Zipf exponent of SKU popularity (> 1)")
	fs.IntVar(&cfg.MaxOrder, "max-order", 5, "shop: most SKUs in one order")
	fs.DurationVar(&cfg.Timeout, "timeout", 5*time.Second, "longest wait for one lock (counted as a timeout)")
	fs.DurationVar(&cfg.Round, "round", time.Second, "with --vs: length of one interleaved round")
	var vs stringList
	fs.Var(&vs, "vs", "another target (same schemes as URL; may be repeated), run interleaved with the first;\n"+
		"ratios (first / second) are printed")
	allowRemote := fs.Bool("allow-remote", false, "allow targets that are not on loopback")
	asJSON := fs.Bool("json", false, "print the results as JSON")
	cpuProfile := fs.String("cpu-profile", "", "write the load generator's CPU profile to this file")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: mlock bench [flags] [URL]\n\nLoads a lock provider (mlock://, mlocks://, redis://, redis://...?mode=medusa for Medusa's own\n"+
			"scripts, etcd:// (etcd's concurrency.Mutex), memory:) with one scenario, and reports server and client (this process's) CPU per operation.\n"+
			"URL defaults to --uri. Targets must be on loopback unless --allow-remote.\n"+
			"Latencies are the wait to acquire a lock (P50, P99, MAX; hotkey: HANDOFF from release to the next grant);\n"+
			"on a terminal a progress line shows on stderr.\n"+
			"readheavy: --workers (8) lock one of --keys (2) hot keys, shared with probability --reads (0.9), else\n"+
			"exclusive, for --hold (1ms); targets: mlock:// (shared locks), x:mlock:// (the same workload, every lock\n"+
			"exclusive), redis:// (a read/write lock in Lua, Redisson's layout), memory: (sync.RWMutex).\n"+
			"WRITE P99 is the writers' wait.\n"+
			"Exit status: 0 done, 2 usage error, 125 error, a target that completed no operation, or a safety\n"+
			"violation (two holders of one key).\n\n")
		fs.PrintDefaults()
	}
	p := parse(fs, args, stdout, stderr)
	if p.done {
		return p.exit
	}
	if len(p.pos) > 1 {
		return usageError(fs, stderr, fmt.Sprintf("unexpected argument %q", p.pos[1]))
	}
	urls := []string{*uri}
	if len(p.pos) > 0 {
		urls[0] = p.pos[0]
	}
	urls = append(urls, vs...)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var targets []bench.Target
	for _, u := range urls {
		open := bench.Open
		if cfg.Scenario == "readheavy" {
			open = bench.OpenRW
		}
		t, closeT, err := open(ctx, u, *allowRemote)
		if err != nil {
			msg := strings.TrimPrefix(describe(hideURI(err)), "bench: ")
			if errors.Is(err, bench.ErrNotLoopback) {
				return usageError(fs, stderr, msg) // --allow-remote is the fix
			}
			fmt.Fprintf(stderr, "%s: %s\n", fs.Name(), msg)
			return exitError
		}
		defer closeT()
		t.Name = shownURI(t.Name)
		targets = append(targets, t)
	}
	if f, ok := stderr.(*os.File); ok && isTerminal(f) && !*asJSON {
		cfg.Progress = func(target string, ops int64, elapsed time.Duration) {
			fmt.Fprint(f, "\r\033[K"+progressLine(target, ops, elapsed))
		}
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return fail(fs, stderr, err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return fail(fs, stderr, err)
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	results, err := bench.Run(ctx, cfg, targets...)
	if cfg.Progress != nil {
		fmt.Fprint(stderr, "\r\033[K")
	}
	if err != nil {
		return fail(fs, stderr, err)
	}
	if *asJSON {
		out := map[string]any{"date": time.Now().UTC().Format(time.RFC3339), "results": results}
		if len(results) == 2 {
			out["ratios"] = ratios(results[0], results[1])
		}
		if len(results) > 2 {
			var rts []map[string]float64
			for _, other := range results[1:] {
				rts = append(rts, ratios(results[0], other))
			}
			out["ratios"] = rts
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(out)
	} else {
		printResults(stdout, results)
	}
	code := exitOK
	for _, r := range results {
		switch {
		case r.Violations > 0:
			fmt.Fprintf(stderr, "mlock bench: %s: %d SAFETY VIOLATIONS (two holders of one key)\n", r.Target, r.Violations)
			code = exitError
		case r.Ops == 0:
			// A target that granted nothing (a server in its quiet period,
			// every request refused) measured nothing.
			fmt.Fprintf(stderr, "mlock bench: %s: no operation completed (%d errors, %d timeouts)\n", r.Target, r.Errors, r.Timeouts)
			code = exitError
		}
	}
	return code
}

// progressLine is the progress of one target: "TARGET  N ops in D (R/s)".
func progressLine(target string, ops int64, elapsed time.Duration) string {
	rate := 0.0
	if elapsed > 0 {
		rate = float64(ops) / elapsed.Seconds()
	}
	return fmt.Sprintf("%s  %d ops in %v (%.0f/s)", target, ops, elapsed.Round(100*time.Millisecond), rate)
}

// human is d with three significant digits in the unit that suits it:
// 950ns, 812µs, 72.7ms, 1.23s.
func human(d time.Duration) string {
	if d < 0 {
		return "-" + human(-d)
	}
	// Three significant digits before the unit is chosen, so that 999.6µs
	// reads 1ms, not 1000µs.
	if d >= 1000 {
		p := time.Duration(1)
		for d/p >= 1000 {
			p *= 10
		}
		d = (d + p/2) / p * p
	}
	type unit struct {
		size time.Duration
		name string
	}
	u := unit{time.Nanosecond, "ns"}
	for _, c := range []unit{{time.Microsecond, "µs"}, {time.Millisecond, "ms"}, {time.Second, "s"}} {
		if d >= c.size {
			u = c
		}
	}
	v := float64(d) / float64(u.size)
	prec := 0
	switch {
	case u.size == time.Nanosecond || v >= 100:
	case v >= 10:
		prec = 1
	default:
		prec = 2
	}
	s := strconv.FormatFloat(v, 'f', prec, 64)
	if prec > 0 {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s + u.name
}

// printResults prints the results as two tables (latencies and CPU; then
// the fairness of a hotkey run and the counts), each within 100 columns
// for the usual targets.
func printResults(w io.Writer, rs []bench.Result) {
	r0 := rs[0]
	fmt.Fprintf(w, "scenario %s, %d workers\n", r0.Scenario, r0.Workers)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TARGET\tOPS\tOPS/S\tP50\tP99\tMAX\tSRV CPU/OP\tCLI CPU/OP")
	for _, r := range rs {
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%s\t%s\t%s\t%s\t%s\n", r.Target, r.Ops, r.Rate, human(r.P50), human(r.P99), human(r.Max),
			cpuPerOp(r.CPUPerOp, r.CPUKnown), cpuPerOp(r.ClientCPUPerOp, r.ClientCPUKnown))
	}
	tw.Flush()
	fmt.Fprintln(w)
	hot := r0.Scenario == "hotkey"
	if r0.Scenario == "readheavy" {
		fmt.Fprintln(tw, "TARGET\tWRITES\tWRITE P50\tWRITE P99\tWRITE MAX")
		for _, r := range rs {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", r.Target, r.Writes, human(r.WriteP50), human(r.WriteP99), human(r.WriteMax))
		}
		tw.Flush()
		fmt.Fprintln(w)
	}
	head := "TARGET"
	if hot {
		head += "\tHANDOFF P50\tHANDOFF P99\tJAIN\tFIFO"
	}
	fmt.Fprintln(tw, head+"\tTIMEOUTS\tERRORS\tVIOLATIONS")
	for _, r := range rs {
		line := r.Target
		if hot {
			line += fmt.Sprintf("\t%s\t%s\t%.3f\t%.3f", human(r.HandoffP50), human(r.HandoffP99), r.Jain, r.FIFO)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\n", line, r.Timeouts, r.Errors, r.Violations)
	}
	tw.Flush()
	for _, r := range rs {
		if r.FirstError != "" {
			fmt.Fprintf(w, "%s: first error: %s\n", r.Target, r.FirstError)
		}
	}
	for _, other := range rs[1:] {
		rt := ratios(rs[0], other)
		fmt.Fprintf(w, "ratios (first / %s): ops/s %.2fx, p99 %.2fx\n", other.Target, rt["opsPerSec"], rt["p99"])
		var cpu []string
		for _, k := range []struct{ key, label string }{
			{"serverCpuPerOp", "server"}, {"clientCpuPerOp", "client"}, {"totalCpuPerOp", "client+server"},
		} {
			if v, ok := rt[k.key]; ok {
				cpu = append(cpu, fmt.Sprintf("%s %.2fx", k.label, v))
			}
		}
		if len(cpu) > 0 {
			fmt.Fprintf(w, "CPU per op ratios: %s\n", strings.Join(cpu, ", "))
		}
	}
}

func cpuPerOp(d time.Duration, known bool) string {
	if !known {
		return "n/a"
	}
	return human(d)
}

func ratios(a, b bench.Result) map[string]float64 {
	out := map[string]float64{
		"opsPerSec": bench.Ratio(a.Rate, b.Rate),
		"p99":       bench.Ratio(float64(a.P99), float64(b.P99)),
	}
	if a.CPUKnown && b.CPUKnown {
		out["serverCpuPerOp"] = bench.Ratio(float64(a.CPUPerOp), float64(b.CPUPerOp))
	}
	if a.ClientCPUKnown && b.ClientCPUKnown {
		out["clientCpuPerOp"] = bench.Ratio(float64(a.ClientCPUPerOp), float64(b.ClientCPUPerOp))
	}
	if a.CPUKnown && b.CPUKnown && a.ClientCPUKnown && b.ClientCPUKnown {
		out["totalCpuPerOp"] = bench.Ratio(float64(a.CPUPerOp+a.ClientCPUPerOp), float64(b.CPUPerOp+b.ClientCPUPerOp))
	}
	for k, v := range out {
		if math.IsNaN(v) {
			delete(out, k)
		}
	}
	return out
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, " ") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }
