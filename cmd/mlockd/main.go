// Command mlockd runs the mlock lock server.
//
// Every flag can also be set by an environment variable: MLOCK_ followed by
// the flag name in upper case with '-' as '_' (MLOCK_LISTEN,
// MLOCK_SESSION_GRACE, ...). A flag on the command line wins.
//
// # Data directory and restarts
//
// mlockd keeps a data directory, by default mlockd.data in its working
// directory (--data-dir; an empty value means the default, "none" runs
// without one). It holds the fencing-token high-water mark and how the last
// run ended, and is locked while a server uses it: a second mlockd on the
// same directory exits with an error.
//
// A start that may follow a crash grants nothing for the quiet period
// (--quiet-period, default the session grace + 1 % + 5 ms): a client of the
// previous run may still believe it holds a lock until then. Requests queue
// and are granted when it ends; try-locks are refused as busy; status shows
// quietUntil. The first start on a new directory and a start after a clean
// shutdown (SIGTERM or SIGINT: mlockd tells every holder its locks are gone
// and waits up to --shutdown-wait for those clients to confirm with bye)
// grant at once. Without a data directory every start is quiet. The quiet
// period in force is recorded in the data directory: a start after a crash
// is quiet for the crashed run's period if it is longer than its own, so a
// restart with a shorter --session-grace or --quiet-period does not shorten
// what the crashed run's clients may believe. A --quiet-period below the
// session grace + 1 % + 5 ms is logged as unsafe; --quiet-period 0 turns the
// quiet period off: unsafe, for tests that restart servers on purpose.
//
// A negative --session-grace drops a disconnected session's locks at once
// and is announced to clients as 0: a client that follows the safety rule
// then cannot hold a lock across any silence. Use a positive grace.
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

	"github.com/mlock-dev/mlock/internal/datadir"
	"github.com/mlock-dev/mlock/server"
)

// noDataDir is the --data-dir value that runs without a data directory.
const noDataDir = "none"

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
	fs.StringVar(&cfg.Addr, "listen", server.DefaultAddr, "TCP address to listen on; beyond loopback it needs credentials (--auth-file or --tls-client-ca) or --insecure")
	fs.StringVar(&cfg.AuthFile, "auth-file", "", "auth file: principals, hashed tokens and rights (see docs/security.md); reloaded on SIGHUP. Without it: protected mode, loopback clients only")
	fs.BoolVar(&cfg.Insecure, "insecure", false, "without credentials, accept clients from any address anyway (anyone who reaches the server can take, release and list every lock)")
	fs.StringVar(&cfg.TLSCertFile, "tls-cert", "", "TLS certificate file (PEM): every connection speaks TLS 1.2+; reloaded on SIGHUP")
	fs.StringVar(&cfg.TLSKeyFile, "tls-key", "", "TLS private key file (PEM), with --tls-cert")
	fs.StringVar(&cfg.TLSClientCAFile, "tls-client-ca", "", "CA file (PEM) verifying client certificates (mTLS); a verified certificate's name is the client's principal")
	fs.IntVar(&cfg.MaxConnsPerIP, "max-conns-per-ip", server.DefaultMaxConnsPerIP, "most simultaneous connections from one IP address (an IPv6 /64 counts as one; loopback is not limited)")
	fs.IntVar(&cfg.MaxUnauthenticated, "max-unauthenticated", server.DefaultMaxUnauthenticated, "most connections that have not completed connect (TLS handshake included)")
	fs.IntVar(&cfg.MaxSessions, "max-sessions", server.DefaultMaxSessions, "most sessions, connected or in their grace period")
	idle := optDuration{}
	fs.Var(&idle, "idle-timeout", "close a connection that sent nothing for this `duration` after its handshake (default 1m0s; 0: never)")
	fs.IntVar(&cfg.MaxLocks, "max-locks", server.DefaultMaxLocks, "most live requests (held and waiting) in the whole server (-1: no limit)")
	fs.IntVar(&cfg.MaxEntries, "max-entries", server.DefaultMaxEntries, "most queue entries in the whole server; a request on k resources is k entries (-1: no limit)")
	fs.IntVar(&cfg.MaxNameBytes, "max-name-bytes", server.DefaultMaxNameBytes, "most bytes of resource and owner names held by the whole server (-1: no limit)")
	fs.IntVar(&cfg.MaxSessionBytes, "max-session-bytes", server.DefaultMaxSessionBytes, "most bytes of resource and owner names held by one session (-1: no limit)")
	fs.IntVar(&cfg.StatusRate, "status-rate", server.DefaultStatusRate, "detailed status and locks listings per second and principal (-1: no limit)")
	fs.DurationVar(&cfg.SessionGrace, "session-grace", server.DefaultSessionGrace, "how long a disconnected session keeps its locks; announced to clients, which believe a lock for at most this long after their last answer (negative: dropped at once and announced as 0, so a client that follows the safety rule cannot hold a lock across any silence; use a positive grace)")
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
	fs.StringVar(&cfg.DataDir, "data-dir", datadir.DefaultDir, "data directory: fencing-token high-water mark and how the last run ended, locked while in use (empty: the default; \""+noDataDir+"\": none, then every start is quiet)")
	quiet := optDuration{}
	fs.Var(&quiet, "quiet-period", "after a start that may follow a crash, grant nothing for this `duration`, or for the crashed run's, if longer (default: session grace + 1% + 5ms; shorter is unsafe and logged; 0: never quiet, unsafe, for tests)")
	shutdownWait := optDuration{}
	fs.Var(&shutdownWait, "shutdown-wait", "on shutdown, the `duration` to wait for clients holding locks to confirm (bye) after they are told (default 2s; 0: no wait, then the next start is quiet if any lock was held)")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	shutdownTimeout := fs.Duration("shutdown-timeout", 10*time.Second, "how long shutdown may take in all, the wait for holders included")
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
	switch cfg.DataDir {
	case "":
		cfg.DataDir = datadir.DefaultDir
	case noDataDir:
		cfg.DataDir = ""
	}
	// 0 on the command line turns these off; in server.Config that is a
	// negative value (0 there is the default).
	if quiet.set {
		cfg.QuietPeriod = quiet.off()
	}
	if shutdownWait.set {
		cfg.ShutdownWait = shutdownWait.off()
	}
	if idle.set {
		cfg.IdleTimeout = idle.off()
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
	if cfg.DataDir == "" {
		cfg.Logger.Warn("no data directory: every start is quiet, and tokens start at the clock")
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
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
wait:
	for {
		select {
		case err := <-errc:
			srv.Shutdown(context.Background()) // releases the data directory
			return err
		case <-hup:
			// A service manager's reload: read the auth file and the TLS
			// certificate again; never die on it.
			cfg.Logger.Info("SIGHUP: reloading")
			if err := srv.Reload(); err != nil {
				cfg.Logger.Error("reload failed; keeping the previous configuration", "err", err)
			}
		case <-ctx.Done():
			break wait
		}
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

// optDuration is a duration flag whose absence means "the server's
// default", so that 0 can mean "off".
type optDuration struct {
	d   time.Duration
	set bool
}

func (o *optDuration) String() string {
	if o == nil || !o.set {
		return ""
	}
	return o.d.String()
}

func (o *optDuration) Set(v string) error {
	d, err := time.ParseDuration(v)
	if err != nil {
		return errors.New("want a duration such as 15s")
	}
	if d < 0 {
		return errors.New("negative duration")
	}
	o.d, o.set = d, true
	return nil
}

// off returns the server.Config value: the duration, or -1 for 0 (off).
func (o *optDuration) off() time.Duration {
	if o.d == 0 {
		return -1
	}
	return o.d
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
