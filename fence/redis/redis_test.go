package redis_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/mlock-dev/mlock/fence"
	fenceredis "github.com/mlock-dev/mlock/fence/redis"
	"github.com/mlock-dev/mlock/internal/fencetest"
	"github.com/mlock-dev/mlock/internal/testenv"
)

func TestMain(m *testing.M) {
	if os.Getenv("REDIS_URL") == "" {
		if err := testenv.SkipExamples("REDIS_URL is not set", "the runnable example of fence/redis needs a Redis (start redis-server and set REDIS_URL)"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	goleak.VerifyTestMain(m)
}

// open returns a client of the Redis at REDIS_URL (skipped without it,
// failing under CI=true) and a prefix of keys of the test's own, whose
// keys are deleted at the end.
func open(t *testing.T) (*goredis.Client, string) {
	t.Helper()
	u := testenv.Getenv(t, "REDIS_URL", "the Redis fence tests need a Redis (start redis-server and set REDIS_URL)")
	o, err := goredis.ParseURL(u)
	if err != nil {
		t.Fatal(err)
	}
	c := goredis.NewClient(o)
	prefix := fmt.Sprintf("fencetest:%d:", rand.Uint64())
	t.Cleanup(func() {
		ctx := context.Background()
		for _, pat := range []string{prefix + "*", "mlock_fenced:{" + prefix + "*"} {
			keys, _ := c.Keys(ctx, pat).Result()
			if len(keys) > 0 {
				c.Del(ctx, keys...)
			}
		}
		c.Close()
	})
	return c, prefix
}

func TestStaleSetRefused(t *testing.T) {
	c, p := open(t)
	ctx := context.Background()
	res := []string{p + "sku:1"}
	key := "stock:{" + p + "sku:1}"
	for _, tok := range []uint64{9, 9, 10} { // 10 after 9: compared as numbers, not as strings
		if err := fenceredis.Set(ctx, c, tok, res, key, tok); err != nil {
			t.Fatalf("token %d: %v", tok, err)
		}
	}
	err := fenceredis.Set(ctx, c, 9, res, key, 9)
	var se *fence.StaleError
	if !errors.Is(err, fence.ErrStale) || !errors.As(err, &se) || se.Token != 9 || se.Highest != 10 || se.Resource != res[0] {
		t.Fatalf("stale Set: %v; want a StaleError of 9 against 10 on %s", err, res[0])
	}
	if v, _ := c.Get(ctx, key).Result(); v != "10" {
		t.Fatalf("the key holds %q after the stale write, want 10", v)
	}
	if v, _ := c.Get(ctx, fenceredis.FenceKey(res[0])).Result(); v != "10" {
		t.Fatalf("the fence holds %q, want 10", v)
	}
	// Tokens beyond Lua's exact doubles still compare right.
	big := uint64(math.MaxInt64 - 1)
	if err := fenceredis.Set(ctx, c, big, res, key, "big"); err != nil {
		t.Fatal(err)
	}
	if err := fenceredis.Set(ctx, c, big-1, res, key, "big-1"); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("token %d after %d: %v", big-1, big, err)
	}
	// Two resources: stale on either is stale.
	two := []string{p + "a", p + "b"}
	if err := fenceredis.Set(ctx, c, 5, two[1:], p+"x", 1); err != nil {
		t.Fatal(err)
	}
	if err := fenceredis.Set(ctx, c, 4, two, p+"x", 2); !errors.As(err, &se) || se.Resource != two[1] || se.Highest != 5 {
		t.Fatalf("stale on %s: %v", two[1], err)
	}
	if v, _ := c.Exists(ctx, fenceredis.FenceKey(two[0])).Result(); v != 0 {
		t.Fatal("a refused script recorded its token on the other resource")
	}
	// A body's error, returned or raised: its token is not recorded.
	for _, body := range []string{`return redis.error_reply('NOPE')`, `error('NOPE')`} {
		failing := fenceredis.NewScript(body)
		other := []string{p + "failing"}
		if _, err := failing.Run(ctx, c, 50, other, nil); err == nil || errors.Is(err, fence.ErrStale) || !strings.Contains(err.Error(), "NOPE") {
			t.Fatalf("the body's error: %v", err)
		}
		if v, _ := c.Exists(ctx, fenceredis.FenceKey(other[0])).Result(); v != 0 {
			t.Fatalf("%s: the token of a failed body was recorded", body)
		}
	}
	if v, _ := c.Get(ctx, fenceredis.FenceKey(res[0])).Result(); v != strconv.FormatUint(big, 10) {
		t.Fatalf("the fence holds %q, want %d", v, big)
	}
	for _, tok := range []uint64{0, 1 << 63} {
		if err := fenceredis.Set(ctx, c, tok, res, key, 1); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("token %d: %v", tok, err)
		}
	}
}

// buy decrements a stock if it is above 0 and logs the sale with its token
// and the stock it saw: the body's KEYS and ARGV start at 1.
var buy = fenceredis.NewScript(`
local stock = tonumber(redis.call('GET', KEYS[1]) or '0')
if stock <= 0 then return 0 end
redis.call('SET', KEYS[1], stock - 1)
redis.call('RPUSH', KEYS[2], ARGV[1] .. ' ' .. stock)
return 1`)

// TestConcurrentStaleAndFreshWriters: writers with tokens in random order,
// all at once. The accepted ones ran in the order of their tokens, the
// highest is accepted, the stock never went below 0 and matches the sales.
func TestConcurrentStaleAndFreshWriters(t *testing.T) {
	c, p := open(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res := []string{p + "sku:1"}
	stock, sales := "stock:{"+res[0]+"}", "sales:{"+res[0]+"}"
	const n, initial = 80, 1000
	if err := c.Set(ctx, stock, initial, 0).Err(); err != nil {
		t.Fatal(err)
	}
	accepted, _ := fencetest.Race(t, n, func(token uint64) error {
		_, err := buy.Run(ctx, c, token, res, []string{stock, sales}, int(token))
		return err
	})
	log, err := c.LRange(ctx, sales, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	last := 0
	for k, line := range log {
		var tok, seen int
		if _, err := fmt.Sscan(line, &tok, &seen); err != nil {
			t.Fatal(err)
		}
		if tok <= last || seen != initial-k {
			t.Errorf("sale %d: token %d after %d, saw %d: want growing tokens, each seeing the one before", k, tok, last, seen)
		}
		last = tok
	}
	left, _ := c.Get(ctx, stock).Int()
	if last != n || len(log) != accepted || left != initial-accepted {
		t.Fatalf("last token %d (want %d), %d sales, %d accepted, stock %d", last, n, len(log), accepted, left)
	}
	t.Logf("%d writers: %d accepted, %d refused as stale", n, accepted, n-accepted)
}
