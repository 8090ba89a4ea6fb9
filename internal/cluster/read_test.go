package cluster

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// ReadIndex: on the ready leader, an index at or above every entry committed before the call, with no
// log entry written for it, many concurrent reads confirmed in few rounds; on a follower, and on a
// leader cut off from the others, ErrNotLeader or an error, never an index. WaitApplied waits for the
// index on a follower.
func TestReadIndex(t *testing.T) {
	t.Parallel()
	tc := newInmemCluster(t, 3, false, nil)
	li := tc.leader()
	fi := (li + 1) % 3
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tc.propose(ctx, li, 5)
	committed := tc.nodes[li].Status().CommitIndex
	idx, err := tc.nodes[li].ReadIndex(ctx)
	if err != nil || idx < committed {
		t.Fatalf("ReadIndex = %d, %v; want at least %d", idx, err, committed)
	}
	if err := tc.nodes[fi].WaitApplied(ctx, idx); err != nil {
		t.Fatal(err)
	}
	if got := tc.nodes[fi].AppliedIndex(); got < idx {
		t.Fatalf("follower applied %d after WaitApplied(%d)", got, idx)
	}
	wctx, wcancel := context.WithTimeout(ctx, 50*time.Millisecond)
	if err := tc.nodes[fi].WaitApplied(wctx, idx+1000); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitApplied of an index never written = %v", err)
	}
	wcancel()
	if _, err := tc.nodes[fi].ReadIndex(ctx); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("ReadIndex on a follower = %v, want ErrNotLeader", err)
	}

	// 200 concurrent reads: no entry, and all answered.
	last := tc.nodes[li].Status().LastIndex
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := tc.nodes[li].ReadIndex(ctx); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := tc.nodes[li].Status().LastIndex; got > last+1 { // a notice may follow the last proposal
		t.Fatalf("200 reads took the log from %d to %d", last, got)
	}

	// Cut off, the leader confirms nothing.
	tc.isolate(li)
	rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
	defer rcancel()
	if idx, err := tc.nodes[li].ReadIndex(rctx); err == nil {
		t.Fatalf("a leader cut off from the others gave read index %d", idx)
	}
	tc.heal(li)
}

// ReadIndexWithin: reads that may wait long share one round with a read that may not, which does not
// wait for their window; every one of them is answered with an index at or above every entry
// committed before that read, in one round of heartbeats.
func TestReadIndexWithin(t *testing.T) {
	t.Parallel()
	tc := newInmemCluster(t, 3, false, nil)
	li := tc.leader()
	n := tc.nodes[li]
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := n.Propose(ctx, []byte("p0")); err != nil {
		t.Fatal(err)
	}
	// A round now: the next reads come within their window of it.
	if _, err := n.ReadIndex(ctx); err != nil {
		t.Fatal(err)
	}
	n.mu.Lock()
	l := n.lead
	n.mu.Unlock()
	const slow = 20
	const window = time.Minute // past the test's own bound: their round is the fast read's
	type answer struct {
		idx uint64
		err error
	}
	answers := make(chan answer, slow)
	for range slow {
		go func() {
			idx, err := n.ReadIndexWithin(ctx, window)
			answers <- answer{idx, err}
		}()
	}
	for {
		l.rmu.Lock()
		k := len(l.readers)
		l.rmu.Unlock()
		if k == slow {
			break
		}
		select {
		case a := <-answers:
			t.Fatalf("a read of window %v answered before any other read came: %d, %v", window, a.idx, a.err)
		case <-time.After(5 * time.Millisecond): // polled: the reads join
		}
	}
	before := l.rounds.Load()
	if _, err := n.Propose(ctx, []byte("p1")); err != nil {
		t.Fatal(err)
	}
	committed := n.Status().CommitIndex
	idx, err := n.ReadIndex(ctx)
	if err != nil || idx < committed {
		t.Fatalf("ReadIndex = %d, %v; want at least %d", idx, err, committed)
	}
	for range slow {
		a := <-answers
		if a.err != nil || a.idx != idx {
			t.Fatalf("a read of window %v answered %d, %v; want the fast read's round (%d)", window, a.idx, a.err, idx)
		}
	}
	if got := l.rounds.Load() - before; got != 1 {
		t.Fatalf("%d rounds for the %d reads, want 1", got, slow+1)
	}
}
