package faulttest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mlock-dev/mlock"
)

// Environment:
//
//	MLOCK_SESSION_FAULT_ROUNDS=N   fault rounds (default 3: one of each kind)

// The session workload.
const (
	idleHolders  = 24               // sessions that hold a lock and only ping
	idlePingers  = 120              // sessions that hold nothing and only ping (load)
	idleTTL      = time.Minute      // the holders' lease: their belief is their session's
	sessionGrace = 3 * time.Second  // the servers' --session-grace
	waiterTTL    = time.Second      // a waiter's lease (it unlocks at once)
	waiterWait   = 3 * time.Second  // a waiter's wait timeout
	pingEvery    = time.Second      // every client's ping interval
	holdIdleMin  = 2 * time.Second  // an idle hold lasts 2 to 5 s
	holdIdleMax  = 5 * time.Second  //
	sessionLoad  = 2 * time.Second  // load before each fault
	sessionAfter = 1 * time.Second  // load after the cluster is healthy again
	lossNear     = 2 * sessionGrace // a holder's loss counts as the fault's up to this after it healed
)

// sessionFaultKinds are run in turn, one per round.
var sessionFaultKinds = []string{"stop-leader", "kill-leader", "kill-follower"}

// TestClusterSessionLiveness checks session liveness off the log on three
// real mlockd processes: idle holders (a lease of a minute, never
// extended: what they believe is their session's life, lastAck + grace,
// from their answered pings) spread over the nodes, a waiter queued behind
// each on another session, and more sessions that only ping; one fault per
// round: the leader stopped (SIGSTOP) past an election, the leader killed,
// a follower killed (each then restarted or continued). The checks:
//
//   - safety (checkSafety): no waiter is granted a holder's resource while
//     the holder still believes it alive ("session": the session ended
//     before the send time of its last answered ping plus the grace);
//   - liveness: an idle holder loses its lock only near a fault (from the
//     fault until lossNear after the cluster is healthy again): its pings
//     are answered otherwise.
func TestClusterSessionLiveness(t *testing.T) {
	t.Parallel() // its own cluster
	if runtime.GOOS != "linux" {
		t.Skipf("SKIPPED: the cluster fault tests need Linux (signals, process groups); this is %s", runtime.GOOS)
	}
	rounds := 3
	if n, err := strconv.Atoi(os.Getenv("MLOCK_SESSION_FAULT_ROUNDS")); err == nil && n > 0 {
		rounds = n
	}
	bin := buildMlockd(t)
	principals := idleHolders + 3 + idlePingers
	c := newCluster(t, bin, clusterOptions{grace: sessionGrace, workers: principals})
	h := newClusterHistory()
	newClient := func(w int, stay bool, ttl, wait time.Duration) *mlock.Client {
		name := fmt.Sprintf("w%d", w)
		cl, err := mlock.NewClient(mlock.Options{Addrs: c.addrs(w), StayOnNode: stay, Name: name,
			Token: mlock.Secret(c.tokens[name]), TTL: ttl, Timeout: wait,
			DialTimeout: 2 * time.Second, MaxBackoff: 300 * time.Millisecond, PingInterval: pingEvery})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close() })
		return cl
	}
	holders := make([]*mlock.Client, idleHolders)
	for i := range holders {
		holders[i] = newClient(i, i%2 == 1, idleTTL, waiterWait)
	}
	waiters := make([]*mlock.Client, 3)
	for i := range waiters {
		waiters[i] = newClient(idleHolders+i, true, waiterTTL, waiterWait)
	}
	for i := range idlePingers {
		newClient(idleHolders+3+i, i%2 == 1, idleTTL, waiterWait)
	}

	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var lost atomic.Int64
	lostAt := make(chan int64, 10000)
	for i, cl := range holders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			holdIdle(ctx, h, i, cl, lostAt, &lost)
		}()
		wg.Add(1)
		go func() {
			defer wg.Done()
			waitBehind(ctx, h, idleHolders+i, waiters[i%3], fmt.Sprintf("sl:%d", i))
		}()
	}

	elapsed := runRounds(t, c, h, rounds, sessionFaultKinds, sessionLoad, sessionAfter, func(r int) *mlock.Client { return holders[r%idleHolders] })
	stop()
	waitLoad(t, &wg, 3*callLimit, "the holders and waiters did not stop within %v", nil)
	c.stopAll()
	close(lostAt)

	_, grants, events := h.snapshot()
	idle, taken := 0, 0
	for _, g := range grants {
		if g.Idle {
			idle++
		} else {
			taken++
		}
	}
	vs, empty := checkSafety(grants)
	// Liveness: losses away from every fault.
	type window struct{ from, to int64 }
	byRound := map[int]*window{}
	for _, e := range events {
		w := byRound[e.Round]
		if w == nil {
			w = &window{e.T, 1<<63 - 1}
			byRound[e.Round] = w
		}
		if len(e.What) >= 7 && e.What[:7] == "healthy" {
			w.to = e.T + int64(lossNear)
		}
	}
	quiet := 0
	for at := range lostAt {
		near := false
		for _, w := range byRound {
			near = near || at >= w.from && at <= w.to
		}
		if !near {
			quiet++
		}
	}
	t.Logf("%d rounds in %v: %d sessions (%d idle holders, %d pingers, 3 waiters); %d idle holds, %d lost "+
		"(%d away from a fault); %d waiter grants (%d already past their Deadline); %d safety violations",
		rounds, elapsed.Round(time.Millisecond), idleHolders+idlePingers+3, idleHolders, idlePingers,
		idle, lost.Load(), quiet, taken, empty, len(vs))
	for _, v := range vs {
		t.Errorf("%s: %s\n%v", v.kind, v.msg, events)
	}
	if quiet > 0 {
		t.Errorf("%d idle holders lost their lock away from any fault: their pings were not answered in time", quiet)
	}
	if idle == 0 || taken == 0 {
		t.Errorf("%d idle holds and %d waiter grants: the workload did not run", idle, taken)
	}
}

// holdIdle takes resource sl:<w> with a lease of a minute and holds it
// idle for 2 to 5 s (the client pings), then unlocks it, until ctx ends;
// each hold is a grant whose belief is the latest Deadline seen (its
// session's end, from the answered pings), the loss seen, or the unlock.
func holdIdle(ctx context.Context, h *clusterHistory, w int, c *mlock.Client, lostAt chan<- int64, lost *atomic.Int64) {
	rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
	res := fmt.Sprintf("sl:%d", w)
	for n := 0; n < 10000 && ctx.Err() == nil; n++ {
		lctx, cancel := context.WithTimeout(ctx, callLimit)
		call := h.now()
		l, err := c.Lock(lctx, res, &mlock.LockOptions{TTL: idleTTL, Timeout: waiterWait})
		cancel()
		ret := h.now()
		if err != nil {
			sleepCtx(ctx, 50*time.Millisecond)
			continue
		}
		g := grant{Worker: w, Res: res, Token: l.Token(), Call: call, Start: ret, Idle: true}
		var end int64
		sample := func() {
			if d := l.Deadline(); !d.IsZero() {
				end = max(end, h.at(d))
			}
		}
		sample()
		g.Arrival = end
		hold := holdIdleMin + time.Duration(rng.Int64N(int64(holdIdleMax-holdIdleMin)))
		until := time.After(hold)
		tk := time.NewTicker(5 * time.Millisecond)
		var lostSeen int64
	wait:
		for {
			select {
			case <-ctx.Done():
				break wait
			case <-until:
				break wait
			case <-l.Lost():
				lostSeen = h.now()
				break wait
			case <-tk.C:
				sample()
			}
		}
		tk.Stop()
		sample()
		g.LeaseEnd = end
		g.End, g.Why = beliefEnd(h.now(), end, lostSeen)
		if g.Why != "unlock" {
			lost.Add(1)
			at := g.End
			if lostSeen != 0 {
				at = min(at, lostSeen)
			}
			select {
			case lostAt <- at:
			default:
			}
		}
		h.addGrant(g)
		uctx, cancel := context.WithTimeout(context.Background(), callLimit)
		_ = l.Unlock(uctx)
		cancel()
		sleepCtx(ctx, time.Duration(rng.IntN(100))*time.Millisecond)
	}
}

// waitBehind keeps a lock request queued on res (wait timeout waiterWait);
// each grant is recorded with its belief (from the grant to its Deadline or
// the unlock's call) and unlocked at once.
func waitBehind(ctx context.Context, h *clusterHistory, w int, c *mlock.Client, res string) {
	for n := 0; n < 100000 && ctx.Err() == nil; n++ {
		lctx, cancel := context.WithTimeout(ctx, callLimit)
		call := h.now()
		l, err := c.Lock(lctx, res, &mlock.LockOptions{TTL: waiterTTL, Timeout: waiterWait})
		cancel()
		ret := h.now()
		if err != nil {
			sleepCtx(ctx, 20*time.Millisecond)
			continue
		}
		g := grant{Worker: w, Res: res, Token: l.Token(), Call: call, Start: ret}
		if d := l.Deadline(); !d.IsZero() {
			g.LeaseEnd = h.at(d)
		}
		g.Arrival = g.LeaseEnd
		g.End, g.Why = h.now(), "unlock"
		if g.LeaseEnd < g.End {
			g.End, g.Why = g.LeaseEnd, "deadline"
		}
		h.addGrant(g)
		uctx, cancel := context.WithTimeout(context.Background(), callLimit)
		_ = l.Unlock(uctx)
		cancel()
	}
}
