package observe

import (
	"math"
	"time"
)

// DurationBuckets are the upper bounds, in seconds, of the wait and hold
// time histograms: 100 µs to 1 h.
var DurationBuckets = []float64{
	0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
	1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600,
}

// DepthBuckets are the upper bounds of the histogram of the entries ahead
// of a request when it is queued.
var DepthBuckets = []float64{0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 10_000, 100_000}

// maxBuckets bounds the buckets of a histogram (the +Inf one excluded).
const maxBuckets = 24

// durationBounds are DurationBuckets in nanoseconds; depthBounds are
// DepthBuckets as integers.
var durationBounds, depthBounds = toInts(DurationBuckets, 1e9), toInts(DepthBuckets, 1)

func toInts(b []float64, scale float64) []int64 {
	out := make([]int64, len(b))
	for i, v := range b {
		out[i] = int64(v * scale)
	}
	return out
}

// hist counts observations into buckets of fixed bounds: counts[i] for
// the values at most bounds[i] and above bounds[i-1], counts[len(bounds)]
// for the rest.
type hist struct {
	counts [maxBuckets + 1]uint64
	sum    float64 // like Prometheus's: an int64 of nanoseconds wraps after 292 years of total hold
	n      uint64
}

func (h *hist) observe(bounds []int64, v int64) {
	v = max(v, 0)
	i := 0
	for i < len(bounds) && v > bounds[i] {
		i++
	}
	h.counts[i]++
	h.sum += float64(v)
	h.n++
}

// cumulative returns the buckets in Prometheus's form: upper bound →
// observations at or below it.
func (h *hist) cumulative(exported []float64) map[float64]uint64 {
	m := make(map[float64]uint64, len(exported))
	var c uint64
	for i, ub := range exported {
		c += h.counts[i]
		m[ub] = c
	}
	return m
}

// Durations is a histogram of durations, observed in nanoseconds and
// exported in seconds with DurationBuckets. The zero value is empty and
// ready. It is not safe for concurrent use: the server updates its
// histograms under its core's lock and copies them (plain assignment)
// under the same lock. Observe does not allocate.
type Durations struct{ h hist }

// Observe counts d nanoseconds (a negative d counts as 0).
func (d *Durations) Observe(ns int64) { d.h.observe(durationBounds, ns) }

// Count returns the number of observations.
func (d *Durations) Count() uint64 { return d.h.n }

// Sum returns the sum of the observations (saturated at the largest
// time.Duration).
func (d *Durations) Sum() time.Duration {
	if d.h.sum >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(d.h.sum)
}

// Depths is a histogram of queue depths with DepthBuckets; like Durations
// otherwise.
type Depths struct{ h hist }

// Observe counts a depth (a negative one counts as 0).
func (d *Depths) Observe(v int64) { d.h.observe(depthBounds, v) }

// Count returns the number of observations.
func (d *Depths) Count() uint64 { return d.h.n }
