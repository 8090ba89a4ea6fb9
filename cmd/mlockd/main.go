// Command mlockd runs the mlock lock server.
//
// Every flag can also be set by an environment variable: MLOCK_ followed by
// the flag name in upper case with '-' as '_' (MLOCK_LISTEN,
// MLOCK_SESSION_GRACE, ...). A flag on the command line wins. --help
// prints every flag on stdout; --version prints the version.
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
	"os"
	"os/signal"
	"regexp"
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
	idle, quiet, shutdownWait optDuration
	logLevel, logFormat       *string
	shutdownTimeout           *time.Duration
	cpuProfile                *string
	version                   *bool
	http                      *httpOptions // http.go
}

// newFlagSet defines every flag of mlockd on a flag set that prints
// nothing itself: run prints its errors and its help.
func newFlagSet(cfg *server.Config) (*flag.FlagSet, *options) {
	fs := flag.NewFlagSet("mlockd", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	var opt options
	idle, quiet, shutdownWait := &opt.idle, &opt.quiet, &opt.shutdownWait
	fs.StringVar(&cfg.Addr, "listen", server.DefaultAddr, "TCP address to listen on; beyond loopback it needs credentials (--auth-file or --tls-client-ca) or --insecure")
	fs.StringVar(&cfg.AuthFile, "auth-file", "", "auth file: principals, hashed tokens and rights (see docs/security.md); reloaded on SIGHUP. Without it: protected mode, loopback clients only")
	fs.BoolVar(&cfg.Insecure, "insecure", false, "without credentials, accept clients from any address anyway (anyone who reaches the server can take, release and list every lock)")
	fs.StringVar(&cfg.TLSCertFile, "tls-cert", "", "TLS certificate file (PEM): every connection speaks TLS 1.2+, a cluster node's Raft port included; reloaded on SIGHUP")
	fs.StringVar(&cfg.TLSKeyFile, "tls-key", "", "TLS private key file (PEM), with --tls-cert")
	fs.StringVar(&cfg.TLSClientCAFile, "tls-client-ca", "", "CA file (PEM) verifying client certificates (mTLS); a verified certificate's name is the client's principal. Without --auth-file, a client without a certificate is refused, on loopback too")
	fs.IntVar(&cfg.MaxConnsPerIP, "max-conns-per-ip", server.DefaultMaxConnsPerIP, "most simultaneous connections from one IP address (an IPv6 /64 counts as one; loopback is not limited)")
	fs.IntVar(&cfg.MaxUnauthenticated, "max-unauthenticated", server.DefaultMaxUnauthenticated, "most connections that have not completed connect (TLS handshake included); a newcomer past it evicts the oldest of them (-1: no limit)")
	fs.IntVar(&cfg.MaxUnauthenticatedPerIP, "max-unauthenticated-per-ip", server.DefaultMaxUnauthenticatedPerIP, "most connections from one address that have not completed connect (loopback addresses too, each on its own; an IPv6 /64 counts as one); a newcomer past it evicts that address's oldest (-1: no limit)")
	fs.IntVar(&cfg.PrincipalMaxLocks, "principal-max-locks", 0, "default quota of live lock requests of a principal whose auth-file line has no max-locks= (0: half of --max-locks; -1: none)")
	fs.IntVar(&cfg.PrincipalMaxSessions, "principal-max-sessions", 0, "default quota of sessions of a principal whose auth-file line has no max-sessions= (0: half of --max-sessions; -1: none)")
	fs.IntVar(&cfg.PrincipalMaxConns, "principal-max-conns", 0, "default quota of connections of a principal whose auth-file line has no max-conns= (0: half of --max-conns; -1: none)")
	fs.IntVar(&cfg.MaxSessions, "max-sessions", server.DefaultMaxSessions, "most sessions, connected or in their grace period")
	fs.Var(idle, "idle-timeout", "close a connection that sent nothing for this `duration` after its handshake (default 1m0s; 0: never)")
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
	fs.Var(quiet, "quiet-period", "after a start that may follow a crash, grant nothing for this `duration`, or for the crashed run's, if longer (default: session grace + 1% + 5ms; shorter is unsafe and logged; 0: never quiet, unsafe, for tests)")
	fs.Var(shutdownWait, "shutdown-wait", "on shutdown, the `duration` to wait for clients holding locks to confirm (bye) after they are told (default 2s; 0: no wait, then the next start is quiet if any lock was held)")
	opt.logLevel = fs.String("log-level", "info", "log level: debug, info, warn, error")
	opt.logFormat = fs.String("log-format", "text", "log format: text or json")
	opt.shutdownTimeout = fs.Duration("shutdown-timeout", 10*time.Second, "how long shutdown may take in all, the wait for holders included")
	opt.cpuProfile = fs.String("cpu-profile", "", "write a CPU profile to this file until shutdown (for diagnosis)")
	opt.version = fs.Bool("version", false, "print the version and exit")
	opt.http = addHTTPFlags(fs, cfg)
	return fs, &opt
}

// printUsage prints the help: what mlockd is, every flag and its variable.
func printUsage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintf(w, "Usage: mlockd [flags]\n\n"+
		"Runs the mlock lock server. Every flag can also be set as MLOCK_<FLAG> (e.g. MLOCK_LISTEN,\n"+
		"MLOCK_MAX_CONNS); a flag on the command line wins. SIGHUP reloads the auth file, the TLS\n"+
		"certificate and the client CA; SIGTERM and SIGINT shut down cleanly.\n"+
		"Exit status: 0 after a clean shutdown (or --help, --version); 1 the server failed;\n"+
		"2 a bad flag, variable or setting.\n\n")
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

func run(args []string, stdout, stderr io.Writer) error {
	var cfg server.Config
	fs, opt := newFlagSet(&cfg)
	addClusterFlags(fs, &cfg) // cluster.go
	hopt := opt.http
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage(stdout, fs)
			return nil
		}
		return &usageError{msg: flagError(fs, err)}
	}
	if *opt.version {
		fmt.Fprintln(stdout, "mlockd", mlock.Version, "("+runtime.Version(), runtime.GOOS+"/"+runtime.GOARCH+")")
		return nil
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	fromEnv, err := applyEnv(fs, os.LookupEnv)
	if err != nil {
		return err
	}
	idle, quiet, shutdownWait := &opt.idle, &opt.quiet, &opt.shutdownWait
	logLevel, logFormat, shutdownTimeout, cpuProfile := opt.logLevel, opt.logFormat, opt.shutdownTimeout, opt.cpuProfile
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
		return usagef("%s %q: want debug, info, warn or error", source(fromEnv, "log-level"), *logLevel)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch *logFormat {
	case "text":
		cfg.Logger = slog.New(slog.NewTextHandler(stderr, opts))
	case "json":
		cfg.Logger = slog.New(slog.NewJSONHandler(stderr, opts))
	default:
		return usagef("%s %q: want text or json", source(fromEnv, "log-format"), *logFormat)
	}
	if err := cfg.Validate(); err != nil {
		return &usageError{msg: configError(err, fromEnv)}
	}
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

// envName is the environment variable of a flag: MLOCK_ and the name in
// upper case with '-' as '_'.
func envName(flagName string) string {
	return "MLOCK_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// applyEnv sets every flag not given on the command line from its MLOCK_
// environment variable, and returns the flags so set, by name, with their
// variable. A bad value is a usage error naming the variable, its value and
// what it wants.
func applyEnv(fs *flag.FlagSet, lookup func(string) (string, bool)) (map[string]string, error) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	fromEnv := map[string]string{}
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil {
			return
		}
		name := envName(f.Name)
		if v, ok := lookup(name); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = usagef("%s=%q: %s (see --%s)", name, v, want(f, e), f.Name)
				return
			}
			fromEnv[f.Name] = name
		}
	})
	return fromEnv, err
}

// flagRE reads the flag package's error for a bad value.
var flagRE = regexp.MustCompile(`^invalid (?:boolean )?value "(.*)" for (?:flag )?-([\w-]+): (.*)$`)

// flagError is the flag package's parse error in mlockd's words: a bad
// value names the flag, the value and what the flag wants.
func flagError(fs *flag.FlagSet, err error) string {
	m := flagRE.FindStringSubmatch(err.Error())
	if m == nil {
		return err.Error()
	}
	f := fs.Lookup(m[2])
	if f == nil {
		return err.Error()
	}
	return fmt.Sprintf("--%s %q: %s", f.Name, m[1], want(f, errors.New(m[3])))
}

// want says what flag f wants, given the error of setting it: the flag
// package's "parse error" and "value out of range" say too little.
func want(f *flag.Flag, err error) string {
	msg := err.Error()
	if msg != "parse error" && msg != "value out of range" && !strings.HasPrefix(msg, "parse error") {
		return msg
	}
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return msg
	}
	switch g.Get().(type) {
	case int, int64:
		if msg == "value out of range" {
			return "out of range for an integer"
		}
		return "want an integer"
	case uint, uint64:
		return "want a non-negative integer"
	case time.Duration:
		return "want a duration such as 15s or 1m30s"
	case bool:
		return "want true or false"
	case float64:
		return "want a number"
	}
	return msg
}

// source is how a setting was given: its variable if it came from the
// environment, else its flag.
func source(fromEnv map[string]string, flagName string) string {
	if v, ok := fromEnv[flagName]; ok {
		return v
	}
	return "--" + flagName
}

// configFlags names the flag of each field of server.Config that a flag
// sets, so that the errors of server.Config.Validate, which name the
// fields, name what the user gave.
var configFlags = map[string]string{
	"Addr": "listen", "AuthFile": "auth-file", "Insecure": "insecure", "TLSCertFile": "tls-cert",
	"TLSKeyFile": "tls-key", "TLSClientCAFile": "tls-client-ca", "MaxConnsPerIP": "max-conns-per-ip",
	"MaxUnauthenticated": "max-unauthenticated", "MaxUnauthenticatedPerIP": "max-unauthenticated-per-ip",
	"PrincipalMaxLocks": "principal-max-locks", "PrincipalMaxSessions": "principal-max-sessions",
	"PrincipalMaxConns": "principal-max-conns", "MaxSessions": "max-sessions", "IdleTimeout": "idle-timeout",
	"MaxLocks": "max-locks", "MaxEntries": "max-entries", "MaxNameBytes": "max-name-bytes",
	"MaxSessionBytes": "max-session-bytes", "StatusRate": "status-rate", "SessionGrace": "session-grace",
	"DefaultTTL": "default-ttl", "AuthTimeout": "auth-timeout", "MaxFrame": "max-frame", "MaxConns": "max-conns",
	"MaxPendingOutput": "max-pending-output", "WriteTimeout": "write-timeout", "MaxOfflineBytes": "max-offline-bytes",
	"MaxResources": "max-resources", "MaxNameLen": "max-name-len", "MaxSocketIDLen": "max-socket-id-len",
	"MaxLocksPerSession": "max-locks-per-session", "MaxQueueLen": "max-queue-len", "MaxTTL": "max-ttl",
	"MaxTimeout": "max-timeout", "StatusLimit": "status-limit", "DataDir": "data-dir", "QuietPeriod": "quiet-period",
	"ShutdownWait": "shutdown-wait", "LogSlowWait": "log-slow-wait", "LogLongQueue": "log-long-queue",
}

// fieldRE matches a field name of server.Config in an error, with or
// without "Config.".
var fieldRE = regexp.MustCompile(`(?:Config\.)?\b([A-Z][A-Za-z]+)\b`)

// configError is an error of server.Config.Validate with each field named
// by its flag, or its variable if the value came from the environment:
// "server: Config.MaxFrame 100000000 is above 16777216" becomes
// "--max-frame 100000000 is above 16777216".
func configError(err error, fromEnv map[string]string) string {
	msg := strings.TrimPrefix(err.Error(), "server: ")
	return fieldRE.ReplaceAllStringFunc(msg, func(w string) string {
		field := strings.TrimPrefix(w, "Config.")
		if name, ok := configFlags[field]; ok {
			return source(fromEnv, name)
		}
		return w
	})
}
