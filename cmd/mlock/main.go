// Command mlock is the mlock command line: run a command under a lock (cron
// de-duplication), inspect an mlockd server, and benchmark lock providers
// side by side.
//
//	mlock run [flags] RESOURCES -- CMD [ARGS...]
//	mlock status [--json]
//	mlock ping [--timeout D]
//	mlock locks [--json] [PREFIX]
//	mlock bench [flags] [URL]
//	mlock evict RESOURCES
//	mlock token NAME RIGHT...
//	mlock version
//
// The server is --uri, or $MLOCK_URI, or mlock://127.0.0.1:12340; run and
// bench take any lock provider (mlock://, mlocks://, redis://, etcd://, memory:),
// the others an mlock:// or mlocks:// server. "mlock COMMAND --help"
// prints a command's help on stdout and exits 0.
//
// Exit status: 0 done; 2 a usage error (unknown command or flag, missing
// or bad argument); 125 mlock's own error (server unreachable, refused).
// "mlock run" exits with its command's status, or 75 (lock lost), 124 (not
// taken in time), 126 (command not executable), 127 (command not found), or
// --skip-exit (default 0) when --skip-if-locked skipped the command.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/mlock-dev/mlock"
)

// Exit codes of mlock itself. "mlock run" otherwise exits with its
// command's status.
const (
	exitOK            = 0
	exitUsage         = 2   // a usage error: unknown command or flag, missing or bad argument
	exitLost          = 75  // the lock was lost while the command ran (EX_TEMPFAIL)
	exitNotTaken      = 124 // the lock could not be taken in time, or tolerate refused it
	exitError         = 125 // mlock's own error: server unreachable, refused, failed
	exitNotExecutable = 126 // the command was found but cannot be run
	exitNotFound      = 127 // the command was not found
)

const defaultURI = "mlock://127.0.0.1:12340"

// What --uri accepts, per command.
const (
	uriServer    = "mlock:// or mlocks:// (TLS) server"
	uriProviders = "lock provider: mlock:// or mlocks:// server, redis://host:port/db, etcd://host:port, memory: (this process only)"
)

func main() {
	// The Redis client's own log lines (a refused dial, retried) would
	// reach stderr, which cron mails: the errors that matter come back
	// from the calls, and are printed once.
	goredis.SetLogger(quietLog{})
	os.Exit(cli(os.Args[1:], os.Stdout, os.Stderr))
}

// quietLog drops the Redis client's log lines.
type quietLog struct{}

func (quietLog) Printf(context.Context, string, ...any) {}

func cli(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "run":
		return cmdRun(rest, stdout, stderr)
	case "status":
		return cmdStatus(rest, stdout, stderr)
	case "ping":
		return cmdPing(rest, stdout, stderr)
	case "locks":
		return cmdLocks(rest, stdout, stderr)
	case "top":
		return cmdTop(rest, stdout, stderr)
	case "bench":
		return cmdBench(rest, stdout, stderr)
	case "token":
		return cmdToken(rest, stdout, stderr)
	case "evict":
		return cmdEvict(rest, stdout, stderr)
	case "cluster":
		return cmdCluster(rest, stdout, stderr)
	case "version":
		return cmdVersion(rest, stdout, stderr)
	case "--version", "-version":
		fmt.Fprintln(stdout, versionLine("mlock"))
		return exitOK
	case "help", "-h", "-help", "--help":
		if len(rest) > 0 && rest[0] != "help" && !strings.HasPrefix(rest[0], "-") {
			return cli([]string{rest[0], "--help"}, stdout, stderr)
		}
		usage(stdout)
		return exitOK
	}
	fmt.Fprintf(stderr, "mlock: unknown command %q\nRun 'mlock --help' for usage.\n", cmd)
	return exitUsage
}

func usage(w io.Writer) {
	fmt.Fprintf(w, `Usage:
  mlock run [flags] RESOURCES -- CMD [ARGS...]   run CMD while holding RESOURCES ("a|b")
  mlock status [--json]                          the server's status
  mlock ping [--timeout D]                       check the server
  mlock locks [--json] [PREFIX]                  holders and waiters per resource
  mlock top [--http URL] [PREFIX]                the busiest resources, refreshed every second
  mlock bench [flags] [URL]                      load a provider: uncontended, hotkey, shop
  mlock evict RESOURCES                          (admin) revoke whoever holds RESOURCES ("a|b")
  mlock cluster status|join|remove               a cluster's nodes, lag and members (see "mlock cluster --help")
  mlock token NAME RIGHT...                      a new token and its auth-file line (RIGHT: prefix=P, admin, from=CIDR, cert, max-locks=N, ...)
  mlock version                                  this command's version and the server's

The server is --uri, default $MLOCK_URI, else %s. "mlock COMMAND --help"
lists a command's flags and what its --uri accepts: run and bench take any lock provider
(mlock://, mlocks://, redis://, etcd://, memory:), the other commands an mlock:// or mlocks:// server.

Exit status: 0 done; 2 usage error; 125 mlock's own error (server unreachable, refused);
"mlock run" also: the command's status, 75 lock lost, 124 lock not taken in time,
126 command not executable, 127 command not found (see "mlock run --help").
`, defaultURI)
}

// versionLine is "NAME VERSION (GO OS/ARCH)".
func versionLine(name string) string {
	return fmt.Sprintf("%s %s (%s %s/%s)", name, mlock.Version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// uriFlag defines --uri; accepts says what the command takes. The help
// shows the default without its secret (shownURI).
func uriFlag(fs *flag.FlagSet, accepts string) *string {
	def := os.Getenv("MLOCK_URI")
	if def == "" {
		def = defaultURI
	}
	usage := accepts + " (default $MLOCK_URI, else " + defaultURI + ")"
	if env := os.Getenv("MLOCK_URI"); env != "" {
		usage = accepts + " (default $MLOCK_URI, now " + shownURI(env) + ", else " + defaultURI + ")"
	}
	p := fs.String("uri", def, usage)
	// The usage says the default: flag's own "(default ...)" is left out.
	fs.Lookup("uri").DefValue = ""
	return p
}

// hideURI returns err without the URI that a *url.Error quotes (it may
// hold a token or a password): "invalid URI: " and what is wrong with it.
// Other errors are returned as they are.
func hideURI(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return fmt.Errorf("invalid URI: %w", ue.Err)
	}
	return err
}

// shownURI is uri as a command shows it: the password of its userinfo (an
// mlock:// token, a Redis or etcd password) replaced by "xxxxx". A URI that
// does not parse is not shown at all.
func shownURI(uri string) string {
	u, err := url.Parse(uri)
	if err != nil {
		return "(invalid URI)"
	}
	return u.Redacted()
}

// newFlagSet returns the flag set of "mlock name": its errors are printed
// by parse, its help (fs.Usage, writing to fs.Output()) by parse on --help.
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("mlock "+name, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: %s [flags]\n\n", fs.Name())
		fs.PrintDefaults()
	}
	return fs
}

// parsed is the outcome of parse: the positional arguments, or the exit
// status when the command must end (help printed, or a usage error).
type parsed struct {
	pos  []string
	exit int
	done bool
}

// parse parses flags that may come before or after the positional
// arguments, up to a "--". --help (-h) prints fs.Usage to stdout: done,
// exit 0. A bad flag prints one line and a pointer to --help on stderr:
// done, exit 2.
func parse(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) parsed {
	help := fs.Usage
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	defer func() { fs.Usage = help }()
	var pos []string
	for {
		if len(args) > 0 && args[0] == "--" {
			return parsed{pos: append(pos, args...)}
		}
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fs.SetOutput(stdout)
				help()
				return parsed{done: true, exit: exitOK}
			}
			return parsed{done: true, exit: usageError(fs, stderr, err.Error())}
		}
		args = fs.Args()
		if len(args) == 0 {
			return parsed{pos: pos}
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// usageError prints "mlock CMD: msg" and a pointer to --help; it returns
// exitUsage.
func usageError(fs *flag.FlagSet, stderr io.Writer, msg string) int {
	fmt.Fprintf(stderr, "%s: %s\nRun '%s --help' for usage.\n", fs.Name(), msg, fs.Name())
	return exitUsage
}

// clientOptions parses an mlock:// URI for a command-line client: the
// connection attempt and the wait for the connection are bounded by
// dialTimeout.
func clientOptions(uri string, dialTimeout time.Duration) (mlock.Options, error) {
	o, err := mlock.ParseURI(uri)
	if err != nil {
		return o, err
	}
	o.DialTimeout = dialTimeout
	return o, nil
}

func client(uri string) (*mlock.Client, error) {
	o, err := clientOptions(uri, 3*time.Second)
	if err != nil {
		return nil, err
	}
	return mlock.NewClient(o)
}

// signalCtx is a context cancelled by SIGINT or SIGTERM.
func signalCtx() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// describe is err as one line for "mlock CMD: ": the "mlock: " that opens
// the client's errors is not repeated after the command's own prefix.
func describe(err error) string {
	return strings.TrimPrefix(err.Error(), "mlock: ")
}

// fail prints "mlock CMD: err" and returns exitError.
func fail(fs *flag.FlagSet, stderr io.Writer, err error) int {
	fmt.Fprintf(stderr, "%s: %s\n", fs.Name(), describe(err))
	return exitError
}

// timeoutFlag defines an inspection command's --timeout.
func timeoutFlag(fs *flag.FlagSet) *time.Duration {
	return fs.Duration("timeout", 5*time.Second, "longest wait for the server's answer, connecting included;\n"+
		"a server that refuses the connection (nothing listens) fails at once")
}

// withClient parses an inspection command's flags (define the others on fs
// first, and its Usage), connects to --uri (an mlock:// or mlocks://
// server) and runs do within --timeout. It takes minPos to maxPos
// positional arguments.
func withClient(fs *flag.FlagSet, args []string, stdout, stderr io.Writer, minPos, maxPos int,
	do func(ctx context.Context, c *mlock.Client, uri string, pos []string) error) int {
	return withClientChecked(fs, args, stdout, stderr, minPos, maxPos, nil, do)
}

// withClientChecked is withClient with check (nil: none), which runs once
// the flags and arguments are parsed and found in range, before the client
// is made: what it returns, if not empty, is a usage error.
func withClientChecked(fs *flag.FlagSet, args []string, stdout, stderr io.Writer, minPos, maxPos int, check func() string,
	do func(ctx context.Context, c *mlock.Client, uri string, pos []string) error) int {
	uri := uriFlag(fs, uriServer)
	timeout := timeoutFlag(fs)
	p := parse(fs, args, stdout, stderr)
	if p.done {
		return p.exit
	}
	switch {
	case len(p.pos) < minPos:
		return usageError(fs, stderr, "missing argument")
	case len(p.pos) > maxPos:
		return usageError(fs, stderr, fmt.Sprintf("unexpected argument %q", p.pos[maxPos]))
	}
	if *timeout <= 0 {
		return usageError(fs, stderr, "--timeout must be positive")
	}
	if check != nil {
		if msg := check(); msg != "" {
			return usageError(fs, stderr, msg)
		}
	}
	o, err := clientOptions(*uri, *timeout)
	if err != nil {
		return fail(fs, stderr, err)
	}
	c, err := mlock.NewClient(o)
	if err != nil {
		return fail(fs, stderr, err)
	}
	defer c.Close()
	ctx, stop := signalCtx()
	defer stop()
	ctx, cancel := context.WithTimeoutCause(ctx, *timeout, errNoAnswer)
	defer cancel()
	ctx, settle := failFast(ctx, c.Addrs(), *timeout)
	err = do(ctx, c, *uri, p.pos)
	settle(err)
	if err != nil {
		return fail(fs, stderr, explain(ctx, err, c.Addrs(), *timeout))
	}
	return exitOK
}

// errNoAnswer is the cause of an inspection command's --timeout.
var errNoAnswer = errors.New("no answer")

// explain is the error of a call made under ctx (see withClient): the
// refusal that cut it short, or "no answer from ADDR within D" for its
// --timeout, else err.
func explain(ctx context.Context, err error, addrs []string, timeout time.Duration) error {
	cause := context.Cause(ctx)
	var r *refusedError
	switch {
	case errors.As(cause, &r):
		return r
	case errors.Is(cause, errNoAnswer) && errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("no answer from %s within %v", strings.Join(addrs, ", "), timeout)
	}
	return err
}

// refusedError: every address refused the TCP connection.
type refusedError struct {
	addrs []string
	errs  []error
}

func (e *refusedError) Error() string {
	var b strings.Builder
	b.WriteString("server unreachable: ")
	for i, a := range e.addrs {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(a)
		b.WriteString(": connection refused")
	}
	return b.String()
}

func (e *refusedError) Unwrap() []error { return e.errs }

// failFast probes every address with a plain TCP connection, beside the
// client's own attempts, and cancels the returned context with a
// *refusedError if every one refuses the connection (nothing listens
// there): the client retries a refused connection until its DialTimeout,
// and a retried call waits twice, so "connection refused" would otherwise
// take the whole --timeout and be reported as "server unreachable" only.
// The probe closes its connection at once; it does nothing else. settle
// ends the probe once the call under ctx has returned err: if err says a
// connection was refused, the call may have failed before the probe saw
// the refusal (both race on a busy machine), so settle lets the probe
// finish first, and the refusal is then reported the same way whichever
// came first.
func failFast(ctx context.Context, addrs []string, timeout time.Duration) (_ context.Context, settle func(err error)) {
	ctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if r := probeRefused(ctx, addrs, timeout); r != nil {
			cancel(r)
		}
	}()
	return ctx, func(err error) {
		if !errors.Is(err, syscall.ECONNREFUSED) {
			cancel(nil)
		}
		<-done
		cancel(nil)
	}
}

// probeRefused probes every address with a plain TCP connection (closed at
// once) and returns a *refusedError if every one refused it; nil as soon as
// one did not (reachable, or not refused: the caller's own calls tell).
func probeRefused(ctx context.Context, addrs []string, timeout time.Duration) *refusedError {
	if len(addrs) == 0 {
		return nil
	}
	errs := make([]error, len(addrs))
	ch := make(chan int, len(addrs))
	d := net.Dialer{Timeout: timeout}
	for i, a := range addrs {
		go func() {
			nc, err := d.DialContext(ctx, "tcp", a)
			if err == nil {
				nc.Close()
			}
			errs[i] = err
			ch <- i
		}()
	}
	for range addrs {
		if i := <-ch; !errors.Is(errs[i], syscall.ECONNREFUSED) {
			return nil
		}
	}
	return &refusedError{addrs: addrs, errs: errs}
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// inspectUsage sets the help of an inspection command.
func inspectUsage(fs *flag.FlagSet, synopsis, what string) {
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: %s\n\n%s\nExit status: 0 done, 2 usage error, 125 error (server unreachable, refused).\n\n", synopsis, what)
		fs.PrintDefaults()
	}
}

func cmdPing(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("ping")
	inspectUsage(fs, "mlock ping [--uri URI] [--timeout D]", "Checks that the server answers, and prints the round trip.\n")
	return withClient(fs, args, stdout, stderr, 0, 0, func(ctx context.Context, c *mlock.Client, uri string, _ []string) error {
		start := time.Now()
		if err := c.Ping(ctx); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "pong from %s in %v\n", shownURI(uri), time.Since(start).Round(time.Microsecond))
		return nil
	})
}

func cmdVersion(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("version")
	inspectUsage(fs, "mlock version [--uri URI] [--timeout D]",
		"Prints this command's version, then the server's (from its status).\n")
	return withClient(fs, args, stdout, stderr, 0, 0, func(ctx context.Context, c *mlock.Client, uri string, _ []string) error {
		fmt.Fprintln(stdout, "client:", versionLine("mlock"))
		st, err := c.Status(ctx)
		if err != nil {
			return fmt.Errorf("server version: %w", err)
		}
		fmt.Fprintf(stdout, "server: mlockd %s at %s\n", st.Version, shownURI(uri))
		return nil
	})
}

func cmdStatus(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("status")
	asJSON := fs.Bool("json", false, "print the status document as JSON")
	inspectUsage(fs, "mlock status [--json] [--uri URI] [--timeout D]", "Prints the server's counters, sessions, limits and CPU time.\n")
	return withClient(fs, args, stdout, stderr, 0, 0, func(ctx context.Context, c *mlock.Client, uri string, _ []string) error {
		st, err := c.Status(ctx)
		if err != nil || *asJSON {
			if err == nil {
				err = printJSON(stdout, st)
			}
			return err
		}
		w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintf(w, "server\t%s (mlockd %s)\n", shownURI(uri), st.Version)
		fmt.Fprintf(w, "uptime\t%v (since %s)\n", (time.Duration(st.LiveTime) * time.Millisecond).Round(time.Second),
			time.UnixMilli(st.StartAt).UTC().Format(time.RFC3339))
		if st.QuietUntil > 0 {
			fmt.Fprintf(w, "quiet until\t%s (after a start that may follow a crash: nothing is granted before)\n",
				time.UnixMilli(st.QuietUntil).UTC().Format(time.RFC3339Nano))
		}
		fmt.Fprintf(w, "connections\t%d (sessions %d, refused %d)\n", st.SocketCount, st.Sessions, st.RejectedConnections)
		fmt.Fprintf(w, "locks\t%d held, %d waiting\n", st.HeldLocks, st.CurrentLocks-st.HeldLocks)
		fmt.Fprintf(w, "requests\t%d (granted %d, tolerate refused %d, timed out %d)\n", st.LockCount, st.LockedCount, st.IntoleranceCount, st.TimeoutCount)
		fmt.Fprintf(w, "ended\t%d unlocked, %d expired, %d dropped with their session\n", st.FinishedCount, st.ExpiredCount, st.DroppedCount)
		fmt.Fprintf(w, "extends\t%d (failed %d)\n", st.ExtendCount, st.ExtendFailedCount)
		fmt.Fprintf(w, "last token\t%d\n", st.LastToken)
		if l := st.Limits; l != nil {
			fmt.Fprintf(w, "held names\t%d queue entries, %d bytes of names\n", l.Entries, l.NameBytes)
			fmt.Fprintf(w, "refused\t%d auth, %d per-address, %d sessions, %d forbidden, %d server full, %d rate-limited; %d idle closed\n",
				l.AuthFailed, l.RejectedPerIP, l.SessionsRefused, l.Forbidden, l.ServerFull, l.RateLimited, l.IdleClosed)
		}
		if cl := st.Cluster; cl != nil {
			leader := cl.Leader
			if leader == "" {
				leader = "none known"
			} else if cl.LeaderAddr != "" {
				leader += " at " + cl.LeaderAddr
			}
			fmt.Fprintf(w, "cluster\tnode %s (%s), leader %s, term %d, index %d committed %d applied %d\n",
				cl.ID, cl.Role, leader, cl.Term, cl.LastIndex, cl.CommitIndex, cl.AppliedIndex)
			for _, p := range cl.Peers {
				state := p.Suffrage
				if p.Failing {
					state += ", failing"
				}
				fmt.Fprintf(w, "  peer\t%s %s (%s)\n", p.ID, p.Addr, state)
			}
		}
		fmt.Fprintf(w, "cpu time\t%v\n", time.Duration(st.CPUTimeMs*float64(time.Millisecond)).Round(time.Millisecond))
		if st.Reads > 0 {
			fmt.Fprintf(w, "batching\t%.1f frames per read (%d reads, %d writes)\n", float64(st.FramesIn)/float64(st.Reads), st.Reads, st.Writes)
		}
		return w.Flush()
	})
}

func cmdLocks(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("locks")
	asJSON := fs.Bool("json", false, "print the listing as JSON")
	inspectUsage(fs, "mlock locks [--json] [--uri URI] [--timeout D] [PREFIX]",
		"Lists the holders and waiters of every resource whose name starts with PREFIX (default: all),\n"+
			"as far as the server's --status-limit allows.\n")
	return withClient(fs, args, stdout, stderr, 0, 1, func(ctx context.Context, c *mlock.Client, _ string, pos []string) error {
		prefix := ""
		if len(pos) > 0 {
			prefix = pos[0]
		}
		ls, err := c.Locks(ctx, prefix)
		if err != nil || *asJSON {
			if err == nil {
				err = printJSON(stdout, ls)
			}
			return err
		}
		w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "RESOURCE\tPOS\tSTATE\tMODE\tOWNER\tLOCK\tSESSION\tTOKEN\tAGE\tLEFT")
		ms := func(p *int64) string {
			if p == nil {
				return "-"
			}
			return (time.Duration(*p) * time.Millisecond).String()
		}
		for _, q := range ls.Queues {
			for _, e := range q.Entries {
				owner, token, left := e.Owner, "-", ms(e.TimeoutLeftMs)
				if owner == "" {
					owner = "-"
				}
				if e.State == "held" {
					token, left = fmt.Sprint(e.Token), ms(e.TTLLeftMs)
				}
				fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%v\t%s\n", q.Resource, e.Position, e.State, modeName(e.Mode),
					owner, e.Lock, e.Session, token, time.Duration(e.AgeMs)*time.Millisecond, left)
			}
		}
		if err := w.Flush(); err != nil {
			return err
		}
		if ls.Truncated {
			fmt.Fprintln(stdout, "(listing truncated at the server's status limit)")
		}
		return nil
	})
}

// modeName is how mlock locks shows a mode: exclusive, shared, or "k of n"
// permits.
func modeName(mode string) string {
	switch mode {
	case "", "x": // "": a server without modes
		return "exclusive"
	case "s":
		return "shared"
	}
	if k, n, ok := strings.Cut(mode, "/"); ok {
		return k + " of " + n
	}
	return mode
}

func cmdEvict(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("evict")
	inspectUsage(fs, "mlock evict [--uri URI] [--timeout D] RESOURCES",
		"Revokes the lock holding each resource of RESOURCES (\"a|b\"), whoever holds it: its holder is told at\n"+
			"once and can no longer extend it, and the resource goes to the next waiter when the holder can no longer\n"+
			"believe it holds it (at most the server's session grace later). Administrators only.\n")
	return withClient(fs, args, stdout, stderr, 1, 1, func(ctx context.Context, c *mlock.Client, _ string, pos []string) error {
		n, err := c.Evict(ctx, pos[0])
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%d lock(s) revoked; their holders were told; the resources are free within the session grace\n", n)
		return nil
	})
}

// splitCommand separates "RESOURCES -- CMD ARGS" (the "--" is optional).
func splitCommand(pos []string) (string, []string, error) {
	if len(pos) == 0 {
		return "", nil, errors.New("missing RESOURCES")
	}
	res, rest := pos[0], pos[1:]
	if len(rest) > 0 && rest[0] == "--" {
		rest = rest[1:]
	}
	if len(rest) == 0 {
		return "", nil, errors.New("missing the command to run after --")
	}
	if strings.TrimSpace(res) == "" {
		return "", nil, errors.New("empty RESOURCES")
	}
	return res, rest, nil
}
