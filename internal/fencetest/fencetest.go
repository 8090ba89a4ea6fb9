// Package fencetest holds what the fence stores' tests share: writers
// racing with tokens in a random order, and the check of the writes a
// store accepted.
package fencetest

import (
	"errors"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/mlock-dev/mlock/fence"
)

// Race calls write with each token of 1..n, all at once, in a random
// order, and returns how many calls were accepted (no error) and how many
// refused as stale. A refusal must be a *fence.StaleError (and
// fence.ErrStale) naming its own token and a higher one, else the test is
// marked failed; any other error ends the test.
func Race(t testing.TB, n int, write func(token uint64) error) (accepted, refused int) {
	t.Helper()
	tokens := rand.Perm(n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, tk := range tokens {
		wg.Go(func() {
			errs[i] = write(uint64(tk + 1))
		})
	}
	wg.Wait()
	for i, err := range errs {
		var se *fence.StaleError
		switch {
		case err == nil:
			accepted++
		case errors.As(err, &se) && errors.Is(err, fence.ErrStale):
			refused++
			if se.Token != uint64(tokens[i]+1) || se.Highest <= se.Token {
				t.Errorf("refusal %v: its highest is not above its token", se)
			}
		default:
			t.Fatalf("token %d: %v", tokens[i]+1, err)
		}
	}
	return accepted, refused
}

// Rows is what the rows of a query give: both *sql.Rows and pgx.Rows.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
}

// Chain reads rows of (token, seen), the accepted writes in commit order,
// and marks the test failed unless the tokens grow and each write saw the
// count of the writes before it (0 for the first). It returns the last
// token (0 when there is none) and the count of rows; what names the
// chain in a failure ("" for none). A row that cannot be read ends the
// test.
func Chain(t testing.TB, what string, rows Rows) (last int64, count int) {
	t.Helper()
	if what != "" {
		what += ": "
	}
	for rows.Next() {
		var tok int64
		var seen int
		if err := rows.Scan(&tok, &seen); err != nil {
			t.Fatal(err)
		}
		if tok <= last || seen != count {
			t.Errorf("%swrite %d has token %d after %d, read %d: want growing tokens, each reading the one before", what, count, tok, last, seen)
		}
		last, count = tok, count+1
	}
	return last, count
}
