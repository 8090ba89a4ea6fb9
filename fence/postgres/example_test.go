package postgres_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/fence"
	"github.com/mlock-dev/mlock/fence/postgres"
	"github.com/mlock-dev/mlock/locking"
)

// A sale deducts stock under the lock of its SKU: the write is fenced by
// the lock's token, so that a buyer that slept past its lease cannot sell
// again what the next holder has already sold. (It needs an mlockd and a
// PostgreSQL: compiled, not run.)
func Example() {
	ctx := context.Background()
	c, err := mlock.New("mlock://127.0.0.1:12340?ttl=2000")
	if err != nil {
		panic(err)
	}
	defer c.Close()
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL")) // the driver of github.com/jackc/pgx/v5/stdlib
	if err != nil {
		panic(err)
	}
	defer db.Close()
	if err := postgres.CreateSchema(ctx, db); err != nil { // once, or in a migration
		panic(err)
	}

	l, err := c.Lock(ctx, "sku:1", nil)
	if err != nil {
		panic(err)
	}
	defer l.Unlock(ctx)
	err = postgres.Tx(ctx, db, nil, l.Token(), fence.Split(l.Resources()), func(tx *sql.Tx) error {
		// Read inside the transaction, after the fence: what the last
		// accepted holder left.
		var stock int
		if err := tx.QueryRowContext(ctx, `SELECT stock FROM skus WHERE sku = 1`).Scan(&stock); err != nil {
			return err
		}
		if stock == 0 {
			return errors.New("sold out")
		}
		_, err := tx.ExecContext(ctx, `UPDATE skus SET stock = $1 WHERE sku = 1`, stock-1)
		return err
	})
	if errors.Is(err, fence.ErrStale) {
		fmt.Println("the lock passed to another buyer while this one slept: nothing written")
	}
}

// With Do, the function finds its lock, and so its token, in its context.
func Example_do() {
	ctx := context.Background()
	c, _ := mlock.New("mlock://127.0.0.1:12340")
	db, _ := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	err := c.Do(ctx, "sku:1|sku:2", nil, func(ctx context.Context) error {
		l := mlock.HeldLock(ctx)
		return postgres.Tx(ctx, db, nil, l.Token(), fence.Split(l.Resources()), func(tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `UPDATE skus SET stock = stock - 1 WHERE sku IN (1, 2)`)
			return err
		})
	})
	fmt.Println(err)
}

// With the locking module, ExecuteLease hands the job its Lease and token.
func Example_execute() {
	ctx := context.Background()
	m := locking.NewModule() // the memory provider; or Register the Provider locking.Open(ctx, "mlock://...") returns
	db, _ := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	keys := []string{"sku:1"}
	err := m.ExecuteLease(ctx, keys, func(ctx context.Context, l locking.Lease) error {
		return postgres.Tx(ctx, db, nil, l.Token, keys, func(tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `UPDATE skus SET stock = stock - 1 WHERE sku = 1`)
			return err
		})
	}, locking.ExecuteOptions{})
	fmt.Println(err)
}
