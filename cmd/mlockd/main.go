// Command mlockd runs the mlock lock server.
//
// Every flag can also be set by an environment variable: MLOCK_ followed by
// the flag name in upper case with '-' as '_' (MLOCK_LISTEN,
// MLOCK_SESSION_GRACE, ...). A flag on the command line wins. --help
// prints every flag on stdout; --version prints the version. The server's
// flags are its settings table's (server.Settings); docs/configuration.md
// lists them all.
//
// Exit status: 0 after a clean shutdown (SIGTERM or SIGINT), --help or
// --version; 1 when the server fails (it cannot listen, its data directory
// is in use, ...); 2 for a bad flag, environment variable or setting,
// printed as one line naming the flag or the variable and the value,
// followed by a pointer to --help. SIGHUP reloads the auth file, the TLS
// certificate and the client CA (a failed reload is logged and keeps the
// previous ones);
// it never stops the server.
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
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/internal/datadir"
	"github.com/mlock-dev/mlock/server"
)

// noDataDir is the --data-dir value that runs without a data directory.
const noDataDir = "none"

// Exit codes.
const (
	exitOK    = 0
	exitError = 1 // the server failed: it could not listen, its data directory is in use, ...
	exitUsage = 2 // a bad flag, environment variable or setting: nothing was started
)

func main() {
	os.Exit(mainStatus(os.Args[1:], os.Stdout, os.Stderr))
}

// mainStatus runs mlockd and returns its exit status: a usage error is
// printed as one line and a pointer to --help (exit 2), another error as
// one line (exit 1).
func mainStatus(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "recover" {
		return recoverStatus(args[1:], stdout, stderr) // recover.go
	}
	err := run(args, stdout, stderr)
	var ue *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "mlockd: %s\nRun 'mlockd --help' for usage.\n", ue.msg)
		return exitUsage
	}
	fmt.Fprintln(stderr, "mlockd:", strings.TrimPrefix(err.Error(), "server: "))
	return exitError
}

// usageError is a bad flag, environment variable or setting.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// options are the command line's settings beyond server.Config.
type options struct {
	logLevel, logFormat *string
	shutdownTimeout     *time.Duration
	cpuProfile          *string
	version             *bool
	http                *httpOptions // http.go
	bad                 *badValue    // the first bad value given to a flag
}

// newFlagSet defines every flag of mlockd on a flag set that prints
// nothing itself: run prints its errors and its help. The server's
// settings come from its table (flags.go), then mlockd's own, the HTTP
// listener's (http.go) and a cluster node's (cluster.go).
func newFlagSet(cfg *server.Config) (*flag.FlagSet, *options) {
	fs := flag.NewFlagSet("mlockd", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	var opt options
	addSettingFlags(fs, cfg)
	opt.logLevel = fs.String("log-level", "info", "log level: debug, info, warn, error")
	opt.logFormat = fs.String("log-format", "text", "log format: text or json")
	opt.shutdownTimeout = fs.Duration("shutdown-timeout", 10*time.Second, "how long shutdown may take in all, the wait for holders included")
	opt.cpuProfile = fs.String("cpu-profile", "", "write a CPU profile to this file until shutdown (for diagnosis)")
	opt.version = fs.Bool("version", false, "print the version and exit")
	opt.http = addHTTPFlags(fs)
	addClusterFlags(fs, cfg)
	opt.bad = recordErrors(fs)
	return fs, &opt
}

// printUsage prints the help: what mlockd is, every flag and its variable.
func printUsage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintf(w, "Usage: mlockd [flags]\n\n"+
		"Runs the mlock lock server. Every flag can also be set as MLOCK_<FLAG> (e.g. MLOCK_LISTEN,\n"+
		"MLOCK_MAX_CONNS); a flag on the command line wins. SIGHUP reloads the auth file, the TLS\n"+
		"certificate and the client CA; SIGTERM and SIGINT shut down cleanly.\n"+
		"Exit status: 0 after a clean shutdown (or --help, --version); 1 the server failed;\n"+
		"2 a bad flag, variable or setting (nothing was started).\n\n"+
		"A cluster that lost a majority of its nodes: 'mlockd recover' makes a survivor a one-node cluster\n"+
		"that keeps its locks, sessions and fencing tokens (see 'mlockd recover --help', docs/operations.md).\n\n")
	unwrapFlags(fs)
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

// checkExposure refuses, as a usage error before anything starts, a
// listener beyond loopback on a server without credentials (an auth file or
// client certificates) unless Insecure: the lock port (cfg.Addr) when its
// host is empty (every interface) or an IP address beyond loopback (a host
// name is left to the server, which checks the address it listens on), and
// the HTTP listener (httpAddr) when its host is not loopback or localhost.
func checkExposure(cfg *server.Config, httpAddr string, fromEnv map[string]string) error {
	if cfg.AuthFile != "" || cfg.TLSClientCAFile != "" || cfg.Insecure {
		return nil
	}
	if cfg.Addr != "" {
		if host, _, err := net.SplitHostPort(cfg.Addr); err == nil && host != "localhost" {
			if ip := net.ParseIP(host); host == "" || (ip != nil && !ip.IsLoopback()) {
				return usagef("%s %s: beyond loopback the lock port needs credentials (--auth-file or --tls-client-ca), or --insecure to accept the risk",
					source(fromEnv, "listen"), cfg.Addr)
			}
		}
	}
	if httpAddr != "" && !loopbackAddr(httpAddr) {
		return usagef("%s %s: the HTTP listener shows every resource, owner and principal; beyond loopback it needs credentials (--auth-file or --tls-client-ca), which then protect it, or --insecure",
			source(fromEnv, "http"), httpAddr)
	}
	return nil
}

// configure reads the command line and the environment into a Config,
// validated, and mlockd's own options. A nil Config without an error:
// --help or --version, printed on stdout.
func configure(args []string, stdout, stderr io.Writer) (*server.Config, *options, error) {
	var cfg server.Config
	fs, opt := newFlagSet(&cfg)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage(stdout, fs)
			return nil, nil, nil
		}
		if opt.bad.err != nil {
			return nil, nil, opt.bad.err
		}
		return nil, nil, &usageError{msg: err.Error()}
	}
	if *opt.version {
		fmt.Fprintln(stdout, "mlockd", mlock.Version, "("+runtime.Version(), runtime.GOOS+"/"+runtime.GOARCH+")")
		return nil, nil, nil
	}
	if fs.NArg() > 0 {
		return nil, nil, usagef("unexpected argument %q", fs.Arg(0))
	}
	fromEnv, err := applyEnv(fs, os.LookupEnv)
	if err != nil {
		return nil, nil, err
	}
	switch cfg.DataDir {
	case "":
		cfg.DataDir = datadir.DefaultDir
	case noDataDir:
		cfg.DataDir = ""
	}
	if cfg.Logger, err = newLogger(*opt.logLevel, *opt.logFormat, fromEnv, stderr); err != nil {
		return nil, nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, nil, &usageError{msg: configError(err, fromEnv)}
	}
	if err := checkExposure(&cfg, *opt.http.addr, fromEnv); err != nil {
		return nil, nil, err
	}
	return &cfg, opt, nil
}

func run(args []string, stdout, stderr io.Writer) error {
	c, opt, err := configure(args, stdout, stderr)
	if c == nil || err != nil {
		return err // --help, --version, or a usage error
	}
	cfg := *c
	hopt, shutdownTimeout, cpuProfile := opt.http, opt.shutdownTimeout, opt.cpuProfile
	if cfg.DataDir == "" {
		cfg.Logger.Warn("no data directory: every start is quiet, and tokens start at the clock")
	}
	logStart(cfg, *hopt.addr)
	srv, err := server.New(cfg)
	if err != nil {
		return err
	}
	var hs *httpServer
	if *hopt.addr != "" {
		// Before the lock listener: /readyz says "not listening yet" until it listens.
		if hs, err = startHTTP(hopt, &cfg, srv, cfg.Logger); err != nil {
			srv.Shutdown(context.Background())
			return err
		}
		defer hs.stop(context.Background())
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
			// A service manager's reload: read the auth file, the TLS
			// certificate and the client CA again; never die on it.
			cfg.Logger.Info("SIGHUP: reloading")
			if err := srv.Reload(); err != nil {
				cfg.Logger.Error("reload failed; keeping the previous configuration", "err", err)
			}
		case <-ctx.Done():
			break wait
		case <-srv.Failed():
			// A cluster node whose Raft directory cannot be written: it
			// stopped (fail-stop); exit for the supervisor to restart it.
			cfg.Logger.Error("mlockd: stopping: this node cannot write its Raft directory", "err", srv.FailedErr())
			sctx, cancel := context.WithTimeout(context.Background(), *shutdownTimeout)
			defer cancel()
			srv.Shutdown(sctx)
			hs.stop(sctx)
			return srv.FailedErr()
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
	hs.stop(sctx)
	cfg.Logger.Info("mlockd stopped", "uptime", time.Since(started).Round(time.Millisecond))
	return nil
}

// newLogger is the logger of --log-level and --log-format, writing to w;
// a bad value is a usage error naming its flag or variable.
func newLogger(level, format string, fromEnv map[string]string, w io.Writer) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, usagef("%s %q: want debug, info, warn or error", source(fromEnv, "log-level"), level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, usagef("%s %q: want text or json", source(fromEnv, "log-format"), format)
}

// started is when mlockd started, for its last log line.
var started = time.Now()

// logStart logs what this run is: version, addresses and the main limits.
func logStart(cfg server.Config, httpAddr string) {
	attrs := []any{"version", mlock.Version, "go", runtime.Version(), "listen", cfg.Addr, "http", httpAddr,
		"data-dir", cfg.DataDir, "session-grace", cfg.SessionGrace, "max-conns", cfg.MaxConns, "max-sessions", cfg.MaxSessions,
		"max-locks", cfg.MaxLocks, "max-queue-len", cfg.MaxQueueLen, "max-ttl", cfg.MaxTTL}
	if cfg.Cluster != nil {
		attrs = append(attrs, "cluster-id", cfg.Cluster.ID)
	}
	cfg.Logger.Info("mlockd starting", attrs...)
}
