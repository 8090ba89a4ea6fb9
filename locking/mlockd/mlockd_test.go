package mlockd_test

import (
	"context"
	"testing"

	"go.uber.org/goleak"

	"github.com/mlock-dev/mlock/locking"
	"github.com/mlock-dev/mlock/locking/lockingtest"
	_ "github.com/mlock-dev/mlock/locking/mlockd"
	"github.com/mlock-dev/mlock/server"
	"github.com/mlock-dev/mlock/server/servertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	addr, _ := servertest.Start(t, server.Config{}, "")
	uri := "mlock://" + addr
	lockingtest.Run(t, lockingtest.Harness{
		New: func(t *testing.T) locking.Provider {
			p, err := locking.Open(context.Background(), uri)
			if err != nil {
				t.Fatal(err)
			}
			return p
		},
		Tokens: true,
	})
}
