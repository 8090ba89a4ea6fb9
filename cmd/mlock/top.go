package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mlock-dev/mlock"
)

// topView is what one screen of mlock top shows: the fields of mlockd's
// /api/view that it reads, or the same built from the lock protocol.
type topView struct {
	Now     int64                `json:"now"`
	Version string               `json:"version"`
	StartAt int64                `json:"startAt"`
	Ready   bool                 `json:"ready"`
	Why     string               `json:"why"`
	Quiet   bool                 `json:"quiet"`
	Counts  topCounts            `json:"counts"`
	Cluster *mlock.StatusCluster `json:"cluster"`
	Matched int                  `json:"matched"`
	Top     []mlock.LocksQueue   `json:"top"`
	Rates   struct {
		Grants   []float64 `json:"grants"`
		Timeouts []float64 `json:"timeouts"`
		Requests []float64 `json:"requests"`
		Expiries []float64 `json:"expiries"`
	} `json:"rates"`
	// partial: the protocol's listing stopped at the server's status
	// limit, so the longest queues are those of its first resources.
	partial bool
	// queuesAtLeast: the protocol's status listed queues up to the
	// server's status limit, so Counts.Queues is a lower bound.
	queuesAtLeast bool
}

// checkHTTPURL reports why --http's value raw (empty: not given) names no
// JSON API to read: it does not parse, its scheme is not http or https,
// or it names no host. The error shows raw with its credentials redacted.
func checkHTTPURL(raw string) error {
	if raw == "" {
		return nil
	}
	s := raw
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	u, err := url.Parse(s)
	switch {
	case err != nil:
		// The parser's error quotes the URL, and its credentials with it.
		return errors.New("--http: the URL does not parse (want http://HOST:PORT or https://NAME:TOKEN@HOST:PORT)")
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("--http %s: the scheme must be http or https", u.Redacted())
	case u.Hostname() == "":
		return fmt.Errorf("--http %s names no host", u.Redacted())
	}
	return nil
}

// httpTarget returns, for --http's value raw, the JSON API's base URL (no
// trailing slash; http:// when raw names no scheme), how it is shown (its
// credentials redacted), and the address a refused connection is probed
// at (port 443 for https and 80 for http unless given; none when the URL
// has no host).
func httpTarget(raw string) (base, where string, addrs []string) {
	base = strings.TrimSuffix(raw, "/")
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	where = redactURL(base)
	if u, err := url.Parse(base); err == nil && u.Host != "" {
		port := u.Port()
		if port == "" {
			port = map[bool]string{true: "443", false: "80"}[u.Scheme == "https"]
		}
		addrs = []string{net.JoinHostPort(u.Hostname(), port)}
	}
	return base, where, addrs
}

type topCounts struct {
	Held     int    `json:"held"`
	Waiting  int    `json:"waiting"`
	Queues   int    `json:"queues"`
	Online   int    `json:"online"`
	Grace    int    `json:"grace"`
	Conns    int    `json:"conns"`
	Grants   uint64 `json:"grants"`
	Timeouts uint64 `json:"timeouts"`
	Expiries uint64 `json:"expiries"`
	Requests uint64 `json:"requests"`
}

func cmdTop(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("top")
	httpURL := fs.String("http", os.Getenv("MLOCK_HTTP"), "read mlockd's JSON API at this URL (its --http address, e.g. http://127.0.0.1:12341;\n"+
		"on a server with credentials an administrator's name and token: https://ops:TOKEN@lock.internal:12341;\n"+
		"default $MLOCK_HTTP, unless --uri is given); without it, the lock protocol at --uri")
	interval := fs.Duration("interval", time.Second, "time between refreshes")
	iterations := fs.Int("n", 0, "refresh this many times, then exit (0: until interrupted; 1 when stdout is not a terminal)")
	limit := fs.Int("limit", 0, "resources shown (default: what fits the terminal, at least 10)")
	inspectUsage(fs, "mlock top [--http URL | --uri URI] [--interval D] [-n N] [--limit N] [PREFIX]",
		"Shows the busiest resources (the longest queues: holder, how long held, time left, waiters),\n"+
			"the counts of locks, sessions and connections, the rates of grants and timeouts, and the\n"+
			"node's and cluster's state, refreshed every second, like top. PREFIX keeps the resources\n"+
			"whose name starts with it. From mlockd's JSON API (--http), or from the lock protocol, whose\n"+
			"listing stops at the server's --status-limit (the busiest of those resources are shown).\n")
	uri := uriFlag(fs, uriServer)
	timeout := timeoutFlag(fs)
	p := parse(fs, args, stdout, stderr)
	if p.done {
		return p.exit
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	switch {
	case given["uri"] && given["http"]:
		return usageError(fs, stderr, "give --http or --uri, not both")
	case given["uri"]:
		*httpURL = "" // $MLOCK_HTTP is only --http's default
	}
	switch {
	case len(p.pos) > 1:
		return usageError(fs, stderr, fmt.Sprintf("unexpected argument %q", p.pos[1]))
	case *interval < 100*time.Millisecond:
		return usageError(fs, stderr, "--interval must be at least 100ms")
	case *iterations < 0 || *limit < 0:
		return usageError(fs, stderr, "-n and --limit must not be negative")
	case *timeout <= 0:
		return usageError(fs, stderr, "--timeout must be positive")
	}
	if err := checkHTTPURL(*httpURL); err != nil {
		return usageError(fs, stderr, err.Error())
	}
	prefix := ""
	if len(p.pos) == 1 {
		prefix = p.pos[0]
	}
	tty := false
	var out *os.File
	if f, ok := stdout.(*os.File); ok {
		tty, out = isTerminal(f), f
	}
	n := *iterations
	if n == 0 && !tty {
		n = 1
	}
	var show, cols int
	// fit reads the terminal's size again: it may have been resized.
	fit := func() {
		var rows int
		rows, cols = termSize(out, tty)
		show = *limit
		if show == 0 {
			show = max(10, rows-8)
		}
	}
	fit()
	var fetch func(ctx context.Context) (*topView, error)
	var addrs []string // the addresses probed for a refusal (failFast)
	where := shownURI(*uri)
	if *httpURL != "" {
		var base string
		base, where, addrs = httpTarget(*httpURL)
		hc := &http.Client{Timeout: *timeout}
		fetch = func(ctx context.Context) (*topView, error) { return fetchHTTP(ctx, hc, base, prefix, show) }
	} else {
		o, err := clientOptions(*uri, *timeout)
		if err != nil {
			return fail(fs, stderr, err)
		}
		c, err := mlock.NewClient(o)
		if err != nil {
			return fail(fs, stderr, err)
		}
		defer c.Close()
		addrs = c.Addrs()
		var prev *topView
		var prevAt time.Time
		fetch = func(ctx context.Context) (*topView, error) {
			v, err := fetchProtocol(ctx, c, prefix)
			if err != nil {
				return nil, err
			}
			now := time.Now()
			if prev != nil {
				v.ratesSince(prev, now.Sub(prevAt))
			}
			prev, prevAt = v, now
			return v, nil
		}
	}
	ctx, stop := signalCtx()
	defer stop()
	for i := 0; n == 0 || i < n; i++ {
		if i > 0 {
			select {
			case <-ctx.Done():
				return exitOK
			case <-time.After(*interval):
			}
		}
		fit()
		// A refused connection is told as the other commands tell it
		// (explain), whether --uri or --http.
		fctx, cancel := context.WithTimeoutCause(ctx, *timeout, errNoAnswer)
		fctx, settle := failFast(fctx, addrs, *timeout)
		v, err := fetch(fctx)
		settle(err)
		if err != nil {
			err = explain(fctx, err, addrs, *timeout)
		}
		cancel()
		if ctx.Err() != nil {
			return exitOK
		}
		if err != nil && i == 0 {
			return fail(fs, stderr, err)
		}
		var b strings.Builder
		if tty {
			b.WriteString("\x1b[H\x1b[2J") // home, clear
		}
		if err != nil {
			fmt.Fprintf(&b, "mlock top: %s (retrying every %v)\n", describe(err), *interval)
		} else {
			renderTop(&b, v, where, prefix, show, cols)
		}
		if _, err := io.WriteString(stdout, b.String()); err != nil {
			return exitError
		}
	}
	return exitOK
}

// fetchHTTP reads /api/view.
func fetchHTTP(ctx context.Context, hc *http.Client, base, prefix string, limit int) (*topView, error) {
	u := base + "/api/view?prefix=" + url.QueryEscape(prefix) + "&limit=" + strconv.Itoa(limit)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	res, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(res.Body, 200))
		return nil, fmt.Errorf("%s: %s %s", redactURL(u), res.Status, strings.TrimSpace(string(b)))
	}
	var v topView
	if err := json.NewDecoder(res.Body).Decode(&v); err != nil {
		return nil, fmt.Errorf("%s: %w", redactURL(u), err)
	}
	return &v, nil
}

// redactURL is u with the password of its user info (an administrator's
// token, sent as Basic credentials) replaced by xxxxx.
func redactURL(u string) string {
	p, err := url.Parse(u)
	if err != nil || p.User == nil {
		return u
	}
	return p.Redacted()
}

// fetchProtocol builds the view from the status and locks commands.
func fetchProtocol(ctx context.Context, c *mlock.Client, prefix string) (*topView, error) {
	st, err := c.Status(ctx)
	if err != nil {
		return nil, err
	}
	ls, err := c.Locks(ctx, prefix)
	if err != nil {
		return nil, err
	}
	now := time.Now().UnixMilli()
	v := &topView{Now: now, Version: st.Version, StartAt: st.StartAt, Ready: true, Quiet: st.QuietUntil > now,
		Cluster: st.Cluster, Top: ls.Queues, Matched: len(ls.Queues), partial: ls.Truncated}
	v.Counts = topCounts{Held: st.HeldLocks, Waiting: st.CurrentLocks - st.HeldLocks, Online: st.SocketCount,
		Grace: max(st.Sessions-st.SocketCount, 0), Conns: st.Connections, Grants: st.LockedCount,
		Timeouts: st.TimeoutCount, Expiries: st.ExpiredCount, Requests: st.LockCount}
	v.Counts.Queues = len(st.Queues)
	v.queuesAtLeast = st.Truncated
	if st.Cluster != nil {
		v.Ready = st.Cluster.Leader != ""
		if !v.Ready {
			v.Why = "no known leader"
		}
	}
	slices.SortStableFunc(v.Top, func(a, b mlock.LocksQueue) int { return cmp.Compare(b.Length, a.Length) })
	return v, nil
}

// ratesSince sets v's rates from the counters of prev, d earlier.
func (v *topView) ratesSince(prev *topView, d time.Duration) {
	if d <= 0 {
		return
	}
	r := func(a, b uint64) []float64 { return []float64{float64(b-min(a, b)) / d.Seconds()} }
	v.Rates.Grants = r(prev.Counts.Grants, v.Counts.Grants)
	v.Rates.Timeouts = r(prev.Counts.Timeouts, v.Counts.Timeouts)
	v.Rates.Requests = r(prev.Counts.Requests, v.Counts.Requests)
	v.Rates.Expiries = r(prev.Counts.Expiries, v.Counts.Expiries)
}

// termSize returns the terminal's rows and columns (as the terminal f
// tells, else $LINES and $COLUMNS, else 24×100); not on a terminal, lines
// are not cut (0 columns).
func termSize(f *os.File, tty bool) (int, int) {
	rows, cols := 24, 100
	if n, err := strconv.Atoi(os.Getenv("LINES")); err == nil && n > 0 {
		rows = n
	}
	if n, err := strconv.Atoi(os.Getenv("COLUMNS")); err == nil && n > 0 {
		cols = n
	}
	if !tty {
		return rows, 0
	}
	if r, c, ok := winSize(f); ok {
		rows, cols = r, c
	}
	return rows, cols
}

// renderTop writes one screen.
func renderTop(b *strings.Builder, v *topView, where, prefix string, limit, cols int) {
	line := func(format string, args ...any) {
		s := fmt.Sprintf(format, args...)
		if r := []rune(s); cols > 0 && len(r) > cols {
			s = string(r[:cols-1]) + "…"
		}
		b.WriteString(s)
		b.WriteByte('\n')
	}
	state := "ready"
	if !v.Ready {
		state = "NOT READY: " + v.Why
	}
	if v.Quiet {
		state += ", quiet start (granting nothing yet)"
	}
	line("mlockd %s at %s · up %s · %s · %s", v.Version, where, dur(v.Now-v.StartAt), state,
		time.UnixMilli(v.Now).Format("15:04:05"))
	c := v.Counts
	queues := strconv.Itoa(c.Queues)
	if v.queuesAtLeast {
		queues = "at least " + queues
	}
	line("locks: %d held, %d waiting on %s resources · sessions: %d online, %d in grace · connections: %d",
		c.Held, c.Waiting, queues, c.Online, c.Grace, c.Conns)
	last := func(r []float64) string {
		if len(r) == 0 {
			return "-"
		}
		return strconv.FormatFloat(r[len(r)-1], 'f', 1, 64)
	}
	line("per second: %s grants, %s lock requests, %s timeouts, %s expiries",
		last(v.Rates.Grants), last(v.Rates.Requests), last(v.Rates.Timeouts), last(v.Rates.Expiries))
	if cl := v.Cluster; cl != nil {
		leader := cl.Leader
		if leader == "" {
			leader = "none known"
		}
		line("cluster: node %s %s, leader %s, term %d, commit %d, applied %d", cl.ID, cl.Role, leader, cl.Term, cl.CommitIndex, cl.AppliedIndex)
	}
	b.WriteByte('\n')
	what := "resources"
	if prefix != "" {
		what = "resources starting with " + strconv.Quote(prefix)
	}
	if v.partial {
		what += " (of the first the server lists: its --status-limit)"
	}
	line("%d %s held or waited for; the longest queues:", v.Matched, what)
	line("%-28s %5s  %-16s %9s %9s  %s", "RESOURCE", "QUEUE", "HOLDER", "HELD", "LEFT", "WAITERS (position owner waited)")
	for i, q := range v.Top {
		if i == limit {
			break
		}
		holder, held, left := "-", "-", "-"
		holders := 0
		var waiters []string
		for _, e := range q.Entries {
			if e.State == "held" {
				if holders++; holders > 1 {
					holder = fmt.Sprintf("%d holders", holders) // shared: the first one's times
					continue
				}
				holder = cmp.Or(e.Owner, "(anonymous)")
				held = dur(e.AgeMs)
				if e.HeldMs != nil {
					held = dur(*e.HeldMs)
				}
				if e.TTLLeftMs != nil {
					left = dur(*e.TTLLeftMs)
				}
				continue
			}
			if len(waiters) < 3 {
				waiters = append(waiters, fmt.Sprintf("#%d %s %s", e.Position, cmp.Or(e.Owner, "-"), dur(e.AgeMs)))
			}
		}
		nw := 0
		for _, e := range q.Entries {
			if e.State != "held" {
				nw++
			}
		}
		nw += q.Length - len(q.Entries)
		if nw > len(waiters) {
			waiters = append(waiters, fmt.Sprintf("+%d more", nw-len(waiters)))
		}
		line("%-28s %5d  %-16s %9s %9s  %s", clip(q.Resource, 28), q.Length, clip(holder, 16), held, left, strings.Join(waiters, ", "))
	}
	if len(v.Top) == 0 {
		line("(nothing is held or waited for)")
	}
}

// clip shortens s to n runes with an ellipsis.
func clip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// dur formats milliseconds for a column: 850ms, 4.2s, 3m04s, 2h05m, 3d04h.
func dur(ms int64) string {
	d := time.Duration(max(ms, 0)) * time.Millisecond
	switch {
	case d < time.Second:
		return strconv.FormatInt(ms, 10) + "ms"
	case d < time.Minute:
		return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + "s"
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%02dh", int(d.Hours())/24, int(d.Hours())%24)
}
