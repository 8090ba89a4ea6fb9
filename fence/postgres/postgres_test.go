//go:build unix

package postgres_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the database/sql driver of the tests

	"github.com/mlock-dev/mlock/fence"
	"github.com/mlock-dev/mlock/fence/postgres"
	"github.com/mlock-dev/mlock/internal/fencetest"
	"github.com/mlock-dev/mlock/internal/pgtest"
)

// examples is the PostgreSQL of the runnable examples (example_run_test.go).
var examples *pgtest.Examples

func TestMain(m *testing.M) {
	pgtest.RunWithExamples(m, "the runnable examples of fence/postgres need it", &examples)
}

// open starts a PostgreSQL server and returns a database/sql handle on it
// with the fence table and the tests' tables: counter (one row per
// resource: the value a fenced transaction reads and increments) and
// writes (every accepted write, in commit order by id).
func open(t *testing.T) *sql.DB {
	t.Helper()
	s := pgtest.Start(t, "the PostgreSQL fence tests need it")
	db, err := sql.Open("pgx", s.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	ctx := context.Background()
	if err := postgres.CreateSchema(ctx, db); err != nil {
		t.Fatal(err)
	}
	if err := postgres.CreateSchema(ctx, db); err != nil { // again: IF NOT EXISTS
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE counter (resource text PRIMARY KEY, n int NOT NULL);
		CREATE TABLE writes (id bigserial PRIMARY KEY, resource text NOT NULL, token bigint NOT NULL, seen int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return db
}

// write is a fenced read-modify-write: it reads resource's counter, writes
// it back one higher and logs the write with its token.
func write(ctx context.Context, db *sql.DB, token uint64, resource string) error {
	return postgres.Tx(ctx, db, nil, token, []string{resource}, func(tx *sql.Tx) error {
		var n int
		err := tx.QueryRowContext(ctx, `SELECT n FROM counter WHERE resource = $1`, resource).Scan(&n)
		if errors.Is(err, sql.ErrNoRows) {
			n, err = 0, nil
		}
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO counter VALUES ($1, $2) ON CONFLICT (resource) DO UPDATE SET n = $2`, resource, n+1); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO writes (resource, token, seen) VALUES ($1, $2, $3)`, resource, int64(token), n)
		return err
	})
}

func TestStaleWriteRefusedAndRolledBack(t *testing.T) {
	t.Parallel() // each on a PostgreSQL server of its own: their start-ups overlap
	db := open(t)
	ctx := context.Background()
	if err := write(ctx, db, 5, "sku:1"); err != nil {
		t.Fatal(err)
	}
	if err := write(ctx, db, 5, "sku:1"); err != nil { // the same holder again
		t.Fatalf("the same token again: %v", err)
	}
	if err := write(ctx, db, 9, "sku:1"); err != nil {
		t.Fatal(err)
	}
	err := write(ctx, db, 5, "sku:1")
	var se *fence.StaleError
	if !errors.Is(err, fence.ErrStale) || !errors.As(err, &se) || se.Resource != "sku:1" || se.Token != 5 || se.Highest != 9 {
		t.Fatalf("stale write: %v; want a StaleError of token 5 against 9 on sku:1", err)
	}
	if err := write(ctx, db, 3, "sku:2"); err != nil { // another resource has its own fence
		t.Fatalf("another resource: %v", err)
	}
	var n, w int
	if err := db.QueryRowContext(ctx, `SELECT (SELECT n FROM counter WHERE resource = 'sku:1'), (SELECT count(*) FROM writes WHERE resource = 'sku:1')`).Scan(&n, &w); err != nil {
		t.Fatal(err)
	}
	if n != 3 || w != 3 {
		t.Fatalf("counter %d, writes %d; want 3 and 3 (the stale write rolled back)", n, w)
	}

	// A failing job rolls back its writes and the token it recorded.
	boom := errors.New("boom")
	err = postgres.Tx(ctx, db, nil, 20, []string{"sku:1"}, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `UPDATE counter SET n = 100 WHERE resource = 'sku:1'`); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Tx = %v, want the job's error", err)
	}
	var tok int64
	if err := db.QueryRowContext(ctx, `SELECT (SELECT n FROM counter WHERE resource = 'sku:1'), (SELECT token FROM mlock_fence WHERE resource = 'sku:1')`).Scan(&n, &tok); err != nil {
		t.Fatal(err)
	}
	if n != 3 || tok != 9 {
		t.Fatalf("after a failed job: counter %d, fence %d; want 3 and 9", n, tok)
	}

	// Check in the caller's own transaction, over two resources.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := postgres.Check(ctx, tx, 10, "sku:2", "sku:1"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	tx, err = db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = postgres.Check(ctx, tx, 9, "sku:1", "sku:2")
	_ = tx.Rollback()
	if !errors.As(err, &se) || se.Highest != 10 || se.Resource != "sku:1" {
		t.Fatalf("Check(9) after 10 = %v", err)
	}

	// Bad calls: nothing sent.
	for _, tok := range []uint64{0, 1 << 63} {
		called := false
		err := postgres.Tx(ctx, db, nil, tok, []string{"sku:1"}, func(*sql.Tx) error { called = true; return nil })
		if !errors.Is(err, fence.ErrInvalid) || called {
			t.Errorf("token %d: %v, job run %v; want ErrInvalid, not run", tok, err, called)
		}
	}
}

// TestPausedHolderHoldsTheNextBack: a holder inside its fenced transaction
// (paused there) keeps the next holder's write waiting until it commits; the
// next one then reads what it wrote.
func TestPausedHolderHoldsTheNextBack(t *testing.T) {
	t.Parallel()
	db := open(t)
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := postgres.Check(ctx, tx, 5, "sku:1"); err != nil {
		t.Fatal(err)
	}
	next := make(chan error, 1)
	go func() { next <- write(ctx, db, 6, "sku:1") }()
	select {
	case err := <-next:
		t.Fatalf("the next holder wrote while the first one's transaction was open: %v", err)
	case <-time.After(300 * time.Millisecond): // it must still wait: a wrong answer shows up at once
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO counter VALUES ('sku:1', 41)`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-next; err != nil {
		t.Fatal(err)
	}
	var seen int
	if err := db.QueryRowContext(ctx, `SELECT seen FROM writes WHERE token = 6`).Scan(&seen); err != nil || seen != 41 {
		t.Fatalf("the next holder read %d, %v; want 41", seen, err)
	}
}

// TestConcurrentStaleAndFreshWriters: writers with tokens in random order,
// all at once, on two resources. The accepted writes of a resource come in
// the order of their tokens, each read what the one before it wrote (no
// update lost), the highest token is always accepted, and every refusal
// names a higher token.
func TestConcurrentStaleAndFreshWriters(t *testing.T) {
	t.Parallel()
	db := open(t)
	db.SetMaxOpenConns(40)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 60
	accepted, refused := fencetest.Race(t, n, func(token uint64) error {
		return write(ctx, db, token, []string{"sku:a", "sku:b"}[(token-1)%2])
	})
	for _, r := range []string{"sku:a", "sku:b"} {
		rows, err := db.QueryContext(ctx, `SELECT token, seen FROM writes WHERE resource = $1 ORDER BY id`, r)
		if err != nil {
			t.Fatal(err)
		}
		last, _ := fencetest.Chain(t, r, rows)
		rows.Close()
		if want := map[string]int64{"sku:a": n - 1, "sku:b": n}[r]; last != want { // tokens 1..n, odd ones on sku:a
			t.Errorf("%s: last accepted token %d; the highest must always be accepted", r, last)
		}
	}
	t.Logf("%d writers: %d accepted, %d refused as stale", n, accepted, refused)
	if accepted == 0 || accepted+refused != n {
		t.Fatalf("accepted %d + refused %d != %d", accepted, refused, n)
	}
}

// TestRepeatableReadFailsRatherThanReadsStale: under REPEATABLE READ, a
// transaction whose snapshot predates the last accepted commit fails at the
// fence (a serialization failure), even with a higher token: it could not
// see that commit's writes.
func TestRepeatableReadFailsRatherThanReadsStale(t *testing.T) {
	t.Parallel()
	db := open(t)
	ctx := context.Background()
	if err := write(ctx, db, 1, "sku:1"); err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT n FROM counter WHERE resource = 'sku:1'`).Scan(&n); err != nil { // the snapshot
		t.Fatal(err)
	}
	if err := write(ctx, db, 2, "sku:1"); err != nil {
		t.Fatal(err)
	}
	err = postgres.Check(ctx, tx, 3, "sku:1")
	if err == nil || errors.Is(err, fence.ErrStale) || !strings.Contains(err.Error(), "40001") {
		t.Fatalf("Check under an old snapshot = %v; want a serialization failure (SQLSTATE 40001)", err)
	}
}
