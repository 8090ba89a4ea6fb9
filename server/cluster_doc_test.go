package server

import (
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// docSection returns the text of the "## name" section of doc.
func docSection(t *testing.T, doc, name string) string {
	t.Helper()
	i := strings.Index(doc, "\n## "+name+"\n")
	if i < 0 {
		t.Fatalf("docs/cluster.md has no section %q", name)
	}
	rest := doc[i+len(name)+5:]
	if j := strings.Index(rest, "\n## "); j >= 0 {
		rest = rest[:j]
	}
	return rest
}

// atoiAll returns the integers of the first group of every match of re.
func atoiAll(t *testing.T, re *regexp.Regexp, s string) []int {
	t.Helper()
	var out []int
	for _, m := range re.FindAllStringSubmatch(s, -1) {
		n, err := strconv.Atoi(m[1])
		if err != nil {
			t.Fatalf("%q: %v", m[0], err)
		}
		out = append(out, n)
	}
	return out
}

// TestRunbookVersions reads docs/cluster.md: the cluster versions and log
// formats its upgrade runbook says the nodes print, and its tables of log
// and snapshot formats, must be this build's (logFormat, snapFormat): the
// runbook once promised "logFormat": 2 and "version": 2 while the builds
// printed 3.
func TestRunbookVersions(t *testing.T) {
	data, err := os.ReadFile("../docs/cluster.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	up := docSection(t, doc, "Upgrades")

	// What a node of this build prints in the mixed cluster and after.
	formats := atoiAll(t, regexp.MustCompile(`"logFormat": (\d+)`), up)
	if len(formats) == 0 {
		t.Fatal(`the Upgrades runbook names no "logFormat": what step 5 checks`)
	}
	for _, f := range formats {
		if f != logFormat {
			t.Errorf(`the Upgrades runbook says a new node prints "logFormat": %d; this build reads log formats up to %d`, f, logFormat)
		}
	}
	mixed := atoiAll(t, regexp.MustCompile("every new node says `\"version\": (\\d+)`"), up)
	after := atoiAll(t, regexp.MustCompile("After the last node, every node says `\"version\": (\\d+)`"), up)
	keeps := atoiAll(t, regexp.MustCompile(`on the new build \(steps 1 to 5\) keeps version (\d+)`), up)
	raised := atoiAll(t, regexp.MustCompile(`(\d+) with this build`), up)
	if len(mixed) != 1 || len(after) != 1 || len(keeps) != 1 || len(raised) != 1 {
		t.Fatalf("the Upgrades runbook: want one version while mixed, after the last node, after the restarts, and raised to; "+
			"found %v, %v, %v, %v", mixed, after, keeps, raised)
	}
	if mixed[0] != logFormat1 {
		t.Errorf(`the Upgrades runbook says the mixed cluster's version is %d; it is %d (the previous release announces nothing)`, mixed[0], logFormat1)
	}
	for _, v := range []int{after[0], keeps[0], raised[0]} {
		if v != logFormat {
			t.Errorf("the Upgrades runbook says the version after the upgrade is %d; this build raises it to %d", v, logFormat)
		}
	}
	for _, v := range atoiAll(t, regexp.MustCompile(`"version": (\d+)`), up) {
		if v != logFormat1 && v != logFormat {
			t.Errorf(`the Upgrades runbook names "version": %d: neither the mixed cluster's (%d) nor this build's (%d)`, v, logFormat1, logFormat)
		}
	}

	// The tables of formats end with this build's.
	lf := docSection(t, doc, "Log and snapshot formats")
	table := lf[strings.Index(lf, "Log formats:"):]
	table = table[strings.Index(table, "\n|"):]
	table = table[:strings.Index(table, "\n\n")]
	rows := atoiAll(t, regexp.MustCompile(`(?m)^\| (\d+) \|`), table)
	if len(rows) == 0 || rows[len(rows)-1] != logFormat {
		t.Errorf("the table of log formats has the rows %v; this build's last format is %d", rows, logFormat)
	}
	for i, r := range rows {
		if r != i+1 {
			t.Errorf("the table of log formats has the rows %v, want 1 to %d", rows, logFormat)
			break
		}
	}
	snaps := atoiAll(t, regexp.MustCompile(`format (\d+) carries`), lf)
	if len(snaps) == 0 || snaps[len(snaps)-1] != snapFormat {
		t.Errorf("the snapshot formats named are %v; this build writes snapshot format %d at most", snaps, snapFormat)
	}
	// The rollback runbook: the version it lowers to is the previous
	// release's format, the one the nodes then print; after the cancel,
	// this build's; the status fields it names are the status's.
	rb := docSection(t, doc, "Rollback")
	tos := atoiAll(t, regexp.MustCompile(`--to (\d+)`), rb)
	if len(tos) == 0 {
		t.Fatal("the Rollback runbook names no --to")
	}
	for _, v := range tos {
		if v != logFormat1 {
			t.Errorf("the Rollback runbook lowers to version %d; a rollback lowers to %d only", v, logFormat1)
		}
	}
	for _, v := range atoiAll(t, regexp.MustCompile(`"version": (\d+)`), rb) {
		if v != logFormat1 && v != logFormat {
			t.Errorf(`the Rollback runbook names "version": %d: neither the lowered version (%d) nor this build's (%d)`, v, logFormat1, logFormat)
		}
	}
	if again := atoiAll(t, regexp.MustCompile("every node says `\"version\": (\\d+)` again"), rb); len(again) != 1 || again[0] != logFormat {
		t.Errorf("the Rollback runbook's version after the cancel: %v, want [%d]", again, logFormat)
	}
	tags := map[string]bool{}
	st := reflect.TypeFor[ClusterStatus]()
	for i := range st.NumField() {
		name, _, _ := strings.Cut(st.Field(i).Tag.Get("json"), ",")
		tags[name] = true
	}
	for _, m := range regexp.MustCompile(`"([a-zA-Z]+)": (?:true|\d)`).FindAllStringSubmatch(rb, -1) {
		if !tags[m[1]] {
			t.Errorf("the Rollback runbook names the status field %q; the cluster status has no such field", m[1])
		}
	}

	// The refusal a stale node's client gets is in docs/protocol.md.
	proto, err := os.ReadFile("../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(proto), "`node cannot read the cluster log!`") {
		t.Error("docs/protocol.md does not list the error `node cannot read the cluster log!`")
	}
}
