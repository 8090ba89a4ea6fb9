// Command worker is the client process of the fault tests: it takes a lock,
// appends its critical section to a shared history log, and exits.
//
// Every line it writes is one whole O_APPEND write:
//
//	start <resource> <token> <unix ns> <worker id>
//	beat  <resource> <token> <unix ns> <worker id>
//	end   <resource> <token> <unix ns> <worker id> ok|lost|term
//	grant <resource> <token> <unix ns> <worker id> <call unix ns> <believed ns> <span ns>
//
// A grant line (client mode) tells when Lock returned, when it was called,
// for how long the lock was believed held from then (the client's Deadline;
// 0 or less: lost on arrival), and the shorter of the ttl and the session
// grace the server announced (the client promises two thirds of it).
// A beat is an action taken under the lock (a write to the protected
// resource). Before each action the worker checks that it still believes it
// holds the lock; an "end ... lost" line carries the time of its last action.
//
// Modes:
//
//	client   the Go client (mlock.Client Lock + Hold) against mlockd
//	execute  locking.Open + Acquire (for the token) + locking.Execute
//	exec     the command run by "mlock run": token from MLOCK_TOKEN
//	         (or "-"), stops at SIGTERM like a command that knows nothing
//	env      writes MLOCK_* environment variables to the log and exits
//
// Exit status: 0 done; 2 bad arguments; 3 the lock was not taken (error on
// stderr); 4 the lock was lost; 5 the wait for the lock timed out; 143
// stopped by SIGTERM (exec mode).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/locking"
	_ "github.com/mlock-dev/mlock/locking/mlockd"
	_ "github.com/mlock-dev/mlock/locking/redis"
)

var (
	mode    = flag.String("mode", "client", "client, execute, exec or env")
	uri     = flag.String("uri", "", "server or provider URI")
	res     = flag.String("res", "r", "resource")
	ttl     = flag.Duration("ttl", time.Second, "lease")
	hold    = flag.Duration("hold", time.Second, "length of the critical section")
	beat    = flag.Duration("beat", 20*time.Millisecond, "interval between actions")
	timeout = flag.Duration("timeout", 10*time.Second, "longest wait for the lock")
	logPath = flag.String("log", "", "history log (appended)")
	id      = flag.String("id", "", "worker id")
)

type history struct{ f *os.File }

func (h history) line(fields ...string) {
	// One write of a whole line: O_APPEND keeps lines of processes apart.
	_, _ = h.f.Write([]byte(strings.Join(fields, " ") + "\n"))
}

func ns(t time.Time) string { return strconv.FormatInt(t.UnixNano(), 10) }

// section runs the critical section: start, a beat every *beat until *hold
// has passed, end. believed is asked before every action; term (may be nil)
// ends the section at once.
func section(ctx context.Context, h history, tok string, believed func(time.Time) bool, term <-chan os.Signal) (lost, termed bool) {
	now := time.Now()
	if !believed(now) {
		return true, false // lost before the first action: no section
	}
	h.line("start", *res, tok, ns(now), *id)
	last, until := now, now.Add(*hold)
	t := time.NewTimer(*beat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
		case <-t.C:
			t.Reset(*beat)
		case <-term:
			h.line("end", *res, tok, ns(time.Now()), *id, "term")
			return false, true
		}
		now = time.Now()
		if !believed(now) {
			h.line("end", *res, tok, ns(last), *id, "lost")
			return true, false
		}
		if !now.Before(until) {
			h.line("end", *res, tok, ns(now), *id, "ok")
			return false, false
		}
		h.line("beat", *res, tok, ns(now), *id)
		last = now
	}
}

func main() {
	flag.Parse()
	if *logPath == "" || *id == "" {
		fmt.Fprintln(os.Stderr, "worker: -log and -id are required")
		os.Exit(2)
	}
	f, err := os.OpenFile(*logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(2)
	}
	h := history{f}
	ctx := context.Background()
	switch *mode {
	case "client":
		os.Exit(runClient(ctx, h))
	case "execute":
		os.Exit(runExecute(ctx, h))
	case "exec":
		os.Exit(runExec(h))
	case "env":
		var env []string
		for _, kv := range os.Environ() {
			if strings.HasPrefix(kv, "MLOCK_") {
				env = append(env, kv)
			}
		}
		sort.Strings(env)
		for _, kv := range env {
			h.line("env", *id, kv)
		}
		os.Exit(0)
	}
	fmt.Fprintln(os.Stderr, "worker: unknown -mode", *mode)
	os.Exit(2)
}

func runClient(ctx context.Context, h history) int {
	c, err := mlock.New(*uri)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 2
	}
	defer c.Close()
	wctx, cancel := context.WithTimeout(ctx, *timeout+5*time.Second)
	defer cancel()
	call := time.Now()
	l, err := c.Lock(wctx, *res, &mlock.LockOptions{TTL: *ttl, Timeout: *timeout})
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker: lock:", err)
		if errors.Is(err, mlock.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
			return 5
		}
		return 3
	}
	tok := strconv.FormatUint(l.Token(), 10)
	at := time.Now()
	believed := time.Duration(0)
	if d := l.Deadline(); !d.IsZero() {
		believed = d.Sub(at)
	}
	span := *ttl
	if grace, ok := c.SessionGrace(); ok {
		span = min(span, grace)
	}
	h.line("grant", *res, tok, ns(at), *id, ns(call), strconv.FormatInt(int64(believed), 10), strconv.FormatInt(int64(span), 10))
	var lost bool
	err = c.Hold(ctx, l, func(jctx context.Context) error {
		lost, _ = section(jctx, h, tok, func(now time.Time) bool {
			if jctx.Err() != nil {
				return false
			}
			select {
			case <-l.Lost():
				return false
			default:
			}
			// The client's own bound on its belief.
			return now.Before(l.Deadline())
		}, nil)
		return nil
	})
	if lost || errors.Is(err, mlock.ErrLost) {
		fmt.Fprintln(os.Stderr, "worker: lost:", err)
		return 4
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 3
	}
	return 0
}

func runExecute(ctx context.Context, h history) int {
	p, err := locking.Open(ctx, *uri)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 2
	}
	defer p.Close()
	keys := []string{*res}
	owner := "fault-" + *id
	actx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	// Acquire gives the token; Execute by the same owner renews that lock
	// and runs the job under the module's watchdog.
	lease, err := p.Acquire(actx, keys, locking.AcquireOptions{OwnerID: owner, Expire: *ttl, AwaitQueue: true})
	if err != nil {
		_, _ = p.Release(context.Background(), keys, locking.ReleaseOptions{OwnerID: owner})
		fmt.Fprintln(os.Stderr, "worker: acquire:", err)
		if errors.Is(err, locking.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
			return 5
		}
		return 3
	}
	tok := strconv.FormatUint(lease.Token, 10)
	var lost bool
	err = locking.Execute(ctx, p, keys, func(jctx context.Context) error {
		lost, _ = section(jctx, h, tok, func(time.Time) bool { return jctx.Err() == nil }, nil)
		return nil
	}, locking.ExecuteOptions{Timeout: time.Second, Expire: *ttl, OwnerID: owner})
	if lost || errors.Is(err, locking.ErrLost) {
		fmt.Fprintln(os.Stderr, "worker: lost:", err)
		return 4
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 3
	}
	return 0
}

func runExec(h history) int {
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM, syscall.SIGINT)
	tok := os.Getenv("MLOCK_TOKEN")
	if tok == "" {
		tok = "-"
	}
	_, termed := section(context.Background(), h, tok, func(time.Time) bool { return true }, term)
	if termed {
		return 143
	}
	return 0
}
