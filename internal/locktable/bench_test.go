package locktable

import (
	"fmt"
	"runtime"
	"strconv"
	"testing"
	"time"
)

func benchTable(b *testing.B) *Table {
	b.Helper()
	seed := [32]byte{3}
	t, err := New(Config{Seed: &seed, MaxLocksPerSession: -1, MaxQueueLen: -1,
		MaxLocks: -1, MaxEntries: -1, MaxNameBytes: -1, MaxSessionBytes: -1})
	if err != nil {
		b.Fatal(err)
	}
	t.Attach(0, "s")
	return t
}

func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = prefix + strconv.Itoa(i)
	}
	return out
}

// fill adds n held single-resource locks.
func fill(b *testing.B, t *Table, n int) {
	b.Helper()
	req := Request{Session: "s", TTL: time.Minute, Resources: make([]string, 1)}
	for i, name := range names("live:", n) {
		req.Resources[0] = name
		if _, err := t.Lock(int64(i), &req); err != nil {
			b.Fatal(err)
		}
	}
}

// benchLockUnlock times lock+unlock cycles of k resources. Besides ns/op
// (wall clock) it reports cpu-ns/op, the CPU time of the benchmark's own
// thread per cycle (Linux): on a machine shared with other work, the wall
// clock also counts the time other processes held the CPU.
func benchLockUnlock(b *testing.B, t *Table, k int) {
	req := Request{Session: "s", TTL: time.Minute, Resources: names("bench:", k)}
	now := int64(1_000_000) // after every fill lock was taken
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.ReportAllocs()
	b.ResetTimer()
	cpu := threadCPU()
	for i := 0; i < b.N; i++ {
		now++
		g, err := t.Lock(now, &req)
		if err != nil || !g.Granted {
			b.Fatal(err)
		}
		if err := t.Unlock(now, g.ID, "s"); err != nil {
			b.Fatal(err)
		}
	}
	if end := threadCPU(); cpu >= 0 && end >= 0 {
		b.ReportMetric(float64(end-cpu)/float64(b.N), "cpu-ns/op")
	}
}

// BenchmarkEngineUncontended: one lock+unlock cycle on free resources.
func BenchmarkEngineUncontended(b *testing.B) {
	for _, k := range []int{1, 5} {
		b.Run(fmt.Sprintf("resources=%d", k), func(b *testing.B) {
			benchLockUnlock(b, benchTable(b), k)
		})
	}
}

// BenchmarkEngineLive: the same cycle with n other live locks in the table.
func BenchmarkEngineLive(b *testing.B) {
	for _, n := range []int{1_000, 100_000, 1_000_000} {
		b.Run(fmt.Sprintf("live=%d", n), func(b *testing.B) {
			t := benchTable(b)
			fill(b, t, n)
			benchLockUnlock(b, t, 1)
		})
	}
}

// BenchmarkEngineHandoff: a hot resource with one holder and one waiter; each
// op enqueues a new waiter and unlocks the holder, which grants the waiter.
func BenchmarkEngineHandoff(b *testing.B) {
	t := benchTable(b)
	granted := 0
	t.cfg.OnEvent = func(e Event) {
		if e.Kind == Granted {
			granted++
		}
	}
	req := Request{Session: "s", TTL: time.Minute, Resources: []string{"hot"}}
	head, _ := t.Lock(1, &req)
	holder := head.ID
	now := int64(1)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		now++
		w, err := t.Lock(now, &req)
		if err != nil || w.Granted {
			b.Fatal("waiter must queue", err)
		}
		if err := t.Unlock(now, holder, "s"); err != nil {
			b.Fatal(err)
		}
		holder = w.ID
	}
	b.StopTimer()
	if granted != b.N {
		b.Fatalf("%d hand-offs, %d grants", b.N, granted)
	}
}

// BenchmarkEngineMemoryPerLock reports the heap bytes per held
// single-resource lock with 1 M held locks (metric bytes/lock). Each op is
// one whole fill of 1 M locks.
func BenchmarkEngineMemoryPerLock(b *testing.B) {
	const n = 1_000_000
	res := names("mem:", n) // the names belong to the caller, not the engine
	var perLock float64
	for i := 0; i < b.N; i++ {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		t := benchTable(b)
		req := Request{Session: "s", TTL: time.Hour, Resources: make([]string, 1)}
		for j := range n {
			req.Resources[0] = res[j]
			if _, err := t.Lock(int64(j), &req); err != nil {
				b.Fatal(err)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		perLock = float64(after.HeapAlloc-before.HeapAlloc) / n
		runtime.KeepAlive(t)
	}
	b.ReportMetric(perLock, "bytes/lock")
}

// BenchmarkEngineLiveEarliest is the deadline heap's worst case: every new
// lock expires before all n live ones, so it climbs to the top of the heap
// and its removal sifts a leaf down again (O(log n)).
func BenchmarkEngineLiveEarliest(b *testing.B) {
	for _, n := range []int{1_000, 1_000_000} {
		b.Run(fmt.Sprintf("live=%d", n), func(b *testing.B) {
			t := benchTable(b)
			req := Request{Session: "s", TTL: 24 * time.Hour, Resources: make([]string, 1)}
			for i, name := range names("live:", n) {
				req.Resources[0] = name
				if _, err := t.Lock(int64(i), &req); err != nil {
					b.Fatal(err)
				}
			}
			benchLockUnlock(b, t, 1)
		})
	}
}

// BenchmarkEngineFresh: lock+unlock cycles on resources never seen before,
// with n other live locks in the table: every cycle creates and frees a
// queue (and its entry in the ordered index of names).
func BenchmarkEngineFresh(b *testing.B) {
	for _, n := range []int{0, 1_000_000} {
		b.Run(fmt.Sprintf("live=%d", n), func(b *testing.B) {
			t := benchTable(b)
			fill(b, t, n)
			fresh := names("fresh:", 1<<16)
			req := Request{Session: "s", TTL: time.Minute, Resources: make([]string, 1)}
			now := int64(1_000_000)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				now++
				req.Resources[0] = fresh[i&(1<<16-1)]
				g, err := t.Lock(now, &req)
				if err != nil || !g.Granted {
					b.Fatal(err)
				}
				if err := t.Unlock(now, g.ID, "s"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSnapshot: MarshalBinary and Restore of a Table with 100 000 held
// single-resource locks and 10 000 waiters (metric bytes: the snapshot's
// size).
func BenchmarkSnapshot(b *testing.B) {
	const n = 100_000
	t := benchTable(b)
	fill(b, t, n)
	req := Request{Session: "s", TTL: time.Minute, Timeout: time.Minute, Resources: make([]string, 1)}
	for i, name := range names("live:", n/10) {
		req.Resources[0] = name
		if _, err := t.Lock(int64(n+i), &req); err != nil {
			b.Fatal(err)
		}
	}
	snap, err := t.MarshalBinary()
	if err != nil {
		b.Fatal(err)
	}
	b.Run("marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := t.MarshalBinary(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(len(snap)), "bytes")
	})
	b.Run("restore", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := Restore(Config{}, snap); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(len(snap)), "bytes")
	})
}

// BenchmarkEngineSharedBatch: a writer holds a hot resource, 1 000 readers
// wait behind it, then a waiting writer and a tail of more readers. Each op
// is the writer's unlock, which grants the 1 000 readers in one step (the
// tail stays behind the second writer); building the queue is not timed.
// The cost per op is the same whatever the tail's length: O(readers
// granted), not O(queue). Metric ns/reader: per reader granted.
func BenchmarkEngineSharedBatch(b *testing.B) {
	const readers = 1000
	for _, tail := range []int{0, 10_000, 100_000} {
		b.Run(fmt.Sprint("tail=", tail), func(b *testing.B) {
			granted := 0
			onEvent := func(e Event) {
				if e.Kind == Granted {
					granted++
				}
			}
			w := Request{Session: "s", TTL: time.Minute, Resources: []string{"hot"}}
			r := Request{Session: "s", TTL: time.Minute, Resources: []string{"hot"}, Modes: []Mode{Shared}}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				t := benchTable(b)
				t.cfg.OnEvent = onEvent
				holder, _ := t.Lock(1, &w)
				for range readers {
					t.Lock(1, &r)
				}
				t.Lock(1, &w)
				for range tail {
					t.Lock(1, &r)
				}
				granted = 0
				runtime.GC() // the queue's garbage is not the release's cost
				b.StartTimer()
				if err := t.Unlock(2, holder.ID, "s"); err != nil {
					b.Fatal(err)
				}
				if granted != readers {
					b.Fatalf("%d readers granted, want %d", granted, readers)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*readers), "ns/reader")
		})
	}
}

// BenchmarkQueuesPageFirst: the first listing of a Table of n held locks,
// which builds the ordered index of names (O(n log n)); later listings
// only seek in it (BenchmarkQueuesPage). Each op drops the index first.
func BenchmarkQueuesPageFirst(b *testing.B) {
	for _, n := range []int{1_000, 1_000_000} {
		b.Run(fmt.Sprintf("live=%d", n), func(b *testing.B) {
			t := benchTable(b)
			fill(b, t, n)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t.idx = nameIndex{max: youngMax, slack: dropSlack}
				got := 0
				t.QueuesPage("live:", "", 100, 1000, func(QueueInfo) bool { got++; return true })
				if got != 100 {
					b.Fatal(got)
				}
			}
		})
	}
}

// BenchmarkEngineLiveListed is BenchmarkEngineLive while listings come (a
// page of 100 queues every 1 000 cycles, in the timing): the index of
// names exists, and each cycle's queue is young, created and freed
// without touching the tree.
func BenchmarkEngineLiveListed(b *testing.B) {
	for _, n := range []int{1_000, 1_000_000} {
		b.Run(fmt.Sprintf("live=%d", n), func(b *testing.B) {
			t := benchTable(b)
			fill(b, t, n)
			req := Request{Session: "s", TTL: time.Minute, Resources: []string{"bench:0"}}
			now := int64(1_000_000)
			t.QueuesPage("live:", "", 100, 1000, func(QueueInfo) bool { return true }) // builds the index
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				now++
				g, err := t.Lock(now, &req)
				if err != nil || !g.Granted {
					b.Fatal(err)
				}
				if err := t.Unlock(now, g.ID, "s"); err != nil {
					b.Fatal(err)
				}
				if i%1000 == 999 {
					t.QueuesPage("live:", "", 100, 1000, func(QueueInfo) bool { return true })
				}
			}
			b.StopTimer()
			if t.idx.tree == nil {
				b.Fatal("the index was dropped while listings came")
			}
		})
	}
}
