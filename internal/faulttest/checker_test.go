package faulttest

import (
	"bufio"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/internal/lease"
)

// The history log. Workers append (see testdata/worker):
//
//	start <resource> <token> <ns> <wid>
//	beat  <resource> <token> <ns> <wid>
//	end   <resource> <token> <ns> <wid> ok|lost|term
//	grant <resource> <token> <ns> <wid> <call ns> <believed ns> <span ns>
//
// (grant: the Go client's Lock returned at ns, called at call ns, with the
// lock believed held for believed ns more, 0 or less: lost on arrival; span
// is the shorter of the ttl and the session grace) and
// the harness appends:
//
//	spawn <wid> <ns> <mode>
//	dead  <wid> <ns> <exit status: 0, 125, sig:..., killed (by the harness)>
//	fault <ns> <text...>
//	round <ns> <n>
//
// Times are Unix nanoseconds of the one host clock.

// section is one critical section: from its start to its end line, or, if
// the worker never wrote one (killed), until the harness saw it dead.
type section struct {
	wid, res, token string
	start, end      int64
	how             string // ok, lost, term, dead (no end line), open (neither)
}

// arrival is a grant line: when the lock came and how long it was
// believed held from then.
type arrival struct {
	wid, res       string
	call, at       int64
	believed, span int64
}

// violation is one broken rule with the history lines that show it.
type violation struct {
	kind string // overlap, token, waiter, arrival
	msg  string
	from int64 // window of the history to print
	to   int64
	wids []string
}

// history is a parsed log.
type history struct {
	lines    []string
	times    []int64 // per line; 0 if none
	wids     []string
	sections []*section
	arrivals []arrival
	faults   []int64           // times of the harness's fault lines
	exits    map[string]string // wid -> exit status ("0", "125", "killed", ...)
	modes    map[string]string // wid -> mode
	origin   int64             // first time in the log
}

func parseHistory(r io.Reader) (*history, error) {
	h := &history{exits: map[string]string{}, modes: map[string]string{}}
	open := map[string]*section{}
	dead := map[string]int64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(line)
		var ts int64
		var wid string
		if len(f) == 0 {
			continue
		}
		num := func(i int) int64 {
			if i >= len(f) {
				return 0
			}
			n, _ := strconv.ParseInt(f[i], 10, 64)
			return n
		}
		switch f[0] {
		case "start", "beat", "end":
			if len(f) < 5 {
				return nil, fmt.Errorf("short line %q", line)
			}
			ts, wid = num(3), f[4]
			s := open[wid]
			switch {
			case f[0] == "start":
				s = &section{wid: wid, res: f[1], token: f[2], start: ts, end: ts, how: "open"}
				open[wid] = s
				h.sections = append(h.sections, s)
			case s == nil:
				return nil, fmt.Errorf("%s without start: %q", f[0], line)
			case f[0] == "beat":
				s.end = max(s.end, ts)
			default:
				s.end = max(s.end, ts)
				s.how = "end"
				if len(f) > 5 {
					s.how = f[5]
				}
			}
		case "spawn":
			wid, ts = f[1], num(2)
			if len(f) > 3 {
				h.modes[wid] = f[3]
			}
		case "dead":
			wid, ts = f[1], num(2)
			dead[wid] = ts
			if len(f) > 3 {
				h.exits[wid] = f[3]
			}
		case "grant":
			if len(f) < 8 {
				return nil, fmt.Errorf("short line %q", line)
			}
			ts, wid = num(3), f[4]
			h.arrivals = append(h.arrivals, arrival{wid: wid, res: f[1], at: ts, call: num(5), believed: num(6), span: num(7)})
		case "fault":
			ts = num(1)
			h.faults = append(h.faults, ts)
		case "round":
			ts = num(1)
		case "env":
			if len(f) > 1 {
				wid = f[1]
			}
		}
		if ts != 0 && (h.origin == 0 || ts < h.origin) {
			h.origin = ts
		}
		h.lines = append(h.lines, line)
		h.times = append(h.times, ts)
		h.wids = append(h.wids, wid)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	for _, s := range h.sections {
		if s.how != "open" {
			continue
		}
		if d, ok := dead[s.wid]; ok {
			s.end, s.how = max(s.end, d), "dead"
		} else {
			s.end = 1<<63 - 1 // still running: lasts for ever
		}
	}
	return h, nil
}

// check applies the rules: on one resource no two critical sections
// overlap, tokens strictly increase in start order (a token of "-",
// unknown, is skipped), and every grant whose wait saw no fault arrives
// usable (see checkArrivals).
//
// fenced > 0 weakens the first rule for a backend that cannot refuse a
// newcomer after losing its data (Redis restarted without persistence): an
// overlap is then allowed if the older section has the smaller token (a
// fenced resource rejects its late actions), its worker learned of the loss
// (the section did not end "ok", or the worker's exit status says lost) and
// it stopped within fenced of the newer one's start.
func (h *history) check(fenced time.Duration) []violation {
	byRes := map[string][]*section{}
	for _, s := range h.sections {
		byRes[s.res] = append(byRes[s.res], s)
	}
	var vs []violation
	res := make([]string, 0, len(byRes))
	for r := range byRes {
		res = append(res, r)
	}
	sort.Strings(res)
	for _, r := range res {
		ss := byRes[r]
		sort.SliceStable(ss, func(i, j int) bool { return ss[i].start < ss[j].start })
		for i, a := range ss {
			for _, b := range ss[i+1:] {
				if b.start >= a.end {
					break // sorted by start: no later b overlaps a
				}
				if fenced > 0 && h.learned(a) && a.end-b.start <= int64(fenced) && tokenLess(a.token, b.token) {
					continue
				}
				why := ""
				if fenced > 0 && !h.learned(a) {
					why = fmt.Sprintf("; worker %s never learned it lost the lock (exit status %s)", a.wid, h.exits[a.wid])
				}
				vs = append(vs, violation{
					kind: "overlap",
					msg: fmt.Sprintf("resource %s: worker %s (token %s, %s) and worker %s (token %s, %s) overlap for %v%s",
						r, a.wid, a.token, h.span(a), b.wid, b.token, h.span(b), time.Duration(min(a.end, b.end)-b.start), why),
					from: b.start, to: min(a.end, b.end), wids: []string{a.wid, b.wid},
				})
			}
		}
		var prev *section
		for _, s := range ss {
			if s.token == "-" {
				continue
			}
			if prev != nil {
				p, _ := strconv.ParseUint(prev.token, 10, 64)
				n, _ := strconv.ParseUint(s.token, 10, 64)
				if n <= p {
					vs = append(vs, violation{
						kind: "token",
						msg: fmt.Sprintf("resource %s: token %s of worker %s (started %s) does not exceed token %s of worker %s (started %s)",
							r, s.token, s.wid, h.at(s.start), prev.token, prev.wid, h.at(prev.start)),
						from: prev.start, to: s.start, wids: []string{prev.wid, s.wid},
					})
				}
			}
			prev = s
		}
	}
	return append(vs, h.checkArrivals()...)
}

// faultNear is how long before a lock call a fault still counts as one
// during its wait: the client may still be reconnecting from it.
const faultNear = int64(time.Second)

// checkArrivals requires of every grant whose wait (from
// faultNear before its call to its arrival) saw no fault line that it
// arrived with at least lease.MinUsable of its span to believe: a lock that is
// lost, or about to be, on arrival is a bug whatever the wait. Grants whose
// wait saw a fault are left out: the fault may hold back every answer of
// the confirmation (see the client's Safety).
func (h *history) checkArrivals() []violation {
	var vs []violation
	for _, a := range h.arrivals {
		if a.believed >= int64(lease.MinUsable(time.Duration(a.span))) || h.faultIn(a.call-faultNear, a.at) {
			continue
		}
		vs = append(vs, violation{
			kind: "arrival",
			msg: fmt.Sprintf("resource %s: worker %s was granted the lock at %s after a wait of %v without a fault, "+
				"believed held for only %v (want at least %v)", a.res, a.wid, h.at(a.at), time.Duration(a.at-a.call),
				time.Duration(a.believed), lease.MinUsable(time.Duration(a.span))),
			from: a.call, to: a.at, wids: []string{a.wid},
		})
	}
	return vs
}

// shortAfterFault counts the grants short on arrival whose wait saw a fault
// (those checkArrivals leaves out): the fault may hold back every answer of
// the client's confirmations, so the harness bounds them by the workers
// that were waiting when a fault began (see report).
func (h *history) shortAfterFault() int {
	n := 0
	for _, a := range h.arrivals {
		if a.believed < int64(lease.MinUsable(time.Duration(a.span))) && h.faultIn(a.call-faultNear, a.at) {
			n++
		}
	}
	return n
}

// faultIn reports whether a fault line lies within [from, to].
func (h *history) faultIn(from, to int64) bool {
	for _, t := range h.faults {
		if t >= from && t <= to {
			return true
		}
	}
	return false
}

// learned reports whether the worker of s learned that it lost the lock:
// its section ended early, or it exited with a status other than 0 (the
// worker's 4, mlock run's 75).
func (h *history) learned(s *section) bool {
	st, ok := h.exits[s.wid]
	return s.how != "ok" || ok && st != "0"
}

// tokenLess reports whether token a is known to be below token b.
func tokenLess(a, b string) bool {
	x, err1 := strconv.ParseUint(a, 10, 64)
	y, err2 := strconv.ParseUint(b, 10, 64)
	return err1 == nil && err2 == nil && x < y
}

// at formats t relative to the start of the log.
func (h *history) at(t int64) string {
	if t == 1<<63-1 {
		return "never"
	}
	return fmt.Sprintf("+%.3fs", float64(t-h.origin)/1e9)
}

func (h *history) span(s *section) string {
	return fmt.Sprintf("%s..%s %s", h.at(s.start), h.at(s.end), s.how)
}

// excerpt returns the history lines of v, at most limit: every line of its
// workers except beats, the beats around the boundaries of the window (the
// others are counted), and the harness's fault lines from shortly before.
func (h *history) excerpt(v violation, limit int) string {
	const near = int64(60 * time.Millisecond)
	var b strings.Builder
	n, skipped := 0, map[string]int{}
	flush := func() {
		for _, w := range v.wids {
			if skipped[w] > 0 {
				fmt.Fprintf(&b, "\t\t%9s  (%d beats of %s)\n", "", skipped[w], w)
				delete(skipped, w)
			}
		}
	}
	for i, line := range h.lines {
		ts := h.times[i]
		show := strings.HasPrefix(line, "fault") && ts >= v.from-int64(5*time.Second) && ts <= v.to+near
		for _, w := range v.wids {
			if h.wids[i] != w {
				continue
			}
			if !strings.HasPrefix(line, "beat") || abs(ts-v.from) <= near || abs(ts-v.to) <= near {
				show = true
			} else {
				skipped[w]++
			}
		}
		if !show {
			continue
		}
		flush()
		if n == limit {
			b.WriteString("\t\t...\n")
			return b.String()
		}
		n++
		fmt.Fprintf(&b, "\t\t%9s  %s\n", h.at(ts), line)
	}
	flush()
	return b.String()
}

func abs(d int64) int64 {
	if d < 0 {
		return -d
	}
	return d
}

// TestChecker runs the checker on hand-made histories.
func TestChecker(t *testing.T) {
	for _, tc := range []struct {
		name   string
		log    string
		fenced time.Duration
		want   []string // violation kinds
	}{
		{"sequential", `
start r 1 100 a
beat r 1 150 a
end r 1 200 a ok
start r 2 200 b
end r 2 300 b ok
`, 0, nil},
		{"overlap", `
start r 1 100 a
start r 2 150 b
end r 1 200 a ok
end r 2 300 b ok
`, 0, []string{"overlap"}},
		{"lost end is the last action", `
start r 1 100 a
beat r 1 120 a
end r 1 120 a lost
start r 2 150 b
end r 2 300 b ok
`, 0, nil},
		{"killed without end lasts until dead", `
spawn a 90 exec 1
start r 1 100 a
start r 2 150 b
end r 2 300 b ok
dead a 160 killed
`, 0, []string{"overlap"}},
		{"running without end lasts for ever", `
start r 1 100 a
start r 2 1500 b
end r 2 1600 b ok
`, 0, []string{"overlap"}},
		{"tokens repeat", `
start r 4 100 a
end r 4 200 a ok
start r 1 300 b
end r 1 400 b ok
`, 0, []string{"token"}},
		{"unknown tokens skipped", `
start r 4 100 a
end r 4 200 a ok
start r - 300 b
end r - 400 b ok
start r 5 500 c
end r 5 600 c ok
`, 0, nil},
		{"fenced overlap noticed in time", `
start r 1 100 a
start r 2 150 b
end r 1 200 a lost
end r 2 300 b ok
`, 100, nil},
		{"fenced overlap noticed late", `
start r 1 100 a
start r 2 150 b
end r 1 400 a lost
end r 2 500 b ok
`, 100, []string{"overlap"}},
		{"fenced overlap never noticed", `
start r 1 100 a
start r 2 150 b
end r 1 200 a ok
end r 2 300 b ok
dead a 210 0
`, 100, []string{"overlap"}},
		{"fenced overlap reported at exit", `
start r 1 100 a
start r 2 150 b
end r 1 200 a ok
end r 2 300 b ok
dead a 210 75
`, 100, nil},
		{"fenced overlap with a lower token", `
start r 2 100 a
start r 1 150 b
end r 2 200 a lost
end r 1 300 b ok
`, 100, []string{"overlap", "token"}},
		{"grant usable on arrival", `
grant r 1 5000000000 a 1000000000 1500000000 2000000000
start r 1 5000000000 a
end r 1 5100000000 a ok
`, 0, nil},
		{"grant lost on arrival without a fault", `
grant r 1 5000000000 a 1000000000 0 2000000000
`, 0, []string{"arrival"}},
		{"grant short on arrival without a fault", `
fault 3000000000 proxy cut
grant r 1 5000000000 a 4100000000 600000000 2000000000
`, 0, []string{"arrival"}},
		{"grant short on arrival after a fault in the wait", `
grant r 1 5000000000 a 1000000000 600000000 2000000000
fault 3000000000 proxy cut
`, 0, nil},
		{"resources apart", `
start r 1 100 a
start s 1 150 b
end r 1 200 a ok
end s 1 300 b ok
`, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := parseHistory(strings.NewReader(tc.log))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, v := range h.check(tc.fenced) {
				got = append(got, v.kind)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("violations %v, want %v", h.check(tc.fenced), tc.want)
			}
		})
	}
}
