package server

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/internal/cluster"
	"github.com/mlock-dev/mlock/internal/proctest"
)

// A follower of this build whose applied cluster version lags behind the
// leader's (the version just raised) writes its commands in the lower
// format; forwarded on a new forwarding connection (its previous one closed,
// as a full leader's links were in TestClusterLinksPassClientLimits), such a
// command was answered "ask again" for announceGrace, then refused as a
// stale member's, and the follower fenced, unless the follower happened to
// say its formats again on that connection first (every announceEvery).
// Now a node says its formats first on every forwarding connection it
// opens, so the leader takes the command at once: the lag is made here
// deterministic by holding the follower's apply of the raise.
func TestLaggingFollowerNewLinkNotStale(t *testing.T) {
	t.Parallel()
	var hold atomic.Pointer[string] // the node whose apply of a raise is held
	release := make(chan struct{})
	held := make(chan struct{})
	var heldOnce, releaseOnce sync.Once
	var leaderID atomic.Pointer[string]
	var seenFormat atomic.Int64 // the format of the held node's attach, as the leader applied it (0: not yet)
	apply := func(node string, _ int64, cmds [][]byte) {
		h := hold.Load()
		if h == nil {
			return
		}
		for _, c := range cmds {
			_, _, body, err := cluster.ParseDedupCommand(c)
			var m logCmd
			if err != nil || decodeLogCmd(body, &m) != nil {
				continue
			}
			switch {
			case node == *h && m.op == opVersion && m.version > logFormat1:
				heldOnce.Do(func() { close(held) })
				<-release
			case m.op == opAttach && m.node == *h && leaderID.Load() != nil && node == *leaderID.Load():
				seenFormat.CompareAndSwap(0, int64(m.format))
			}
		}
	}
	tc := newTestClusterWith(t, 3, false, func(tc *testCluster) { tc.hooks.apply = apply })
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(unblock) // before the nodes stop (cleanups run last first)
	tc.waitVersion(logFormat, false)

	// The version is lowered and pinned, so that the raise below is one
	// the test makes, while the follower f's apply of it is held.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var err error
	proctest.WaitFor(t, 30*time.Second, "the rollback accepted", func() bool {
		err = tc.nodes[tc.leader()].rollbackHere(ctx, rollbackReq{to: logFormat1})
		return err == nil
	})
	tc.waitVersion(logFormat1, true)
	l := tc.leader()
	f := (l + 1) % 3
	fID, lID := tc.nodes[f].cl.id, tc.nodes[l].cl.id
	leaderID.Store(&lID)
	hold.Store(&fID)
	proctest.WaitFor(t, 30*time.Second, "the cancel accepted", func() bool {
		err = tc.nodes[l].rollbackHere(ctx, rollbackReq{cancel: true})
		if errors.Is(err, cluster.ErrNotLeader) {
			t.Skip("the leadership moved") // f was chosen as the follower of l
		}
		return err == nil
	})
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("the follower did not reach the raise")
	}
	if v := tc.nodes[l].cl.versionNow.Load(); v != logFormat {
		t.Fatalf("the leader's version %d, want %d", v, logFormat)
	}
	if v := tc.nodes[f].cl.writeFormat(); v != logFormat1 {
		t.Fatalf("the held follower writes format %d, want %d", v, logFormat1)
	}

	// Right after f said its formats again (on its link of now), the
	// leader's links close: f forwards its next command on a new one.
	srv := tc.nodes[l]
	saidAt := func() time.Time {
		srv.cl.formats.mu.Lock()
		defer srv.cl.formats.mu.Unlock()
		return srv.cl.formats.said[fID].at
	}
	before := saidAt()
	proctest.WaitFor(t, 2*announceEvery, fID+" says its formats again", func() bool { return saidAt() != before })
	closeLinks(srv)
	fw := tc.nodes[f].cl.fwd
	proctest.WaitFor(t, 10*time.Second, fID+"'s link to the leader closed", func() bool {
		fw.mu.Lock()
		defer fw.mu.Unlock()
		return fw.conns[tc.addrs[l]] == nil
	})

	c := tc.dial(f, "lagging")
	deadline := time.Now().Add(3 * announceGrace)
	for seenFormat.Load() == 0 {
		if n := tc.refusedAll(); n != 0 {
			t.Fatalf("the leader refused %d forwarded commands of %s, a node of this build behind by one version", n, fID)
		}
		if !srv.cl.node.IsLeader() {
			t.Skip("the leadership moved") // the check above is the leader's
		}
		if time.Now().After(deadline) {
			t.Fatalf("the leader did not apply %s's attach within %v", fID, 3*announceGrace)
		}
		time.Sleep(10 * time.Millisecond) // polled: the apply hook has no event the test waits on
	}
	if got := seenFormat.Load(); got != logFormat1 {
		t.Fatalf("%s's attach was written in format %d: the lag the test makes is lost", fID, got)
	}
	unblock()
	c.expect("connected 1.0 new * **")
	if n := tc.refusedAll(); n != 0 {
		t.Fatalf("the leader refused %d forwarded commands of %s", n, fID)
	}
	if why := srv.cl.formats.staleNow(fID); why != "" {
		t.Fatalf("%s is fenced: %s", fID, why)
	}
}
