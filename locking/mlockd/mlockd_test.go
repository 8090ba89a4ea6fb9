package mlockd_test

import (
	"context"
	"net"
	"testing"

	"go.uber.org/goleak"

	"github.com/mlock-dev/mlock/locking"
	"github.com/mlock-dev/mlock/locking/lockingtest"
	_ "github.com/mlock-dev/mlock/locking/mlockd"
	"github.com/mlock-dev/mlock/server"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	srv, err := server.New(server.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { srv.Serve(ln); close(done) }()
	defer func() { srv.Shutdown(context.Background()); <-done }()
	uri := "mlock://" + ln.Addr().String()
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
