package redis_test

import (
	"context"
	"errors"
	"fmt"

	goredis "github.com/redis/go-redis/v9"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/fence"
	fenceredis "github.com/mlock-dev/mlock/fence/redis"
)

// sell deducts one unit of a stock kept in Redis; its KEYS and ARGV are its
// own (the fence's come before them and are taken off).
var sell = fenceredis.NewScript(`
local stock = tonumber(redis.call('GET', KEYS[1]) or '0')
if stock <= 0 then return 0 end
redis.call('DECR', KEYS[1])
return 1`)

// A sale under the lock of its SKU, the stock in Redis, fenced by the
// lock's token. (It needs an mlockd and a Redis: compiled, not run.)
func Example() {
	ctx := context.Background()
	c, _ := mlock.New("mlock://127.0.0.1:12340?ttl=2000")
	defer c.Close()
	rdb := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()

	err := c.Do(ctx, "sku:1", nil, func(ctx context.Context) error {
		l := mlock.HeldLock(ctx)
		// stock:{sku:1} shares its hash tag with the fence's key.
		sold, err := sell.Run(ctx, rdb, l.Token(), fence.Split(l.Resources()), []string{"stock:{sku:1}"})
		if err == nil && sold == int64(0) {
			return errors.New("sold out")
		}
		return err
	})
	if errors.Is(err, fence.ErrStale) {
		fmt.Println("the lock passed to another buyer while this one slept: nothing sold")
	}
}
