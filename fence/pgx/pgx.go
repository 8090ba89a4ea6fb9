// Package pgx fences PostgreSQL writes made through pgx v5
// (github.com/jackc/pgx/v5) natively: a *pgx.Conn, a *pgxpool.Pool or
// anything else that begins a pgx.Tx. It uses the table and the statements
// of fence/postgres (see there for the schema and the guarantees).
package pgx

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mlock-dev/mlock/fence"
	"github.com/mlock-dev/mlock/fence/postgres"
)

// Beginner begins a transaction: *pgx.Conn and *pgxpool.Pool are ones.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Execer runs a statement: *pgx.Conn and *pgxpool.Pool are ones.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// CreateSchema runs postgres.Schema on db.
func CreateSchema(ctx context.Context, db Execer) error {
	_, err := db.Exec(ctx, postgres.Schema)
	return err
}

// Check is postgres.Check for a pgx.Tx: it checks token against, and
// records it for, each of resources in tx. It returns nil when the token is
// at least the highest recorded for every resource; a *fence.StaleError
// (errors.Is(err, fence.ErrStale)) when it is lower for one of them; an
// error of kind fence.ErrInvalid for a token of 0 or above math.MaxInt64,
// or no resource; or the database's error. After an error the caller must
// roll tx back (Tx does).
func Check(ctx context.Context, tx pgx.Tx, token uint64, resources ...string) error {
	res, err := fence.Resources(token, resources)
	if err != nil {
		return err
	}
	for _, r := range res {
		var got int64
		err := tx.QueryRow(ctx, postgres.CheckSQL, r, int64(token)).Scan(&got)
		if errors.Is(err, pgx.ErrNoRows) {
			stale := &fence.StaleError{Resource: r, Token: token}
			var high int64
			if tx.QueryRow(ctx, postgres.HighestSQL, r).Scan(&high) == nil && high > 0 {
				stale.Highest = uint64(high)
			}
			return stale
		}
		if err != nil {
			return fmt.Errorf("fence: checking the token of %q: %w", r, err)
		}
	}
	return nil
}

// Tx runs fn in a transaction begun on db, fenced by token on resources:
// Check, then fn, then the commit. If Check or fn fails (or fn panics: the
// panic goes on) it rolls the transaction back and returns that error: a
// *fence.StaleError for a stale token, fn not run. It returns the commit's
// error if the commit fails; nil once the writes are committed. fn should
// read what its writes depend on inside tx.
func Tx(ctx context.Context, db Beginner, token uint64, resources []string, fn func(pgx.Tx) error) error {
	if _, err := fence.Resources(token, resources); err != nil {
		return err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	if err := Check(ctx, tx, token, resources...); err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		return err
	}
	committed = true
	return tx.Commit(ctx)
}
