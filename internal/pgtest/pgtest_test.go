//go:build unix

package pgtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStartAndStop(t *testing.T) {
	s := Start(t, "the test of the PostgreSQL harness needs it")
	ctx := context.Background()
	c, err := pgx.Connect(ctx, s.URL)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := c.QueryRow(ctx, "SELECT 40 + 2").Scan(&n); err != nil || n != 42 {
		t.Fatalf("SELECT 40 + 2 = %d, %v", n, err)
	}
	c.Close(ctx)
	s.Stop()
	if _, err := pgx.Connect(ctx, s.URL); err == nil {
		t.Fatal("connected after Stop")
	}
}
