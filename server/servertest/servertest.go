// Package servertest runs an mlockd server in-process for tests, in the
// manner of net/http/httptest.
package servertest

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/server"
)

// Start runs a server with cfg on a free loopback port (or on addr, if
// given, retrying for a second while the port is still held by a server
// just stopped). It returns the address and a function that shuts the
// server down; the test's cleanup calls it too, so calling it is optional.
//
// Tests restart servers on purpose, so unless cfg sets DataDir or
// QuietPeriod the server grants at once after every start (QuietPeriod -1,
// unsafe outside tests); a test of the quiet period sets either.
func Start(tb testing.TB, cfg server.Config, addr string) (string, func()) {
	tb.Helper()
	if cfg.DataDir == "" && cfg.QuietPeriod == 0 {
		cfg.QuietPeriod = -1
	}
	srv, err := server.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	var ln net.Listener
	for i := 0; ; i++ {
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		if i >= 100 {
			tb.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	done := make(chan struct{})
	go func() { srv.Serve(ln); close(done) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		srv.Shutdown(context.Background())
		<-done
	}
	tb.Cleanup(stop)
	return ln.Addr().String(), stop
}
