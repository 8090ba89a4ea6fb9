//go:build unix

package pgx_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mlock-dev/mlock/fence"
	fencepgx "github.com/mlock-dev/mlock/fence/pgx"
	"github.com/mlock-dev/mlock/internal/fencetest"
	"github.com/mlock-dev/mlock/internal/pgtest"
)

// examples is the PostgreSQL of the runnable examples (example_run_test.go).
var examples *pgtest.Examples

func TestMain(m *testing.M) {
	pgtest.RunWithExamples(m, "the runnable examples of fence/pgx need it", &examples)
}

// TestConcurrentStaleAndFreshWriters: writers with tokens in random order,
// all at once, through a pgxpool.Pool. The accepted writes come in the
// order of their tokens, each read what the one before wrote, the highest
// token is accepted, every refusal is a StaleError naming a higher token,
// and a refused write left nothing behind.
func TestConcurrentStaleAndFreshWriters(t *testing.T) {
	s := pgtest.Start(t, "the pgx fence tests need it")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, s.URL+"&pool_max_conns=30")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := fencepgx.CreateSchema(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE counter (n int NOT NULL); INSERT INTO counter VALUES (0);
		CREATE TABLE writes (id bigserial PRIMARY KEY, token bigint NOT NULL, seen int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	const n = 50
	accepted, _ := fencetest.Race(t, n, func(token uint64) error {
		return fencepgx.Tx(ctx, pool, token, fence.Split("sku:1|sku:2"), func(tx pgx.Tx) error {
			var seen int
			if err := tx.QueryRow(ctx, `UPDATE counter SET n = n + 1 RETURNING n - 1`).Scan(&seen); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO writes (token, seen) VALUES ($1, $2)`, int64(token), seen)
			return err
		})
	})
	rows, err := pool.Query(ctx, `SELECT token, seen FROM writes ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	last, k := fencetest.Chain(t, "", rows)
	rows.Close()
	var count int
	if err := pool.QueryRow(ctx, `SELECT n FROM counter`).Scan(&count); err != nil {
		t.Fatal(err)
	}
	if last != n || k != accepted || count != accepted {
		t.Fatalf("last token %d (want %d), %d writes, counter %d, %d accepted", last, n, k, count, accepted)
	}
	for _, r := range []string{"sku:1", "sku:2"} {
		var tok int64
		if err := pool.QueryRow(ctx, `SELECT token FROM mlock_fence WHERE resource = $1`, r).Scan(&tok); err != nil || tok != n {
			t.Fatalf("fence of %s: %d, %v; want %d", r, tok, err, n)
		}
	}
	t.Logf("%d writers: %d accepted, %d refused as stale", n, accepted, n-accepted)

	// A failing job: nothing kept, not even its token.
	boom := errors.New("boom")
	err = fencepgx.Tx(ctx, pool, n+5, []string{"sku:1"}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE counter SET n = 1000`); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Tx = %v, want the job's error", err)
	}
	var tok int64
	if err := pool.QueryRow(ctx, `SELECT (SELECT n FROM counter), (SELECT token FROM mlock_fence WHERE resource = 'sku:1')`).Scan(&count, &tok); err != nil {
		t.Fatal(err)
	}
	if count != accepted || tok != n {
		t.Fatalf("after a failed job: counter %d, fence %d; want %d and %d", count, tok, accepted, n)
	}
	if err := fencepgx.Tx(ctx, pool, 0, []string{"sku:1"}, func(pgx.Tx) error { return nil }); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("token 0: %v", err)
	}
}
