package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/mlock-dev/mlock/cmd/mlock/internal/bench"
)

func cmdBench(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("bench", stderr)
	uri := uriFlag(fs)
	var cfg bench.Config
	fs.StringVar(&cfg.Scenario, "scenario", "uncontended", "uncontended, hotkey or shop")
	fs.IntVar(&cfg.Workers, "workers", 0, "concurrent workers (default 8; shop 32)")
	fs.DurationVar(&cfg.Duration, "duration", 5*time.Second, "run time per target (at most 10m)")
	fs.Int64Var(&cfg.Count, "count", 0, "stop after this many operations per target (0: no limit)")
	fs.DurationVar(&cfg.Hold, "hold", 0, "time each lock is held (default 0; shop 1ms)")
	fs.IntVar(&cfg.SKUs, "skus", 1000, "shop: number of SKUs")
	fs.Float64Var(&cfg.Zipf, "zipf", 1.1, "shop: Zipf exponent of SKU popularity (> 1)")
	fs.IntVar(&cfg.MaxOrder, "max-order", 5, "shop: most SKUs in one order")
	fs.DurationVar(&cfg.Timeout, "timeout", 5*time.Second, "longest wait for one lock (counted as a timeout)")
	fs.DurationVar(&cfg.Round, "round", time.Second, "with --vs: length of one interleaved round")
	vs := fs.String("vs", "", "a second target, run interleaved with the first; ratios are printed")
	allowRemote := fs.Bool("allow-remote", false, "allow targets that are not on loopback")
	asJSON := fs.Bool("json", false, "print the results as JSON")
	cpuProfile := fs.String("cpu-profile", "", "write the load generator's CPU profile to this file")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: mlock bench [flags] [URL]\n\nLoads a lock provider (mlock://, redis://, redis://...?mode=medusa for Medusa's own scripts,\n"+
			"memory:) with one scenario, and reports server and client (this process's) CPU per operation.\n"+
			"URL defaults to --uri. Targets must be on loopback unless --allow-remote.\n\n")
		fs.PrintDefaults()
	}
	pos, err := parse(fs, args)
	if err != nil {
		return exitError
	}
	urls := []string{*uri}
	if len(pos) > 0 {
		urls[0] = pos[0]
	}
	if *vs != "" {
		urls = append(urls, *vs)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var targets []bench.Target
	for _, u := range urls {
		t, closeT, err := bench.Open(ctx, u, *allowRemote)
		if err != nil {
			return fail(stderr, err)
		}
		defer closeT()
		targets = append(targets, t)
	}
	if f, ok := stderr.(*os.File); ok && isTerminal(f) && !*asJSON {
		cfg.Progress = func(target string, ops int64, elapsed time.Duration) {
			fmt.Fprintf(f, "\r\033[K%s: %d ops in %v (%.0f/s)", target, ops, elapsed.Round(100*time.Millisecond), float64(ops)/elapsed.Seconds())
		}
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return fail(stderr, err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return fail(stderr, err)
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	results, err := bench.Run(ctx, cfg, targets...)
	if cfg.Progress != nil {
		fmt.Fprint(stderr, "\r\033[K")
	}
	if err != nil {
		return fail(stderr, err)
	}
	if *asJSON {
		out := map[string]any{"date": time.Now().UTC().Format(time.RFC3339), "results": results}
		if len(results) == 2 {
			out["ratios"] = ratios(results[0], results[1])
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(out)
	} else {
		printResults(stdout, results)
	}
	for _, r := range results {
		if r.Violations > 0 {
			fmt.Fprintf(stderr, "mlock bench: %s: %d SAFETY VIOLATIONS (two holders of one key)\n", r.Target, r.Violations)
			return exitError
		}
	}
	return exitOK
}

func us(d time.Duration) string { return fmt.Sprintf("%.0fµs", float64(d)/float64(time.Microsecond)) }

func printResults(w io.Writer, rs []bench.Result) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	r0 := rs[0]
	fmt.Fprintf(tw, "scenario %s, %d workers\n", r0.Scenario, r0.Workers)
	hot := r0.Scenario == "hotkey"
	head := "TARGET\tOPS\tOPS/S\tP50\tP99\tMAX"
	if hot {
		head += "\tHANDOFF P50\tHANDOFF P99\tJAIN\tFIFO"
	}
	head += "\tTIMEOUTS\tERRORS\tVIOLATIONS\tSERVER CPU/OP\tCLIENT CPU/OP"
	fmt.Fprintln(tw, head)
	for _, r := range rs {
		line := fmt.Sprintf("%s\t%d\t%.0f\t%s\t%s\t%s", r.Target, r.Ops, r.Rate, us(r.P50), us(r.P99), us(r.Max))
		if hot {
			line += fmt.Sprintf("\t%s\t%s\t%.3f\t%.3f", us(r.HandoffP50), us(r.HandoffP99), r.Jain, r.FIFO)
		}
		line += fmt.Sprintf("\t%d\t%d\t%d\t%s\t%s", r.Timeouts, r.Errors, r.Violations,
			cpuPerOp(r.CPUPerOp, r.CPUKnown), cpuPerOp(r.ClientCPUPerOp, r.ClientCPUKnown))
		fmt.Fprintln(tw, line)
	}
	tw.Flush()
	for _, r := range rs {
		if r.FirstError != "" {
			fmt.Fprintf(w, "%s: first error: %s\n", r.Target, r.FirstError)
		}
	}
	if len(rs) == 2 {
		rt := ratios(rs[0], rs[1])
		fmt.Fprintf(w, "ratios (first / second): ops/s %.2fx, p99 %.2fx", rt["opsPerSec"], rt["p99"])
		for _, k := range []struct{ key, label string }{
			{"serverCpuPerOp", "server CPU per op"}, {"clientCpuPerOp", "client CPU per op"},
			{"totalCpuPerOp", "client+server CPU per op"},
		} {
			if v, ok := rt[k.key]; ok {
				fmt.Fprintf(w, ", %s %.2fx", k.label, v)
			}
		}
		fmt.Fprintln(w)
	}
}

func cpuPerOp(d time.Duration, known bool) string {
	if !known {
		return "n/a"
	}
	return fmt.Sprintf("%.1fµs", float64(d)/float64(time.Microsecond))
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
