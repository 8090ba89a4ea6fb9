package scenario

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// ms is a log time: t0 plus n ms.
func ms(n int) int64 { return 1_700_000_000_000_000_000 + int64(n)*int64(time.Millisecond) }

// goodOrder is the log of an order that waited from at to grant, held its
// lock until end and unlocked it.
func goodOrder(id string, at, grant, end int, token uint64, res string) []string {
	return []string{
		fmt.Sprintf("ready %s %d", id, ms(0)),
		fmt.Sprintf("ask %s %d %s", id, ms(at), res),
		fmt.Sprintf("grant %s %d %d %d %s", id, ms(grant), int64(900*time.Millisecond), token, res),
		fmt.Sprintf("start %s %d %d %s", id, ms(grant), token, res),
		fmt.Sprintf("end %s %d %d %s", id, ms(end), token, res),
		fmt.Sprintf("done %s %d", id, ms(end+1)),
	}
}

// TestAnalyze shows that the checks count what they claim to, from logs
// written by hand.
func TestAnalyze(t *testing.T) {
	type counts struct {
		grants, skipped, lostOnArrival, losses, overlaps, tokenInversions, badExits int
		maxWait                                                                     time.Duration
	}
	two := []proc{{id: "a", exit: 0}, {id: "b", exit: 0}}
	for _, tc := range []struct {
		name  string
		procs []proc
		log   []string
		want  counts
		prob  string // a problem that must be reported
	}{
		{"one after the other", two,
			cat(goodOrder("a", 0, 1, 100, 7, "sku:1|sku:2"), goodOrder("b", 0, 101, 200, 8, "sku:2")),
			counts{grants: 2, maxWait: 101 * time.Millisecond}, ""},
		{"disjoint resources at once", two,
			cat(goodOrder("a", 0, 1, 100, 7, "sku:1"), goodOrder("b", 0, 1, 100, 8, "sku:2")),
			counts{grants: 2, maxWait: time.Millisecond}, ""},
		{"overlap on a shared resource", two,
			cat(goodOrder("a", 0, 1, 100, 7, "sku:1|sku:2"), goodOrder("b", 0, 99, 200, 8, "sku:3|sku:2")),
			counts{grants: 2, overlaps: 1, maxWait: 99 * time.Millisecond}, "overlap on sku:2: a"},
		{"section inside a longer one", []proc{{id: "a"}, {id: "b"}, {id: "c"}},
			cat(goodOrder("a", 0, 1, 500, 7, "x"), goodOrder("b", 0, 501, 600, 8, "x"), goodOrder("c", 0, 300, 400, 9, "x")),
			counts{grants: 3, overlaps: 1, tokenInversions: 1, maxWait: 501 * time.Millisecond}, "overlap on x: a"},
		{"tokens out of order", two,
			cat(goodOrder("a", 0, 1, 100, 8, "x"), goodOrder("b", 0, 101, 200, 7, "x")),
			counts{grants: 2, tokenInversions: 1, maxWait: 101 * time.Millisecond}, "token order on x: b (token 7) after a (token 8)"},
		{"believed too short at arrival", []proc{{id: "a"}},
			[]string{fmt.Sprintf("ask a %d x", ms(0)), fmt.Sprintf("grant a %d %d 1 x", ms(3000), int64(600*time.Millisecond)),
				fmt.Sprintf("start a %d 1 x", ms(3000)), fmt.Sprintf("end a %d 1 x", ms(3100))},
			counts{grants: 1, lostOnArrival: 1, maxWait: 3 * time.Second}, "believed held only 600ms at arrival"},
		{"believed short after the worker's stall", []proc{{id: "a"}},
			[]string{fmt.Sprintf("ask a %d x", ms(0)), fmt.Sprintf("grant a %d %d 1 x %d", ms(3000), int64(600*time.Millisecond), int64(60*time.Millisecond)),
				fmt.Sprintf("start a %d 1 x", ms(3000)), fmt.Sprintf("end a %d 1 x", ms(3100))},
			counts{grants: 1, maxWait: 3 * time.Second}, ""},
		{"believed too short even before the worker's stall", []proc{{id: "a"}},
			[]string{fmt.Sprintf("ask a %d x", ms(0)), fmt.Sprintf("grant a %d %d 1 x %d", ms(3000), int64(600*time.Millisecond), int64(40*time.Millisecond)),
				fmt.Sprintf("start a %d 1 x", ms(3000)), fmt.Sprintf("end a %d 1 x", ms(3100))},
			counts{grants: 1, lostOnArrival: 1, maxWait: 3 * time.Second}, "believed held only 600ms at arrival (40ms after"},
		{"a lag above maxArrivalLag excuses only maxArrivalLag", []proc{{id: "a"}},
			[]string{fmt.Sprintf("ask a %d x", ms(0)), fmt.Sprintf("grant a %d %d 1 x %d", ms(3000), int64(300*time.Millisecond), int64(time.Second)),
				fmt.Sprintf("start a %d 1 x", ms(3000)), fmt.Sprintf("end a %d 1 x", ms(3100))},
			counts{grants: 1, lostOnArrival: 1, maxWait: 3 * time.Second}, "believed held only 300ms at arrival (1s after"},
		{"lost on arrival", []proc{{id: "a", exit: 3}},
			[]string{fmt.Sprintf("ask a %d x", ms(0)), fmt.Sprintf("grant a %d 0 1 x", ms(3000)),
				fmt.Sprintf("loss a %d arrival mlock: lock lost: expired", ms(3000))},
			counts{grants: 1, lostOnArrival: 1, badExits: 1, maxWait: 3 * time.Second}, "exit status 3"},
		{"lost during the hold", []proc{{id: "a", exit: 3}},
			[]string{fmt.Sprintf("ask a %d x", ms(0)), fmt.Sprintf("grant a %d %d 1 x", ms(10), int64(900*time.Millisecond)),
				fmt.Sprintf("start a %d 1 x", ms(10)), fmt.Sprintf("loss a %d hold expired", ms(50))},
			counts{grants: 1, losses: 1, badExits: 1, maxWait: 10 * time.Millisecond}, "its critical section did not end"},
		{"a lost section ends at its loss", []proc{{id: "a", exit: 3}, {id: "b"}},
			cat([]string{fmt.Sprintf("ask a %d x", ms(0)), fmt.Sprintf("grant a %d %d 1 x", ms(10), int64(900*time.Millisecond)),
				fmt.Sprintf("start a %d 1 x", ms(10)), fmt.Sprintf("loss a %d hold expired", ms(50))},
				goodOrder("b", 0, 2000, 2100, 2, "x")),
			counts{grants: 2, losses: 1, badExits: 1, maxWait: 2 * time.Second}, "did not end"},
		{"a section that runs on after its loss is granted to another", []proc{{id: "a", exit: 3}, {id: "b"}},
			cat([]string{fmt.Sprintf("ask a %d x", ms(0)), fmt.Sprintf("grant a %d %d 1 x", ms(10), int64(900*time.Millisecond)),
				fmt.Sprintf("start a %d 1 x", ms(10)), fmt.Sprintf("loss a %d hold expired", ms(50))},
				goodOrder("b", 0, 40, 100, 2, "x")),
			counts{grants: 2, losses: 1, overlaps: 1, badExits: 1, maxWait: 40 * time.Millisecond}, "overlap on x: a"},
		{"a killed worker's section may run on", []proc{{id: "a", exit: -1}, {id: "b"}},
			cat([]string{fmt.Sprintf("ask a %d x", ms(0)), fmt.Sprintf("grant a %d %d 1 x", ms(10), int64(900*time.Millisecond)),
				fmt.Sprintf("start a %d 1 x", ms(10))},
				goodOrder("b", 0, 2000, 2100, 2, "x")),
			counts{grants: 2, overlaps: 1, badExits: 1, maxWait: 2 * time.Second}, "overlap on x: a"},
		{"cron runs: one ran, one skipped, one waited", []proc{{id: "w", role: waiter, launched: ms(0)},
			{id: "s", role: skipper, launched: ms(0)}, {id: "r", role: skipper, launched: ms(0)}},
			[]string{fmt.Sprintf("start r %d 5 job %d", ms(10), ms(1010)/1e6), fmt.Sprintf("end r %d 5 job", ms(110)),
				fmt.Sprintf("start w %d 6 job %d", ms(120), ms(1120)/1e6), fmt.Sprintf("end w %d 6 job", ms(220))},
			counts{grants: 2, skipped: 1, maxWait: 120 * time.Millisecond}, ""},
		{"cron run refused to start its command", []proc{{id: "w", role: waiter, exit: 125}},
			nil, counts{lostOnArrival: 1, badExits: 1}, "never granted"},
		{"cron run stopped for a loss", []proc{{id: "w", role: waiter, exit: 75, launched: ms(0)}},
			[]string{fmt.Sprintf("start w %d 6 job %d", ms(120), ms(1120)/1e6)},
			counts{grants: 1, losses: 1, badExits: 1, maxWait: 120 * time.Millisecond}, "did not end"},
		// mlock run stops its command for a loss (exit 75) kill-after +
		// 100 ms before its Deadline, so that it is dead before the lease
		// can end on the server and the next run be granted: the section
		// ends where the command said it stopped, else when mlock run
		// exited (it reaps its command first), not never.
		{"cron run stopped for a loss, then the next run", []proc{{id: "w", role: waiter, exit: 75, launched: ms(0), exited: ms(700)},
			{id: "v", role: waiter, launched: ms(0), exited: ms(900)}},
			[]string{fmt.Sprintf("start w %d 6 job %d", ms(120), ms(620)/1e6), fmt.Sprintf("stop w %d 6 job", ms(400)),
				fmt.Sprintf("start v %d 7 job %d", ms(640), ms(1140)/1e6), fmt.Sprintf("end v %d 7 job", ms(790))},
			counts{grants: 2, losses: 1, badExits: 1, maxWait: 640 * time.Millisecond}, "did not end"},
		{"cron run stopped for a loss, no stop line: until mlock run exited", []proc{{id: "w", role: waiter, exit: 75, launched: ms(0), exited: ms(500)},
			{id: "v", role: waiter, launched: ms(0), exited: ms(900)}},
			[]string{fmt.Sprintf("start w %d 6 job %d", ms(120), ms(620)/1e6),
				fmt.Sprintf("start v %d 7 job %d", ms(640), ms(1140)/1e6), fmt.Sprintf("end v %d 7 job", ms(790))},
			counts{grants: 2, losses: 1, badExits: 1, maxWait: 640 * time.Millisecond}, "did not end"},
		{"cron run stopped after the next run started", []proc{{id: "w", role: waiter, exit: 75, launched: ms(0), exited: ms(800)},
			{id: "v", role: waiter, launched: ms(0), exited: ms(900)}},
			[]string{fmt.Sprintf("start w %d 6 job %d", ms(120), ms(620)/1e6), fmt.Sprintf("stop w %d 6 job", ms(650)),
				fmt.Sprintf("start v %d 7 job %d", ms(640), ms(1140)/1e6), fmt.Sprintf("end v %d 7 job", ms(790))},
			counts{grants: 2, losses: 1, overlaps: 1, badExits: 1, maxWait: 640 * time.Millisecond}, "overlap on job: w"},
		{"cron run stopped, exited after the next run started", []proc{{id: "w", role: waiter, exit: 75, launched: ms(0), exited: ms(660)},
			{id: "v", role: waiter, launched: ms(0), exited: ms(900)}},
			[]string{fmt.Sprintf("start w %d 6 job %d", ms(120), ms(620)/1e6),
				fmt.Sprintf("start v %d 7 job %d", ms(640), ms(1140)/1e6), fmt.Sprintf("end v %d 7 job", ms(790))},
			counts{grants: 2, losses: 1, overlaps: 1, badExits: 1, maxWait: 640 * time.Millisecond}, "overlap on job: w"},
		{"cron run started with little lease left (shown, not checked)", []proc{{id: "w", role: waiter, launched: ms(0)}},
			[]string{fmt.Sprintf("start w %d 6 job %d", ms(120), ms(200)/1e6), fmt.Sprintf("end w %d 6 job", ms(190))},
			counts{grants: 1, maxWait: 120 * time.Millisecond}, ""},
		{"a line of a process not started", []proc{{id: "a"}},
			cat(goodOrder("a", 0, 1, 100, 7, "x"), []string{fmt.Sprintf("ready z %d", ms(0))}),
			counts{grants: 1, maxWait: time.Millisecond}, "unknown process"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var evs []event
			for _, l := range tc.log {
				e, err := parseLine(l)
				if err != nil {
					t.Fatalf("%q: %v", l, err)
				}
				evs = append(evs, e)
			}
			r := analyze("single", tc.name, time.Second, tc.procs, evs)
			got := counts{r.grants, r.skipped, r.lostOnArrival, r.losses, r.overlaps, r.tokenInversions, r.badExits, r.maxWait()}
			if got != tc.want {
				t.Errorf("got %+v, want %+v\nproblems: %s", got, tc.want, strings.Join(r.problems, "\n"))
			}
			all := strings.Join(r.problems, "\n")
			if tc.prob != "" && !strings.Contains(all, tc.prob) {
				t.Errorf("problems do not name %q:\n%s", tc.prob, all)
			}
			if tc.prob == "" && tc.want == (counts{grants: tc.want.grants, skipped: tc.want.skipped, maxWait: tc.want.maxWait}) && all != "" {
				t.Errorf("problems in a clean log:\n%s", all)
			}
		})
	}
}

func TestUsable(t *testing.T) {
	for ttl, want := range map[time.Duration]time.Duration{
		time.Second:            (990*time.Millisecond - 5*time.Millisecond) * 2 / 3,
		2 * time.Second:        (1980*time.Millisecond - 5*time.Millisecond) * 2 / 3,
		500 * time.Millisecond: (495*time.Millisecond - 5*time.Millisecond) * 2 / 3,
	} {
		if got := usable(ttl); got != want {
			t.Errorf("usable(%v) = %v, want %v", ttl, got, want)
		}
	}
}

func TestPercentile(t *testing.T) {
	d := []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for p, want := range map[float64]time.Duration{50: 5, 99: 10, 100: 10, 0: 1, 10: 1, 11: 2} {
		if got := percentile(d, p); got != want {
			t.Errorf("percentile(1..10, %v) = %v, want %v", p, got, want)
		}
	}
	if got := percentile(nil, 50); got != 0 {
		t.Errorf("percentile(nil) = %v, want 0", got)
	}
}

func TestParseLine(t *testing.T) {
	for _, tc := range []struct {
		line string
		want event
		err  string
	}{
		{"ready o1 5", event{kind: "ready", id: "o1", ns: 5}, ""},
		{"ask o1 5 a|b", event{kind: "ask", id: "o1", ns: 5, resources: []string{"a", "b"}}, ""},
		{"grant o1 5 -3 9 a", event{kind: "grant", id: "o1", ns: 5, believed: -3, token: 9, resources: []string{"a"}}, ""},
		{"grant o1 5 -3 9 a 40", event{kind: "grant", id: "o1", ns: 5, believed: -3, token: 9, resources: []string{"a"}, lag: 40}, ""},
		{"grant o1 5 -3 9 a -1", event{}, "grant: lag"},
		{"start o1 5 9 a 1700", event{kind: "start", id: "o1", ns: 5, token: 9, resources: []string{"a"}, expiresAt: 1700}, ""},
		{"end o1 5 9 a", event{kind: "end", id: "o1", ns: 5, token: 9, resources: []string{"a"}}, ""},
		{"stop o1 5 9 a", event{kind: "stop", id: "o1", ns: 5, token: 9, resources: []string{"a"}}, ""},
		{"end o1 5 9 a 1700", event{}, "want 2 fields"},
		{"stop o1 5", event{}, "want 2 to 3 fields"},
		{"loss o1 5 hold lock lost: expired", event{kind: "loss", id: "o1", ns: 5, text: "hold lock lost: expired"}, ""},
		{"", event{}, "want at least"},
		{"ready o1", event{}, "want at least"},
		{"ready  5", event{}, "empty id"},
		{"ready o1 0", event{}, "want Unix ns > 0"},
		{"ready o1 x", event{}, "want Unix ns > 0"},
		{"ready o1 5 extra", event{}, "want 0 to 0 fields"},
		{"ask o1 5 a||b", event{}, "empty name"},
		{"grant o1 5 1 -1 a", event{}, "token"},
		{"grant o1 5 x 1 a", event{}, "believed"},
		{"start o1 5 1 a 0", event{}, "want Unix ms > 0"},
		{"end o1 5", event{}, "want 2 to 3 fields"},
		{"loss o1 5", event{}, "want 1 to"},
		{"hello o1 5", event{}, "unknown kind"},
		{"ready o1 5\x00", event{}, "want Unix ns"},
		{"ready o1 " + strings.Repeat("1", maxLine), event{}, "over"},
	} {
		t.Run(tc.line, func(t *testing.T) {
			got, err := parseLine(tc.line)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("parseLine(%q) = %+v, %v; want an error with %q", tc.line, got, err, tc.err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("parseLine(%q) = %+v, %v; want %+v", tc.line, got, err, tc.want)
			}
			if line := formatLine(got); line != tc.line {
				t.Errorf("formatLine = %q, want %q", line, tc.line)
			}
		})
	}
}

// FuzzParseLine: any line parses or is refused with an error, never a
// panic; what parses formats back to a line that parses to the same event.
func FuzzParseLine(f *testing.F) {
	for _, s := range []string{"ready o1 5", "ask o1 5 a|b", "grant o1 5 -3 9 a", "start o1 5 9 a 1700",
		"end o1 5 9 a|b|c", "stop o1 5 9 a", "loss o1 5 hold lock lost", "error o1 5 lock: timeout", "done o1 5", "grant o 1 1 1 |"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		e, err := parseLine(line)
		if err != nil {
			return
		}
		again, err := parseLine(formatLine(e))
		if err != nil {
			t.Fatalf("%q parsed to %+v, whose line %q does not parse: %v", line, e, formatLine(e), err)
		}
		if !reflect.DeepEqual(again, e) {
			t.Fatalf("%q: %+v, then %+v", line, e, again)
		}
	})
}

func TestAnalyzeLeastLeft(t *testing.T) {
	cron := analyze("single", "cron", time.Second, []proc{{id: "w", launched: ms(0)}}, []event{
		{kind: "start", id: "w", ns: ms(100), token: 1, resources: []string{"job"}, expiresAt: ms(180) / 1e6},
		{kind: "end", id: "w", ns: ms(150), token: 1, resources: []string{"job"}}})
	if !cron.leftKnown || !cron.serverLease || cron.leastLeft != 80*time.Millisecond || cron.lostOnArrival != 0 {
		t.Errorf("cron: least left %v (known %v, server's lease %v), %d lost on arrival; want 80ms, the server's lease, 0",
			cron.leastLeft, cron.leftKnown, cron.serverLease, cron.lostOnArrival)
	}
	var evs []event
	for _, l := range cat(goodOrder("a", 0, 1, 100, 7, "x"), goodOrder("b", 0, 101, 200, 8, "x")) {
		e, err := parseLine(l)
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, e)
	}
	orders := analyze("single", "orders", time.Second, []proc{{id: "a"}, {id: "b"}}, evs)
	if !orders.leftKnown || orders.serverLease || orders.leastLeft != 900*time.Millisecond {
		t.Errorf("orders: least left %v (known %v, server's lease %v); want 900ms believed", orders.leastLeft, orders.leftKnown, orders.serverLease)
	}
	if !strings.Contains(orders.row(), "900ms (657ms)") || !strings.Contains(cron.row(), "80ms* (not checked)") {
		t.Errorf("rows do not show the least left:\n%s\n%s", orders.row(), cron.row())
	}
}

func cat(parts ...[]string) []string {
	var all []string
	for _, p := range parts {
		all = append(all, p...)
	}
	return all
}

// LogLine writes what parseLine reads back: kind, id, the time in Unix ns
// and each argument as fmt.Sprint writes it.
func TestLogLine(t *testing.T) {
	at := time.Unix(0, 1_700_000_000_123_456_789)
	line := LogLine("grant", "o1", at, int64(-3), uint64(9), "a|b")
	if want := "grant o1 1700000000123456789 -3 9 a|b"; line != want {
		t.Fatalf("LogLine = %q, want %q", line, want)
	}
	e, err := parseLine(line)
	if err != nil || e.kind != "grant" || e.id != "o1" || e.ns != at.UnixNano() || e.believed != -3 || e.token != 9 ||
		!slices.Equal(e.resources, []string{"a", "b"}) {
		t.Fatalf("parseLine(%q) = %+v, %v", line, e, err)
	}
	if got := LogLine("ready", "o1", at); got != "ready o1 1700000000123456789" {
		t.Fatalf("LogLine without arguments = %q", got)
	}
}
