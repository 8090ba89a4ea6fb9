package observe

import (
	"testing"
	"time"

	"github.com/mlock-dev/mlock"
)

// Bucket bounds are inclusive; a negative value counts as 0; values past
// the last bound land in +Inf.
func TestHistogramBuckets(t *testing.T) {
	var d Durations
	for _, v := range []time.Duration{-time.Second, 0, 100 * time.Microsecond, 100*time.Microsecond + 1, time.Hour, 2 * time.Hour} {
		d.Observe(int64(v))
	}
	cum := d.h.cumulative(DurationBuckets)
	if d.Count() != 6 || cum[0.0001] != 3 || cum[0.00025] != 4 || cum[3600] != 5 {
		t.Fatalf("count %d, buckets %v", d.Count(), cum)
	}
	if d.Sum() != 100*time.Microsecond+100*time.Microsecond+1+3*time.Hour {
		t.Fatalf("sum %v", d.Sum())
	}
	var q Depths
	for _, v := range []int64{0, 1, 2, 3, 1_000_000} {
		q.Observe(v)
	}
	cum = q.h.cumulative(DepthBuckets)
	if q.Count() != 5 || cum[0] != 1 || cum[1] != 2 || cum[2] != 3 || cum[5] != 4 || cum[100_000] != 4 {
		t.Fatalf("depth buckets %v", cum)
	}
}

// counting is a Source whose grants the test sets.
type counting struct{ grants, busiest int }

func (c *counting) Snapshot(s *Snapshot)        { s.Grants = uint64(c.grants) }
func (*counting) Status() *mlock.Status         { return &mlock.Status{} }
func (*counting) Cluster() *mlock.StatusCluster { return nil }
func (*counting) Locks(string, string, int) *mlock.Locks {
	return &mlock.Locks{}
}
func (c *counting) Busiest(string, int, int) ([]mlock.LocksQueue, int) {
	c.busiest++
	return nil, 0
}
func (*counting) Ready() (bool, string) { return true, "" }

// The rates are the counters' differences over the samples' times; a
// busiest-queues result is reused within TopCache.
func TestRatesAndTopCache(t *testing.T) {
	src := &counting{}
	h := New(src, Options{TopCache: time.Hour})
	h.Close() // the test records the samples itself
	h.mu.Lock()
	h.head, h.full = 0, false
	h.mu.Unlock()
	h.record()
	src.grants = 30
	h.record()
	h.mu.Lock()
	h.samples[1].at = h.samples[0].at.Add(20 * time.Millisecond) // the second sample 20 ms later
	h.mu.Unlock()
	r := h.rates()
	if len(r.Grants) != 1 || r.Grants[0] <= 0 {
		t.Fatalf("rates %+v", r)
	}
	h.mu.Lock()
	dt := h.samples[1].at.Sub(h.samples[0].at).Seconds()
	h.mu.Unlock()
	if want := 30 / dt; r.Grants[0] < want*0.999 || r.Grants[0] > want*1.001 {
		t.Fatalf("grants rate %v, want %v", r.Grants[0], want)
	}
	h.busiest("", 5)
	h.busiest("", 5)
	h.busiest("x", 5)
	if src.busiest != 2 {
		t.Fatalf("Busiest called %d times, want 2 (one per view)", src.busiest)
	}
	// The ring keeps History's worth of samples.
	for range len(h.samples) + 3 {
		h.record()
	}
	if r := h.rates(); len(r.At) != len(h.samples)-1 {
		t.Fatalf("%d rates from a full ring of %d", len(r.At), len(h.samples))
	}
}

// A histogram's sum never wraps: a busy server's total hold time passes
// the 292 years int64 nanoseconds hold (10 000 grants a second of locks
// held a second get there in 11 days; 110 000 holds of 24 h at once), and
// mlock_hold_seconds_sum must keep growing, never turn negative.
func TestHistogramSumDoesNotWrap(t *testing.T) {
	var d Durations
	const n = 110_000
	for range n {
		d.Observe(int64(24 * time.Hour))
	}
	reg := NewRegistry(func(s *Snapshot) { s.Hold = d })
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "mlock_hold_seconds" {
			continue
		}
		h := f.GetMetric()[0].GetHistogram()
		want := float64(n) * 86400
		if got := h.GetSampleSum(); got < want*0.999 || got > want*1.001 || h.GetSampleCount() != n {
			t.Fatalf("mlock_hold_seconds sum %v count %d, want %v and %d", got, h.GetSampleCount(), want, n)
		}
		return
	}
	t.Fatal("no mlock_hold_seconds")
}
