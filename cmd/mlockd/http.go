package main

import (
	"context"
	"errors"
	"flag"
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
	fs.Var(neverDuration{&cfg.LogSlowWait}, "log-slow-wait", "log a waiter granted after waiting longer than this `duration` (rate-limited; 0 or negative: never)")
	fs.Var(neverInt{&cfg.LogLongQueue}, "log-long-queue", "log a lock request queued behind at least this `number` of entries (rate-limited; 0 or negative: never)")
	return &o
}

// neverDuration is a duration flag whose 0 means never, like a negative
// value: in server.Config, 0 is the default.
type neverDuration struct{ p *time.Duration }

func (v neverDuration) String() string {
	switch {
	case v.p == nil:
		return ""
	case *v.p < 0:
		return "0s"
	}
	return v.p.String()
}

func (v neverDuration) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return errors.New("want a duration such as 1s")
	}
	*v.p = d
	if d <= 0 {
		*v.p = -1
	}
	return nil
}

func (v neverDuration) Get() any { return *v.p }

// neverInt is an integer flag whose 0 means never, like a negative value.
type neverInt struct{ p *int }

func (v neverInt) String() string {
	switch {
	case v.p == nil:
		return ""
	case *v.p < 0:
		return "0"
	}
	return strconv.Itoa(*v.p)
}

func (v neverInt) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil {
		return errors.New("want an integer")
	}
	*v.p = n
	if n <= 0 {
		*v.p = -1
	}
	return nil
}

func (v neverInt) Get() any { return *v.p }

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
