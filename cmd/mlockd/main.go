// Command mlockd runs the mlock lock server.
//
// Every flag can also be set by an environment variable: MLOCK_ followed by
// the flag name in upper case with '-' as '_' (MLOCK_LISTEN,
// MLOCK_SESSION_GRACE, ...). A flag on the command line wins.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/mlock-dev/mlock/server"
)

func main() {
	if err := run(os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "mlockd:", err)
		os.Exit(1)
	}
}

func run(args []string, stderr *os.File) error {
	fs := flag.NewFlagSet("mlockd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg server.Config
	fs.StringVar(&cfg.Addr, "listen", server.DefaultAddr, "TCP address to listen on; listening beyond loopback is an explicit choice")
	fs.DurationVar(&cfg.SessionGrace, "session-grace", server.DefaultSessionGrace, "how long a disconnected session keeps its locks")
	fs.DurationVar(&cfg.DefaultTTL, "default-ttl", server.DefaultTTL, "lease of a lock sent without a ttl")
	fs.DurationVar(&cfg.AuthTimeout, "auth-timeout", server.DefaultAuthTimeout, "time a new connection has to send connect")
	fs.IntVar(&cfg.MaxFrame, "max-frame", server.DefaultMaxFrame, "largest frame payload in bytes (at most 16 MiB)")
	fs.IntVar(&cfg.MaxConns, "max-conns", server.DefaultMaxConns, "most simultaneous connections")
	fs.IntVar(&cfg.MaxPendingOutput, "max-pending-output", server.DefaultMaxPendingOutput, "bytes queued for a client that does not read before it is disconnected")
	fs.DurationVar(&cfg.WriteTimeout, "write-timeout", server.DefaultWriteTimeout, "a client that does not read what it is sent for this long is disconnected")
	fs.IntVar(&cfg.MaxOfflineBytes, "max-offline-bytes", server.DefaultMaxOfflineBytes, "bytes of pushes kept for a disconnected session")
	fs.IntVar(&cfg.MaxResources, "max-resources", server.DefaultMaxResources, "most resources in one request")
	fs.IntVar(&cfg.MaxNameLen, "max-name-len", server.DefaultMaxNameLen, "longest resource or owner name in bytes")
	fs.IntVar(&cfg.MaxSocketIDLen, "max-socket-id-len", server.DefaultMaxSocketIDLen, "longest socketId in bytes")
	fs.IntVar(&cfg.MaxLocksPerSession, "max-locks-per-session", server.DefaultMaxLocksPerSession, "most live requests of one session (-1: no limit)")
	fs.IntVar(&cfg.MaxQueueLen, "max-queue-len", server.DefaultMaxQueueLen, "most entries in one resource's queue, holder included (-1: no limit)")
	fs.DurationVar(&cfg.MaxTTL, "max-ttl", server.DefaultMaxTTL, "longest lease")
	fs.DurationVar(&cfg.MaxTimeout, "max-timeout", server.DefaultMaxTimeout, "longest wait timeout")
	fs.IntVar(&cfg.StatusLimit, "status-limit", server.DefaultStatusLimit, "most locks, queues and sockets listed by status and locks")
	fs.StringVar(&cfg.DataDir, "data-dir", "", "directory for the fencing-token high-water mark (empty: tokens start at the clock)")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	shutdownTimeout := fs.Duration("shutdown-timeout", 10*time.Second, "how long shutdown waits for connections to flush")
	cpuProfile := fs.String("cpu-profile", "", "write a CPU profile to this file until shutdown (for diagnosis)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: mlockd [flags]\n\nRuns the mlock lock server. Every flag can also be set as MLOCK_<FLAG> (e.g. MLOCK_LISTEN).\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if err := applyEnv(fs, os.LookupEnv); err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch *logFormat {
	case "text":
		cfg.Logger = slog.New(slog.NewTextHandler(stderr, opts))
	case "json":
		cfg.Logger = slog.New(slog.NewJSONHandler(stderr, opts))
	default:
		return fmt.Errorf("--log-format %q: want text or json", *logFormat)
	}
	srv, err := server.New(cfg)
	if err != nil {
		return err
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	cfg.Logger.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), *shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return err
	}
	if err := <-errc; err != nil && !errors.Is(err, server.ErrServerClosed) {
		return err
	}
	return nil
}

// applyEnv sets every flag not given on the command line from its MLOCK_
// environment variable.
func applyEnv(fs *flag.FlagSet, lookup func(string) (string, bool)) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil {
			return
		}
		name := "MLOCK_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := lookup(name); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s: %w", name, e)
			}
		}
	})
	return err
}
