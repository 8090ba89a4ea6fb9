// Command order is the Go worker of the scenario suite: one order (one
// process, so one session of its own) that locks its resources with the Go
// client, holds them for a while and unlocks, writing what it sees to the
// suite's shared log, one line per event, each line one write to a file
// opened with O_APPEND (see the package documentation of scenario for the
// format).
//
// It connects first, writes a ready line, then waits for its standard input
// to close: the test closes every worker's at once, so that all the orders
// ask at the same moment.
//
// Exit status: 0 the order held its lock for its whole hold and unlocked it;
// 3 the lock was lost (on arrival, during the hold, or found gone by the
// unlock); 4 the lock was not granted (timeout, refused, connection); 2 a
// usage error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/internal/scenario"
)

func main() { os.Exit(run()) }

func run() int {
	uri := flag.String("uri", "", "server or cluster, mlock://h1,h2,h3")
	id := flag.String("id", "", "the worker's name in the log")
	resources := flag.String("resources", "", "what to lock, a|b|c")
	ttl := flag.Duration("ttl", 2*time.Second, "lease")
	hold := flag.Duration("hold", 100*time.Millisecond, "how long to hold the lock")
	timeout := flag.Duration("timeout", time.Minute, "longest wait")
	logPath := flag.String("log", "", "the shared log")
	stall := flag.Duration("stall", 0, "for the suite's own test: pause this long between the end-of-section check and the end line,\n"+
		"as a process descheduled there would")
	flag.Parse()
	if *uri == "" || *id == "" || *resources == "" || *logPath == "" || strings.ContainsAny(*id, " \n") {
		fmt.Fprintln(os.Stderr, "order: -uri, -id (no spaces), -resources and -log are required")
		return 2
	}
	f, err := os.OpenFile(*logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, "order:", err)
		return 2
	}
	defer f.Close()
	// logAt writes a line with the time at (a section's start and end are
	// logged with the time their lock was last seen believed held: the
	// process may be descheduled before it writes the line).
	logAt := func(at time.Time, kind string, args ...any) {
		if _, err := f.Write([]byte(scenario.LogLine(kind, *id, at, args...) + "\n")); err != nil {
			fmt.Fprintln(os.Stderr, "order: writing the log:", err)
		}
	}
	logf := func(kind string, args ...any) { logAt(time.Now(), kind, args...) }

	c, err := mlock.New(*uri)
	if err != nil {
		logf("error", "client:", err)
		return 2
	}
	defer c.Close()
	pctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	err = c.Ping(pctx)
	cancel()
	if err != nil {
		logf("error", "ping:", err)
		return 4
	}
	logf("ready")
	_, _ = io.Copy(io.Discard, os.Stdin) // the start signal: stdin closed

	ctx, cancel := context.WithTimeout(context.Background(), *timeout+10*time.Second)
	defer cancel()
	logf("ask", *resources)
	l, err := c.Lock(ctx, *resources, &mlock.LockOptions{TTL: *ttl, Timeout: *timeout})
	if err != nil {
		logf("error", "lock:", err)
		return 4
	}
	// The grant as it reaches the caller: how long the client believes the
	// lock held from here on.
	believed := time.Until(l.Deadline())
	if l.Deadline().IsZero() {
		believed = 0
	}
	logf("grant", believed.Nanoseconds(), l.Token(), *resources)
	if err := l.Err(); err != nil {
		logf("loss", "arrival", err)
		return 3
	}
	// The section starts, and later ends, at a moment the lock is seen
	// believed held: the time is read first, then the Deadline checked
	// against it (the check comes after: if the lock is believed held then,
	// it was at that time).
	at := time.Now()
	if err := l.Err(); err != nil || !at.Before(l.Deadline()) {
		logf("loss", "arrival", "past the deadline at the start of the section:", err)
		return 3
	}
	logAt(at, "start", l.Token(), *resources)
	t := time.NewTimer(*hold)
	select {
	case <-t.C:
	case <-l.Lost():
		logf("loss", "hold", l.Err())
		return 3
	}
	// Still believed held at the end of the section?
	at = time.Now()
	if err := l.Err(); err != nil || !at.Before(l.Deadline()) {
		logf("loss", "hold", "past the deadline at the end of the section:", err)
		return 3
	}
	time.Sleep(*stall) // fixed: the stall is the input of the suite's own test (0 otherwise)
	logAt(at, "end", l.Token(), *resources)
	uctx, ucancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ucancel()
	if err := l.Unlock(uctx); err != nil {
		if errors.Is(err, mlock.ErrLost) {
			logf("loss", "unlock", err)
			return 3
		}
		logf("error", "unlock:", err)
		return 4
	}
	logf("done")
	return 0
}
