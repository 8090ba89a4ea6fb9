package locking_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mlock-dev/mlock/internal/proctest"
	"github.com/mlock-dev/mlock/internal/testenv"
	"github.com/mlock-dev/mlock/locking"
	"github.com/mlock-dev/mlock/locking/lockingtest"
)

func TestMain(m *testing.M) {
	testenv.WaitBound(8) // the conformance subtests wait for leases and queues
	goleak.VerifyTestMain(m)
}

func TestMemoryConformance(t *testing.T) {
	lockingtest.Run(t, lockingtest.Harness{
		New:    func(*testing.T) locking.Provider { return locking.NewMemory() },
		Tokens: true,
		Namespaced: func(_ *testing.T, p locking.Provider, ns string) locking.Provider {
			return p.(*locking.Memory).Namespace(ns)
		},
		QueueLen: func(p locking.Provider, key string) int { return p.(*locking.Memory).QueueLen(key) },
	})
}

func TestMemoryLeaseExpires(t *testing.T) {
	m := locking.NewMemory()
	defer m.Close()
	ctx := context.Background()
	if _, err := m.Acquire(ctx, []string{"x"}, locking.AcquireOptions{OwnerID: "a", Expire: 50 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	// A waiter is granted when the lease ends, without polling.
	wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := m.Acquire(wctx, []string{"x"}, locking.AcquireOptions{OwnerID: "b", AwaitQueue: true}); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 40*time.Millisecond || d > time.Second {
		t.Fatalf("granted after %v, want about 50ms", d)
	}
}

// TestMemoryRenewKeepsToken: renewing (Renew, or Acquire again by the
// holder) keeps the lock's original token and uses none.
func TestMemoryRenewKeepsToken(t *testing.T) {
	m := locking.NewMemory()
	defer m.Close()
	ctx := context.Background()
	l1, err := m.Acquire(ctx, []string{"a", "b"}, locking.AcquireOptions{OwnerID: "o", Expire: time.Minute})
	if err != nil || l1.Token == 0 {
		t.Fatal(l1, err)
	}
	if ok, err := m.Renew(ctx, []string{"b", "a"}, "o", time.Minute); !ok || err != nil {
		t.Fatalf("renew: %v %v", ok, err)
	}
	l2, err := m.Acquire(ctx, []string{"a", "b"}, locking.AcquireOptions{OwnerID: "o", Expire: time.Minute})
	if err != nil || l2.Token != l1.Token {
		t.Fatalf("re-entry: token %d, want the original %d (%v)", l2.Token, l1.Token, err)
	}
	l3, err := m.Acquire(ctx, []string{"c"}, locking.AcquireOptions{OwnerID: "o"})
	if err != nil || l3.Token != l1.Token+1 {
		t.Fatalf("next grant: token %d after %d: a renewal burned a token (%v)", l3.Token, l1.Token, err)
	}
	if ok, _ := m.Renew(ctx, []string{"a"}, "o", time.Minute); ok {
		t.Fatal("renewed a subset of the lock")
	}
	if ok, _ := m.Renew(ctx, []string{"a", "b"}, "x", time.Minute); ok {
		t.Fatal("renewed by another owner")
	}
}

// TestMemoryRenewAfterPartialRelease: after Release of some keys the owner
// no longer holds the whole set, and another owner can take the released key.
func TestMemoryRenewAfterPartialRelease(t *testing.T) {
	m := locking.NewMemory()
	defer m.Close()
	ctx := context.Background()
	if _, err := m.Acquire(ctx, []string{"a", "b"}, locking.AcquireOptions{OwnerID: "o"}); err != nil {
		t.Fatal(err)
	}
	if ok, _ := m.Release(ctx, []string{"a"}, locking.ReleaseOptions{OwnerID: "o"}); !ok {
		t.Fatal("release a")
	}
	if _, err := m.Acquire(ctx, []string{"a"}, locking.AcquireOptions{OwnerID: "p"}); err != nil {
		t.Fatalf("another owner takes a: %v", err)
	}
	if ok, _ := m.Renew(ctx, []string{"a", "b"}, "o", time.Minute); ok {
		t.Fatal("renewed a|b after releasing a")
	}
	if ok, _ := m.Renew(ctx, []string{"b"}, "o", time.Minute); !ok {
		t.Fatal("the rest, b, is still held and renewable")
	}
}

// TestMemoryConflictNamesKey: the conflict error names the busy key, not
// the first key asked for.
func TestMemoryConflictNamesKey(t *testing.T) {
	m := locking.NewMemory()
	defer m.Close()
	ctx := context.Background()
	if _, err := m.Acquire(ctx, []string{"b"}, locking.AcquireOptions{OwnerID: "x"}); err != nil {
		t.Fatal(err)
	}
	_, err := m.Acquire(ctx, []string{"a", "b", "c"}, locking.AcquireOptions{OwnerID: "y"})
	if !errors.Is(err, locking.ErrConflict) || !strings.Contains(err.Error(), `"b"`) || strings.Contains(err.Error(), `"a"`) {
		t.Fatalf("err = %v", err)
	}
	// An owner asking for keys that only overlap its own lock.
	_, err = m.Acquire(ctx, []string{"b", "c"}, locking.AcquireOptions{OwnerID: "x"})
	if !errors.Is(err, locking.ErrConflict) {
		t.Fatalf("overlap: %v", err)
	}
}

// TestMemoryCloseWakesWaiters: Close ends a wait with ErrClosed.
func TestMemoryCloseWakesWaiters(t *testing.T) {
	m := locking.NewMemory()
	ctx := context.Background()
	if _, err := m.Acquire(ctx, []string{"k"}, locking.AcquireOptions{OwnerID: "a"}); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := m.Acquire(ctx, []string{"k"}, locking.AcquireOptions{OwnerID: "b", AwaitQueue: true})
		errc <- err
	}()
	proctest.WaitFor(t, 10*time.Second, "the waiter queued", func() bool { return m.QueueLen("k") == 2 })
	m.Close()
	if err := <-errc; !errors.Is(err, locking.ErrClosed) {
		t.Fatalf("waiter after Close: %v", err)
	}
	if _, err := m.Acquire(ctx, []string{"z"}, locking.AcquireOptions{}); !errors.Is(err, locking.ErrClosed) {
		t.Fatalf("Acquire after Close: %v", err)
	}
}

// recorder is a provider that records renewals.
type recorder struct {
	locking.Provider
	mu     sync.Mutex
	renews []time.Duration
	start  time.Time
	fail   bool
}

func (r *recorder) Renew(ctx context.Context, keys []string, owner string, expire time.Duration) (bool, error) {
	r.mu.Lock()
	r.renews = append(r.renews, time.Since(r.start))
	fail := r.fail
	r.mu.Unlock()
	if fail {
		return false, nil
	}
	return r.Provider.Renew(ctx, keys, owner, expire)
}

func TestRefusedRenewalCancelsJob(t *testing.T) {
	r := &recorder{Provider: locking.NewMemory(), start: time.Now(), fail: true}
	defer r.Close()
	err := locking.Execute(context.Background(), r, []string{"job"}, func(ctx context.Context) error {
		<-ctx.Done()
		return ctx.Err()
	}, locking.ExecuteOptions{Expire: 30 * time.Millisecond})
	if !errors.Is(err, locking.ErrLost) {
		t.Fatalf("err = %v", err)
	}
}

type closer struct {
	locking.Provider
	err    error
	closed *[]string
	id     string
}

func (c closer) Close() error { *c.closed = append(*c.closed, c.id); return c.err }

func TestModule(t *testing.T) {
	m := locking.NewModule()
	if m.DefaultID() != locking.MemoryID {
		t.Fatal("an empty module defaults to memory")
	}
	ctx := context.Background()
	if err := m.Execute(ctx, []string{"k"}, func(context.Context) error { return nil }, locking.ExecuteOptions{}); err != nil {
		t.Fatal(err)
	}
	var closed []string
	a := closer{Provider: locking.NewMemory(), id: "a", closed: &closed, err: errors.New("boom")}
	b := closer{Provider: locking.NewMemory(), id: "b", closed: &closed}
	if err := m.Register("a", a, false); err != nil {
		t.Fatal(err)
	}
	if m.DefaultID() != "a" {
		t.Fatal("the only registered provider is the default")
	}
	m.Register("b", b, true)
	if m.DefaultID() != "b" || m.Register("b", b, false) == nil || m.Register("", b, false) == nil {
		t.Fatal("explicit default, duplicate and empty ids")
	}
	if _, err := m.Acquire(ctx, []string{"k"}, locking.AcquireOptions{Provider: "nope"}); !errors.Is(err, locking.ErrNoProvider) ||
		err.Error() != "Unable to retrieve the locking provider with id: nope" {
		t.Fatalf("unknown provider: %v", err)
	}
	// Routing: a lock on "a" is not seen on "b".
	m.Acquire(ctx, []string{"r"}, locking.AcquireOptions{Provider: "a", OwnerID: "x"})
	if _, err := m.Acquire(ctx, []string{"r"}, locking.AcquireOptions{OwnerID: "y"}); err != nil {
		t.Fatalf("default provider b: %v", err)
	}
	if ok, _ := m.Release(ctx, []string{"r"}, locking.ReleaseOptions{Provider: "a", OwnerID: "x"}); !ok {
		t.Fatal("release routed to a")
	}
	err := m.Close()
	if err == nil || len(closed) != 2 {
		t.Fatalf("Close = %v, closed %v: every provider is closed, failures reported", err, closed)
	}
	a.Provider.Close()
	b.Provider.Close()
}

func TestOpen(t *testing.T) {
	p, err := locking.Open(context.Background(), "memory:")
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	if _, err := locking.Open(context.Background(), "nope://x"); err == nil {
		t.Fatal("unknown scheme")
	}
}
