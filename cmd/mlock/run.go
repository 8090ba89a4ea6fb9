package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/internal/lease"
	"github.com/mlock-dev/mlock/locking"
	"github.com/mlock-dev/mlock/locking/etcd"     // etcd:// for locking.Open
	_ "github.com/mlock-dev/mlock/locking/mlockd" // mlock:// for locking.Open
	"github.com/mlock-dev/mlock/locking/provider"
	_ "github.com/mlock-dev/mlock/locking/redis" // redis:// for locking.Open
)

// exitCode carries the command's exit status out of the job.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// flagError is a flag value that does not fit the server, found once
// connected: a usage error (exit 2), whose text says what to change.
type flagError struct{ msg string }

func (e *flagError) Error() string { return e.msg }

// errLostLock marks a command stopped because the lock was lost; the
// error that wraps it names the loss too.
var errLostLock = errors.New("the lock was lost; the command was stopped")

// killMargin is how long before the believed end of the lease the command
// must be dead: the watchdog declares the loss kill-after + killMargin early,
// SIGTERM then, SIGKILL kill-after later.
const killMargin = 100 * time.Millisecond

// defaultKillAfter is --kill-after when not given: at most ttl/4 and, with
// mlock://, a quarter of the server's session grace (see fitGrace).
const defaultKillAfter = 10 * time.Second

// Environment of the command.
const (
	envToken     = "MLOCK_TOKEN"      // the fencing token (0 for a provider without tokens)
	envResources = "MLOCK_RESOURCES"  // the resources, '|'-joined, as given
	envExpiresAt = "MLOCK_EXPIRES_AT" // Unix ms of the lease's end as the provider reported it, if known
)

func cmdRun(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("run")
	uri := uriFlag(fs, uriProviders)
	ttl := fs.Duration("ttl", 60*time.Second, "lease, renewed every ttl/3 while the command runs")
	timeout := fs.Duration("timeout", 0, "longest wait for the lock (0: no limit)")
	tolerate := fs.Int("tolerate", 0, "mlock:// only: give up at once if a queue already holds more than N entries (0: no limit)")
	skip := fs.Bool("skip-if-locked", false, "if the lock is taken, do not wait and do not run the command: exit --skip-exit\n"+
		"(cron de-duplication)")
	skipExit := fs.Int("skip-exit", 0, "with --skip-if-locked, the exit status when the command was skipped (0-255)")
	quiet := fs.Bool("quiet", false, "print nothing when the command is skipped, nor the progress of the wait;\n"+
		"errors are still printed (for cron, which mails any output)")
	verbose := fs.Bool("verbose", false, "tell on stderr that the run waits, its place in the queues (mlock:// only)\n"+
		"and when it got the lock (default when stderr is a terminal, unless --quiet)")
	killAfter := fs.Duration("kill-after", defaultKillAfter, "after a lost lock, SIGKILL the command this long after SIGTERM;\n"+
		"at most ttl/4, and with mlock:// kill-after + 200ms must be below the server's session grace less\n"+
		"its drift margin (1% + 5ms); when not given: the shortest of 10s, ttl/4 and, with mlock://,\n"+
		"a quarter of the session grace the server announces (15s by default)")
	// The usage says the default, which depends on --ttl and the server: flag's
	// own "(default 10s)" is left out.
	fs.Lookup("kill-after").DefValue = "0s"
	owner := fs.String("owner", "", "owner id of the lock (default: host:pid); give every run its own: an owner's lock is\n"+
		"re-entrant, so a run asking with the owner of a running one is given its lock, even with --skip-if-locked,\n"+
		"and the two commands run at once (the first is stopped on mlock://)")
	shared := fs.Bool("shared", false, "mlock:// only: take the resources shared (a read lock): shared runs go together,\n"+
		"an exclusive one waits for them and blocks later shared ones")
	permits := fs.String("permits", "", "mlock:// only: K/N takes K of the N permits of each resource (a semaphore: at most\n"+
		"N permits held at once; every user of the resource must give the same N)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: mlock run [flags] RESOURCES -- CMD [ARGS...]\n\n"+
			"Runs CMD while holding every resource of RESOURCES (\"a|b\"), renewing the lease, forwarding signals.\n"+
			"CMD gets %s (the fencing token: pass it to what the lock protects), %s (the resources)\n"+
			"and, when the provider reports it, %s (the lease's end, Unix ms, on the provider's clock).\n"+
			"If the lock may be lost, CMD gets SIGTERM, then SIGKILL kill-after later, early enough to be dead\n"+
			"(kill-after + 100ms before the lease may end) before anyone else can be granted the lock.\n\n"+
			"Exit status: the command's; --skip-exit (default 0) when --skip-if-locked skipped it;\n"+
			"%d the lock was lost (the command was stopped; stderr names the cause: expired, released by its\n"+
			"owner, the session lost, the server shutting down; a lock found expired only after the command\n"+
			"exited 0 in time is no loss: a note says so); %d the lock was not taken in time (--timeout,\n"+
			"--tolerate, or interrupted while waiting); %d mlock's own error (server unreachable, refused);\n"+
			"%d a usage error (a --kill-after that does not fit the server's grace among them); %d the command\n"+
			"cannot be executed; %d the command was not found.\n\n"+
			"For cron: mlock run --skip-if-locked --quiet --ttl 2m report:nightly -- ./nightly-report.sh\n\n",
			envToken, envResources, envExpiresAt, exitLost, exitNotTaken, exitError, exitUsage, exitNotExecutable, exitNotFound)
		fs.PrintDefaults()
	}
	p := parse(fs, args, stdout, stderr)
	if p.done {
		return p.exit
	}
	resources, command, err := splitCommand(p.pos)
	if err != nil {
		return usageError(fs, stderr, err.Error())
	}
	if _, err := provider.Keys(strings.Split(resources, "|")); err != nil {
		return usageError(fs, stderr, "RESOURCES: "+strings.TrimPrefix(err.Error(), "invalid key "))
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	switch {
	case *ttl < time.Millisecond:
		return usageError(fs, stderr, "--ttl must be at least 1ms")
	case *timeout < 0:
		return usageError(fs, stderr, "--timeout must not be negative (0: no limit)")
	case *skipExit < 0 || *skipExit > 255:
		return usageError(fs, stderr, fmt.Sprintf("--skip-exit %d: want 0 to 255", *skipExit))
	case given["skip-exit"] && !*skip:
		return usageError(fs, stderr, "--skip-exit needs --skip-if-locked")
	case *quiet && *verbose:
		return usageError(fs, stderr, "--quiet and --verbose exclude each other")
	case strings.ContainsAny(*owner, " |"):
		return usageError(fs, stderr, fmt.Sprintf("--owner %q: no spaces, no '|'", *owner))
	}
	lead, err := leadOf(*ttl, killAfter, given["kill-after"])
	if err != nil {
		return usageError(fs, stderr, err.Error())
	}
	// The command must exist and be executable before the lock is taken.
	if code, err := lookCommand(command[0]); err != nil {
		fmt.Fprintf(stderr, "%s: %s\n", fs.Name(), err)
		return code
	}
	if *owner == "" {
		host, _ := os.Hostname()
		*owner = fmt.Sprintf("%s:%d", host, os.Getpid())
	}
	u, err := url.Parse(*uri)
	if err != nil {
		return usageError(fs, stderr, fmt.Sprintf("--uri: %v", hideURI(err)))
	}
	isMlock := u.Scheme == "mlock" || u.Scheme == "mlocks"
	if *tolerate != 0 && !isMlock {
		return usageError(fs, stderr, "--tolerate needs an mlock:// server")
	}
	mode, err := modeFlags(*shared, *permits, isMlock)
	if err != nil {
		return usageError(fs, stderr, err.Error())
	}
	out := &progress{w: stderr, on: *verbose, resources: resources, start: time.Now()}
	if f, ok := stderr.(*os.File); ok && !*quiet && isTerminal(f) {
		out.on = true
	}
	sigc := make(chan os.Signal, 8)
	signal.Notify(sigc, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2)
	defer signal.Stop(sigc)
	// Until the command starts, a signal abandons the wait.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	waiting, handed := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(handed)
		select {
		case sig := <-sigc:
			select {
			case <-waiting:
				// The command is about to start: the signal is its own
				// (runCommand forwards it).
				select {
				case sigc <- sig:
				default:
				}
			default:
				cancel()
			}
		case <-waiting:
		}
	}()
	job := func(jctx context.Context, g grant) error {
		close(waiting)
		<-handed // from here on signals are the command's
		if ctx.Err() != nil {
			return ctx.Err() // interrupted as the lock came: the command is not run
		}
		out.got(g)
		return runCommand(jctx, command, commandEnv(os.Environ(), resources, g), sigc, *killAfter, stderr)
	}

	r := runner{resources: resources, ttl: *ttl, lead: lead, timeout: *timeout, skip: *skip, owner: *owner, mode: mode,
		job: job, progress: out, killAfter: killAfter, killGiven: given["kill-after"], quiet: *quiet}
	if isMlock {
		err = r.mlock(ctx, *uri, *tolerate)
	} else {
		err = r.provider(ctx, *uri)
	}
	return exitStatus(err, exitOptions{resources: resources, quiet: *quiet, skipExit: *skipExit}, stderr)
}

// lookCommand looks for the command as exec does, before the lock is
// taken: an error says why it cannot be run, with the exit status (127 not
// found, 126 found but not executable).
func lookCommand(name string) (int, error) {
	_, err := exec.LookPath(name)
	switch {
	case err == nil:
		return 0, nil
	case errors.Is(err, exec.ErrDot):
		return exitNotExecutable, fmt.Errorf("%s: refusing to run a command found through a relative PATH entry; use ./%s", name, name)
	case errors.Is(err, exec.ErrNotFound), errors.Is(err, fs.ErrNotExist):
		return exitNotFound, fmt.Errorf("%s: command not found", name)
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EISDIR):
		return exitNotExecutable, fmt.Errorf("%s: not executable", name)
	}
	return exitNotExecutable, fmt.Errorf("%s: %v", name, err)
}

// leadOf checks --kill-after against --ttl and returns the watchdog's lead:
// kill-after + killMargin. A kill-after not given is clamped to ttl/4; one
// given above ttl/4, or a ttl too short for the lead, is refused. The
// server's session grace is checked once the lock is taken (checkGrace):
// the client learns it only from the server.
func leadOf(ttl time.Duration, killAfter *time.Duration, given bool) (time.Duration, error) {
	switch {
	case *killAfter < 0:
		return 0, errors.New("--kill-after must not be negative")
	case *killAfter > ttl/4 && given:
		return 0, fmt.Errorf("--kill-after %v is not well below --ttl %v: it must be at most ttl/4 (%v), "+
			"so that the command is dead before the lock can be given to anyone else", *killAfter, ttl, ttl/4)
	case *killAfter > ttl/4:
		*killAfter = ttl / 4
	}
	lead := *killAfter + killMargin
	if err := (&lease.Options{TTL: ttl, Lead: lead}).Check(); err != nil {
		return 0, fmt.Errorf("--ttl %v is too short to stop the command in time (kill-after %v + %v before the lease ends): "+
			"use a longer --ttl", ttl, *killAfter, killMargin)
	}
	return lead, nil
}

// grant is what the command is told about its lock.
type grant struct {
	token     uint64
	expiresAt time.Time // zero: unknown
}

// commandEnv is env without inherited MLOCK_TOKEN, MLOCK_RESOURCES and
// MLOCK_EXPIRES_AT, plus this lock's. The lock id, a secret, is never
// passed.
func commandEnv(env []string, resources string, g grant) []string {
	out := make([]string, 0, len(env)+3)
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if name != envToken && name != envResources && name != envExpiresAt {
			out = append(out, kv)
		}
	}
	out = append(out, envToken+"="+strconv.FormatUint(g.token, 10), envResources+"="+resources)
	if !g.expiresAt.IsZero() {
		out = append(out, envExpiresAt+"="+strconv.FormatInt(g.expiresAt.UnixMilli(), 10))
	}
	return out
}

// runner takes the lock and runs the job under it.
type runner struct {
	resources string
	ttl, lead time.Duration
	timeout   time.Duration // 0: no limit
	begin     time.Time     // when the wait that timeout bounds began (the run's first connection)
	skip      bool
	owner     string
	mode      mlock.Mode // mlock:// only
	job       func(context.Context, grant) error
	progress  *progress
	// killAfter is --kill-after (the job reads it when it starts), fitted
	// to the server's session grace (fitGrace) unless killGiven.
	killAfter *time.Duration
	killGiven bool
	quiet     bool // --quiet: no note of a lock that expired after the command ended
}

// errWaitRanOut is the cause of a wait for the server cut by --timeout.
var errWaitRanOut = errors.New("the wait ran out")

// causeError is an error told in msg alone, its cause err (which errors.Is
// and errors.As see, for the exit status) left out of the text: the cause
// would say again, in the client's words, what msg says.
type causeError struct {
	msg string
	err error
}

func (e *causeError) Error() string { return e.msg }
func (e *causeError) Unwrap() error { return e.err }

// retryPause is the pause between two tries of a wait cut by a lost
// session or connection.
const retryPause = 250 * time.Millisecond

// mlock runs the job over the Go client: the lock (with the lead), then
// the client's Hold, which runs the one lease watchdog.
func (r *runner) mlock(ctx context.Context, uri string, tolerate int) error {
	c, err := client(uri)
	if err != nil {
		return err
	}
	defer c.Close()
	// --timeout counts from here: the wait for a connection is part of it.
	if r.timeout > 0 && r.begin.IsZero() {
		r.begin = time.Now()
	}
	// A server never reached is a usage or network problem, not a restart:
	// fail at once (a refused connection without waiting for the dial
	// timeout, see failFast).
	pctx, settle := failFast(ctx, c.Addrs(), c.Options().DialTimeout)
	if r.timeout > 0 && !r.skip {
		// A server that does not answer (a cluster node without a leader)
		// is waited for no longer than --timeout: the lock was not taken
		// in time (exit 124).
		var cancel context.CancelFunc
		pctx, cancel = context.WithTimeoutCause(pctx, r.timeout, errWaitRanOut)
		defer cancel()
	}
	err = c.Ping(pctx)
	settle(err)
	if err != nil {
		if errors.Is(context.Cause(pctx), errWaitRanOut) {
			return &causeError{err: err,
				msg: fmt.Sprintf("no answer from %s within --timeout %v: the lock was not asked for", strings.Join(c.Addrs(), ", "), r.timeout)}
		}
		return explain(pctx, err, c.Addrs(), c.Options().DialTimeout)
	}
	if grace, ok := c.SessionGrace(); ok {
		if err := r.fitGrace(grace); err != nil {
			return err
		}
	}
	l, err := r.lockMlock(ctx, c, tolerate)
	if err != nil {
		return err
	}
	return r.hold(ctx, c, l)
}

// lockMlock takes the lock. A wait cut by a lost session (the server
// restarted) or a broken connection, once the server was reached, is asked
// again until the timeout: the wait held nothing, so asking again is safe.
func (r *runner) lockMlock(ctx context.Context, c *mlock.Client, tolerate int) (*mlock.Lock, error) {
	o := &mlock.LockOptions{TTL: r.ttl, Timeout: -1, Tolerate: tolerate, Owner: r.owner, Lead: r.lead, Mode: r.mode}
	if r.skip {
		return c.TryLock(ctx, r.resources, o)
	}
	var end time.Time
	if r.timeout > 0 {
		begin := r.begin
		if begin.IsZero() {
			begin = time.Now()
		}
		end = begin.Add(r.timeout)
	}
	if r.progress.on {
		wctx, stop := context.WithCancel(ctx)
		defer stop()
		go r.progress.watch(wctx, c, r.owner)
	}
	for {
		if !end.IsZero() {
			o.Timeout = max(time.Until(end).Round(time.Millisecond), time.Millisecond)
		}
		l, err := c.Lock(ctx, r.resources, o)
		if err == nil || !retryable(err) || ctx.Err() != nil {
			return l, err
		}
		pause := retryPause
		if !end.IsZero() {
			left := time.Until(end)
			if left <= 0 {
				return nil, &causeError{err: &mlock.Error{Type: mlock.TypeTimeout, Err: err},
					msg: fmt.Sprintf("--timeout %v ran out while the server could not be reached (%s)", r.timeout, describe(err))}
			}
			pause = min(pause, left)
		}
		select {
		case <-time.After(pause):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// retryable says whether a failed wait may be asked again: its session was
// lost or its connection broke (not the client closed).
func retryable(err error) bool {
	return errors.Is(err, mlock.ErrSessionLost) ||
		(errors.Is(err, mlock.ErrConnection) && !errors.Is(err, mlock.ErrClosed))
}

// hold runs the job while holding l, with the client's Hold: it extends l
// every ttl/3 (more often while the client's Deadline for the lock, which
// also counts the end of its session, is the nearer end: see
// internal/lease), declares the loss r.lead (LockOptions.Lead) before the
// lock's Deadline, and unlocks l when the job returns. The lock is made
// ready first (see ready).
func (r *runner) hold(ctx context.Context, c *mlock.Client, l *mlock.Lock) error {
	if err := r.ready(ctx, c, l); err != nil {
		uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), c.Options().DialTimeout)
		_ = l.Unlock(uctx)
		ucancel()
		return err
	}
	var jobErr error
	heldAtEnd := false // the lock still believed held when the command had ended
	err := c.Hold(ctx, l, func(ctx context.Context) error {
		jobErr = r.job(ctx, grant{token: l.Token(), expiresAt: l.ExpiresAt()})
		heldAtEnd = time.Now().Before(l.Deadline())
		return jobErr
	})
	if errors.Is(err, mlock.ErrLost) && errors.Is(jobErr, errLostLock) {
		return jobErr // the command was stopped for the loss, which it names
	}
	if expiredAfterTheCommand(err, jobErr, heldAtEnd) && !lostOtherwise(l.Err()) {
		if !r.quiet {
			fmt.Fprintf(r.progress.w, "mlock run: the lock was found expired after the command ended (%s): "+
				"the command ran whole under it\n", lossText(err))
		}
		return nil
	}
	return err
}

// lostOtherwise reports whether the lock's own record of its loss (lockErr,
// Lock.Err) says something else ended it than its lease: a release, an
// eviction, the session lost.
func lostOtherwise(lockErr error) bool {
	return lockErr != nil && (!errors.Is(lockErr, mlock.ErrExpired) || errors.Is(lockErr, mlock.ErrReleased))
}

// expiredAfterTheCommand says whether err, Hold's, is only the lease found
// expired after the command had ended: the command exited 0 (jobErr nil:
// not stopped for a loss) while the lock was still believed held
// (heldAtEnd), and the loss is an expiry, which the server declares only
// after the end the client believes (it counts from the send time of its
// requests, with the drift margin), never a release, an eviction or a
// server's shutdown, which may come at any time. This is the unlock sent
// as the command ended and answered after the lease ran out (a slow
// answer, a cluster's failover: seconds), or the watchdog's end coming
// between the command's exit and Hold's return. The command then ran whole
// under the lock: its status is the run's, not exitLost (75).
func expiredAfterTheCommand(err, jobErr error, heldAtEnd bool) bool {
	if err == nil || jobErr != nil || !heldAtEnd || !errors.Is(err, mlock.ErrLost) ||
		!errors.Is(err, mlock.ErrExpired) || errors.Is(err, mlock.ErrReleased) {
		return false
	}
	// A server that does not tell a release from an expiry (1.0) says
	// "released" in the expiry's text: it may have been a release.
	var e *mlock.Error
	return !errors.As(err, &e) || !strings.Contains(e.Msg, "released")
}

// minLeft is the least time the lock must be believed held, after an
// answer from the server, beyond the lead (kill-after + killMargin), for
// the command to be started.
const minLeft = killMargin

// fitGrace fits --kill-after to the server's session grace: a lock is
// believed held at most grace less its drift margin (1 % + 5 ms) after an
// answer from the server, and the command must be dead killMargin before
// that, with minLeft to spare. Not given, kill-after is at most a quarter
// of the grace (as it is at most a quarter of the ttl); given, one that
// does not fit is refused, with the value that would.
func (r *runner) fitGrace(grace time.Duration) error {
	believed := grace - lease.Margin(grace)
	limit := believed - killMargin - minLeft // kill-after must be below it
	switch {
	case believed <= 0:
		return fmt.Errorf("the server's session grace %v is too short for mlock run: a lock is not believed held "+
			"at all after an answer from the server (the grace less its drift margin, 1%% + 5ms, is not above 0), "+
			"and kill-after + %v must be below that; give the server a longer --session-grace",
			grace, killMargin+minLeft)
	case limit <= 0:
		return fmt.Errorf("the server's session grace %v is too short for mlock run: a lock is believed held at most %v "+
			"after an answer from the server, and kill-after + %v must be below that; give the server a longer "+
			"--session-grace", grace, believed.Round(time.Millisecond), killMargin+minLeft)
	}
	if !r.killGiven {
		*r.killAfter = min(*r.killAfter, grace/4, limit-time.Millisecond)
		r.lead = *r.killAfter + killMargin
		return nil
	}
	if *r.killAfter >= limit {
		return &flagError{fmt.Sprintf("--kill-after %v is too long for the server's session grace %v: kill-after + %v must be "+
			"below the grace less its drift margin (1%% + 5ms), %v; use --kill-after %v or less",
			*r.killAfter, grace, killMargin+minLeft, believed.Round(time.Millisecond),
			(limit - time.Millisecond).Truncate(time.Millisecond))}
	}
	return nil
}

// ready makes sure that, when the command starts, the lock is believed
// held for more than the lead plus minLeft. The client hands over a grant
// with at least two thirds of its ttl to believe, whatever the wait, which
// is enough for any kill-after that --ttl and the grace allow; if less is
// left (a slow answer), one extend renews the lease from now. A lock still
// too short then cannot be run under: the error names the number to change.
func (r *runner) ready(ctx context.Context, c *mlock.Client, l *mlock.Lock) error {
	enough := func() (time.Duration, bool) {
		d := l.Deadline()
		left := time.Until(d)
		return left, !d.IsZero() && left-r.lead >= minLeft
	}
	if _, ok := enough(); ok {
		return nil
	}
	if _, err := l.Extend(ctx, 0); err != nil {
		if errors.Is(err, mlock.ErrLost) {
			return err
		}
		return nil // left to the watchdog, which renews at once
	}
	left, ok := enough()
	if ok {
		return nil
	}
	return fmt.Errorf("the lock is believed held only %v after an extend, which must exceed kill-after %v + %v by "+
		"at least %v: the network is too slow for --ttl %v; use a longer --ttl or a shorter --kill-after",
		left.Round(time.Millisecond), r.lead-killMargin, killMargin, minLeft, r.ttl)
}

// provider runs the job through locking.Execute on the provider of uri.
func (r *runner) provider(ctx context.Context, uri string) error {
	p, err := locking.Open(ctx, uri)
	if err != nil {
		return err
	}
	defer p.Close()
	// A server that refuses the connection is unreachable (exit 125), not a
	// lock held for longer than --timeout: say so at once.
	if refused := probeRefused(ctx, providerAddrs(uri), probeTimeout); refused != nil {
		return refused
	}
	timeout := r.timeout
	if timeout <= 0 {
		timeout = -1
	}
	if r.progress.on && !r.skip {
		wctx, stop := context.WithCancel(ctx)
		defer stop()
		go r.progress.watch(wctx, nil, r.owner)
	}
	var jobErr error
	err = locking.ExecuteLease(ctx, p, strings.Split(r.resources, "|"), func(ctx context.Context, l locking.Lease) error {
		jobErr = r.job(ctx, grant{token: l.Token, expiresAt: l.ExpiresAt})
		return jobErr
	}, locking.ExecuteOptions{Timeout: timeout, Expire: r.ttl, Lead: r.lead, OwnerID: r.owner, NoWait: r.skip})
	if errors.Is(err, locking.ErrLost) && errors.Is(jobErr, errLostLock) {
		return jobErr // the command was stopped for the loss, which it named
	}
	return err
}

// probeTimeout bounds the probe of a provider's addresses (see
// probeRefused): an address that does not answer in time is left to the
// provider.
const probeTimeout = 3 * time.Second

// providerAddrs returns the TCP addresses of a redis:// or etcd:// URI;
// none for other providers.
func providerAddrs(uri string) []string {
	switch {
	case strings.HasPrefix(uri, "redis://"):
		if o, err := goredis.ParseURL(uri); err == nil && o.Network == "tcp" {
			return []string{o.Addr}
		}
	case strings.HasPrefix(uri, "etcd://"):
		if addrs, err := etcd.Endpoints(uri); err == nil {
			return addrs
		}
	}
	return nil
}

// exitOptions are what exitStatus needs of the flags.
type exitOptions struct {
	resources string
	quiet     bool // no word of a skip
	skipExit  int  // the status of a skip
}

// exitStatus maps the outcome to the process exit status, and says on
// stderr, in one line, what went wrong.
func exitStatus(err error, o exitOptions, stderr io.Writer) int {
	var code exitCode
	var lost *lostError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &lost):
		return exitLost // runCommand said so when it stopped the command
	case errors.As(err, new(*flagError)):
		fmt.Fprintln(stderr, "mlock run:", err)
		return exitUsage
	case errors.As(err, &code) && !errors.Is(err, mlock.ErrLost) && !errors.Is(err, locking.ErrLost):
		return int(code)
	case errors.Is(err, mlock.ErrLost), errors.Is(err, locking.ErrLost):
		fmt.Fprintln(stderr, "mlock run: lock lost:", lossText(err))
		return exitLost
	case errors.Is(err, errNotRun):
		fmt.Fprintln(stderr, "mlock run:", err)
		var e *commandError
		if errors.As(err, &e) {
			return e.code
		}
		return exitNotExecutable
	case errors.Is(err, mlock.ErrBusy), errors.Is(err, locking.ErrConflict):
		if !o.quiet {
			fmt.Fprintf(stderr, "mlock run: %s is locked: not running the command\n", o.resources)
		}
		return o.skipExit // --skip-if-locked
	case errors.Is(err, context.Canceled):
		// The run's context ends on SIGINT or SIGTERM only.
		fmt.Fprintln(stderr, "mlock run: lock not taken: interrupted while waiting")
		return exitNotTaken
	case errors.Is(err, mlock.ErrTolerate), errors.Is(err, mlock.ErrTimeout), errors.Is(err, locking.ErrTimeout):
		fmt.Fprintln(stderr, "mlock run: lock not taken:", describe(err))
		return exitNotTaken
	}
	fmt.Fprintln(stderr, "mlock run:", describe(err))
	return exitError
}

// lossText says why a lock was lost, in a few words, then the client's
// detail if it adds any: "released by its owner elsewhere" (Release,
// ReleaseAll, an unlock from another session, or an administrator's
// evict) is told apart from "expired" and from a lost session.
func lossText(err error) string {
	var e *mlock.Error
	detail := ""
	if errors.As(err, &e) {
		detail = e.Msg
	}
	var kind string
	switch {
	case errors.Is(err, mlock.ErrReleased) && detail == "lock evicted by an administrator":
		kind, detail = "evicted by an administrator", ""
	case errors.Is(err, mlock.ErrReleased):
		kind, detail = "released by its owner elsewhere (a release by owner, or an unlock by another holder "+
			"of the same owner, such as a run with the same --owner)", ""
	case errors.Is(err, mlock.ErrExpired) && strings.Contains(detail, "released"):
		// A server that does not tell a release from an expiry (1.0).
		kind, detail = "expired, or released by its owner elsewhere (the server does not say which)", ""
	case errors.Is(err, mlock.ErrExpired):
		kind = "expired"
	case errors.Is(err, mlock.ErrSessionLost) && detail == "server shutting down":
		kind, detail = "the server is shutting down (it ends every lock it holds)", ""
	case errors.Is(err, mlock.ErrSessionLost):
		kind = "the session was lost"
	case errors.Is(err, mlock.ErrClosed):
		kind = "the client was closed"
	default:
		return describe(err)
	}
	switch detail {
	case "", "lock expired", "session lost", "client closed":
		return kind
	}
	return kind + ": " + detail
}

// lostError is the error of a command stopped because the lock was lost;
// it was said on stderr when the command was stopped.
type lostError struct{ cause error }

func (e *lostError) Error() string { return "the lock was lost: " + lossText(e.cause) }
func (e *lostError) Unwrap() []error {
	return []error{errLostLock, e.cause}
}

// errNotRun marks a command that could not be started.
var errNotRun = errors.New("the command could not be run")

// commandError is a command that could not be started, with its exit
// status (126 or 127).
type commandError struct {
	err  error
	code int
}

func (e *commandError) Error() string   { return e.err.Error() }
func (e *commandError) Unwrap() []error { return []error{errNotRun, e.err} }

// startError maps the error of starting the command to its status: 127
// for a command that is not there, 126 for one that cannot be executed.
func startError(name string, err error) error {
	code := exitNotExecutable
	msg := "cannot execute"
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, exec.ErrNotFound) {
		code, msg = exitNotFound, "command not found"
	}
	return &commandError{err: fmt.Errorf("%s: %s: %w", name, msg, err), code: code}
}

// runCommand starts the command, forwards signals to it, and stops it
// (SIGTERM, then SIGKILL after killAfter) if ctx ends because the lock was
// lost.
func runCommand(ctx context.Context, command []string, env []string, sigc chan os.Signal, killAfter time.Duration, stderr io.Writer) error {
	cmd := exec.Command(command[0], command[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr, cmd.Env = os.Stdin, os.Stdout, os.Stderr, env
	// The command gets a process group of its own, so that stopping it after
	// a lost lock stops what it started too (sh -c 'a; b' leaves b running
	// if only sh is killed). Not when stdin is a terminal: a background
	// group reading it would be stopped by the terminal; there the command
	// shares mlock's group and the terminal's signals reach all of it.
	group := !isTerminal(os.Stdin)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: group}
	dieWithParent(cmd.SysProcAttr)
	// The kernel's parent-death signal follows the thread that started the
	// command: keep this goroutine on it until the command is reaped.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if ctx.Err() != nil {
		// Lost before the start (declared lost while mlock run got
		// ready): starting the command only to stop it could cut it in
		// the middle of its work.
		fmt.Fprintf(stderr, "mlock run: lock lost: %s; not running the command\n", lossText(context.Cause(ctx)))
		return &lostError{cause: context.Cause(ctx)}
	}
	if err := cmd.Start(); err != nil {
		return startError(command[0], err)
	}
	send := func(sig os.Signal) {
		if s, ok := sig.(syscall.Signal); ok && group {
			_ = syscall.Kill(-cmd.Process.Pid, s)
			return
		}
		_ = cmd.Process.Signal(sig)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var kill <-chan time.Time
	lost := false
	ended := ctx.Done() // nil once seen: the select stops watching it
	for {
		select {
		case err := <-done:
			if lost {
				send(syscall.SIGKILL) // what the command started may outlive it
				return &lostError{cause: context.Cause(ctx)}
			}
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
					return exitCode(128 + int(ws.Signal()))
				}
				return exitCode(ee.ExitCode())
			}
			return err
		case sig := <-sigc:
			if !group && (sig == syscall.SIGINT || sig == syscall.SIGQUIT) && inForeground(os.Stdin) {
				// The terminal's ^C or ^\: it reached the whole foreground
				// group, the command too; a second one could make it stop
				// abruptly (many programs take it so).
				continue
			}
			send(sig)
		case <-ended:
			ended = nil
			lost = true
			fmt.Fprintf(stderr, "mlock run: lock lost: %s; stopping the command\n", lossText(context.Cause(ctx)))
			send(syscall.SIGTERM)
			kill = time.After(killAfter)
		case <-kill:
			send(syscall.SIGKILL)
		}
	}
}

// modeFlags returns the mode of --shared and --permits K/N.
func modeFlags(shared bool, permits string, isMlock bool) (mlock.Mode, error) {
	switch {
	case (shared || permits != "") && !isMlock:
		return mlock.Exclusive, errors.New("--shared and --permits need an mlock:// server")
	case shared && permits != "":
		return mlock.Exclusive, errors.New("--shared and --permits exclude each other")
	case shared:
		return mlock.Shared, nil
	case permits == "":
		return mlock.Exclusive, nil
	}
	k, n, ok := strings.Cut(permits, "/")
	ki, err1 := strconv.Atoi(k)
	ni, err2 := strconv.Atoi(n)
	if !ok || err1 != nil || err2 != nil || ki < 1 || ki > ni || ni > mlock.MaxPermits {
		return mlock.Exclusive, fmt.Errorf("--permits %q: want K/N with 1 <= K <= N <= %d, such as 1/5", permits, mlock.MaxPermits)
	}
	return mlock.Permits(ki, ni), nil
}
