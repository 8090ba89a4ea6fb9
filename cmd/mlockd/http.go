package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/mlock-dev/mlock/server"
	"github.com/mlock-dev/mlock/server/observe"
)

// httpOptions are the flags of the HTTP listener.
type httpOptions struct {
	addr        *string
	pprof       *bool
	openMetrics *bool
}

// addHTTPFlags defines --http, --http-pprof and --http-open-metrics.
func addHTTPFlags(fs *flag.FlagSet) *httpOptions {
	var o httpOptions
	o.addr = fs.String("http", "", "serve metrics (/metrics), health (/healthz, /readyz), the live page (/) and its JSON API (/api/) on this `host:port` (e.g. 127.0.0.1:12341; empty: off). With credentials (--auth-file, --tls-client-ca) all but /healthz and /readyz need an administrator (bearer token <name>:<token>, Basic name and token, or client certificate), and with --tls-cert it speaks TLS; without, it has no authentication, and beyond loopback it needs --insecure")
	o.pprof = fs.Bool("http-pprof", false, "with --http, also serve Go's profiler under /debug/pprof/ (administrators only, with credentials)")
	o.openMetrics = fs.Bool("http-open-metrics", false, "with --http and credentials, serve /metrics without credentials too (it shows counts, never a resource or a principal)")
	return &o
}

// httpServer is the running HTTP listener.
type httpServer struct {
	srv  *http.Server
	h    *observe.Handler
	errc chan error
	log  *slog.Logger
	once sync.Once
}

// startHTTP listens on o's address and serves srv's HTTP endpoints, with
// TLS when srv has a certificate. On a server with credentials (cfg) they
// are for administrators (server.HTTPAdmin); without, an address beyond
// loopback is refused unless cfg.Insecure (then a warning is logged: the
// endpoints show every resource and owner to whoever reaches them), as for
// the lock listener.
func startHTTP(o *httpOptions, cfg *server.Config, srv *server.Server, log *slog.Logger) (*httpServer, error) {
	addr := *o.addr
	credentialed := cfg.AuthFile != "" || cfg.TLSClientCAFile != ""
	if !credentialed && !cfg.Insecure && !loopbackAddr(addr) {
		return nil, usagef("--http %s: the HTTP listener shows every resource, owner and principal; beyond loopback it needs credentials (--auth-file or --tls-client-ca), which then protect it, or --insecure", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	if ta, ok := ln.Addr().(*net.TCPAddr); ok && !ta.IP.IsLoopback() && !credentialed {
		log.Warn("insecure: the HTTP listener is beyond loopback and has no authentication: whoever reaches it sees every resource, owner and session (hashed)", "http", ln.Addr().String())
	}
	tlsOn := srv.TLSConfig() != nil
	if tlsOn {
		ln = tls.NewListener(ln, srv.TLSConfig().Clone())
	}
	h := srv.HTTPHandler(observe.Options{Pprof: *o.pprof, OpenMetrics: *o.openMetrics})
	hs := &httpServer{h: h, errc: make(chan error, 1), log: log,
		srv: &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Minute,
			ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}}
	log.Info("HTTP listening", "http", ln.Addr().String(), "tls", tlsOn, "authentication", credentialed,
		"open-metrics", credentialed && *o.openMetrics, "pprof", *o.pprof)
	go func() { hs.errc <- hs.srv.Serve(ln) }()
	return hs, nil
}

// loopbackAddr reports whether the host of addr (host:port) is a loopback
// address or localhost. An empty or unspecified host (every interface) is
// not.
func loopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
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
