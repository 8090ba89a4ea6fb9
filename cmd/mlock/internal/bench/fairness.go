package bench

import "time"

// fairness accounts the hotkey scenario's grants from the order of its
// requests and answers: which workers wait, since when, and who is granted.
// A grant is out of FIFO order when another worker had asked more than
// FIFOSlack before the one granted and is still waiting. It is not safe for
// concurrent use: its caller serializes request and done.
type fairness struct {
	waitFrom map[int]time.Time // workers waiting, since when
	grants   []int64           // per worker
	granted  int64             // all grants
	overtake int64             // grants out of FIFO order
}

func newFairness(workers int) *fairness {
	return &fairness{waitFrom: map[int]time.Time{}, grants: make([]int64, workers)}
}

// request records that worker w asked for the key at at.
func (f *fairness) request(w int, at time.Time) {
	f.waitFrom[w] = at
}

// done records the answer to w's request: a grant, or none (a timeout, an
// error, the end of the round). Either way w no longer waits.
func (f *fairness) done(w int, granted bool) {
	from, waiting := f.waitFrom[w]
	delete(f.waitFrom, w)
	if !granted {
		return
	}
	f.grants[w]++
	f.granted++
	if !waiting {
		return
	}
	for _, other := range f.waitFrom {
		if other.Add(FIFOSlack).Before(from) {
			f.overtake++ // someone waiting clearly longer was passed over
			return
		}
	}
}

// jain returns Jain's index of the grants per worker (0 with no grants).
func (f *fairness) jain() float64 { return Jain(f.grants) }

// fifo returns the share of the grants that went to the longest waiter (0
// with no grants: nothing was measured).
func (f *fairness) fifo() float64 {
	if f.granted == 0 {
		return 0
	}
	return 1 - float64(f.overtake)/float64(f.granted)
}
