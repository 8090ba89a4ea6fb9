package pgx_test

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/fence"
	fencepgx "github.com/mlock-dev/mlock/fence/pgx"
)

// A sale on a pgxpool.Pool, fenced by the lock's token. (It needs an
// mlockd and a PostgreSQL: compiled, not run.)
func Example() {
	ctx := context.Background()
	c, _ := mlock.New("mlock://127.0.0.1:12340?ttl=2000")
	defer c.Close()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	_ = fencepgx.CreateSchema(ctx, pool) // once, or in a migration

	err = c.Do(ctx, "sku:1", nil, func(ctx context.Context) error {
		l := mlock.HeldLock(ctx)
		return fencepgx.Tx(ctx, pool, l.Token(), fence.Split(l.Resources()), func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, `UPDATE skus SET stock = stock - 1 WHERE sku = 1 AND stock > 0`)
			if err == nil && tag.RowsAffected() == 0 {
				return errors.New("sold out")
			}
			return err
		})
	})
	var stale *fence.StaleError
	if errors.As(err, &stale) {
		fmt.Printf("refused: token %d, but %d has written since\n", stale.Token, stale.Highest)
	}
}
