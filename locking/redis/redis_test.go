package redis_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/mlock-dev/mlock/internal/testenv"
	"github.com/mlock-dev/mlock/locking"
	"github.com/mlock-dev/mlock/locking/lockingtest"
	"github.com/mlock-dev/mlock/locking/redis"
)

func TestMain(m *testing.M) {
	testenv.WaitBound(8) // the conformance subtests wait for leases and queues
	goleak.VerifyTestMain(m)
}

// redisURL returns REDIS_URL. Without it the test is skipped, except under
// CI=true, where a missing Redis is a failure.
func redisURL(t testing.TB) string {
	t.Helper()
	return testenv.Getenv(t, "REDIS_URL", "the Redis provider tests need a Redis (start redis-server and set REDIS_URL)")
}

func open(t testing.TB, o redis.Options) *redis.Provider {
	t.Helper()
	o.RedisURL = redisURL(t)
	p, err := redis.Open(o)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestConformance(t *testing.T) {
	t.Parallel()
	ns := fmt.Sprintf("mlocktest:%x:", rand.Uint32())
	lockingtest.Run(t, lockingtest.Harness{
		New:    func(t *testing.T) locking.Provider { return open(t, redis.Options{Namespace: ns}) },
		Tokens: true,
		Namespaced: func(t *testing.T, _ locking.Provider, ns string) locking.Provider {
			return open(t, redis.Options{Namespace: "mlocktest:" + ns})
		},
		Backoff: func(base, max time.Duration, factor float64) func(float64) time.Duration {
			return redis.NewBackoff(base, max, factor).Next
		},
	})
}

func TestConformancePollingOnly(t *testing.T) {
	t.Parallel()
	ns := fmt.Sprintf("mlocktest:%x:", rand.Uint32())
	lockingtest.Run(t, lockingtest.Harness{
		New: func(t *testing.T) locking.Provider { return open(t, redis.Options{Namespace: ns, NoWake: true}) },
	})
}

func TestMissingRedisURL(t *testing.T) {
	_, err := redis.Open(redis.Options{})
	if !errors.Is(err, redis.ErrNoRedisURL) || !strings.HasPrefix(err.Error(), `No "redisUrl" provided in "locking" module`) {
		t.Fatalf("err = %v", err)
	}
}

func TestKeyLayoutAndOptionsFromURL(t *testing.T) {
	u := redisURL(t)
	sep := "?"
	if strings.Contains(u, "?") {
		sep = "&"
	}
	p, err := locking.Open(context.Background(), u+sep+"namespace=layout:&defaultRetryInterval=5ms&backoffFactor=3&wake=false")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	rdb := raw(t)
	ctx := context.Background()
	if _, err := p.Acquire(ctx, []string{"cart_123"}, locking.AcquireOptions{OwnerID: "user_1", Expire: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Acquire(ctx, []string{"cart_456"}, locking.AcquireOptions{}); err != nil {
		t.Fatal(err)
	}
	if v, _ := rdb.Get(ctx, "layout:cart_123").Result(); v != "user_1" {
		t.Fatalf("value %q, want the owner", v)
	}
	if v, _ := rdb.Get(ctx, "layout:cart_456").Result(); v != "*" {
		t.Fatalf("anonymous value %q, want *", v)
	}
	if ttl, _ := rdb.PTTL(ctx, "layout:cart_123").Result(); ttl < 59*time.Second {
		t.Fatalf("ttl %v", ttl)
	}
	if ttl, _ := rdb.PTTL(ctx, "layout:cart_456").Result(); ttl != -1*time.Nanosecond && ttl != -1 {
		t.Fatalf("a lock without expire has ttl %v, want none", ttl)
	}
	p.ReleaseAll(ctx, locking.ReleaseOptions{OwnerID: "user_1"})
	p.ReleaseAll(ctx, locking.ReleaseOptions{})
	if n, _ := rdb.Exists(ctx, "layout:cart_123", "layout:cart_456").Result(); n != 0 {
		t.Fatalf("%d keys left", n)
	}
}

func raw(t testing.TB) *goredis.Client {
	o, err := goredis.ParseURL(redisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	c := goredis.NewClient(o)
	t.Cleanup(func() { c.Close() })
	return c
}

// TestMedusaInterop has Medusa's own scripts (the Medusa mode) and the
// provider share keys in Medusa's default namespace.
func TestMedusaInterop(t *testing.T) {
	p := open(t, redis.Options{}) // Medusa's default namespace
	defer p.Close()
	m := open(t, redis.Options{Medusa: true})
	defer m.Close()
	rdb := raw(t)
	ctx := context.Background()
	suffix := fmt.Sprintf("%x", rand.Uint32())
	goKey, medusaKey := "interop_go_"+suffix, "interop_medusa_"+suffix
	acq := func(q locking.Provider, key, owner string) error {
		_, err := q.Acquire(ctx, []string{key}, locking.AcquireOptions{OwnerID: owner, Expire: time.Minute})
		return err
	}
	rel := func(q locking.Provider, key, owner string) bool {
		ok, err := q.Release(ctx, []string{key}, locking.ReleaseOptions{OwnerID: owner})
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}

	// Go takes a lock; Medusa sees it held.
	if err := acq(p, goKey, "go-owner"); err != nil {
		t.Fatal(err)
	}
	if err := acq(m, goKey, "medusa-owner"); !errors.Is(err, locking.ErrConflict) {
		t.Fatalf("Medusa acquired a key the Go provider holds: %v", err)
	}
	if rel(m, goKey, "medusa-owner") {
		t.Fatal("Medusa released another owner's lock")
	}
	if err := acq(m, goKey, "go-owner"); err != nil {
		t.Fatalf("Medusa re-entry of the same owner: %v", err)
	}
	if !rel(m, goKey, "go-owner") {
		t.Fatal("Medusa release by the owner")
	}
	if err := acq(p, goKey, "someone"); err != nil {
		t.Fatalf("after Medusa's release: %v", err)
	}
	rel(p, goKey, "someone")

	// Medusa takes a lock; Go sees it held, and can release it as its owner.
	if err := acq(m, medusaKey, "medusa-owner"); err != nil {
		t.Fatal(err)
	}
	if ttl, _ := rdb.TTL(ctx, "medusa_lock:"+medusaKey).Result(); ttl != time.Minute {
		t.Fatalf("Medusa's TTL %v, want 60 s (EX)", ttl)
	}
	err := acq(p, medusaKey, "go-owner")
	if !errors.Is(err, locking.ErrConflict) || err.Error() != fmt.Sprintf("Failed to acquire lock for key %q", medusaKey) {
		t.Fatalf("Go acquire of Medusa's lock: %v", err)
	}
	l, err := p.Acquire(ctx, []string{medusaKey}, locking.AcquireOptions{OwnerID: "medusa-owner", Expire: time.Minute})
	if err != nil || l.Token == 0 {
		t.Fatalf("same owner re-entry across implementations: %+v, %v", l, err)
	}
	if rel(p, medusaKey, "go-owner") {
		t.Fatal("Go released another owner's Medusa lock")
	}
	if !rel(p, medusaKey, "medusa-owner") {
		t.Fatal("Go release by the Medusa owner")
	}
	// Anonymous locks are "*" on both sides.
	if _, err := m.Acquire(ctx, []string{medusaKey}, locking.AcquireOptions{Expire: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if v, _ := rdb.Get(ctx, "medusa_lock:"+medusaKey).Result(); v != "*" {
		t.Fatalf("Medusa's anonymous value %q", v)
	}
	if !rel(p, medusaKey, "") {
		t.Fatal("Go anonymous release of Medusa's anonymous lock")
	}
}

// The Medusa mode runs Medusa's scripts and nothing else: no fencing
// counter, no token keys, no release message; tokens are 0; a renewal is
// Medusa's extendLock, and a partly released lock cannot be renewed.
func TestMedusaMode(t *testing.T) {
	ns := fmt.Sprintf("mlocktest:%x:", rand.Uint32())
	u := redisURL(t)
	sep := "?"
	if strings.Contains(u, "?") {
		sep = "&"
	}
	m, err := locking.Open(context.Background(), u+sep+"mode=medusa&namespace="+ns)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	rdb := raw(t)
	ctx := context.Background()
	sub := rdb.Subscribe(ctx, "mlock_release:"+ns)
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	o := locking.AcquireOptions{OwnerID: "o", Expire: 1500 * time.Millisecond}
	l, err := m.Acquire(ctx, []string{"a", "b"}, o)
	if err != nil || l.Token != 0 {
		t.Fatalf("Acquire = %+v, %v; want token 0", l, err)
	}
	if ttl, _ := rdb.TTL(ctx, ns+"a").Result(); ttl != 2*time.Second {
		t.Fatalf("ttl %v, want 2 s: whole seconds, rounded up", ttl)
	}
	if n, _ := rdb.Exists(ctx, "mlock_fence:"+ns, "mlock_fence_tok:"+ns+"a").Result(); n != 0 {
		t.Fatal("the Medusa mode wrote a fencing key")
	}
	if ok, err := m.Renew(ctx, []string{"a", "b"}, "o", time.Minute); !ok || err != nil {
		t.Fatalf("Renew = %v, %v", ok, err)
	}
	if ttl, _ := rdb.TTL(ctx, ns+"b").Result(); ttl != time.Minute {
		t.Fatalf("renewed ttl %v", ttl)
	}
	// Medusa's quirk: re-entry only without awaitQueue.
	if _, err := m.Acquire(ctx, []string{"a"}, o); err != nil {
		t.Fatalf("re-entry: %v", err)
	}
	actx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err = m.Acquire(actx, []string{"a"}, locking.AcquireOptions{OwnerID: "o", AwaitQueue: true})
	cancel()
	if !errors.Is(err, locking.ErrTimeout) {
		t.Fatalf("re-entry with awaitQueue = %v; Medusa's script spins against itself", err)
	}
	if ok, _ := m.Release(ctx, []string{"a"}, locking.ReleaseOptions{OwnerID: "o"}); !ok {
		t.Fatal("release")
	}
	if ok, err := m.Renew(ctx, []string{"a", "b"}, "o", time.Minute); ok || err != nil {
		t.Fatalf("Renew after a partial release = %v, %v", ok, err)
	}
	// No atomicity, as Medusa: a failed multi-key acquisition keeps what it took.
	if _, err := m.Acquire(ctx, []string{"a", "b"}, locking.AcquireOptions{OwnerID: "p"}); !errors.Is(err, locking.ErrConflict) {
		t.Fatalf("Acquire of a held key: %v", err)
	}
	if v, _ := rdb.Get(ctx, ns+"a").Result(); v != "p" {
		t.Fatalf("a = %q: Medusa's acquire keeps the keys it took", v)
	}
	// A waiter (a provider of its own, on a client that says when a try of
	// its has been answered) polls and gets the key after the release.
	wo, err := goredis.ParseURL(redisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	wc := goredis.NewClient(wo)
	defer wc.Close() // New's provider does not close the client it is given
	tried := make(chan struct{}, 1)
	wc.AddHook(answeredHook{tried})
	w, err := redis.New(wc, redis.Options{Medusa: true, Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	got := make(chan error, 1)
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	go func() {
		_, err := w.Acquire(wctx, []string{"b"}, locking.AcquireOptions{OwnerID: "w", AwaitQueue: true, Expire: time.Minute})
		got <- err
	}()
	select {
	case <-tried: // it found b held: it polls from now on
	case err := <-got:
		t.Fatalf("the waiter's Acquire returned %v while o held b", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter did not try within 10 s")
	}
	if ok, _ := m.Release(ctx, []string{"b"}, locking.ReleaseOptions{OwnerID: "o"}); !ok {
		t.Fatal("release b")
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if err := m.ReleaseAll(ctx, locking.ReleaseOptions{OwnerID: "w"}); err != nil {
		t.Fatal(err)
	}
	if err := m.ReleaseAll(ctx, locking.ReleaseOptions{OwnerID: "p"}); err != nil {
		t.Fatal(err)
	}
	if n, _ := rdb.Exists(ctx, ns+"a", ns+"b").Result(); n != 0 {
		t.Fatalf("%d keys left after ReleaseAll", n)
	}
	if msg, err := sub.ReceiveTimeout(ctx, 50*time.Millisecond); err == nil {
		t.Fatalf("the Medusa mode published %v", msg)
	}
	if _, err := locking.Open(ctx, u+sep+"mode=nope"); err == nil {
		t.Fatal("an unknown mode")
	}
}

// answeredHook signals, without blocking, each time a script call (EVAL,
// EVALSHA) of its client has been run: for a provider, a try (an EVALSHA
// refused as NOSCRIPT, which the client follows with the script, is not).
type answeredHook struct{ answered chan<- struct{} }

func (h answeredHook) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h answeredHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		err := next(ctx, cmd)
		h.signal([]goredis.Cmder{cmd})
		return err
	}
}

func (h answeredHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		err := next(ctx, cmds)
		h.signal(cmds)
		return err
	}
}

func (h answeredHook) signal(cmds []goredis.Cmder) {
	for _, c := range cmds {
		if n := c.Name(); (n == "eval" || n == "evalsha") && !goredis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
			select {
			case h.answered <- struct{}{}:
			default:
			}
			return
		}
	}
}

// The token of a lock is kept beside each of its keys, with the key's TTL,
// and removed with it.
func TestTokenKeys(t *testing.T) {
	ns := fmt.Sprintf("mlocktest:%x:", rand.Uint32())
	p := open(t, redis.Options{Namespace: ns})
	defer p.Close()
	rdb := raw(t)
	ctx := context.Background()
	l, err := p.Acquire(ctx, []string{"x", "y"}, locking.AcquireOptions{OwnerID: "o", Expire: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"x", "y"} {
		tk := "mlock_fence_tok:" + ns + k
		if v, _ := rdb.Get(ctx, tk).Uint64(); v != l.Token {
			t.Fatalf("%s = %d, want %d", tk, v, l.Token)
		}
		if ttl, _ := rdb.PTTL(ctx, tk).Result(); ttl < 59*time.Second {
			t.Fatalf("%s ttl %v", tk, ttl)
		}
	}
	// Keys taken one by one are not one lock: taking them together again
	// gives them one new token.
	p.Release(ctx, []string{"x", "y"}, locking.ReleaseOptions{OwnerID: "o"})
	lx, _ := p.Acquire(ctx, []string{"x"}, locking.AcquireOptions{OwnerID: "o"})
	ly, _ := p.Acquire(ctx, []string{"y"}, locking.AcquireOptions{OwnerID: "o"})
	both, err := p.Acquire(ctx, []string{"x", "y"}, locking.AcquireOptions{OwnerID: "o"})
	if err != nil || both.Token <= ly.Token || ly.Token <= lx.Token {
		t.Fatalf("tokens x %d, y %d, together %+v (%v)", lx.Token, ly.Token, both, err)
	}
	if ttl, _ := rdb.PTTL(ctx, "mlock_fence_tok:"+ns+"x").Result(); ttl != -1 {
		t.Fatalf("the token of a lock without expiry has ttl %v", ttl)
	}
	if again, _ := p.Acquire(ctx, []string{"x", "y"}, locking.AcquireOptions{OwnerID: "o"}); again.Token != both.Token {
		t.Fatalf("renewal token %d, want %d", again.Token, both.Token)
	}
	if err := p.ReleaseAll(ctx, locking.ReleaseOptions{OwnerID: "o"}); err != nil {
		t.Fatal(err)
	}
	if n, _ := rdb.Exists(ctx, ns+"x", ns+"y", "mlock_fence_tok:"+ns+"x", "mlock_fence_tok:"+ns+"y").Result(); n != 0 {
		t.Fatalf("%d keys left", n)
	}
}

// Execute waits Options.WaitLockingTimeout by default, Medusa's
// waitLockingTimeout.
func TestWaitLockingTimeoutIsExecutesDefault(t *testing.T) {
	p := open(t, redis.Options{Namespace: fmt.Sprintf("mlocktest:%x:", rand.Uint32()), WaitLockingTimeout: 150 * time.Millisecond})
	defer p.Close()
	ctx := context.Background()
	if _, err := p.Acquire(ctx, []string{"k"}, locking.AcquireOptions{OwnerID: "holder", Expire: time.Minute}); err != nil {
		t.Fatal(err)
	}
	defer p.Release(ctx, []string{"k"}, locking.ReleaseOptions{OwnerID: "holder"})
	start := time.Now()
	err := locking.Execute(ctx, p, []string{"k"}, func(context.Context) error { return nil }, locking.ExecuteOptions{})
	if d := time.Since(start); !errors.Is(err, locking.ErrTimeout) || d < 150*time.Millisecond || d > 2*time.Second {
		t.Fatalf("Execute = %v after %v", err, d)
	}
}

// BenchmarkHandoff measures the hand-off latency of the Redis provider: a
// holder releases a hot key while another caller waits for it with
// AwaitQueue; the latency is from the release call to the waiter's return.
// "wake" uses the release message, "poll" only Medusa's backoff.
func BenchmarkHandoff(b *testing.B) {
	for _, mode := range []string{"wake", "poll"} {
		b.Run(mode, func(b *testing.B) {
			p := open(b, redis.Options{Namespace: fmt.Sprintf("mlockbench:%x:", rand.Uint32()), NoWake: mode == "poll"})
			defer p.Close()
			ctx := context.Background()
			key := []string{"hot"}
			lat := make([]time.Duration, 0, b.N)
			for i := 0; i < b.N; i++ {
				if _, err := p.Acquire(ctx, key, locking.AcquireOptions{OwnerID: "holder", Expire: time.Minute}); err != nil {
					b.Fatal(err)
				}
				got := make(chan time.Time, 1)
				go func() {
					if _, err := p.Acquire(ctx, key, locking.AcquireOptions{OwnerID: "waiter", Expire: time.Minute, AwaitQueue: true}); err != nil {
						panic(err)
					}
					got <- time.Now()
				}()
				time.Sleep(2 * time.Millisecond) // the waiter is waiting
				start := time.Now()
				p.Release(ctx, key, locking.ReleaseOptions{OwnerID: "holder"})
				lat = append(lat, (<-got).Sub(start))
				p.Release(ctx, key, locking.ReleaseOptions{OwnerID: "waiter"})
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
	}
}
