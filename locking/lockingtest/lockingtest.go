// Package lockingtest is the conformance suite every locking provider runs:
// the cases of Medusa's own locking tests (scaled to milliseconds) and the
// guarantees this module adds (atomic multi-key, no deadlock in any key
// order, renewal, no renewal of a partly released lock, loss detection,
// a job stopped before its lease can run out on the server when renewals
// fail, clean-up after a timeout, fencing tokens kept by a renewal).
//
//	func TestConformance(t *testing.T) {
//		lockingtest.Run(t, lockingtest.Harness{New: func(t *testing.T) locking.Provider { ... }})
//	}
package lockingtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/locking"
)

// Harness describes the provider under test.
type Harness struct {
	// New returns a provider for one test; the suite closes it. Providers
	// may share state between tests: every test uses keys of its own.
	New func(t *testing.T) locking.Provider
	// Tokens says the provider returns fencing tokens (a renewal returns
	// the lock's original token).
	Tokens bool
	// Backoff, if set, returns the provider's retry backoff for a base
	// delay, a cap and a factor; each call of the result takes a uniform
	// draw in [0, 1) and returns the next wait. The suite checks Medusa's
	// jitter bounds on it.
	Backoff func(base, max time.Duration, factor float64) func(r float64) time.Duration
	// Namespaced returns a provider over the same store as p (one New
	// returned) whose keys
	// live under namespace (a Redis provider's Namespace, an etcd
	// provider's Prefix, an mlock client's prefix, Memory.Namespace); the
	// suite closes it. namespace is unique to the test, and is neither a
	// prefix of New's namespace nor has it as a prefix. Without it the
	// namespace cases are skipped.
	Namespaced func(t *testing.T, p locking.Provider, namespace string) locking.Provider
	// QueueLen, if set, returns the entries of key's queue in p's store
	// (p is one New returned), holder included. The suite waits on it for
	// a caller to be queued; without it (a provider whose waiters poll,
	// which the store does not show) it pauses a fixed time instead.
	QueueLen func(p locking.Provider, key string) int
}

// queueLens holds each running test's Harness.QueueLen, by test.
var queueLens sync.Map // *testing.T -> func(string) int

// waitQueued waits until key's queue holds n entries, holder included;
// without Harness.QueueLen, it pauses long enough for a caller on loopback
// to have asked.
func waitQueued(t *testing.T, key string, n int) {
	t.Helper()
	f, ok := queueLens.Load(t)
	if !ok {
		time.Sleep(100 * time.Millisecond) // fixed: the provider shows no queue (its waiters poll); a caller on loopback has asked by now
		return
	}
	queueLen := f.(func(string) int)
	deadline := time.Now().Add(10 * time.Second)
	for pause := time.Millisecond; queueLen(key) != n; pause = min(2*pause, 20*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d entries in the queue, want %d", key, queueLen(key), n)
		}
		time.Sleep(pause) // poll interval: the queue sends no event
	}
}

// Run runs every conformance test as a subtest of t, side by side (each
// with its own provider from h.New and its own keys): -parallel bounds how
// many at once.
func Run(t *testing.T, h Harness) {
	tests := []struct {
		name string
		fn   func(t *testing.T, p locking.Provider, k func(string) string)
	}{
		{"Oversell", testOversell},
		{"AcquireAndRelease", testAcquireRelease},
		{"ParallelReentry", testParallelReentry},
		{"AnonymousOwner", testAnonymous},
		{"ReleaseAfterFailure", testReleaseAfterFailure},
		{"TimeoutOrdering", testTimeoutOrdering},
		{"HoldUntilJobDone", testHoldUntilDone},
		{"RenewalKeepsLease", testRenewal},
		{"LostLeaseCancelsJob", testLostLease},
		{"PartialAcquireCleanup", testPartialCleanup},
		{"OppositeOrderNoDeadlock", testOppositeOrder},
		{"ScopedReleaseAll", testScopedReleaseAll},
		{"AtomicMultiKey", testAtomicMultiKey},
		{"AwaitQueueIsWoken", testAwaitQueue},
		{"AcquireDeadline", testAcquireDeadline},
		{"ReentryRenewsExpire", testReentryRenewsExpire},
		{"InvalidKeys", testInvalidKeys},
		{"PartialReleaseEndsRenewal", testPartialRelease},
		{"OwnerOverlapKeepsHeldLock", testOwnerOverlap},
	}
	type test = struct {
		name string
		fn   func(t *testing.T, p locking.Provider, k func(string) string)
	}
	tests = append(tests, test{"RenewalCadence", testRenewalCadence}, test{"ModuleShutdown", testModuleShutdown},
		test{"UnreachableCancelsInTime", testUnreachableCancelsInTime}, test{"LeadOverHalfRefused", testLeadRefused})
	if h.Tokens {
		tests = append(tests, test{"FencingTokens", testTokens}, test{"RenewalKeepsToken", testRenewalToken})
	}
	if h.Namespaced != nil {
		for _, tc := range []struct {
			name string
			fn   func(t *testing.T, p locking.Provider, ns func(string) locking.Provider, k func(string) string)
		}{
			{"NamespacesIsolated", testNamespacesIsolated},
			{"ReleaseAllStaysInNamespace", testReleaseAllStaysInNamespace},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				p := h.New(t)
				t.Cleanup(func() { p.Close() })
				id := rand.Uint32()
				ns := func(name string) locking.Provider {
					q := h.Namespaced(t, p, fmt.Sprintf("ns%x%s:", id, name))
					t.Cleanup(func() { q.Close() })
					return q
				}
				prefix := fmt.Sprintf("%s:%x:", tc.name, id)
				tc.fn(t, p, ns, func(s string) string { return prefix + s })
			})
		}
	}
	if h.Backoff != nil {
		t.Run("JitterBounds", func(t *testing.T) { testJitter(t, h.Backoff) })
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := h.New(t)
			t.Cleanup(func() { p.Close() })
			if h.QueueLen != nil {
				queueLens.Store(t, func(key string) int { return h.QueueLen(p, key) })
				t.Cleanup(func() { queueLens.Delete(t) })
			}
			prefix := fmt.Sprintf("%s:%x:", tc.name, rand.Uint32())
			tc.fn(t, p, func(s string) string { return prefix + s })
		})
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

func isConflict(t *testing.T, err error, key string) {
	t.Helper()
	if !errors.Is(err, locking.ErrConflict) {
		t.Fatalf("err = %v, want a conflict", err)
	}
	if want := fmt.Sprintf("Failed to acquire lock for key %q", key); err.Error() != want {
		t.Fatalf("message %q, want %q", err.Error(), want)
	}
}

// Ten concurrent buys of a stock of 5: -5 without the lock, 0 with it.
func testOversell(t *testing.T, p locking.Provider, k func(string) string) {
	c := ctx(t)
	for _, locked := range []bool{false, true} {
		var stock atomic.Int64
		stock.Store(5)
		buy := func(context.Context) error {
			if stock.Load() > 0 {
				time.Sleep(10 * time.Millisecond) // fixed: widens the check-then-act window the lock must close
				stock.Add(-1)
			}
			return nil
		}
		// Without the lock, every buyer checks before any buys (a
		// barrier, not a sleep: a busy machine cannot serialize them).
		var checked sync.WaitGroup
		checked.Add(10)
		unlocked := func() {
			ok := stock.Load() > 0
			checked.Done()
			checked.Wait()
			if ok {
				stock.Add(-1)
			}
		}
		var wg sync.WaitGroup
		for range 10 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if !locked {
					unlocked()
					return
				}
				if err := locking.Execute(c, p, []string{k("item_1")}, buy, locking.ExecuteOptions{}); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		want := int64(-5)
		if locked {
			want = 0
		}
		if got := stock.Load(); got != want {
			t.Fatalf("locked=%v: stock %d, want %d", locked, got, want)
		}
	}
}

func testAcquireRelease(t *testing.T, p locking.Provider, k func(string) string) {
	c, key := ctx(t), k("key_name")
	if _, err := p.Acquire(c, []string{key}, locking.AcquireOptions{OwnerID: "user_id_123"}); err != nil {
		t.Fatal(err)
	}
	if ok, err := p.Release(c, []string{key}, locking.ReleaseOptions{OwnerID: "user_id_456"}); ok || err != nil {
		t.Fatalf("another owner's release = %v, %v", ok, err)
	}
	_, err := p.Acquire(c, []string{key}, locking.AcquireOptions{OwnerID: "user_id_456"})
	isConflict(t, err, key)
	if ok, err := p.Release(c, []string{key}, locking.ReleaseOptions{OwnerID: "user_id_123"}); !ok || err != nil {
		t.Fatalf("owner's release = %v, %v", ok, err)
	}
}

func testParallelReentry(t *testing.T, p locking.Provider, k func(string) string) {
	c, key := ctx(t), k("mySpecialKey")
	acquire := func(owner string) [2]error {
		var errs [2]error
		var wg sync.WaitGroup
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = p.Acquire(c, []string{key}, locking.AcquireOptions{OwnerID: owner})
			}()
		}
		wg.Wait()
		return errs
	}
	for _, err := range acquire("user_id_456") {
		if err != nil {
			t.Fatalf("the owner's parallel acquires: %v", err)
		}
	}
	for _, err := range acquire("user_id_000") {
		isConflict(t, err, key)
	}
	if _, err := p.Acquire(c, []string{key}, locking.AcquireOptions{OwnerID: "user_id_456"}); err != nil {
		t.Fatal(err)
	}
	if ok, _ := p.Release(c, []string{key}, locking.ReleaseOptions{OwnerID: "user_id_000"}); ok {
		t.Fatal("another owner released the lock")
	}
	if ok, _ := p.Release(c, []string{key}, locking.ReleaseOptions{OwnerID: "user_id_456"}); !ok {
		t.Fatal("the owner could not release")
	}
}

func testAnonymous(t *testing.T, p locking.Provider, k func(string) string) {
	c, key := ctx(t), k("key_name")
	if _, err := p.Acquire(c, []string{key}, locking.AcquireOptions{}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		_, err := p.Acquire(c, []string{key}, locking.AcquireOptions{})
		isConflict(t, err, key) // anonymous locks are not re-entrant
	}
	_, err := p.Acquire(c, []string{key}, locking.AcquireOptions{OwnerID: "user_id_000"})
	isConflict(t, err, key)
	if ok, _ := p.Release(c, []string{key}, locking.ReleaseOptions{OwnerID: "user_id_000"}); ok {
		t.Fatal("an owner released an anonymous lock")
	}
	if ok, _ := p.Release(c, []string{key}, locking.ReleaseOptions{}); !ok {
		t.Fatal("anonymous release of an anonymous lock")
	}
}

func testReleaseAfterFailure(t *testing.T, p locking.Provider, k func(string) string) {
	c, key := ctx(t), k("lock_key")
	boom := errors.New("fn_1 failed")
	var calls [2]atomic.Int32
	err := locking.Execute(c, p, []string{key}, func(context.Context) error { calls[0].Add(1); return boom }, locking.ExecuteOptions{})
	if err != boom {
		t.Fatalf("Execute returned %v, want the job's error", err)
	}
	err = locking.Execute(c, p, []string{key}, func(context.Context) error { calls[1].Add(1); return nil }, locking.ExecuteOptions{Timeout: time.Second})
	if err != nil || calls[0].Load() != 1 || calls[1].Load() != 1 {
		t.Fatalf("second execute: %v, calls %d %d", err, calls[0].Load(), calls[1].Load())
	}
}

func testTimeoutOrdering(t *testing.T, p locking.Provider, k func(string) string) {
	c, key := ctx(t), k("lock_key")
	results := make([]any, 3)
	var called2 atomic.Bool
	var wg sync.WaitGroup
	started := make(chan struct{})
	failed := make(chan error, 1) // the first caller got no lock
	second := make(chan struct{}) // the second caller gave up
	wg.Add(3)
	go func() {
		defer wg.Done()
		// Timeouts of seconds: only the second caller's is meant to
		// run out (the first holds until it has); the others guard
		// against a hang on a busy machine.
		err := locking.Execute(c, p, []string{key}, func(context.Context) error {
			close(started)
			// The first job holds while the others queue: until the
			// second has timed out and the third waits.
			<-second
			waitQueued(t, key, 2)
			results[0] = "fn_1"
			return nil
		}, locking.ExecuteOptions{Timeout: 10 * time.Second})
		if err != nil {
			results[0] = err
			failed <- err
		}
	}()
	select {
	case <-started:
	case err := <-failed:
		t.Fatalf("the first caller, alone on the key: %v", err)
	}
	go func() {
		defer wg.Done()
		defer close(second)
		results[1] = locking.Execute(c, p, []string{key}, func(context.Context) error { called2.Store(true); return nil },
			locking.ExecuteOptions{Timeout: 100 * time.Millisecond})
	}()
	go func() {
		defer wg.Done()
		err := locking.Execute(c, p, []string{key}, func(context.Context) error { results[2] = "fn_3"; return nil },
			locking.ExecuteOptions{Timeout: 10 * time.Second})
		if err != nil {
			results[2] = err
		}
	}()
	wg.Wait()
	err, _ := results[1].(error)
	if results[0] != "fn_1" || results[2] != "fn_3" || !errors.Is(err, locking.ErrTimeout) || err.Error() != "Timed-out acquiring lock." || called2.Load() {
		t.Fatalf("results = %v (fn_2 called: %v)", results, called2.Load())
	}
}

func testHoldUntilDone(t *testing.T, p locking.Provider, k func(string) string) {
	c, key := ctx(t), k("held_key")
	err := locking.Execute(c, p, []string{key}, func(ctx context.Context) error {
		_, err := p.Acquire(ctx, []string{key}, locking.AcquireOptions{OwnerID: "someone_else"})
		if !errors.Is(err, locking.ErrConflict) {
			return fmt.Errorf("acquire inside the job: %v", err)
		}
		return nil
	}, locking.ExecuteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Acquire(c, []string{key}, locking.AcquireOptions{OwnerID: "someone_else"}); err != nil {
		t.Fatalf("after the job: %v", err)
	}
	if ok, _ := p.Release(c, []string{key}, locking.ReleaseOptions{OwnerID: "someone_else"}); !ok {
		t.Fatal("release after the job")
	}
}

// A job three times longer than its lease keeps the lock: it is renewed.
// The lease is of seconds, not milliseconds: Execute gives each renewal
// until the lease the last one set runs out (Expire less its margin), and a
// starved machine (two cores at load 20, -race) has left a renewal (a script
// and an INFO on Redis) unanswered for more than 300 ms, and once, with a
// lease of 2 s, for more than 1.3 s. Three renewals per lease still fit,
// and the job still outlasts three leases.
func testRenewal(t *testing.T, p locking.Provider, k func(string) string) {
	const expire = 4 * time.Second
	c, key := ctx(t), k("renewed")
	err := locking.Execute(c, p, []string{key}, func(ctx context.Context) error {
		for range 6 {
			select {
			case <-time.After(expire / 2):
			case <-ctx.Done():
				return context.Cause(ctx)
			}
			if _, err := p.Acquire(ctx, []string{key}, locking.AcquireOptions{OwnerID: "intruder"}); !errors.Is(err, locking.ErrConflict) {
				return fmt.Errorf("an intruder got the key mid-job: %v", err)
			}
		}
		return nil
	}, locking.ExecuteOptions{Expire: expire})
	if err != nil {
		t.Fatal(err)
	}
}

func testLostLease(t *testing.T, p locking.Provider, k func(string) string) {
	c, key := ctx(t), k("lost")
	started := make(chan struct{})
	done := make(chan error, 1)
	var cause error
	go func() {
		done <- locking.Execute(c, p, []string{key}, func(ctx context.Context) error {
			close(started)
			<-ctx.Done()
			cause = context.Cause(ctx)
			return ctx.Err()
		}, locking.ExecuteOptions{OwnerID: "lease-holder", Expire: 300 * time.Millisecond})
	}()
	<-started
	if err := p.ReleaseAll(c, locking.ReleaseOptions{OwnerID: "lease-holder"}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, locking.ErrLost) || !errors.Is(cause, locking.ErrLost) {
			t.Fatalf("Execute = %v, cause %v; want the lost lease", err, cause)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the job was not cancelled after losing its lease")
	}
}

func testPartialCleanup(t *testing.T, p locking.Provider, k func(string) string) {
	c := ctx(t)
	free, busy := k("free"), k("busy")
	if _, err := p.Acquire(c, []string{busy}, locking.AcquireOptions{OwnerID: "another-owner", Expire: time.Minute}); err != nil {
		t.Fatal(err)
	}
	var called atomic.Bool
	err := locking.Execute(c, p, []string{free, busy}, func(context.Context) error { called.Store(true); return nil },
		locking.ExecuteOptions{Timeout: 200 * time.Millisecond})
	if !errors.Is(err, locking.ErrTimeout) || called.Load() {
		t.Fatalf("Execute = %v, called %v", err, called.Load())
	}
	if _, err := p.Acquire(c, []string{free}, locking.AcquireOptions{OwnerID: "next"}); err != nil {
		t.Fatalf("the free key was left held: %v", err)
	}
	_, err = p.Acquire(c, []string{busy}, locking.AcquireOptions{OwnerID: "next"})
	isConflict(t, err, busy)
	if ok, _ := p.Release(c, []string{busy}, locking.ReleaseOptions{OwnerID: "another-owner"}); !ok {
		t.Fatal("the busy key lost its owner")
	}
}

func testOppositeOrder(t *testing.T, p locking.Provider, k func(string) string) {
	c := ctx(t)
	a, b := k("abba_a"), k("abba_b")
	if _, err := p.Acquire(c, []string{b}, locking.AcquireOptions{OwnerID: "holder", Expire: time.Minute}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, keys := range [][]string{{b, a}, {a, b}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = locking.Execute(c, p, keys, func(context.Context) error { time.Sleep(10 * time.Millisecond); return nil }, // the job holds a moment
				locking.ExecuteOptions{Timeout: 3 * time.Second})
		}()
		waitQueued(t, b, 2+i) // the two callers wait, in this order
	}
	p.Release(c, []string{b}, locking.ReleaseOptions{OwnerID: "holder"})
	wg.Wait()
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("opposite orders: %v", errs)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("took %v", d)
	}
}

func testScopedReleaseAll(t *testing.T, p locking.Provider, k func(string) string) {
	c := ctx(t)
	mine, theirs := k("ra_mine"), k("ra_theirs")
	p.Acquire(c, []string{mine}, locking.AcquireOptions{OwnerID: "owner_a", Expire: time.Minute})
	p.Acquire(c, []string{theirs}, locking.AcquireOptions{OwnerID: "owner_b", Expire: time.Minute})
	if err := p.ReleaseAll(c, locking.ReleaseOptions{OwnerID: "owner_a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Acquire(c, []string{mine}, locking.AcquireOptions{OwnerID: "owner_c"}); err != nil {
		t.Fatalf("owner_a's key after ReleaseAll: %v", err)
	}
	_, err := p.Acquire(c, []string{theirs}, locking.AcquireOptions{OwnerID: "owner_c"})
	isConflict(t, err, theirs)
	if ok, _ := p.Release(c, []string{theirs}, locking.ReleaseOptions{OwnerID: "owner_b"}); !ok {
		t.Fatal("owner_b's key was released")
	}
	p.Release(c, []string{mine}, locking.ReleaseOptions{OwnerID: "owner_c"})
}

// An owner asking for keys that only overlap what it holds is refused at
// once, with and without AwaitQueue, and an Execute under that owner fails
// without running its job and leaves the owner's lock held: the cleanup of
// the failed acquisition must not release what the owner held before.
func testOwnerOverlap(t *testing.T, p locking.Provider, k func(string) string) {
	c := ctx(t)
	a, b := k("ov_a"), k("ov_b")
	if _, err := p.Acquire(c, []string{a}, locking.AcquireOptions{OwnerID: "ov_owner", Expire: time.Minute}); err != nil {
		t.Fatal(err)
	}
	for _, await := range []bool{false, true} {
		wctx, cancel := context.WithTimeout(c, 5*time.Second)
		_, err := p.Acquire(wctx, []string{a, b}, locking.AcquireOptions{OwnerID: "ov_owner", Expire: time.Minute, AwaitQueue: await})
		cancel()
		if !errors.Is(err, locking.ErrConflict) {
			t.Fatalf("AwaitQueue=%v: the owner's overlapping acquire: %v, want a conflict at once", await, err)
		}
	}
	for _, noWait := range []bool{true, false} {
		ran := false
		err := locking.Execute(c, p, []string{a, b}, func(context.Context) error { ran = true; return nil },
			locking.ExecuteOptions{OwnerID: "ov_owner", NoWait: noWait, Timeout: 5 * time.Second})
		if err == nil || ran {
			t.Fatalf("NoWait=%v: Execute over an overlapping lock of its owner: ran %v, err %v", noWait, ran, err)
		}
		if _, err := p.Acquire(c, []string{a}, locking.AcquireOptions{OwnerID: "someone_else"}); !errors.Is(err, locking.ErrConflict) {
			t.Fatalf("NoWait=%v: the owner's lock on %s was released by the failed Execute: %v", noWait, a, err)
		}
	}
	if ok, err := p.Release(c, []string{a}, locking.ReleaseOptions{OwnerID: "ov_owner"}); !ok || err != nil {
		t.Fatalf("the owner's release = %v, %v", ok, err)
	}
	if _, err := p.Acquire(c, []string{b}, locking.AcquireOptions{OwnerID: "someone_else"}); err != nil {
		t.Fatalf("%s left held: %v", b, err)
	}
	p.Release(c, []string{b}, locking.ReleaseOptions{OwnerID: "someone_else"})
}

func testAtomicMultiKey(t *testing.T, p locking.Provider, k func(string) string) {
	c := ctx(t)
	m1, m2, m3 := k("m1"), k("m2"), k("m3")
	if _, err := p.Acquire(c, []string{m2}, locking.AcquireOptions{OwnerID: "x", Expire: time.Minute}); err != nil {
		t.Fatal(err)
	}
	_, err := p.Acquire(c, []string{m1, m2, m3}, locking.AcquireOptions{OwnerID: "y"})
	isConflict(t, err, m2)
	for _, key := range []string{m1, m3} {
		if _, err := p.Acquire(c, []string{key}, locking.AcquireOptions{OwnerID: "z"}); err != nil {
			t.Fatalf("%s left held by a failed multi-key acquire: %v", key, err)
		}
	}
	// All keys released together, then taken together.
	p.Release(c, []string{m1, m3}, locking.ReleaseOptions{OwnerID: "z"})
	p.Release(c, []string{m2}, locking.ReleaseOptions{OwnerID: "x"})
	if _, err := p.Acquire(c, []string{m3, m1, m2, m1}, locking.AcquireOptions{OwnerID: "y"}); err != nil {
		t.Fatal(err)
	}
	if ok, _ := p.Release(c, []string{m1, m2, m3}, locking.ReleaseOptions{OwnerID: "y"}); !ok {
		t.Fatal("multi-key release")
	}
}

func testAwaitQueue(t *testing.T, p locking.Provider, k func(string) string) {
	c, key := ctx(t), k("await")
	p.Acquire(c, []string{key}, locking.AcquireOptions{OwnerID: "first", Expire: time.Minute})
	got := make(chan error, 1)
	go func() {
		_, err := p.Acquire(c, []string{key}, locking.AcquireOptions{OwnerID: "second", AwaitQueue: true, Expire: time.Minute})
		got <- err
	}()
	waitQueued(t, key, 2) // the second caller waits
	released := time.Now()
	p.Release(c, []string{key}, locking.ReleaseOptions{OwnerID: "first"})
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if d := time.Since(released); d > time.Second {
		t.Fatalf("the waiter took %v after the release", d)
	}
	p.Release(c, []string{key}, locking.ReleaseOptions{OwnerID: "second"})
}

func testAcquireDeadline(t *testing.T, p locking.Provider, k func(string) string) {
	c, key := ctx(t), k("deadline")
	p.Acquire(c, []string{key}, locking.AcquireOptions{OwnerID: "holder", Expire: time.Minute})
	dctx, cancel := context.WithTimeout(c, 100*time.Millisecond)
	defer cancel()
	_, err := p.Acquire(dctx, []string{key}, locking.AcquireOptions{OwnerID: "waiter", AwaitQueue: true})
	if !errors.Is(err, locking.ErrTimeout) {
		t.Fatalf("waiting past the deadline: %v", err)
	}
	p.Release(c, []string{key}, locking.ReleaseOptions{OwnerID: "holder"})
	waitQueued(t, key, 0) // the queue empties: a timed-out waiter granted late would hold the key
	if _, err := p.Acquire(c, []string{key}, locking.AcquireOptions{OwnerID: "third"}); err != nil {
		t.Fatalf("a timed-out waiter kept the key: %v", err)
	}
}

// A re-entry sets the lease anew. Seconds, not milliseconds: with a
// re-entry of 1 s and a pause of 400 ms, on a starved machine (two cores at
// load 36, -race, polling) the owner's Renew came after the second lease
// too had run out. 4.5 s of slack now stand between the pause and it.
func testReentryRenewsExpire(t *testing.T, p locking.Provider, k func(string) string) {
	c, key := ctx(t), k("renew")
	o := locking.AcquireOptions{OwnerID: "o", Expire: time.Second}
	if _, err := p.Acquire(c, []string{key}, o); err != nil {
		t.Fatal(err)
	}
	// The re-entry, before the first expiry, sets the new one.
	o.Expire = 6 * time.Second
	if _, err := p.Acquire(c, []string{key}, o); err != nil {
		t.Fatalf("re-entry: %v", err)
	}
	time.Sleep(1500 * time.Millisecond) // fixed: past the first expiry, on the provider's clock (a store's lease, no event)
	_, err := p.Acquire(c, []string{key}, locking.AcquireOptions{OwnerID: "other"})
	isConflict(t, err, key)
	if ok, _ := p.Renew(c, []string{key}, "o", time.Second); !ok {
		t.Fatal("Renew by the owner")
	}
	if ok, _ := p.Renew(c, []string{key}, "other", time.Second); ok {
		t.Fatal("Renew by another owner")
	}
	p.Release(c, []string{key}, locking.ReleaseOptions{OwnerID: "o"})
	if ok, _ := p.Renew(c, []string{key}, "o", time.Second); ok {
		t.Fatal("Renew of a released lock must fail, not take the key again")
	}
}

func testInvalidKeys(t *testing.T, p locking.Provider, k func(string) string) {
	c := ctx(t)
	for _, keys := range [][]string{nil, {""}, {"a b"}, {"a|b"}} {
		if _, err := p.Acquire(c, keys, locking.AcquireOptions{}); !errors.Is(err, locking.ErrInvalidKey) {
			t.Errorf("Acquire(%q) = %v", keys, err)
		}
	}
}

func testTokens(t *testing.T, p locking.Provider, k func(string) string) {
	c, key := ctx(t), k("fenced")
	var last uint64
	for range 3 {
		l, err := p.Acquire(c, []string{key}, locking.AcquireOptions{OwnerID: "f"})
		if err != nil {
			t.Fatal(err)
		}
		if l.Token <= last {
			t.Fatalf("token %d after %d", l.Token, last)
		}
		last = l.Token
		p.Release(c, []string{key}, locking.ReleaseOptions{OwnerID: "f"})
	}
}

// A renewal (the same owner acquiring exactly the keys it holds, with or
// without AwaitQueue) is the same lock: it returns the lock's original token.
func testRenewalToken(t *testing.T, p locking.Provider, k func(string) string) {
	c, a, b := ctx(t), k("tok_a"), k("tok_b")
	o := locking.AcquireOptions{OwnerID: "t", Expire: time.Minute}
	first, err := p.Acquire(c, []string{a, b}, o)
	if err != nil || first.Token == 0 {
		t.Fatalf("Acquire = %+v, %v", first, err)
	}
	for _, await := range []bool{false, true} {
		o.AwaitQueue = await
		again, err := p.Acquire(c, []string{b, a}, o)
		if err != nil || again.Token != first.Token {
			t.Fatalf("renewal (AwaitQueue %v) = %+v, %v; want the original token %d", await, again, err, first.Token)
		}
	}
	if ok, _ := p.Release(c, []string{a, b}, locking.ReleaseOptions{OwnerID: "t"}); !ok {
		t.Fatal("release")
	}
	next, err := p.Acquire(c, []string{a, b}, locking.AcquireOptions{OwnerID: "t", Expire: time.Minute})
	if err != nil || next.Token <= first.Token {
		t.Fatalf("a new acquisition = %+v, %v; want a token above %d", next, err, first.Token)
	}
	p.Release(c, []string{a, b}, locking.ReleaseOptions{OwnerID: "t"})
}

// After releasing one key of a multi-key lock, the owner no longer holds the
// lock it acquired: renewing it fails, and never takes the released key back
// from its new holder.
func testPartialRelease(t *testing.T, p locking.Provider, k func(string) string) {
	c, a, b := ctx(t), k("pr_a"), k("pr_b")
	if _, err := p.Acquire(c, []string{a, b}, locking.AcquireOptions{OwnerID: "o", Expire: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if ok, err := p.Release(c, []string{a}, locking.ReleaseOptions{OwnerID: "o"}); !ok || err != nil {
		t.Fatalf("partial release = %v, %v", ok, err)
	}
	if ok, err := p.Renew(c, []string{a, b}, "o", time.Minute); ok || err != nil {
		t.Fatalf("renewal after a partial release = %v, %v; want false", ok, err)
	}
	if _, err := p.Acquire(c, []string{a}, locking.AcquireOptions{OwnerID: "other", Expire: time.Minute}); err != nil {
		t.Fatalf("the released key: %v", err)
	}
	if ok, err := p.Renew(c, []string{a, b}, "o", time.Minute); ok || err != nil {
		t.Fatalf("renewal while another owner holds a released key = %v, %v; want false", ok, err)
	}
	_, err := p.Acquire(c, []string{b}, locking.AcquireOptions{OwnerID: "other"})
	isConflict(t, err, b) // the key not released stays held
	if ok, _ := p.Release(c, []string{a}, locking.ReleaseOptions{OwnerID: "other"}); !ok {
		t.Fatal("the new holder lost the released key")
	}
	if ok, _ := p.Release(c, []string{b}, locking.ReleaseOptions{OwnerID: "o"}); !ok {
		t.Fatal("the owner lost the key it did not release")
	}
}

// renewRecorder records when Execute renews its lease.
type renewRecorder struct {
	locking.Provider
	mu     sync.Mutex
	start  time.Time
	renews []time.Duration
}

func (r *renewRecorder) Renew(ctx context.Context, keys []string, owner string, expire time.Duration) (bool, error) {
	r.mu.Lock()
	r.renews = append(r.renews, time.Since(r.start))
	r.mu.Unlock()
	return r.Provider.Renew(ctx, keys, owner, expire)
}

// Medusa's renewal case, scaled: with expire 30 the lease is renewed every
// 10 while the job runs, and never after it. Here expire is 3 s: the job
// runs until it has seen two renewals; neither comes well before its 1 s
// (timers never fire early), the second comes before the lease the first
// renewed would end, and none comes after Execute returned. Only lower
// bounds and the lease's own bound are checked: a busy machine delays
// timers, it never advances them. Seconds, not milliseconds: with 900 ms a
// starved machine (two cores at load 20, -race) left a renewal unanswered
// until the lease ran out, and Execute rightly gave the lock up.
func testRenewalCadence(t *testing.T, p locking.Provider, k func(string) string) {
	const expire = 3 * time.Second
	period := expire / 3
	r := &renewRecorder{Provider: p, start: time.Now()}
	seen := func() int {
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.renews)
	}
	err := locking.Execute(ctx(t), r, []string{k("cadence")}, func(context.Context) error {
		for i := 0; seen() < 2 && i < 1000; i++ {
			time.Sleep(10 * time.Millisecond) // poll interval
		}
		return nil
	}, locking.ExecuteOptions{Expire: expire})
	if err != nil {
		t.Fatal(err)
	}
	after := seen()
	time.Sleep(period * 5 / 2) // fixed: the window in which a renewal after the job would show
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.renews) != 2 || after != 2 {
		t.Fatalf("renewals at %v (%d when Execute returned), want 2 while the job ran and none after", r.renews, after)
	}
	for i, at := range r.renews {
		// A provider may renew a little ahead (a margin for the round trip).
		if want := time.Duration(i+1) * period; at < want-60*time.Millisecond {
			t.Fatalf("renewal %d at %v, well before its %v", i, at, want)
		}
	}
	if gap := r.renews[1] - r.renews[0]; gap >= expire {
		t.Fatalf("renewals %v apart: the lease of %v ran out between them", gap, expire)
	}
}

// unreachable is a provider whose renewals never get an answer: the outcome
// is unknown, as with a server that cannot be reached. It records when
// Acquire was called and when it returned.
type unreachable struct {
	locking.Provider
	called, returned time.Time
}

func (u *unreachable) Acquire(ctx context.Context, keys []string, o locking.AcquireOptions) (locking.Lease, error) {
	u.called = time.Now()
	l, err := u.Provider.Acquire(ctx, keys, o)
	u.returned = time.Now()
	return l, err
}

func (u *unreachable) Renew(context.Context, []string, string, time.Duration) (bool, error) {
	return false, errors.New("lockingtest: the provider cannot be reached")
}

// When no renewal gets through, Execute cancels the job at base + Expire -
// margin - Lead (margin = Expire/100 + 5ms, base the acquisition), so the job
// is stopped (with Lead to spare) while the provider still holds the keys
// for it: nobody else can have them yet. The job must see the cancellation
// within half the Lead, and its intruder then still finds the keys held.
// Seconds, not milliseconds: with a lease of 600 ms and a Lead of 100 ms,
// on a starved machine (two cores at load 20 to 50, -race) the job woke
// 108 ms late (617 ms once, at load 18), and once the intruder's request
// reached Redis after the lease had run out (the job had been stopped in
// time: no double hold). A Lead of 1.9 s leaves 950 ms for each.
func testUnreachableCancelsInTime(t *testing.T, p locking.Provider, k func(string) string) {
	const expire, lead = 4 * time.Second, 1900 * time.Millisecond
	end := expire - (expire/100 + 5*time.Millisecond) - lead // 2.055 s after the base
	u, key := &unreachable{Provider: p}, k("unreachable")
	var cancelled time.Time
	var intruder error
	err := locking.Execute(ctx(t), u, []string{key}, func(ctx context.Context) error {
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
			return errors.New("the job was never cancelled")
		}
		cancelled = time.Now()
		_, intruder = p.Acquire(context.Background(), []string{key}, locking.AcquireOptions{OwnerID: "intruder"})
		return context.Cause(ctx)
	}, locking.ExecuteOptions{Expire: expire, Lead: lead})
	if !errors.Is(err, locking.ErrLost) {
		t.Fatalf("Execute = %v, want ErrLost", err)
	}
	// The base is between the call and the return of Acquire.
	if sinceCall, sinceReturn := cancelled.Sub(u.called), cancelled.Sub(u.returned); sinceCall < end-time.Millisecond ||
		sinceReturn > end+lead/2 {
		t.Fatalf("cancelled %v after Acquire was called, %v after it returned; want about %v", sinceCall, sinceReturn, end)
	}
	if !errors.Is(intruder, locking.ErrConflict) {
		t.Fatalf("when the job was cancelled another owner could take the key: %v", intruder)
	}
}

// Execute refuses a Lead not below half of Expire before acquiring anything.
func testLeadRefused(t *testing.T, p locking.Provider, k func(string) string) {
	key := k("lead")
	err := locking.Execute(ctx(t), p, []string{key}, func(context.Context) error { return errors.New("ran") },
		locking.ExecuteOptions{Expire: time.Second, Lead: 500 * time.Millisecond})
	if !errors.Is(err, locking.ErrInvalidOptions) {
		t.Fatalf("Execute = %v, want ErrInvalidOptions", err)
	}
	if _, err := p.Acquire(ctx(t), []string{key}, locking.AcquireOptions{OwnerID: "other"}); err != nil {
		t.Fatalf("the key was taken by the refused call: %v", err)
	}
}

// failingCloser is a provider whose Close fails.
type failingCloser struct{ locking.Provider }

func (failingCloser) Close() error { return errors.New("boom") }

// Closing a Module closes every provider, going on past one that fails.
func testModuleShutdown(t *testing.T, p locking.Provider, k func(string) string) {
	m := locking.NewModule()
	m.Register("a-failing", failingCloser{}, false)
	m.Register("p", p, true)
	if err := m.Close(); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("Close = %v, want the failure reported", err)
	}
	if _, err := p.Acquire(ctx(t), []string{k("after")}, locking.AcquireOptions{}); err == nil {
		t.Fatal("the provider still works after the module closed it")
	}
}

// Medusa's jitter tests: with a 100 ms base and factor 2, the first wait is
// in [50, 100] ms and the second in [100, 200] ms.
func testJitter(t *testing.T, backoff func(base, max time.Duration, factor float64) func(r float64) time.Duration) {
	for _, r := range []float64{0, 0.5, 0.999999} {
		next := backoff(100*time.Millisecond, time.Second, 2)
		first, second := next(r), next(r)
		if first < 50*time.Millisecond || first > 100*time.Millisecond || second < 100*time.Millisecond || second > 200*time.Millisecond {
			t.Fatalf("r=%v: waits %v then %v", r, first, second)
		}
	}
}

// held asserts that key is held in p (by someone other than owner_z).
func held(t *testing.T, c context.Context, p locking.Provider, key, where string) {
	t.Helper()
	_, err := p.Acquire(c, []string{key}, locking.AcquireOptions{OwnerID: "owner_z"})
	if !errors.Is(err, locking.ErrConflict) {
		t.Fatalf("%s: %q is not held: acquire by another owner = %v", where, key, err)
	}
}

// free asserts that key can be taken in p, and gives it back.
func free(t *testing.T, c context.Context, p locking.Provider, key, where string) {
	t.Helper()
	if _, err := p.Acquire(c, []string{key}, locking.AcquireOptions{OwnerID: "owner_z"}); err != nil {
		t.Fatalf("%s: %q is not free: %v", where, key, err)
	}
	if ok, err := p.Release(c, []string{key}, locking.ReleaseOptions{OwnerID: "owner_z"}); !ok || err != nil {
		t.Fatalf("%s: release of %q = %v, %v", where, key, ok, err)
	}
}

// Two namespaces on one store: the same key is two locks, and neither
// namespace releases the other's, by owner or anonymously (a store of two
// shops on one lock server).
func testNamespacesIsolated(t *testing.T, _ locking.Provider, ns func(string) locking.Provider, k func(string) string) {
	c := ctx(t)
	a, b := ns("A"), ns("B")
	key, anon := k("k"), k("anon")
	for _, p := range []locking.Provider{a, b} {
		if _, err := p.Acquire(c, []string{key}, locking.AcquireOptions{OwnerID: "u1", Expire: time.Minute}); err != nil {
			t.Fatalf("u1 in each namespace: %v", err)
		}
		if _, err := p.Acquire(c, []string{anon}, locking.AcquireOptions{Expire: time.Minute}); err != nil {
			t.Fatalf("anonymous in each namespace: %v", err)
		}
	}
	// A conflict names the key as the caller gave it, without the namespace.
	_, err := a.Acquire(c, []string{key}, locking.AcquireOptions{OwnerID: "u2"})
	isConflict(t, err, key)

	if err := a.ReleaseAll(c, locking.ReleaseOptions{OwnerID: "u1"}); err != nil {
		t.Fatal(err)
	}
	free(t, c, a, key, "A after ReleaseAll(u1) in A")
	held(t, c, b, key, "B after ReleaseAll(u1) in A")
	if err := a.ReleaseAll(c, locking.ReleaseOptions{}); err != nil {
		t.Fatal(err)
	}
	free(t, c, a, anon, "A after ReleaseAll() in A")
	held(t, c, b, anon, "B after ReleaseAll() in A")
	if ok, err := a.Release(c, []string{anon}, locking.ReleaseOptions{}); ok || err != nil {
		t.Fatalf("A's release of a key only B holds = %v, %v", ok, err)
	}
	held(t, c, b, anon, "B after Release() in A")
	if ok, err := b.Release(c, []string{key}, locking.ReleaseOptions{OwnerID: "u1"}); !ok || err != nil {
		t.Fatalf("B's own release = %v, %v", ok, err)
	}
	if err := b.ReleaseAll(c, locking.ReleaseOptions{}); err != nil {
		t.Fatal(err)
	}
	free(t, c, b, anon, "B after ReleaseAll() in B")
}

// A namespace's ReleaseAll leaves the owner's locks outside it alone (an
// "mlock run --owner u1" beside a shop): held, and their Lost channels
// stay open.
func testReleaseAllStaysInNamespace(t *testing.T, p locking.Provider, ns func(string) locking.Provider, k func(string) string) {
	c := ctx(t)
	a := ns("A")
	job := k("report:nightly")
	out, err := p.Acquire(c, []string{job}, locking.AcquireOptions{OwnerID: "u1", Expire: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	outAnon, err := p.Acquire(c, []string{k("anon")}, locking.AcquireOptions{Expire: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Acquire(c, []string{k("cart")}, locking.AcquireOptions{OwnerID: "u1", Expire: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := a.ReleaseAll(c, locking.ReleaseOptions{OwnerID: "u1"}); err != nil {
		t.Fatal(err)
	}
	if err := a.ReleaseAll(c, locking.ReleaseOptions{}); err != nil {
		t.Fatal(err)
	}
	free(t, c, a, k("cart"), "the namespace's own lock")
	held(t, c, p, job, "u1's lock outside the namespace")
	held(t, c, p, k("anon"), "an anonymous lock outside the namespace")
	for _, l := range []locking.Lease{out, outAnon} {
		select {
		case <-l.Lost:
			t.Fatal("a lock outside the namespace was reported lost")
		default:
		}
	}
	if ok, err := p.Release(c, []string{job}, locking.ReleaseOptions{OwnerID: "u1"}); !ok || err != nil {
		t.Fatalf("the owner's own release outside = %v, %v", ok, err)
	}
	p.Release(c, []string{k("anon")}, locking.ReleaseOptions{})
}
