package mlock_test

import (
	"context"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/server"
)

// processCPU returns the CPU time (user + system) of this process so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkLockUnlock measures uncontended lock+unlock cycles of 8 workers
// sharing one connection. With MLOCK_BENCH_ADDR set to a running mlockd the
// process's CPU is the client's alone, reported as cpu-ns/op.
func BenchmarkLockUnlock(b *testing.B) {
	addr := os.Getenv("MLOCK_BENCH_ADDR")
	if addr == "" {
		addr, _ = startServer(b, server.Config{}, "")
	}
	c := client(b, addr, mlock.Options{})
	ctx := context.Background()
	if err := c.Ping(ctx); err != nil {
		b.Fatal(err)
	}
	const workers = 8
	var next atomic.Int64
	var wg sync.WaitGroup
	st0, err := c.Status(ctx)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := processCPU()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := "bench:" + strconv.Itoa(w) + ":" + strconv.Itoa(int(time.Now().UnixNano()%1e6))
			for next.Add(1) <= int64(b.N) {
				l, err := c.Lock(ctx, res, &mlock.LockOptions{TTL: 10 * time.Second})
				if err != nil {
					b.Error(err)
					return
				}
				if err := l.Unlock(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
	if st1, err := c.Status(ctx); err == nil && st1.Reads > st0.Reads {
		// The server's reads are the client's writes, give or take.
		b.ReportMetric(float64(st1.Reads-st0.Reads)/float64(b.N), "srv-reads/op")
		b.ReportMetric(float64(st1.Writes-st0.Writes)/float64(b.N), "srv-writes/op")
	}
}
