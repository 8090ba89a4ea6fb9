//go:build unix

package pgx_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mlock-dev/mlock/fence"
	fencepgx "github.com/mlock-dev/mlock/fence/pgx"
)

// An order's lock of two SKUs (token 4) outlived its lease, and a later
// lock of one of them (token 7) wrote meanwhile: the order's fenced
// transaction on a pgxpool.Pool is refused for that SKU, and writes
// nothing. (The tokens are the locks', l.Token(); here a PostgreSQL the
// test starts.)
func Example_staleHolderRefused() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, examples.URL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := fencepgx.CreateSchema(ctx, pool); err != nil {
		panic(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE skus (sku int PRIMARY KEY, stock int NOT NULL); INSERT INTO skus VALUES (1, 3), (2, 3)`); err != nil {
		panic(err)
	}
	sell := func(token uint64, resources string) error {
		return fencepgx.Tx(ctx, pool, token, fence.Split(resources), func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `UPDATE skus SET stock = stock - 1 WHERE 'sku:' || sku = ANY($1)`, fence.Split(resources))
			return err
		})
	}

	fmt.Println("sku:2 alone, token 7:", sell(7, "sku:2"))
	err = sell(4, "sku:1|sku:2")
	var stale *fence.StaleError
	if errors.As(err, &stale) {
		fmt.Printf("sku:1 and sku:2, token %d: refused, %s has seen token %d\n", stale.Token, stale.Resource, stale.Highest)
	}
	rows, _ := pool.Query(ctx, `SELECT stock FROM skus ORDER BY sku`)
	stocks, err := pgx.CollectRows(rows, pgx.RowTo[int])
	fmt.Println("stocks:", stocks, err)
	// Output:
	// sku:2 alone, token 7: <nil>
	// sku:1 and sku:2, token 4: refused, sku:2 has seen token 7
	// stocks: [3 2] <nil>
}
