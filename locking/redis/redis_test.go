package redis_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/mlock-dev/mlock/locking"
	"github.com/mlock-dev/mlock/locking/lockingtest"
	"github.com/mlock-dev/mlock/locking/redis"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// redisURL returns REDIS_URL. Without it the test is skipped loudly, except
// under CI, where a missing Redis is a failure.
func redisURL(t testing.TB) string {
	u := os.Getenv("REDIS_URL")
	if u == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("REDIS_URL is not set: CI must start redis-server")
		}
		t.Skip("*** REDIS_URL is not set: skipping the Redis provider tests (start redis-server and set REDIS_URL) ***")
	}
	return u
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
	ns := fmt.Sprintf("mlocktest:%x:", rand.Uint32())
	lockingtest.Run(t, lockingtest.Harness{
		New:    func(t *testing.T) locking.Provider { return open(t, redis.Options{Namespace: ns}) },
		Tokens: true,
		Backoff: func(base, max time.Duration, factor float64) func(float64) time.Duration {
			return redis.NewBackoff(base, max, factor).Next
		},
	})
}

func TestConformancePollingOnly(t *testing.T) {
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

// Medusa's own scripts, written from the behaviour of its locking-redis
// provider: acquire (SET NX, re-entry for the same non-anonymous owner when
// not awaiting the queue) and release (compare and delete).
var (
	medusaAcquire = goredis.NewScript(`
local ok
if tonumber(ARGV[2]) > 0 then
  ok = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2])
else
  ok = redis.call('SET', KEYS[1], ARGV[1], 'NX')
end
if ok then return 1 end
if ARGV[3] == 'false' then
  local cur = redis.call('GET', KEYS[1])
  if cur == '*' then return 0 end
  if cur == ARGV[1] then
    if tonumber(ARGV[2]) > 0 then
      redis.call('SET', KEYS[1], ARGV[1], 'XX', 'EX', ARGV[2])
    else
      redis.call('SET', KEYS[1], ARGV[1], 'XX')
    end
    return 1
  end
end
return 0
`)
	medusaRelease = goredis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)
)

func TestMedusaInterop(t *testing.T) {
	p := open(t, redis.Options{}) // Medusa's default namespace
	defer p.Close()
	rdb := raw(t)
	ctx := context.Background()
	suffix := fmt.Sprintf("%x", rand.Uint32())
	goKey, medusaKey := "interop_go_"+suffix, "interop_medusa_"+suffix

	// Go takes a lock; Medusa sees it held.
	if _, err := p.Acquire(ctx, []string{goKey}, locking.AcquireOptions{OwnerID: "go-owner", Expire: time.Minute}); err != nil {
		t.Fatal(err)
	}
	full := "medusa_lock:" + goKey
	if n, _ := medusaAcquire.Run(ctx, rdb, []string{full}, "medusa-owner", 60, "false").Int(); n != 0 {
		t.Fatal("Medusa acquired a key the Go provider holds")
	}
	if n, _ := medusaRelease.Run(ctx, rdb, []string{full}, "medusa-owner").Int(); n != 0 {
		t.Fatal("Medusa released another owner's lock")
	}
	if n, _ := medusaAcquire.Run(ctx, rdb, []string{full}, "go-owner", 60, "false").Int(); n != 1 {
		t.Fatal("Medusa re-entry of the same owner")
	}
	if n, _ := medusaRelease.Run(ctx, rdb, []string{full}, "go-owner").Int(); n != 1 {
		t.Fatal("Medusa release by the owner")
	}
	if _, err := p.Acquire(ctx, []string{goKey}, locking.AcquireOptions{OwnerID: "someone"}); err != nil {
		t.Fatalf("after Medusa's release: %v", err)
	}
	p.Release(ctx, []string{goKey}, locking.ReleaseOptions{OwnerID: "someone"})

	// Medusa takes a lock; Go sees it held, and can release it as its owner.
	mfull := "medusa_lock:" + medusaKey
	if n, _ := medusaAcquire.Run(ctx, rdb, []string{mfull}, "medusa-owner", 60, "false").Int(); n != 1 {
		t.Fatal("Medusa acquire")
	}
	_, err := p.Acquire(ctx, []string{medusaKey}, locking.AcquireOptions{OwnerID: "go-owner"})
	if !errors.Is(err, locking.ErrConflict) || err.Error() != fmt.Sprintf("Failed to acquire lock for key %q", medusaKey) {
		t.Fatalf("Go acquire of Medusa's lock: %v", err)
	}
	if _, err := p.Acquire(ctx, []string{medusaKey}, locking.AcquireOptions{OwnerID: "medusa-owner", Expire: time.Minute}); err != nil {
		t.Fatalf("same owner re-entry across implementations: %v", err)
	}
	if ok, _ := p.Release(ctx, []string{medusaKey}, locking.ReleaseOptions{OwnerID: "go-owner"}); ok {
		t.Fatal("Go released another owner's Medusa lock")
	}
	if ok, _ := p.Release(ctx, []string{medusaKey}, locking.ReleaseOptions{OwnerID: "medusa-owner"}); !ok {
		t.Fatal("Go release by the Medusa owner")
	}
	// Anonymous locks are "*" on both sides.
	if n, _ := medusaAcquire.Run(ctx, rdb, []string{mfull}, "*", 60, "false").Int(); n != 1 {
		t.Fatal("Medusa anonymous acquire")
	}
	if ok, _ := p.Release(ctx, []string{medusaKey}, locking.ReleaseOptions{}); !ok {
		t.Fatal("Go anonymous release of Medusa's anonymous lock")
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
