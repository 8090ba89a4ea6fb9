package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/mlock-dev/mlock"
)

// Pacing of "mlock run"'s progress lines (--verbose, or stderr a
// terminal).
var (
	// waitNotice is how long a wait lasts before it is told: a lock got at
	// once says only that it was got.
	waitNotice = 300 * time.Millisecond
	// queuePoll is the pause between two looks at the queues. Each look is
	// one locks listing per resource (at most maxPolled), and the server
	// answers a principal at most 20 listings a second by default (its
	// --status-rate), shared with every other client of that principal.
	queuePoll = 2 * time.Second
)

// maxPolled is the most resources whose queue is looked at.
const maxPolled = 4

// progress tells on stderr, when on, that a run waits, its place in the
// queues, and when it got the lock. Its methods are safe for concurrent
// use.
type progress struct {
	w         io.Writer
	on        bool
	resources string
	start     time.Time

	mu   sync.Mutex // guards the fields below and writes to w
	done bool       // the lock was got: say no more of the wait
	last string     // the last place in the queues told
}

func (p *progress) printf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.done {
		fmt.Fprintf(p.w, format, args...)
	}
}

// got tells that the lock was got, when, after how long, and its token.
func (p *progress) got(g grant) {
	if !p.on {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done = true
	now := time.Now()
	fmt.Fprintf(p.w, "mlock run: got %s at %s after %v (token %d); running the command\n",
		p.resources, now.Format("15:04:05.000"), now.Sub(p.start).Round(time.Millisecond), g.token)
}

// watch tells, once the wait has lasted waitNotice, that the run waits,
// then (with c, an mlock:// client) the run's place in each queue whenever
// it changes, looked at every queuePoll from the server's locks listing:
// the entries of owner. It returns when ctx ends.
func (p *progress) watch(ctx context.Context, c *mlock.Client, owner string) {
	t := time.NewTimer(waitNotice)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return
	case <-t.C:
	}
	p.printf("mlock run: waiting for %s\n", p.resources)
	if c == nil {
		return
	}
	names := uniqueNames(p.resources, maxPolled)
	for {
		if place := p.place(ctx, c, owner, names); place != "" {
			p.mu.Lock()
			changed := place != p.last
			p.last = place
			p.mu.Unlock()
			if changed {
				p.printf("mlock run: waiting for %s: %s\n", p.resources, place)
			}
		}
		t.Reset(queuePoll)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// place describes owner's waiting entries in the queues of names: "N ahead
// in R's queue (held by OWNER)" for each that is not at the head; "" if
// nothing could be learned (the listing refused or failed: rate-limited,
// say).
func (p *progress) place(ctx context.Context, c *mlock.Client, owner string, names []string) string {
	var parts []string
	for _, name := range names {
		ls, err := c.Locks(ctx, name)
		if err != nil {
			return ""
		}
		for _, q := range ls.Queues {
			if q.Resource != c.Options().Prefix+name {
				continue
			}
			holder := ""
			for _, e := range q.Entries {
				if e.State == "held" && e.Owner != "" && holder == "" {
					holder = e.Owner
				}
			}
			for _, e := range q.Entries {
				if e.Owner != owner || e.State != "waiting" {
					continue
				}
				if e.Position == 0 {
					break // at the head: it waits for the other queues
				}
				part := fmt.Sprintf("%d ahead in %s's queue", e.Position, name)
				if holder != "" {
					part += " (held by " + holder + ")"
				}
				parts = append(parts, part)
				break
			}
		}
	}
	return strings.Join(parts, ", ")
}

// uniqueNames returns the distinct names of "a|b", at most n.
func uniqueNames(resources string, n int) []string {
	var out []string
	seen := map[string]bool{}
	for _, name := range strings.Split(resources, "|") {
		if name != "" && !seen[name] && len(out) < n {
			seen[name] = true
			out = append(out, name)
		}
	}
	return out
}
