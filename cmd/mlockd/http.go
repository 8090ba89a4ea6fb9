package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/mlock-dev/mlock/server"
	"github.com/mlock-dev/mlock/server/observe"
)

// httpOptions are the flags of the HTTP listener.
type httpOptions struct {
	addr  *string
	pprof *bool
}

// addHTTPFlags defines --http, --http-pprof and the story logs'
// thresholds.
func addHTTPFlags(fs *flag.FlagSet, cfg *server.Config) *httpOptions {
	var o httpOptions
	o.addr = fs.String("http", "", "serve metrics (/metrics), health (/healthz, /readyz), the live page (/) and its JSON API (/api/) on this `host:port` (e.g. 127.0.0.1:12341; empty: off). No authentication: keep it where only operators and monitoring reach it")
	o.pprof = fs.Bool("http-pprof", false, "with --http, also serve Go's profiler under /debug/pprof/")
	cfg.LogSlowWait, cfg.LogLongQueue = server.DefaultLogSlowWait, server.DefaultLogLongQueue
	fs.Var(never[time.Duration]{&cfg.LogSlowWait, time.ParseDuration, "want a duration such as 1s"}, "log-slow-wait", "log a waiter granted after waiting longer than this `duration` (rate-limited; 0 or negative: never)")
	fs.Var(never[int]{&cfg.LogLongQueue, strconv.Atoi, "want an integer"}, "log-long-queue", "log a lock request queued behind at least this `number` of entries (rate-limited; 0 or negative: never)")
	return &o
}

// never is a flag whose 0 means never, like a negative value: in
// server.Config, 0 is the default. parse reads a value; want says what
// it takes.
type never[T int | time.Duration] struct {
	p     *T
	parse func(string) (T, error)
	want  string
}

func (v never[T]) String() string {
	switch {
	case v.p == nil:
		return ""
	case *v.p < 0:
		return fmt.Sprint(T(0)) // "0s" or "0"
	}
	return fmt.Sprint(*v.p)
}

func (v never[T]) Set(s string) error {
	n, err := v.parse(s)
	if err != nil {
		return errors.New(v.want)
	}
	*v.p = n
	if n <= 0 {
		*v.p = -1
	}
	return nil
}

func (v never[T]) Get() any { return *v.p }

// httpServer is the running HTTP listener.
type httpServer struct {
	srv  *http.Server
	h    *observe.Handler
	errc chan error
	log  *slog.Logger
	once sync.Once
}

// startHTTP listens on addr and serves srv's HTTP endpoints. It logs a
// warning for an address beyond loopback: the endpoints show every
// resource and owner to whoever reaches them.
func startHTTP(addr string, pprof bool, srv *server.Server, log *slog.Logger) (*httpServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	if ta, ok := ln.Addr().(*net.TCPAddr); ok && !ta.IP.IsLoopback() {
		log.Warn("the HTTP listener is beyond loopback and has no authentication: whoever reaches it sees every resource, owner and session (hashed)", "http", ln.Addr().String())
	}
	h := srv.HTTPHandler(observe.Options{Pprof: pprof})
	hs := &httpServer{h: h, errc: make(chan error, 1), log: log,
		srv: &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Minute}}
	log.Info("HTTP listening", "http", ln.Addr().String(), "pprof", pprof)
	go func() { hs.errc <- hs.srv.Serve(ln) }()
	return hs, nil
}

// stop shuts the HTTP listener down, after the lock server: /readyz
// answers "shutting down" until then. Calls after the first do nothing.
func (hs *httpServer) stop(ctx context.Context) {
	if hs == nil {
		return
	}
	hs.once.Do(func() {
		if err := hs.srv.Shutdown(ctx); err != nil {
			hs.srv.Close()
		}
		if err := <-hs.errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
			hs.log.Warn("HTTP listener", "err", err)
		}
		hs.h.Close()
	})
}
