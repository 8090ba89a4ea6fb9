package redis_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"

	goredis "github.com/redis/go-redis/v9"

	"github.com/mlock-dev/mlock/fence"
	fenceredis "github.com/mlock-dev/mlock/fence/redis"
)

// Two holders of the lock of a SKU whose stock is in Redis, one after the
// other: the first (token 4) slept past its lease, and the next (token 7,
// a later grant's) sold meanwhile. When the first wakes up, its fenced
// script is refused before its body runs: the stock is what the next
// holder left. (The tokens are the locks', l.Token(); here the Redis of
// REDIS_URL, under keys of the run's own.)
func Example_staleHolderRefused() {
	ctx := context.Background()
	o, err := goredis.ParseURL(os.Getenv("REDIS_URL"))
	if err != nil {
		panic(err)
	}
	rdb := goredis.NewClient(o)
	defer rdb.Close()
	sku := fmt.Sprintf("example:%d:sku:1", rand.Uint64())
	stock := "stock:{" + sku + "}"
	defer rdb.Del(ctx, stock, fenceredis.FenceKey(sku))
	if err := rdb.Set(ctx, stock, 3, 0).Err(); err != nil {
		panic(err)
	}

	sold, err := sell.Run(ctx, rdb, 7, []string{sku}, []string{stock})
	fmt.Println("the next holder sells:", sold, err)
	_, err = sell.Run(ctx, rdb, 4, []string{sku}, []string{stock})
	var stale *fence.StaleError
	if errors.As(err, &stale) {
		fmt.Println("the holder that slept is refused:", errors.Is(err, fence.ErrStale), stale.Token, "<", stale.Highest)
	}
	left, err := rdb.Get(ctx, stock).Int()
	fmt.Println("stock left:", left, err)
	// Output:
	// the next holder sells: 1 <nil>
	// the holder that slept is refused: true 4 < 7
	// stock left: 2 <nil>
}
