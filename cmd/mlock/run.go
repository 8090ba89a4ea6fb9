package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/internal/lease"
	"github.com/mlock-dev/mlock/locking"
	_ "github.com/mlock-dev/mlock/locking/mlockd" // mlock:// for locking.Open
	_ "github.com/mlock-dev/mlock/locking/redis"  // redis:// for locking.Open
)

// exitCode carries the command's exit status out of the job.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// errLostLock marks a command stopped because the lock was lost; the
// error that wraps it names the loss too.
var errLostLock = errors.New("the lock was lost; the command was stopped")

// killMargin is how long before the believed end of the lease the command
// must be dead: the watchdog declares the loss kill-after + killMargin early,
// SIGTERM then, SIGKILL kill-after later.
const killMargin = 100 * time.Millisecond

// defaultKillAfter is --kill-after when not given (at most ttl/4).
const defaultKillAfter = 10 * time.Second

// Environment of the command.
const (
	envToken     = "MLOCK_TOKEN"      // the fencing token (0 for a provider without tokens)
	envResources = "MLOCK_RESOURCES"  // the resources, '|'-joined, as given
	envExpiresAt = "MLOCK_EXPIRES_AT" // Unix ms of the lease's end as the provider reported it, if known
)

func cmdRun(args []string, stderr io.Writer) int {
	fs := newFlagSet("run", stderr)
	uri := uriFlag(fs)
	ttl := fs.Duration("ttl", 60*time.Second, "lease, renewed every ttl/3 while the command runs")
	timeout := fs.Duration("timeout", 0, "longest wait for the lock (0: no limit)")
	tolerate := fs.Int("tolerate", 0, "mlock:// only: give up at once if a queue already holds more than N entries (0: no limit)")
	skip := fs.Bool("skip-if-locked", false, "exit 0 without running the command if the lock is taken (cron de-duplication)")
	killAfter := fs.Duration("kill-after", defaultKillAfter, "after a lost lock, SIGKILL the command this long after SIGTERM;\n"+
		"at most ttl/4 (default: 10s or ttl/4, whichever is shorter); with mlock://, kill-after + 200ms\n"+
		"must also be below the server's session grace less 1 % (15s by default)")
	owner := fs.String("owner", "", "owner id of the lock (default: host:pid)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: mlock run [flags] RESOURCES -- CMD [ARGS...]\n\n"+
			"Runs CMD while holding every resource of RESOURCES (\"a|b\"), renewing the lease, forwarding signals.\n"+
			"CMD gets %s (the fencing token: pass it to what the lock protects), %s (the resources)\n"+
			"and, when the provider reports it, %s (the lease's end, Unix ms, on the provider's clock).\n"+
			"If the lock may be lost, CMD gets SIGTERM, then SIGKILL kill-after later, early enough to be dead\n"+
			"(kill-after + 100ms before the lease may end) before anyone else can be granted the lock.\n"+
			"Exit status: the command's; 0 with --skip-if-locked when the lock is taken; %d when the lock was lost\n"+
			"(the command is stopped); %d when the lock was not taken in time; %d on mlock's own errors.\n\n",
			envToken, envResources, envExpiresAt, exitLost, exitNotTaken, exitError)
		fs.PrintDefaults()
	}
	pos, err := parse(fs, args)
	if err != nil {
		return exitError
	}
	resources, command, err := splitCommand(pos)
	if err != nil {
		fmt.Fprintln(stderr, "mlock run:", err)
		fs.Usage()
		return exitError
	}
	if *ttl < time.Millisecond {
		return fail(stderr, errors.New("--ttl must be at least 1ms"))
	}
	killSet := false
	fs.Visit(func(f *flag.Flag) { killSet = killSet || f.Name == "kill-after" })
	lead, err := leadOf(*ttl, killAfter, killSet)
	if err != nil {
		fmt.Fprintln(stderr, "mlock run:", err)
		return exitError
	}
	if *owner == "" {
		host, _ := os.Hostname()
		*owner = fmt.Sprintf("%s:%d", host, os.Getpid())
	}
	sigc := make(chan os.Signal, 8)
	signal.Notify(sigc, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2)
	defer signal.Stop(sigc)
	// Until the command starts, SIGINT and SIGTERM abandon the wait.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	waiting := make(chan struct{})
	go func() {
		select {
		case <-sigc:
			cancel()
		case <-waiting:
		}
	}()
	job := func(ctx context.Context, g grant) error {
		close(waiting)
		return runCommand(ctx, command, commandEnv(os.Environ(), resources, g), sigc, *killAfter, stderr)
	}

	u, err := url.Parse(*uri)
	if err != nil {
		return fail(stderr, err)
	}
	r := runner{resources: resources, ttl: *ttl, lead: lead, timeout: *timeout, skip: *skip, owner: *owner, job: job}
	if u.Scheme == "mlock" || u.Scheme == "mlocks" {
		err = r.mlock(ctx, *uri, *tolerate)
	} else {
		if *tolerate != 0 {
			return fail(stderr, errors.New("--tolerate needs an mlock:// server"))
		}
		err = r.provider(ctx, *uri)
	}
	return exitStatus(err, resources, stderr)
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
	skip      bool
	owner     string
	job       func(context.Context, grant) error
}

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
	o := &mlock.LockOptions{TTL: r.ttl, Timeout: -1, Tolerate: tolerate, Owner: r.owner, Lead: r.lead}
	if r.skip {
		return c.TryLock(ctx, r.resources, o)
	}
	var end time.Time
	if r.timeout > 0 {
		end = time.Now().Add(r.timeout)
	}
	if err := c.Ping(ctx); err != nil {
		return nil, err // never reached: a usage or network problem, not a restart
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
				return nil, &mlock.Error{Type: mlock.TypeTimeout, Msg: "the wait ran out while the server could not be reached", Err: err}
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
// lock's Deadline, and unlocks l when the job returns. A lead that leaves
// no time under the server's session grace is refused before the job
// starts (checkGrace).
func (r *runner) hold(ctx context.Context, c *mlock.Client, l *mlock.Lock) error {
	if err := r.checkGrace(ctx, c, l); err != nil {
		uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), c.Options().DialTimeout)
		_ = l.Unlock(uctx)
		ucancel()
		return err
	}
	var jobErr error
	err := c.Hold(ctx, l, func(ctx context.Context) error {
		jobErr = r.job(ctx, grant{token: l.Token(), expiresAt: l.ExpiresAt()})
		return jobErr
	})
	if errors.Is(err, mlock.ErrLost) && errors.Is(jobErr, errLostLock) {
		return jobErr // the command was stopped for the loss, which it names
	}
	return err
}

// minLeft is the least time the lock must be believed held, after an
// answer from the server, beyond the lead: below it the lead (kill-after)
// eats the whole of the server's session grace.
const minLeft = killMargin

// checkGrace makes sure that the lead leaves time under the lock before
// the command starts. The lock's Deadline is at most the server's session
// grace (less its drift margin) after the last answer on the session, so a
// lock granted after a wait may come with a Deadline close at hand: a ping
// first moves it to a full grace from now (an error is left to the
// watchdog). Then the Deadline tells the grace, which the client does not
// report, and a lead that leaves less than minLeft of it is refused
// (--kill-after is too long for the server's grace). The watchdog renews
// every third of the time left before the Deadline less the lead, so any
// lead that passes keeps the lock.
func (r *runner) checkGrace(ctx context.Context, c *mlock.Client, l *mlock.Lock) error {
	if err := c.Ping(ctx); err != nil {
		return nil
	}
	d := l.Deadline()
	if d.IsZero() {
		return nil // lost already: the watchdog reports it
	}
	if left := time.Until(d); left-r.lead < minLeft {
		return fmt.Errorf("--kill-after %v is too long for the server's session grace: the lock is believed held "+
			"only %v after an answer from the server, which must exceed kill-after + %v by at least %v; "+
			"use a shorter --kill-after", r.lead-killMargin, left.Round(time.Millisecond), killMargin, minLeft)
	}
	return nil
}

// provider runs the job through locking.Execute on the provider of uri.
func (r *runner) provider(ctx context.Context, uri string) error {
	p, err := locking.Open(ctx, uri)
	if err != nil {
		return err
	}
	defer p.Close()
	timeout := r.timeout
	if timeout <= 0 {
		timeout = -1
	}
	return locking.ExecuteLease(ctx, p, strings.Split(r.resources, "|"), func(ctx context.Context, l locking.Lease) error {
		return r.job(ctx, grant{token: l.Token, expiresAt: l.ExpiresAt})
	}, locking.ExecuteOptions{Timeout: timeout, Expire: r.ttl, Lead: r.lead, OwnerID: r.owner, NoWait: r.skip})
}

// exitStatus maps the outcome to the process exit status.
func exitStatus(err error, resources string, stderr io.Writer) int {
	var code exitCode
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &code) && !errors.Is(err, errLostLock) && !errors.Is(err, mlock.ErrLost) && !errors.Is(err, locking.ErrLost):
		return int(code)
	case errors.Is(err, errLostLock), errors.Is(err, mlock.ErrLost), errors.Is(err, locking.ErrLost):
		fmt.Fprintln(stderr, "mlock run: lock lost:", err)
		return exitLost
	case errors.Is(err, mlock.ErrBusy), errors.Is(err, locking.ErrConflict):
		fmt.Fprintf(stderr, "mlock run: %s is locked: not running the command\n", resources)
		return exitOK // --skip-if-locked
	case errors.Is(err, mlock.ErrTolerate), errors.Is(err, mlock.ErrTimeout), errors.Is(err, locking.ErrTimeout),
		errors.Is(err, context.Canceled):
		fmt.Fprintln(stderr, "mlock run: lock not taken:", err)
		return exitNotTaken
	}
	return fail(stderr, err)
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
	if group {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	}
	if err := cmd.Start(); err != nil {
		return err
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
				return fmt.Errorf("%w: %w", errLostLock, context.Cause(ctx))
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
			send(sig)
		case <-ended:
			ended = nil
			lost = true
			fmt.Fprintln(stderr, "mlock run: the lock was lost; stopping the command:", context.Cause(ctx))
			send(syscall.SIGTERM)
			kill = time.After(killAfter)
		case <-kill:
			send(syscall.SIGKILL)
		}
	}
}
