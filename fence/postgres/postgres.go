// Package postgres fences PostgreSQL writes made through database/sql (with
// any driver: pgx's stdlib, lib/pq): a transaction's writes are kept only if
// the lock's fencing token is at least the highest one recorded for each of
// its resources, and the transaction records it.
//
// The fence is one table, keyed by resource (Schema):
//
//	CREATE TABLE IF NOT EXISTS mlock_fence (
//	    resource text PRIMARY KEY,
//	    token    bigint NOT NULL
//	);
//
// Check runs, inside the caller's transaction, for each resource in sorted
// order,
//
//	INSERT INTO mlock_fence (resource, token) VALUES ($1, $2)
//	ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token
//	WHERE mlock_fence.token <= EXCLUDED.token
//	RETURNING token
//
// which records the token and locks the resource's fence row until the
// transaction ends, or returns no row if a higher token is recorded: the
// write is stale. Transactions fencing one resource therefore run one after
// the other, in the order of their tokens, and each sees what the ones
// before it committed: read what the write depends on (the stock left)
// inside the transaction, after Check. Tx does all of it. This holds at
// PostgreSQL's default isolation, READ COMMITTED; under REPEATABLE READ or
// SERIALIZABLE a transaction whose snapshot predates the last accepted
// commit fails at the fence with a serialization error instead (nothing
// written; retry it).
package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/mlock-dev/mlock/fence"
)

// Schema creates the fence table if it does not exist. Run it once (in a
// migration, or with CreateSchema).
const Schema = `CREATE TABLE IF NOT EXISTS mlock_fence (
    resource text PRIMARY KEY,
    token    bigint NOT NULL
)`

// CheckSQL records a token for a resource ($1 the resource, $2 the token)
// and returns it, or returns no row if a higher token is recorded. It is
// exported for those who write the statement themselves (in a stored
// procedure, in another language).
const CheckSQL = `INSERT INTO mlock_fence (resource, token) VALUES ($1, $2)
ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token
WHERE mlock_fence.token <= EXCLUDED.token
RETURNING token`

// HighestSQL returns the token recorded for a resource ($1), for the error
// of a refused write.
const HighestSQL = `SELECT token FROM mlock_fence WHERE resource = $1`

// CreateSchema runs Schema on db.
func CreateSchema(ctx context.Context, db *sql.DB) error {
	_, err := db.ExecContext(ctx, Schema)
	return err
}

// Check checks token against, and records it for, each of resources (the
// resources of the lock, "a|b" split: fence.Split), in tx. It returns nil
// when the token is at least the highest recorded for every resource (an
// equal token is the same holder writing again); a *fence.StaleError
// (errors.Is(err, fence.ErrStale)) when it is lower for one of them; an
// error of kind fence.ErrInvalid for a token of 0 or above math.MaxInt64,
// or no resource; or the database's error. After an error the caller must
// roll tx back (Tx does): what Check recorded before it must not be kept.
//
// Check waits for the fence rows that other transactions hold (until they
// end): a holder paused inside its transaction holds up the next holder's
// writes until it resumes or its connection is dropped (PostgreSQL's
// idle_in_transaction_session_timeout bounds that wait).
func Check(ctx context.Context, tx *sql.Tx, token uint64, resources ...string) error {
	res, err := fence.Resources(token, resources)
	if err != nil {
		return err
	}
	for _, r := range res {
		var got int64
		err := tx.QueryRowContext(ctx, CheckSQL, r, int64(token)).Scan(&got)
		if errors.Is(err, sql.ErrNoRows) {
			stale := &fence.StaleError{Resource: r, Token: token}
			var high int64
			if tx.QueryRowContext(ctx, HighestSQL, r).Scan(&high) == nil && high > 0 {
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

// Tx runs fn in a transaction of db fenced by token on resources: it begins
// the transaction (opts, nil for the defaults), runs Check, then fn, and
// commits. If Check or fn fails (or fn panics: the panic goes on), it rolls
// the transaction back and returns that error: a *fence.StaleError for a
// stale token, fn not run. It returns the commit's error if the commit
// fails; nil once the writes are committed.
//
// fn should read what its writes depend on inside tx: the rows it reads
// then are those the last accepted holder left.
func Tx(ctx context.Context, db *sql.DB, opts *sql.TxOptions, token uint64, resources []string, fn func(*sql.Tx) error) (err error) {
	if _, err := fence.Resources(token, resources); err != nil {
		return err
	}
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return err
	}
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback()
		}
	}()
	if err := Check(ctx, tx, token, resources...); err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		return err
	}
	committed = true
	return tx.Commit()
}
