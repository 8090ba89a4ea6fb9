package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/locking"
	_ "github.com/mlock-dev/mlock/locking/mlockd" // mlock:// for locking.Open
	_ "github.com/mlock-dev/mlock/locking/redis"  // redis:// for locking.Open
)

// exitCode carries the command's exit status out of the job.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// lostError marks a command stopped because the lock was lost.
var errLostLock = errors.New("the lock was lost; the command was stopped")

func cmdRun(args []string, stderr io.Writer) int {
	fs := newFlagSet("run", stderr)
	uri := uriFlag(fs)
	ttl := fs.Duration("ttl", 60*time.Second, "lease, renewed every ttl/3 while the command runs")
	timeout := fs.Duration("timeout", 0, "longest wait for the lock (0: no limit)")
	tolerate := fs.Int("tolerate", 0, "mlock:// only: give up at once if a queue already holds more than N entries (0: no limit)")
	skip := fs.Bool("skip-if-locked", false, "exit 0 without running the command if the lock is taken (cron de-duplication)")
	killAfter := fs.Duration("kill-after", 10*time.Second, "after a lost lock, SIGKILL the command this long after SIGTERM")
	owner := fs.String("owner", "", "owner id of the lock (default: host:pid)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: mlock run [flags] RESOURCES -- CMD [ARGS...]\n\n"+
			"Runs CMD while holding every resource of RESOURCES (\"a|b\"), renewing the lease, forwarding signals.\n"+
			"Exit status: the command's; 0 with --skip-if-locked when the lock is taken; %d when the lock was lost\n"+
			"(the command is stopped); %d when the lock was not taken in time; %d on mlock's own errors.\n\n",
			exitLost, exitNotTaken, exitError)
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
	job := func(ctx context.Context) error {
		close(waiting)
		return runCommand(ctx, command, sigc, *killAfter, stderr)
	}

	u, err := url.Parse(*uri)
	if err != nil {
		return fail(stderr, err)
	}
	if u.Scheme == "mlock" {
		err = runMlock(ctx, *uri, resources, *ttl, *timeout, *tolerate, *skip, *owner, job)
	} else {
		if *tolerate != 0 {
			return fail(stderr, errors.New("--tolerate needs an mlock:// server"))
		}
		err = runProvider(ctx, *uri, resources, *ttl, *timeout, *skip, *owner, job)
	}
	return exitStatus(err, resources, stderr)
}

func runMlock(ctx context.Context, uri, resources string, ttl, timeout time.Duration, tolerate int, skip bool, owner string, job func(context.Context) error) error {
	c, err := client(uri)
	if err != nil {
		return err
	}
	defer c.Close()
	if timeout <= 0 {
		timeout = -1 // no limit
	}
	o := &mlock.LockOptions{TTL: ttl, Timeout: timeout, Tolerate: tolerate, Owner: owner}
	var l *mlock.Lock
	if skip {
		l, err = c.TryLock(ctx, resources, o)
	} else {
		l, err = c.Lock(ctx, resources, o)
	}
	if err != nil {
		return err
	}
	return c.Hold(ctx, l, job)
}

func runProvider(ctx context.Context, uri, resources string, ttl, timeout time.Duration, skip bool, owner string, job func(context.Context) error) error {
	p, err := locking.Open(ctx, uri)
	if err != nil {
		return err
	}
	defer p.Close()
	if timeout <= 0 {
		timeout = -1
	}
	return locking.Execute(ctx, p, strings.Split(resources, "|"), job, locking.ExecuteOptions{
		Timeout: timeout, Expire: ttl, OwnerID: owner, NoWait: skip,
	})
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
func runCommand(ctx context.Context, command []string, sigc chan os.Signal, killAfter time.Duration, stderr io.Writer) error {
	cmd := exec.Command(command[0], command[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var kill <-chan time.Time
	lost := false
	for {
		select {
		case err := <-done:
			if lost {
				return errors.Join(errLostLock, context.Cause(ctx))
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
			_ = cmd.Process.Signal(sig)
		case <-ctx.Done():
			if !lost {
				lost = true
				fmt.Fprintln(stderr, "mlock run: the lock was lost; stopping the command")
				_ = cmd.Process.Signal(syscall.SIGTERM)
				kill = time.After(killAfter)
			}
			ctx = context.WithoutCancel(ctx) // stop selecting on it
		case <-kill:
			_ = cmd.Process.Kill()
		}
	}
}
