// Command mlock is the mlock command line: run a command under a lock (cron
// de-duplication), inspect an mlockd server, and benchmark lock providers
// side by side.
//
//	mlock run [flags] RESOURCES -- CMD [ARGS...]
//	mlock status [--json]
//	mlock ping
//	mlock locks [--json] [PREFIX]
//	mlock bench [flags] [URL]
//
// The server is --uri, or $MLOCK_URI, or mlock://127.0.0.1:12340.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/mlock-dev/mlock"
)

// Exit codes of mlock itself. "mlock run" otherwise exits with its
// command's status.
const (
	exitOK       = 0
	exitLost     = 75  // the lock was lost while the command ran (EX_TEMPFAIL)
	exitNotTaken = 124 // the lock could not be taken in time, or tolerate refused it
	exitError    = 125 // mlock's own error: bad arguments, server unreachable
)

const defaultURI = "mlock://127.0.0.1:12340"

func main() {
	os.Exit(cli(os.Args[1:], os.Stdout, os.Stderr))
}

func cli(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitError
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "run":
		return cmdRun(rest, stderr)
	case "status":
		return cmdStatus(rest, stdout, stderr)
	case "ping":
		return cmdPing(rest, stdout, stderr)
	case "locks":
		return cmdLocks(rest, stdout, stderr)
	case "bench":
		return cmdBench(rest, stdout, stderr)
	case "token":
		return cmdToken(rest, stdout, stderr)
	case "evict":
		return cmdEvict(rest, stdout, stderr)
	case "help", "-h", "--help":
		usage(stdout)
		return exitOK
	}
	fmt.Fprintf(stderr, "mlock: unknown command %q\n", cmd)
	usage(stderr)
	return exitError
}

func usage(w io.Writer) {
	fmt.Fprint(w, `Usage:
  mlock run [flags] RESOURCES -- CMD [ARGS...]   run CMD while holding RESOURCES ("a|b")
  mlock status [--json]                          the server's status
  mlock ping                                     check the server
  mlock locks [--json] [PREFIX]                  holders and waiters per resource
  mlock bench [flags] [URL]                      load a provider: uncontended, hotkey, shop
  mlock evict RESOURCES                          (admin) release whoever holds RESOURCES ("a|b")
  mlock token NAME RIGHT...                      a new token and its auth-file line (RIGHT: prefix=P, admin, from=CIDR, cert)

Every command takes --uri (default $MLOCK_URI, else mlock://127.0.0.1:12340).
"mlock COMMAND --help" lists a command's flags.
`)
}

func uriFlag(fs *flag.FlagSet) *string {
	def := os.Getenv("MLOCK_URI")
	if def == "" {
		def = defaultURI
	}
	return fs.String("uri", def, "server or provider URL (mlock://, redis://, memory:)")
}

func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("mlock "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// parse parses flags that may come before or after the positional
// arguments, up to a "--".
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if len(args) > 0 && args[0] == "--" {
			return append(pos, args...), nil
		}
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

func client(uri string) (*mlock.Client, error) {
	o, err := mlock.ParseURI(uri)
	if err != nil {
		return nil, err
	}
	o.DialTimeout = 3 * time.Second
	return mlock.NewClient(o)
}

func timeoutCtx() (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	return ctx, func() { cancel(); stop() }
}

func fail(stderr io.Writer, err error) int {
	fmt.Fprintln(stderr, "mlock:", err)
	return exitError
}

// withClient parses an inspection command's flags (define the others on fs
// first), connects to --uri and runs do with a 10 s context.
func withClient(fs *flag.FlagSet, args []string, stderr io.Writer,
	do func(ctx context.Context, c *mlock.Client, uri string, pos []string) error) int {
	uri := uriFlag(fs)
	pos, err := parse(fs, args)
	if err != nil {
		return exitError
	}
	c, err := client(*uri)
	if err != nil {
		return fail(stderr, err)
	}
	defer c.Close()
	ctx, cancel := timeoutCtx()
	defer cancel()
	if err := do(ctx, c, *uri, pos); err != nil {
		return fail(stderr, err)
	}
	return exitOK
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func cmdPing(args []string, stdout, stderr io.Writer) int {
	return withClient(newFlagSet("ping", stderr), args, stderr, func(ctx context.Context, c *mlock.Client, uri string, _ []string) error {
		start := time.Now()
		if err := c.Ping(ctx); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "pong from %s in %v\n", uri, time.Since(start).Round(time.Microsecond))
		return nil
	})
}

func cmdStatus(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("status", stderr)
	asJSON := fs.Bool("json", false, "print the status document as JSON")
	return withClient(fs, args, stderr, func(ctx context.Context, c *mlock.Client, uri string, _ []string) error {
		st, err := c.Status(ctx)
		if err != nil || *asJSON {
			if err == nil {
				err = printJSON(stdout, st)
			}
			return err
		}
		w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintf(w, "server\t%s (mlockd %s)\n", uri, st.Version)
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
		fmt.Fprintf(w, "cpu time\t%v\n", time.Duration(st.CPUTimeMs*float64(time.Millisecond)).Round(time.Millisecond))
		if st.Reads > 0 {
			fmt.Fprintf(w, "batching\t%.1f frames per read (%d reads, %d writes)\n", float64(st.FramesIn)/float64(st.Reads), st.Reads, st.Writes)
		}
		return w.Flush()
	})
}

func cmdLocks(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("locks", stderr)
	asJSON := fs.Bool("json", false, "print the listing as JSON")
	return withClient(fs, args, stderr, func(ctx context.Context, c *mlock.Client, _ string, pos []string) error {
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
		fmt.Fprintln(w, "RESOURCE\tPOS\tSTATE\tOWNER\tLOCK\tSESSION\tTOKEN\tAGE\tLEFT")
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
				fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%v\t%s\n", q.Resource, e.Position, e.State, owner, e.Lock, e.Session,
					token, time.Duration(e.AgeMs)*time.Millisecond, left)
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

func cmdEvict(args []string, stdout, stderr io.Writer) int {
	return withClient(newFlagSet("evict", stderr), args, stderr, func(ctx context.Context, c *mlock.Client, _ string, pos []string) error {
		if len(pos) != 1 {
			return errors.New("evict takes one argument: RESOURCES (\"a|b\")")
		}
		n, err := c.Evict(ctx, pos[0])
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%d lock(s) released; their holders were told\n", n)
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
