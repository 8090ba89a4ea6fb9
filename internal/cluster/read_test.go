package cluster

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
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
	idx, err := tc.nodes[li].ReadIndex(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tc.nodes[fi].WaitApplied(ctx, idx); err != nil {
		t.Fatal(err)
	}
	if got := tc.nodes[fi].AppliedIndex(); got < idx {
		t.Fatalf("follower applied %d after WaitApplied(%d)", got, idx)
	}
	if last := lastCommand(tc.sms[fi]); last != "p4" {
		t.Fatalf("follower's last command after WaitApplied(ReadIndex) = %q, want p4", last)
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
	idx, err := n.ReadIndex(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fi := (li + 1) % 3
	if err := tc.nodes[fi].WaitApplied(ctx, idx); err != nil {
		t.Fatal(err)
	}
	if last := lastCommand(tc.sms[fi]); last != "p1" {
		t.Fatalf("follower's last command after WaitApplied(ReadIndex) = %q, want p1", last)
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

// lastCommand returns the last command sm applied ("" if none): its log's last line without its time.
func lastCommand(sm *lockedSM) string {
	var last string
	sm.read(func(s *toySM) {
		if len(s.Log) > 0 {
			_, last, _ = strings.Cut(s.Log[len(s.Log)-1], " ")
		}
	})
	return last
}

// A read index leaves out the leader's quiet notices committed last: with raft's commit timeout at a
// minute, a follower learns that a notice is committed only a minute later, yet its read of an idle
// cluster (the notice after the last proposal committed) is applied at once, and has every command
// proposed before it.
func TestReadIndexLeavesOutQuietNotices(t *testing.T) {
	t.Parallel()
	tc := newInmemCluster(t, 3, false, func(_ int, c *Config) { c.CommitTimeout = time.Minute })
	li := tc.leader()
	ld := tc.nodes[li]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for k := range 3 {
		cmd := fmt.Sprintf("q%d", k)
		if _, err := ld.Propose(ctx, []byte(cmd)); err != nil {
			t.Fatal(err)
		}
		// The notice that follows the proposal is committed and answered on the leader.
		at := ld.AppliedIndex()
		ld.mu.Lock()
		l := ld.lead
		ld.mu.Unlock()
		for {
			st := ld.Status()
			if a := l.answered.Load(); st.CommitIndex > at && a.last == st.CommitIndex && st.LastIndex == st.CommitIndex {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("no notice committed after %s", cmd)
			case <-time.After(2 * time.Millisecond): // polled: the notice's commit
			}
		}
		idx, err := ld.ReadIndex(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if c := ld.Status().CommitIndex; idx >= c {
			t.Fatalf("ReadIndex = %d with a quiet notice committed last (commit index %d)", idx, c)
		}
		for i := range tc.nodes {
			if i == li {
				continue
			}
			wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
			err := tc.nodes[i].WaitApplied(wctx, idx)
			wcancel()
			if err != nil {
				t.Fatalf("follower %d: WaitApplied(ReadIndex %d) after %s: %v", i, idx, cmd, err)
			}
			if last := lastCommand(tc.sms[i]); last != cmd {
				t.Fatalf("follower %d's last command after its read = %q, want %s", i, last, cmd)
			}
		}
	}
}

// entryGate holds, while it is closed, every AppendEntries that carries entries (heartbeats pass):
// the leader's entries stay uncommitted while it keeps its leadership and confirms reads.
type entryGate struct {
	mu   sync.Mutex
	held chan struct{} // nil: open
}

// hold closes the gate; the returned function opens it (once).
func (g *entryGate) hold() (release func()) {
	ch := make(chan struct{})
	g.mu.Lock()
	g.held = ch
	g.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			g.held = nil
			g.mu.Unlock()
			close(ch)
		})
	}
}

func (g *entryGate) wait() {
	g.mu.Lock()
	ch := g.held
	g.mu.Unlock()
	if ch != nil {
		<-ch
	}
}

// gatedTransport is an in-memory transport whose entries wait at gate; no pipeline, as on the
// network transport (noPipeline).
type gatedTransport struct {
	*raft.InmemTransport
	gate *entryGate
}

func (t *gatedTransport) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest,
	resp *raft.AppendEntriesResponse) error {
	if len(args.Entries) > 0 {
		t.gate.wait()
	}
	return t.InmemTransport.AppendEntries(id, target, args, resp)
}

func (*gatedTransport) AppendEntriesPipeline(raft.ServerID, raft.ServerAddress) (raft.AppendPipeline, error) {
	return nil, raft.ErrPipelineReplicationNotSupported
}

// A read index covers every entry the leader proposed before the read, committed or not: an entry
// whose commit is held up (its AppendEntries wait, the heartbeats pass: the leader confirms its
// leadership) holds the read back until it is committed. Before, the read answered the commit index
// at once, below the entry: a follower's ping answered from it was read by the client before the
// grant of an entry whose time (the lease's start) was before the ping was sent, and the client
// counted the lease from the ping's send time, past the server's expiry.
func TestReadIndexCoversEntriesProposedBeforeIt(t *testing.T) {
	t.Parallel()
	gate := &entryGate{}
	tc := newInmemCluster(t, 3, false, func(i int, c *Config) {
		c.Transport = &gatedTransport{InmemTransport: c.Transport.(*raft.InmemTransport), gate: gate}
	})
	li := tc.leader()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tc.propose(ctx, li, 2)
	last := tc.nodes[li].Status().LastIndex
	release := gate.hold()
	defer release()
	proposed := make(chan error, 1)
	go func() {
		_, err := tc.nodes[li].Propose(ctx, []byte("held"))
		proposed <- err
	}()
	var held uint64 // the entry's index, once the leader stored it
	for polls := 0; held == 0; polls++ {
		if polls == 10000 {
			t.Fatal("the leader did not store the proposed entry within 10 s")
		}
		if idx := tc.nodes[li].Status().LastIndex; idx > last {
			held = idx
			break
		}
		time.Sleep(time.Millisecond) // poll interval
	}
	type result struct {
		index uint64
		err   error
	}
	read := make(chan result, 1)
	go func() {
		idx, err := tc.nodes[li].ReadIndex(ctx)
		read <- result{idx, err}
	}()
	var r result
	answered := false
	select {
	case r = <-read: // answered while the entry waits: it must be at or below the index
		answered = true
	case <-time.After(time.Second): // the test's input: how long the entry is held up
	}
	release()
	if !answered {
		r = <-read
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.index < held {
		t.Fatalf("read index %d (answered while the entry was held up: %v), below entry %d proposed before the read",
			r.index, answered, held)
	}
	if err := <-proposed; err != nil {
		t.Fatal(err)
	}
}
