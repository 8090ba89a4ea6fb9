package scenario

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mlock-dev/mlock/internal/lease"
)

// event is one line of the shared log (see the package documentation).
type event struct {
	kind      string
	id        string
	ns        int64    // wall clock, Unix ns
	believed  int64    // grant: ns the lock is believed held at arrival
	lag       int64    // grant (optional): ns the worker's own stall may have taken of believed (see analyze)
	token     uint64   // grant, start, end, stop: the fencing token
	resources []string // ask, grant, start, end, stop
	expiresAt int64    // start of a cron run: MLOCK_EXPIRES_AT, Unix ms (0: not given)
	text      string   // loss: where, then why; error: what
}

// maxLine bounds a log line: a longer one is refused.
const maxLine = 4096

// maxArrivalLag is the most of a worker's lag (see analyze) that excuses a
// grant measured short at arrival.
const maxArrivalLag = 200 * time.Millisecond

// parseLine parses one line of the shared log (without its newline).
func parseLine(line string) (event, error) {
	if len(line) > maxLine {
		return event{}, fmt.Errorf("line of %d bytes, over %d", len(line), maxLine)
	}
	f := strings.Split(line, " ")
	if len(f) < 3 {
		return event{}, errors.New("want at least: kind id ns")
	}
	e := event{kind: f[0], id: f[1]}
	if e.id == "" {
		return event{}, errors.New("empty id")
	}
	ns, err := strconv.ParseInt(f[2], 10, 64)
	if err != nil || ns <= 0 {
		return event{}, fmt.Errorf("time %q: want Unix ns > 0", f[2])
	}
	e.ns = ns
	args := f[3:]
	want := func(n, m int) error {
		if len(args) < n || len(args) > m {
			return fmt.Errorf("%s: want %d to %d fields after the time, got %d", e.kind, n, m, len(args))
		}
		return nil
	}
	switch e.kind {
	case "ready", "done":
		err = want(0, 0)
	case "ask":
		if err = want(1, 1); err == nil {
			e.resources, err = parseResources(args[0])
		}
	case "grant":
		if err = want(3, 4); err != nil {
			break
		}
		if len(args) == 4 {
			if e.lag, err = strconv.ParseInt(args[3], 10, 64); err != nil || e.lag < 0 {
				err = fmt.Errorf("grant: lag %q: want ns >= 0", args[3])
				break
			}
		}
		if e.believed, err = strconv.ParseInt(args[0], 10, 64); err != nil {
			err = fmt.Errorf("grant: believed %q: %v", args[0], err)
			break
		}
		if e.token, err = strconv.ParseUint(args[1], 10, 64); err != nil {
			err = fmt.Errorf("grant: token %q: %v", args[1], err)
			break
		}
		e.resources, err = parseResources(args[2])
	case "start", "end", "stop":
		if err = want(2, 3); err != nil {
			break
		}
		if e.token, err = strconv.ParseUint(args[0], 10, 64); err != nil {
			err = fmt.Errorf("%s: token %q: %v", e.kind, args[0], err)
			break
		}
		if e.resources, err = parseResources(args[1]); err != nil {
			break
		}
		if len(args) == 3 {
			if e.kind != "start" {
				err = fmt.Errorf("%s: want 2 fields after the time, got 3", e.kind)
				break
			}
			if e.expiresAt, err = strconv.ParseInt(args[2], 10, 64); err != nil || e.expiresAt <= 0 {
				err = fmt.Errorf("%s: expiry %q: want Unix ms > 0", e.kind, args[2])
			}
		}
	case "loss", "error":
		if err = want(1, math.MaxInt); err == nil {
			e.text = strings.Join(args, " ")
		}
	default:
		err = fmt.Errorf("unknown kind %q", e.kind)
	}
	if err != nil {
		return event{}, err
	}
	return e, nil
}

// parseResources splits a|b|c, refusing empty names.
func parseResources(s string) ([]string, error) {
	r := strings.Split(s, "|")
	if slices.Contains(r, "") {
		return nil, fmt.Errorf("resources %q: empty name", s)
	}
	return r, nil
}

// formatLine is the line of e: parseLine(formatLine(e)) is e.
func formatLine(e event) string {
	head := e.kind + " " + e.id + " " + strconv.FormatInt(e.ns, 10)
	res := strings.Join(e.resources, "|")
	switch e.kind {
	case "ask":
		return head + " " + res
	case "grant":
		if e.lag != 0 {
			return fmt.Sprintf("%s %d %d %s %d", head, e.believed, e.token, res, e.lag)
		}
		return fmt.Sprintf("%s %d %d %s", head, e.believed, e.token, res)
	case "start", "end", "stop":
		if e.expiresAt != 0 {
			return fmt.Sprintf("%s %d %s %d", head, e.token, res, e.expiresAt)
		}
		return fmt.Sprintf("%s %d %s", head, e.token, res)
	case "loss", "error":
		return head + " " + e.text
	}
	return head
}

// readLog parses the shared log at path.
func readLog(path string) ([]event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var evs []event
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), maxLine+1)
	for n := 1; sc.Scan(); n++ {
		e, err := parseLine(sc.Text())
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %v", path, n, err)
		}
		evs = append(evs, e)
	}
	return evs, sc.Err()
}

// role is what a process of a scenario is expected to do.
type role int

const (
	waiter  role = iota // waits for its lock and holds it (every worker but the skipping cron runs)
	skipper             // mlock run --skip-if-locked: runs, or is skipped, without waiting
)

// proc is one process of a scenario, as the test saw it.
type proc struct {
	id       string
	role     role
	launched int64 // wall clock when it was started, Unix ns
	exited   int64 // wall clock when the test reaped it, Unix ns (0: not reaped)
	exit     int   // -1: killed or not reaped
	stderr   string
}

// worker is what the log says of one process.
type worker struct {
	ready, ask, grant, start, end int64 // Unix ns, 0: not logged
	stop                          int64 // a cron command stopped for a loss: when (Unix ns, 0: not logged)
	believed                      int64 // grant: ns believed held at arrival
	lag                           int64 // grant: ns of it the worker's own stall may have taken
	token                         uint64
	resources                     []string
	expiresAt                     int64 // cron: MLOCK_EXPIRES_AT, Unix ms
	losses, errs                  []event
	lines                         []string
}

// section is one critical section on one resource.
type section struct {
	id         string
	start, end int64
	token      uint64
}

// result is the outcome of one scenario on one target.
type result struct {
	target, scenario string
	ttl              time.Duration
	procs, grants    int
	skipped          int // skipping cron runs that did not run their command
	lostOnArrival    int // lost, or believed less than usable(ttl), when the grant arrived
	losses           int // lost during the hold (or found gone by the unlock)
	overlaps         int // pairs of critical sections on one resource that overlap
	tokenInversions  int // sections of a resource whose token is not above the one before
	badExits         int
	waits            []time.Duration // from the request (or the launch of a cron run) to the grant
	leastLeft        time.Duration   // the least believed (cron: the server's lease) left at arrival
	leftKnown        bool
	serverLease      bool // leastLeft is the server's lease left (mlock run does not show its belief)
	problems         []string
}

// usable is the least a grant must leave to believe at arrival: two thirds
// of the ttl less its drift margin (ttl/100 + 5 ms), the clients' own rule
// (lease.MinUsable: a grant that would leave less is confirmed, or given
// back and asked again, never handed over).
func usable(ttl time.Duration) time.Duration { return lease.MinUsable(ttl) }

// analyze checks the log of a scenario against its processes.
func analyze(target, scenario string, ttl time.Duration, procs []proc, evs []event) *result {
	r := &result{target: target, scenario: scenario, ttl: ttl, procs: len(procs)}
	ws := map[string]*worker{}
	for _, p := range procs {
		ws[p.id] = &worker{}
	}
	for _, e := range evs {
		w := ws[e.id]
		if w == nil {
			r.problems = append(r.problems, "log line of an unknown process: "+formatLine(e))
			continue
		}
		w.lines = append(w.lines, formatLine(e))
		switch e.kind {
		case "ready":
			w.ready = e.ns
		case "ask":
			w.ask = e.ns
		case "grant":
			w.grant, w.believed, w.lag, w.token, w.resources = e.ns, e.believed, e.lag, e.token, e.resources
		case "start":
			w.start, w.token, w.resources, w.expiresAt = e.ns, e.token, e.resources, e.expiresAt
		case "end":
			w.end = e.ns
		case "stop":
			w.stop = e.ns
		case "loss":
			w.losses = append(w.losses, e)
		case "error":
			w.errs = append(w.errs, e)
		}
	}
	least := usable(ttl)
	byRes := map[string][]section{}
	for _, p := range procs {
		w := ws[p.id]
		bad := func(format string, args ...any) {
			r.problems = append(r.problems, fmt.Sprintf("%s (exit %d): %s\n    log: %s\n    stderr: %s",
				p.id, p.exit, fmt.Sprintf(format, args...), strings.Join(w.lines, "\n         "), strings.TrimSpace(p.stderr)))
		}
		if p.exit != 0 {
			r.badExits++
			bad("exit status %d, want 0", p.exit)
		}
		cron := w.grant == 0 && w.start != 0 // mlock run: the command logs its section only
		granted := w.grant != 0 || w.start != 0
		switch {
		case granted:
			r.grants++
		case p.role == skipper && p.exit == 0:
			r.skipped++
		}
		// Lost on arrival.
		arrival := false
		for _, l := range w.losses {
			if strings.HasPrefix(l.text, "arrival") {
				arrival = true
			}
		}
		// The client checks what a grant leaves when it reads it; a
		// worker that measures later (the Node.js one) gives as lag how
		// long after its event loop's last tick before the grant it
		// measured: the client's check came after that tick, so a worker
		// descheduled after the check has left + lag at least.
		// The lag is an upper bound (a stall before the client's check
		// counts in it too), so at most maxArrivalLag of it is allowed:
		// seen up to 40 ms at load 50.
		left, known := time.Duration(w.believed), w.grant != 0
		if known && left+min(time.Duration(w.lag), maxArrivalLag) < least {
			arrival = true
			bad("believed held only %v at arrival (%v after the worker's last tick before it), under %v", left, time.Duration(w.lag), least)
		}
		if cron && w.expiresAt != 0 {
			// Shown, not checked: mlock run starts its command once it
			// believes the lock held for longer than its watchdog's lead
			// (kill-after + 100 ms) + 100 ms, then renews it while the
			// command runs; the fork and exec of the command come between.
			left, known = time.Duration(w.expiresAt*int64(time.Millisecond)-w.start), true
			r.serverLease = true
		}
		if known && (!r.leftKnown || left < r.leastLeft) {
			r.leastLeft, r.leftKnown = left, true
		}
		if w.grant == 0 && w.start == 0 && (p.exit == 75 || p.exit == 125) {
			arrival = true // mlock run: lost, or refused to start the command
		}
		if arrival {
			r.lostOnArrival++
		}
		// Losses during the hold.
		for _, l := range w.losses {
			if !strings.HasPrefix(l.text, "arrival") {
				r.losses++
				bad("lost: %s", l.text)
			}
		}
		if w.start != 0 && p.exit == 75 && len(w.losses) == 0 {
			r.losses++ // mlock run: the command was stopped for a loss
		}
		for _, e := range w.errs {
			bad("error: %s", e.text)
		}
		// The critical section.
		if w.start != 0 {
			end := w.end
			if end == 0 {
				bad("its critical section did not end")
				end = sectionBound(p, w)
			}
			for _, res := range w.resources {
				byRes[res] = append(byRes[res], section{id: p.id, start: w.start, end: end, token: w.token})
			}
		}
		if granted && p.role == waiter && p.exit == 0 && w.start == 0 {
			bad("granted but never started its critical section")
		}
		if !granted && p.role == waiter {
			bad("never granted")
		}
		// The wait.
		switch {
		case w.ask != 0 && w.grant != 0:
			r.waits = append(r.waits, time.Duration(w.grant-w.ask))
		case cron && p.role == waiter:
			r.waits = append(r.waits, time.Duration(w.start-p.launched))
		}
	}
	for res, ss := range byRes {
		slices.SortFunc(ss, func(a, b section) int { return cmpInt(a.start, b.start) })
		var last section // the section that ends last so far
		for i, s := range ss {
			if i > 0 && s.start < last.end {
				r.overlaps++
				r.problems = append(r.problems, fmt.Sprintf("overlap on %s: %s [%d, %d] and %s [%d, %d]",
					res, last.id, last.start, last.end, s.id, s.start, s.end))
			}
			if i > 0 && s.token <= ss[i-1].token {
				r.tokenInversions++
				r.problems = append(r.problems, fmt.Sprintf("token order on %s: %s (token %d) after %s (token %d)",
					res, s.id, s.token, ss[i-1].id, ss[i-1].token))
			}
			if i == 0 || s.end > last.end {
				last = s
			}
		}
	}
	slices.Sort(r.waits)
	return r
}

// sectionBound is the latest a critical section that did not end can have
// lasted, from what the test can prove: a worker that saw its loss stopped
// there; a cron command stopped by mlock run said when (its stop line); a
// process that exited holds nothing after the test reaped it (mlock run
// reaps its command before it exits); one killed or never reaped may have
// run on for ever. Overlaps count against the section up to this bound.
func sectionBound(p proc, w *worker) int64 {
	end := int64(math.MaxInt64)
	if p.exit >= 0 && p.exited != 0 {
		end = p.exited
	}
	if w.stop >= w.start && w.stop != 0 {
		end = min(end, w.stop)
	}
	for _, l := range w.losses {
		if l.ns >= w.start {
			end = min(end, l.ns)
		}
	}
	return end
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// percentile returns the nearest-rank p-th percentile of sorted d (0 if
// empty).
func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	i := int(math.Ceil(p/100*float64(len(d)))) - 1
	return d[min(max(i, 0), len(d)-1)]
}

// maxWait is the longest wait.
func (r *result) maxWait() time.Duration {
	if len(r.waits) == 0 {
		return 0
	}
	return r.waits[len(r.waits)-1]
}

// tableHeader and row make the report's table.
const tableHeader = "target   scenario     procs grants skipped lost-on-arrival losses overlaps token-order bad-exits  wait-p50  wait-p99  wait-max   ttl  least-left (min)"

func (r *result) row() string {
	ms := func(d time.Duration) string { return d.Round(time.Millisecond).String() }
	left := "-"
	if r.leftKnown {
		left = fmt.Sprintf("%s (%s)", ms(r.leastLeft), ms(usable(r.ttl)))
		if r.serverLease {
			left = ms(r.leastLeft) + "* (not checked)"
		}
	}
	return fmt.Sprintf("%-8s %-12s %5d %6d %7d %15d %6d %8d %11d %9d %9s %9s %9s %5s  %s",
		r.target, r.scenario, r.procs, r.grants, r.skipped, r.lostOnArrival, r.losses, r.overlaps, r.tokenInversions,
		r.badExits, ms(percentile(r.waits, 50)), ms(percentile(r.waits, 99)), ms(r.maxWait()), r.ttl, left)
}
