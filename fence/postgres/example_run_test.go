//go:build unix

package postgres_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/mlock-dev/mlock/fence"
	"github.com/mlock-dev/mlock/fence/postgres"
)

// Two holders of the lock of sku:1, one after the other: the first (token
// 4) slept past its lease, and the next (token 7, a later grant's) sold
// meanwhile. When the first wakes up, its fenced transaction is refused
// and rolled back: the stock is what the next holder left. (The tokens are
// the locks', l.Token(); here a PostgreSQL the test starts.)
func Example_staleHolderRefused() {
	ctx := context.Background()
	db, err := sql.Open("pgx", examples.URL())
	if err != nil {
		panic(err)
	}
	defer db.Close()
	if err := postgres.CreateSchema(ctx, db); err != nil {
		panic(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE skus (sku int PRIMARY KEY, stock int NOT NULL); INSERT INTO skus VALUES (1, 3)`); err != nil {
		panic(err)
	}
	sell := func(token uint64) error {
		return postgres.Tx(ctx, db, nil, token, []string{"sku:1"}, func(tx *sql.Tx) error {
			var stock int
			if err := tx.QueryRowContext(ctx, `SELECT stock FROM skus WHERE sku = 1`).Scan(&stock); err != nil {
				return err
			}
			_, err := tx.ExecContext(ctx, `UPDATE skus SET stock = $1 WHERE sku = 1`, stock-1)
			return err
		})
	}

	fmt.Println("the next holder sells:", sell(7))
	err = sell(4)
	fmt.Println("the holder that slept:", err)
	var stale *fence.StaleError
	if errors.As(err, &stale) {
		fmt.Println("stale:", errors.Is(err, fence.ErrStale), stale.Token, "<", stale.Highest)
	}
	var stock int
	if err := db.QueryRowContext(ctx, `SELECT stock FROM skus WHERE sku = 1`).Scan(&stock); err != nil {
		panic(err)
	}
	fmt.Println("stock left:", stock)
	// Output:
	// the next holder sells: <nil>
	// the holder that slept: fence: stale token 4 for "sku:1": token 7 has written since
	// stale: true 4 < 7
	// stock left: 2
}
