package faulttest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/internal/proctest"
)

// TestFailover measures what a kill -9 of the leader costs clients under
// load: 8 workers, each with its own session and starting on a different
// node, take turns on two hot resources (short holds, a wait timeout far
// longer than any election). Per round the leader is killed, restarted
// 0.8 s later, and the cluster waits until healthy. Reported: per round,
// the time from the kill until every worker has been granted a lock again
// (the "recovery"), its p50 and p99 over the rounds, and every failed call.
// It fails on a failed call, on two workers holding one resource at once,
// or on a round that does not recover within 20 s.
//
// MLOCK_FAILOVER_ROUNDS sets the rounds (default 2).
func TestFailover(t *testing.T) {
	t.Parallel() // its own cluster; TestClusterFaults runs alongside
	if runtime.GOOS != "linux" {
		t.Skipf("SKIPPED: the failover test needs Linux (signals, process groups); this is %s", runtime.GOOS)
	}
	rounds := 2
	if n, err := strconv.Atoi(os.Getenv("MLOCK_FAILOVER_ROUNDS")); err == nil && n > 0 {
		rounds = n
	}
	const (
		nWorkers = 8
		hold     = 5 * time.Millisecond
		leaseTTL = 2 * time.Second
		waitFor  = 30 * time.Second // a lock's wait timeout: never reached unless something is wrong
	)
	hot := []string{"fo:a", "fo:b"}
	bin := buildMlockd(t)
	c := newCluster(t, bin, clusterOptions{grace: grace, workers: nWorkers})

	var (
		holders  [2]atomic.Int32 // worker+1 holding hot[i], as the workers believe
		violated atomic.Int64
		mu       sync.Mutex
		lastAt   = make([]time.Time, nWorkers) // guarded by mu: each worker's last grant
		failures []string                      // guarded by mu
		grants   atomic.Int64
	)
	fail := func(w int, what string, err error) {
		mu.Lock()
		defer mu.Unlock()
		if len(failures) < 50 {
			failures = append(failures, fmt.Sprintf("worker %d: %s: %v", w, what, err))
		}
	}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	clients := make([]*mlock.Client, nWorkers)
	for w := range nWorkers {
		cl, err := mlock.NewClient(mlock.Options{Addrs: c.addrs(w), StayOnNode: w%2 == 1, Name: fmt.Sprintf("w%d", w),
			Token: mlock.Secret(c.tokens[fmt.Sprintf("w%d", w)]), TTL: leaseTTL, Timeout: waitFor,
			DialTimeout: 2 * time.Second, MaxBackoff: 300 * time.Millisecond, PingInterval: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		clients[w] = cl
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil && i < 1_000_000; i++ {
				r := (w + i) % len(hot)
				l, err := cl.Lock(ctx, hot[r], nil)
				if err != nil {
					if ctx.Err() == nil {
						fail(w, "lock", err)
					}
					continue
				}
				grants.Add(1)
				mu.Lock()
				lastAt[w] = time.Now()
				mu.Unlock()
				if !holders[r].CompareAndSwap(0, int32(w+1)) {
					violated.Add(1)
				}
				time.Sleep(hold) // fixed: the critical section, the workload's input
				holders[r].CompareAndSwap(int32(w+1), 0)
				uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), waitFor)
				if err := l.Unlock(uctx); err != nil && !errors.Is(err, mlock.ErrExpired) {
					fail(w, "unlock", err)
				}
				cancel()
			}
		}()
	}
	var once sync.Once
	stopWorkers := func() {
		once.Do(func() {
			stop()
			wg.Wait()
			for _, cl := range clients {
				cl.Close()
			}
		})
	}
	defer stopWorkers()

	var recoveries []time.Duration
	for r := 1; r <= rounds; r++ {
		// Load before the fault: every worker granted again since the
		// round began.
		began := time.Now()
		proctest.WaitFor(t, 20*time.Second, fmt.Sprintf("round %d: load before the fault", r), func() bool {
			mu.Lock()
			defer mu.Unlock()
			last := slices.MinFunc(lastAt, func(a, b time.Time) int { return a.Compare(b) })
			return last.After(began)
		})
		victim := c.waitLeader(15 * time.Second)
		if victim == nil {
			t.Fatalf("round %d: no leader\n%s", r, c.logTails())
		}
		killed := time.Now()
		victim.kill()
		// Recovery: every worker granted again after the kill.
		deadline := killed.Add(20 * time.Second)
		restarted := false
		var rec time.Duration
		for {
			if !restarted && time.Since(killed) >= downFor {
				if err := c.start(victim); err != nil {
					t.Fatalf("round %d: restarting %s: %v", r, victim.id, err)
				}
				restarted = true
			}
			mu.Lock()
			last := slices.MinFunc(lastAt, func(a, b time.Time) int { return a.Compare(b) })
			all := last.After(killed)
			if all && rec == 0 {
				// The first moment every worker has a grant after the
				// kill: the last of them came within this poll.
				rec = time.Since(killed)
			}
			mu.Unlock()
			if all && restarted {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: not every worker was granted again within 20 s of the kill\n%s", r, c.logTails())
			}
			time.Sleep(2 * time.Millisecond) // poll interval
		}
		if _, err := c.waitHealthy(20 * time.Second); err != nil {
			t.Fatalf("round %d: %v\n%s", r, err, c.logTails())
		}
		recoveries = append(recoveries, rec)
		t.Logf("round %d: kill -9 of leader %s: every worker granted again within %v", r, victim.id, rec.Round(time.Millisecond))
	}
	stopWorkers()
	slices.Sort(recoveries)
	t.Logf("%d rounds, %d grants, recovery p50 %v p99 %v max %v; failed calls %d; violations %d",
		rounds, grants.Load(), percentile(recoveries, 50).Round(time.Millisecond),
		percentile(recoveries, 99).Round(time.Millisecond), recoveries[len(recoveries)-1].Round(time.Millisecond),
		len(failures), violated.Load())
	for _, f := range failures {
		t.Errorf("failed call: %s", f)
	}
	if v := violated.Load(); v > 0 {
		t.Errorf("%d times two workers held one resource at once", v)
	}
}
