package cluster

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestSingleNodeProposeAndTick(t *testing.T) {
	t.Parallel()
	sm := newLockedSM(false)
	var clock struct {
		sync.Mutex
		off int64
	}
	now := func() int64 {
		clock.Lock()
		defer clock.Unlock()
		return time.Now().UnixNano() + clock.off
	}
	n, err := Open(Config{ID: "a", RaftAddr: "127.0.0.1:0", ClientAddr: "c:1", Bootstrap: true, SM: sm,
		Clock: now, NextDeadline: sm.nextDeadline})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := n.WaitLeader(ctx)
	if err != nil || info.ID != "a" || info.ClientAddr != "c:1" || n.LeaderAddr() != "c:1" {
		t.Fatalf("WaitLeader = %+v, %v", info, err)
	}
	res, err := n.Propose(ctx, []byte("x"))
	if err != nil || string(res) != "1" {
		t.Fatalf("Propose = %q, %v", res, err)
	}
	// A deadline 30 ms ahead: the leader ticks once the clock passes it.
	d := now() + int64(30*time.Millisecond)
	if _, err := n.Propose(ctx, fmt.Appendf(nil, "deadline:%d", d)); err != nil {
		t.Fatal(err)
	}
	for {
		var done bool
		sm.read(func(s *toySM) { done = len(s.Deadlines) == 0 })
		if done {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("no tick for the deadline")
		}
		time.Sleep(5 * time.Millisecond)
	}
	sm.read(func(s *toySM) {
		last := s.Log[len(s.Log)-1]
		var at, dl int64
		if _, err := fmt.Sscanf(last, "%d deadline %d", &at, &dl); err != nil || dl != d || at < d {
			t.Fatalf("last log line %q: want a tick at >= %d", last, d)
		}
		if s.Ticks != 2 { // the leader entry (no OnLeader command) and the deadline's tick
			t.Fatalf("entries without commands = %d, want 2", s.Ticks)
		}
		if s.Backwards {
			t.Fatal("now went backwards")
		}
	})
	// The clock jumps back: entries keep their order in time.
	clock.Lock()
	clock.off = -int64(time.Hour)
	clock.Unlock()
	if _, err := n.Propose(ctx, []byte("y")); err != nil {
		t.Fatal(err)
	}
	sm.read(func(s *toySM) {
		if s.Backwards {
			t.Fatal("now went backwards after the clock did")
		}
	})
	st := n.Status()
	if st.Role != Leader || !st.Ready || st.AppliedIndex == 0 || len(st.Peers) != 1 || st.Peers[0].Suffrage != "Voter" {
		t.Fatalf("Status = %+v", st)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Propose(ctx, []byte("z")); !errors.Is(err, ErrClosed) {
		t.Fatalf("Propose after Close = %v, want ErrClosed", err)
	}
}

func TestGroupCommitThreeNodes(t *testing.T) {
	t.Parallel()
	tc := newInmemCluster(t, 3, false, nil)
	li := tc.leader()
	ld := tc.nodes[li]
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// Followers refuse, naming the leader.
	f := tc.nodes[(li+1)%3]
	if _, err := f.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	_, err := f.Propose(ctx, []byte("no"))
	var nle *NotLeaderError
	if !errors.As(err, &nle) || !errors.Is(err, ErrNotLeader) || nle.Leader.ID != ld.ID() ||
		nle.Leader.ClientAddr != fmt.Sprintf("client%d", li) {
		t.Fatalf("follower Propose = %v", err)
	}

	var before int
	tc.sms[li].read(func(s *toySM) { before = s.Entries })
	const workers, each = 64, 40
	results := make(chan string, workers*each)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for k := range each {
				res, err := ld.Propose(ctx, fmt.Appendf(nil, "w%d-%d", w, k))
				if err != nil {
					t.Error(err)
					return
				}
				results <- string(res)
			}
		})
	}
	wg.Wait()
	close(results)
	seen := map[string]bool{}
	for r := range results {
		if seen[r] {
			t.Fatalf("result %s returned twice", r)
		}
		seen[r] = true
	}
	if len(seen) != workers*each {
		t.Fatalf("%d results, want %d", len(seen), workers*each)
	}
	snap := tc.converge()
	var entries int
	tc.sms[li].read(func(s *toySM) { entries = s.Entries - before })
	t.Logf("%d commands in %d entries (%.1f per entry)", workers*each, entries, float64(workers*each)/float64(entries))
	if entries*4 > workers*each {
		t.Fatalf("group commit: %d entries for %d commands", entries, workers*each)
	}
	if !strings.Contains(string(snap), "failover n") {
		t.Fatal("no failover entry in the log")
	}
	var calls int32
	for i := range tc.onLeader {
		calls += tc.onLeader[i].Load()
	}
	if calls != 1 {
		t.Fatalf("OnLeader called %d times, want 1", calls)
	}
	for i, sm := range tc.sms {
		sm.read(func(s *toySM) {
			if s.Backwards {
				t.Fatalf("node %d: now went backwards", i)
			}
		})
	}
	// Status on the leader sees all peers.
	st := ld.Status()
	if st.Role != Leader || len(st.Peers) != 3 || st.CommitIndex < st.AppliedIndex-0 {
		t.Fatalf("leader Status = %+v", st)
	}
	if fs := f.Status(); fs.Role != Follower || fs.Leader.ID != ld.ID() || fs.LastContact.IsZero() {
		t.Fatalf("follower Status = %+v", fs)
	}
}

// TestLeaderLossDedup cuts the leader off while many clients propose keyed commands and retry them on
// whichever node leads: a new leader takes over (its failover entry first), proposals resume, and after
// the heal every command is in every log exactly once.
func TestLeaderLossDedup(t *testing.T) {
	t.Parallel()
	tc := newInmemCluster(t, 3, true, nil)
	old := tc.leader()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	var o outcome
	const workers, each = 16, 30
	var wg sync.WaitGroup
	progress := make(chan struct{}, workers*each)
	for w := range workers {
		wg.Go(func() {
			client := fmt.Sprintf("c%d", w)
			for k := range each {
				cmd := DedupCommand(client, uint64(k+1), fmt.Appendf(nil, "%s-%d", client, k))
				if _, err := proposeRetry(t, tc.nodes, ctx, cmd, &o); err != nil {
					t.Error(err)
					return
				}
				progress <- struct{}{}
			}
		})
	}
	for range workers * each / 4 {
		<-progress
	}
	tc.isolate(old)
	newLeader := tc.leader(old)
	if tc.onLeader[newLeader].Load() == 0 {
		t.Fatal("OnLeader not called on the new leader")
	}
	// Proposals resume on the new leader while the old one is cut off.
	for range workers * each / 4 {
		select {
		case <-progress:
		case <-ctx.Done():
			t.Fatal("no progress after the leader was cut off")
		}
	}
	tc.heal(old)
	wg.Wait()
	snap := tc.converge()
	t.Logf("outcomes: ok %d, not leader %d, unknown %d", o.ok.Load(), o.notLeader.Load(), o.unknown.Load())

	var log []string
	tc.sms[0].read(func(s *toySM) { log = append(log, s.Log...) })
	count := map[string]int{}
	for _, line := range log {
		_, cmd, _ := strings.Cut(line, " ")
		count[cmd]++
	}
	for w := range workers {
		for k := range each {
			if c := count[fmt.Sprintf("c%d-%d", w, k)]; c != 1 {
				t.Fatalf("command c%d-%d applied %d times", w, k, c)
			}
		}
	}
	if !strings.Contains(string(snap), fmt.Sprintf("failover n%d", newLeader)) {
		t.Fatal("the new leader's failover entry is missing")
	}
}

// TestPartitionHeal: a minority follower cut off misses entries and catches up after the heal; a
// cut-off leader's proposal ends in ErrUnknownOutcome (or ErrNotLeader), never a false success.
func TestPartitionHeal(t *testing.T) {
	t.Parallel()
	tc := newInmemCluster(t, 3, false, nil)
	li := tc.leader()
	fi := (li + 1) % 3
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tc.isolate(fi)
	tc.propose(ctx, li, 20)
	if st := tc.nodes[fi].Status(); st.Role == Leader {
		t.Fatalf("isolated follower became leader: %+v", st)
	}
	tc.heal(fi)
	tc.converge()

	// Now cut off the leader itself and propose on it: the outcome is unknown, the command is not
	// applied by the majority (the old leader's entry is truncated after the heal).
	li = tc.leader()
	tc.isolate(li)
	_, err := tc.nodes[li].Propose(ctx, []byte("lost"))
	if !errors.Is(err, ErrUnknownOutcome) && !errors.Is(err, ErrNotLeader) {
		t.Fatalf("Propose on a cut-off leader = %v, want ErrUnknownOutcome", err)
	}
	nl := tc.leader(li)
	if _, err := tc.nodes[nl].Propose(ctx, []byte("after")); err != nil {
		t.Fatal(err)
	}
	tc.heal(li)
	snap := tc.converge()
	if strings.Contains(string(snap), " lost") {
		t.Fatal("the cut-off leader's uncommitted command was applied")
	}
}

// TestSnapshotCatchUp: a node that missed more than TrailingLogs entries catches up from a snapshot.
func TestSnapshotCatchUp(t *testing.T) {
	t.Parallel()
	tc := newInmemCluster(t, 3, true, func(i int, c *Config) {
		c.SnapshotThreshold = 16
		c.TrailingLogs = 4
		c.SnapshotInterval = 20 * time.Millisecond
	})
	li := tc.leader()
	fi := (li + 1) % 3
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tc.isolate(fi)
	for k := range 100 {
		if _, err := tc.nodes[li].Propose(ctx, DedupCommand("c", uint64(k), fmt.Appendf(nil, "s%d", k))); err != nil {
			t.Fatal(err)
		}
	}
	if err := tc.nodes[li].Snapshot(); err != nil {
		t.Fatal(err)
	}
	tc.heal(fi)
	tc.converge()
	tc.sms[fi].read(func(s *toySM) {
		if s.Restores == 0 {
			t.Fatal("the lagging node did not restore a snapshot")
		}
	})
	// After the restore it keeps deduplicating and applying like the others.
	if _, err := tc.nodes[li].Propose(ctx, DedupCommand("c", 5, []byte("s5"))); err != nil {
		t.Fatal(err)
	}
	if _, err := tc.nodes[li].Propose(ctx, DedupCommand("c", 1000, []byte("new"))); err != nil {
		t.Fatal(err)
	}
	snap := tc.converge()
	if n := strings.Count(string(snap), " s5\""); n != 1 {
		t.Fatalf("s5 applied %d times", n)
	}
}

func TestJoinRemove(t *testing.T) {
	t.Parallel()
	tc := newInmemCluster(t, 3, false, func(i int, c *Config) {
		if i != 0 {
			c.Bootstrap = false
		} else {
			c.Peers = c.Peers[:1]
		}
	})
	if li := tc.leader(); li != 0 {
		t.Fatalf("leader %d, want 0", li)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := tc.nodes[0].Propose(ctx, []byte("before")); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < 3; i++ {
		if err := tc.nodes[0].Join(ctx, tc.nodes[i].ID(), tc.nodes[i].RaftAddr()); err != nil {
			t.Fatal(err)
		}
	}
	if err := tc.nodes[1].Join(ctx, "x", "y"); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("Join on a follower = %v", err)
	}
	tc.converge()
	if st := tc.nodes[0].Status(); len(st.Peers) != 3 {
		t.Fatalf("peers %+v", st.Peers)
	}
	if err := tc.nodes[0].Remove(ctx, tc.nodes[2].ID()); err != nil {
		t.Fatal(err)
	}
	if st := tc.nodes[0].Status(); len(st.Peers) != 2 {
		t.Fatalf("peers after Remove %+v", st.Peers)
	}
	if _, err := tc.nodes[0].Propose(ctx, []byte("after")); err != nil {
		t.Fatal(err)
	}
	tc.converge(0, 1)
}

// TestFollowersLearnCommitsAtOnce: with CommitTimeout at a minute, raft itself would tell the
// followers that an entry is committed only with the next entry or a minute later; the leader's
// notice entry tells them at once, so each follower applies every command while the leader is idle.
func TestFollowersLearnCommitsAtOnce(t *testing.T) {
	t.Parallel()
	tc := newInmemCluster(t, 3, false, func(_ int, c *Config) { c.CommitTimeout = time.Minute })
	li := tc.leader()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for k := range 3 {
		cmd := fmt.Sprintf("c%d", k)
		if _, err := tc.nodes[li].Propose(ctx, []byte(cmd)); err != nil {
			t.Fatal(err)
		}
		for i := range tc.nodes {
			if i == li {
				continue
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				var has bool
				tc.sms[i].read(func(s *toySM) {
					has = len(s.Log) > 0 && strings.HasSuffix(s.Log[len(s.Log)-1], " "+cmd)
				})
				if has {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("follower %d has not applied %s 5 s after the leader answered it", i, cmd)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
	}
}

// TestProposeAsyncKeepsOrder: commands queued one after the other with ProposeAsync are applied in that
// order (each result, the log length, is one more than the last), while several are on their way; a
// command queued behind a Proposal of another leadership is refused, and nothing is queued.
func TestProposeAsyncKeepsOrder(t *testing.T) {
	t.Parallel()
	tc := newInmemCluster(t, 3, false, nil)
	ld := tc.nodes[tc.leader()]
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var prs []*Proposal
	var after *Proposal
	for k := range 200 {
		pr, err := ld.ProposeAsync(ctx, fmt.Appendf(nil, "a%d", k), after)
		if err != nil {
			t.Fatal(err)
		}
		prs, after = append(prs, pr), pr
	}
	last := 0
	for k, pr := range prs {
		res, err := pr.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n, _ := strconv.Atoi(string(res))
		if k > 0 && n != last+1 {
			t.Fatalf("command %d applied at %d, the one before it at %d", k, n, last)
		}
		last = n
	}
	var entries int
	tc.sms[tc.leader()].read(func(s *toySM) { entries = s.Entries })
	if entries >= 200 {
		t.Fatalf("200 queued commands in %d entries: not batched", entries)
	}
	stale := &Proposal{n: ld, l: &leadership{}}
	if _, err := ld.ProposeAsync(ctx, []byte("stale"), stale); !errors.Is(err, ErrNotSameTerm) {
		t.Fatalf("behind another leadership's proposal: %v, want ErrNotSameTerm", err)
	}
	f := tc.nodes[(tc.leader()+1)%3]
	if _, err := f.ProposeAsync(ctx, []byte("f"), nil); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("on a follower: %v, want ErrNotLeader", err)
	}
}

// TestAbandonedProposalSkipsItsChain: a proposal queued behind one (ProposeAsync's after) that was
// abandoned while still queued is skipped too, never taken into an entry: what is applied of a chain is
// a prefix of it, even when the caller gave up on an earlier command.
func TestAbandonedProposalSkipsItsChain(t *testing.T) {
	t.Parallel()
	l := &leadership{n: &Node{cfg: Config{MaxBatch: 16, BatchWindow: -1}}, queue: make(chan *proposal, 16)}
	newProp := func(cmd string, prev *proposal) *proposal {
		return &proposal{cmd: []byte(cmd), done: make(chan proposalResult, 1), fin: make(chan struct{}), prev: prev}
	}
	p1 := newProp("k", nil)
	p2 := newProp("k+1", p1)
	p3 := newProp("k+2", p2)
	other := newProp("other connection", nil)
	for _, p := range []*proposal{p2, other, p3} {
		l.queue <- p
	}
	if !p1.state.CompareAndSwap(propQueued, propAbandoned) { // its Wait's ctx ended
		t.Fatal("p1 not queued")
	}
	window := time.NewTimer(time.Hour)
	defer window.Stop()
	batch := l.collect(nil, p1, window)
	if len(batch) != 1 || batch[0] != other {
		t.Fatalf("batch = %d proposals, want only the other connection's", len(batch))
	}
	for _, p := range []*proposal{p2, p3} {
		if p.prev != nil {
			t.Fatalf("%s still holds the proposal before it: a chain would hold every command", p.cmd)
		}
		select {
		case <-p.fin:
			if r := <-p.done; !errors.Is(r.err, ErrSkipped) {
				t.Fatalf("%s: %v, want ErrSkipped", p.cmd, r.err)
			}
		default:
			t.Fatalf("%s: no result", p.cmd)
		}
	}
}
