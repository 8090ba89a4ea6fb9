package auth

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Tokens of the test files and their lines' credentials.
const (
	tokOrders = "orders-token"
	tokOps    = "ops-token"
)

var (
	hashOrders = Hash(tokOrders)
	hashOps    = Hash(tokOps)
)

func mustParse(t *testing.T, text string) *Table {
	t.Helper()
	tab, err := Parse(strings.NewReader(text))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return tab
}

var addr = netip.MustParseAddr

func TestParseValid(t *testing.T) {
	text := "# the principals\n" +
		"\n" +
		"orders " + hashOrders + " prefix=order: prefix=invoice: prefix=order:   # two prefixes\n" +
		"  ops\t" + hashOps[:7] + strings.ToUpper(hashOps[7:]) + " admin prefix=x from=10.0.0.0/8 from=fd00::/8\r\n" +
		"all " + hashOrders + " prefix=a prefix=*\n" +
		"legacy - prefix=batch: from=192.168.7.0/24 from=::ffff:192.168.8.0/120 from=2001:db8::1\n" +
		"worker-1 - prefix=job# cert\n" +
		"#comment only\n" +
		"mixed@x.y_z " + hashOps + " prefix=m cert\n"
	tab := mustParse(t, text)
	if tab.Len() != 6 {
		t.Fatalf("Len = %d, want 6", tab.Len())
	}
	if w := tab.Warnings(); w != nil {
		t.Errorf("Warnings = %q", w)
	}
	want := map[string]Principal{
		"orders":      {Name: "orders", Prefixes: []string{"order:", "invoice:"}},
		"ops":         {Name: "ops", Admin: true},
		"all":         {Name: "all"},
		"legacy":      {Name: "legacy", Prefixes: []string{"batch:"}},
		"worker-1":    {Name: "worker-1", Prefixes: []string{"job#"}},
		"mixed@x.y_z": {Name: "mixed@x.y_z", Prefixes: []string{"m"}},
	}
	for name, w := range want {
		e := tab.byName[name]
		if e == nil {
			t.Errorf("%s: missing", name)
			continue
		}
		if e.p.Name != w.Name || e.p.Admin != w.Admin || !slices.Equal(e.p.Prefixes, w.Prefixes) || (e.p.Prefixes == nil) != (w.Prefixes == nil) {
			t.Errorf("%s: got %+v, want %+v", name, e.p, w)
		}
	}
	if got := tab.byName["legacy"].from; !slices.Equal(got, []netip.Prefix{
		netip.MustParsePrefix("192.168.7.0/24"), netip.MustParsePrefix("192.168.8.0/24"), netip.MustParsePrefix("2001:db8::1/128"),
	}) {
		t.Errorf("legacy from = %v", got)
	}
	if _, err := tab.Token("ops", tokOps, addr("10.1.2.3")); err != nil {
		t.Errorf("upper-case hex: %v", err)
	}
}

func TestParseErrors(t *testing.T) {
	const secret = "hunter2-very-secret"
	tests := []struct {
		name, text string
		line       int
		want       string // in the message
	}{
		{"plain token", "alice " + secret + " prefix=a\n", 1, "mlock token"},
		{"plain token with colon", "alice tok:" + secret + " prefix=a\n", 1, "sha256:<64 hex digits>"},
		{"short hash", "alice sha256:" + hashOrders[7:20] + " prefix=a\n", 1, "64 hex digits"},
		{"bad hex", "alice sha256:" + strings.Repeat("g", 64) + " prefix=a\n", 1, "64 hex digits"},
		{"sha256 secret", "alice sha256:" + secret + " prefix=a\n", 1, "64 hex digits"},
		{"single field", "\n" + secret + "\n", 2, "single field"},
		{"name too long", strings.Repeat("a", 65) + " - prefix=a cert\n", 1, "longer than 64"},
		{"name with colon", "al:ice " + hashOrders + " prefix=a\n", 1, "byte 3"},
		{"name non-ascii", "alicé " + hashOrders + " prefix=a\n", 1, "[A-Za-z0-9._@-]"},
		{"grants nothing", "# c\nalice " + hashOrders + "\n", 2, "grants nothing"},
		{"grants nothing, cert", "alice - cert from=10.0.0.1\n", 1, "grants nothing"},
		{"token-less unreachable", "alice - prefix=a\n", 1, "neither by address"},
		{"duplicate", "alice " + hashOrders + " prefix=a\nbob - admin cert\nalice - admin cert\n", 3, `"alice" is already defined on line 1`},
		{"overlap", "a - admin from=10.0.0.0/8\nb - admin from=10.1.0.0/16\n", 2, `overlaps from=10.0.0.0/8 of the token-less principal "a" (line 1)`},
		{"overlap mapped", "a - admin from=10.0.0.1\nb - admin from=::ffff:10.0.0.0/120\n", 2, "overlaps"},
		{"overlap v6", "a - admin from=fd00::/8\nb - admin from=fd00::1\n", 2, "overlaps"},
		{"unknown perm", "alice " + hashOrders + " prefix=a " + secret + "\n", 1, "unknown permission (field 4)"},
		{"unknown keyed perm", "alice " + hashOrders + " prefix=a pre=" + secret + "\n", 1, `unknown permission "pre="`},
		{"prefix without =", "alice " + hashOrders + " prefix\n", 1, "unknown permission (field 3)"},
		{"empty prefix", "alice " + hashOrders + " prefix=\n", 1, "prefix=*"},
		{"glob prefix", "alice " + hashOrders + " prefix=order:*\n", 1, "literal"},
		{"control prefix", "alice " + hashOrders + " prefix=a\x01\n", 1, "control"},
		{"bad from", "alice " + hashOrders + " prefix=a from=10.0.0\n", 1, "from=10.0.0: not a CIDR"},
		{"bad cidr", "alice " + hashOrders + " prefix=a from=10.0.0.0/33\n", 1, "not a CIDR"},
		{"host bits", "alice - prefix=a from=10.0.0.1/8\n", 1, "did you mean from=10.0.0.0/8"},
		{"zone", "alice - prefix=a from=fe80::1%eth0\n", 1, "not a CIDR"},
		{"short mapped", "alice - prefix=a from=::ffff:0.0.0.0/95\n", 1, "host bits"},
		{"quota zero", "alice " + hashOrders + " prefix=a max-locks=0\n", 1, "max-locks=: want a number from 1"},
		{"quota negative", "alice " + hashOrders + " prefix=a max-sessions=-1\n", 1, "max-sessions=: want a number"},
		{"quota too large", "alice " + hashOrders + " prefix=a max-conns=1000000001\n", 1, "max-conns=: want a number"},
		{"quota huge", "alice " + hashOrders + " prefix=a max-conns=99999999999999999999999\n", 1, "max-conns=: want"},
		{"quota empty", "alice " + hashOrders + " prefix=a max-locks=\n", 1, "max-locks=: want"},
		{"quota secret", "alice " + hashOrders + " prefix=a max-locks=" + secret + "\n", 1, "max-locks=: want"},
		{"quota twice", "alice " + hashOrders + " prefix=a max-locks=5 max-locks=unlimited\n", 1, "max-locks= is given twice"},
		{"long line", "alice - admin cert prefix=" + strings.Repeat("x", maxLine) + "\n", 1, "longer than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tab, err := Parse(strings.NewReader(tt.text))
			if err == nil {
				t.Fatalf("Parse succeeded: %d principals", tab.Len())
			}
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("error %T %v, want *ParseError", err, err)
			}
			if pe.Line != tt.line {
				t.Errorf("line %d, want %d (%v)", pe.Line, tt.line, err)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, fmt.Sprintf("line %d: ", tt.line)) || !strings.Contains(msg, tt.want) {
				t.Errorf("error %q, want line %d and %q", msg, tt.line, tt.want)
			}
			if strings.Contains(msg, secret) || strings.Contains(msg, hashOrders[7:20]) {
				t.Errorf("error repeats a credential: %q", msg)
			}
		})
	}
}

func TestSameNetworkTwiceInOnePrincipal(t *testing.T) {
	tab := mustParse(t, "a - admin from=10.0.0.0/8 from=10.0.0.0/8 from=10.1.0.0/16\n")
	if p, ok := tab.Address(addr("10.1.1.1")); !ok || p.Name != "a" {
		t.Fatalf("Address = %v, %v", p, ok)
	}
}

func TestTokenlessPrincipalsMayShareNetworksWithTokens(t *testing.T) {
	// from= of a token restricts the token; it does not compete for
	// addresses with the token-less principals.
	tab := mustParse(t, "a - prefix=a from=10.0.0.0/8\nb "+hashOrders+" prefix=b from=10.0.0.0/8\n")
	if p, ok := tab.Address(addr("10.0.0.1")); !ok || p.Name != "a" {
		t.Fatalf("Address = %v, %v", p, ok)
	}
	if p, err := tab.Token("b", tokOrders, addr("10.0.0.1")); err != nil || p.Name != "b" {
		t.Fatalf("Token = %v, %v", p, err)
	}
}

func TestWarnings(t *testing.T) {
	tab := mustParse(t, "a - prefix=a from=0.0.0.0/0\nb - prefix=b from=::/0\nc "+hashOps+" admin from=0.0.0.0/0\n")
	w := tab.Warnings()
	if len(w) != 2 || !strings.Contains(w[0], `line 1: the token-less principal "a" covers every IPv4 address`) || !strings.Contains(w[1], "every IPv6 address") {
		t.Errorf("Warnings = %q", w)
	}
}

var tokenFile = "orders " + hashOrders + " prefix=order:\n" +
	"ops " + hashOps + " admin from=10.0.0.0/8 from=2001:db8::/32\n" +
	"legacy - prefix=batch: from=192.168.7.0/24 from=fd00::/8\n" +
	"worker - prefix=job: cert\n" +
	"both " + hashOrders + " prefix=both: cert from=10.9.9.9\n"

func TestToken(t *testing.T) {
	tab := mustParse(t, tokenFile)
	tests := []struct {
		name, token, addr string
		ok                bool
	}{
		{"orders", tokOrders, "203.0.113.1", true},
		{"orders", tokOrders, "", true}, // no from=: any address, even none
		{"orders", tokOps, "203.0.113.1", false},
		{"orders", tokOrders + "x", "203.0.113.1", false},
		{"orders", "", "203.0.113.1", false},
		{"nobody", tokOrders, "203.0.113.1", false},
		{"", "", "203.0.113.1", false},
		{"ops", tokOps, "10.200.0.1", true},
		{"ops", tokOps, "::ffff:10.200.0.1", true},
		{"ops", tokOps, "2001:db8::7%eth0", true},
		{"ops", tokOps, "11.0.0.1", false},
		{"ops", tokOps, "", false},
		{"legacy", "", "192.168.7.1", false},
		{"legacy", tokOrders, "192.168.7.1", false},
		{"worker", "", "127.0.0.1", false},
		{"both", tokOrders, "10.9.9.9", true},
		{"both", tokOrders, "10.9.9.8", false},
	}
	for _, tt := range tests {
		var a netip.Addr
		if tt.addr != "" {
			a = addr(tt.addr)
		}
		p, err := tab.Token(tt.name, tt.token, a)
		if tt.ok {
			if err != nil || p == nil || p.Name != tt.name {
				t.Errorf("Token(%q, %q, %v) = %v, %v; want the principal", tt.name, tt.token, tt.addr, p, err)
			}
			continue
		}
		if err != ErrAuthFailed || p != nil {
			t.Errorf("Token(%q, %q, %v) = %v, %v; want ErrAuthFailed", tt.name, tt.token, tt.addr, p, err)
		}
	}
}

func TestAddress(t *testing.T) {
	tab := mustParse(t, tokenFile)
	tests := []struct {
		addr string
		want string // "" = none
	}{
		{"192.168.7.0", "legacy"},
		{"192.168.7.255", "legacy"},
		{"::ffff:192.168.7.9", "legacy"},
		{"fd12::1%eth0", "legacy"},
		{"192.168.8.1", ""},
		{"10.0.0.1", ""}, // ops has a token: its from= restricts, it does not cover
		{"10.9.9.9", ""},
		{"127.0.0.1", ""},
	}
	for _, tt := range tests {
		p, ok := tab.Address(addr(tt.addr))
		if tt.want == "" {
			if ok || p != nil {
				t.Errorf("Address(%s) = %v, want none", tt.addr, p)
			}
		} else if !ok || p.Name != tt.want {
			t.Errorf("Address(%s) = %v, %v; want %s", tt.addr, p, ok, tt.want)
		}
	}
	if p, ok := tab.Address(netip.Addr{}); ok || p != nil {
		t.Errorf("Address(zero) = %v", p)
	}
}

func TestCert(t *testing.T) {
	tab := mustParse(t, tokenFile)
	for name, want := range map[string]bool{"worker": true, "both": true, "orders": false, "legacy": false, "nobody": false, "": false} {
		p, ok := tab.Cert(name)
		if ok != want || (ok && p.Name != name) || (!ok && p != nil) {
			t.Errorf("Cert(%q) = %v, %v; want %v", name, p, ok, want)
		}
	}
}

func TestLookupsReturnTheSamePrincipal(t *testing.T) {
	tab := mustParse(t, "x "+hashOrders+" prefix=x cert\ny - prefix=y cert from=10.0.0.0/8\n")
	p1, _ := tab.Token("x", tokOrders, netip.Addr{})
	p2, _ := tab.Cert("x")
	if p1 == nil || p1 != p2 {
		t.Errorf("Token and Cert give %p and %p", p1, p2)
	}
	p3, _ := tab.Address(addr("10.0.0.1"))
	p4, _ := tab.Cert("y")
	if p3 == nil || p3 != p4 {
		t.Errorf("Address and Cert give %p and %p", p3, p4)
	}
}

func TestMay(t *testing.T) {
	p := &Principal{Name: "p", Prefixes: []string{"order:", "invoice:"}}
	for res, want := range map[string]bool{"order:1": true, "order:": true, "invoice:x": true, "orde": false, "x": false, "": false, "Order:1": false} {
		if got := p.May(res); got != want {
			t.Errorf("May(%q) = %v", res, got)
		}
	}
	if !(&Principal{}).May("anything") || !(&Principal{Admin: true, Prefixes: []string{"a"}}).May("b") || !Anonymous().May("x") {
		t.Error("nil prefixes or admin do not allow every resource")
	}
	if a := Anonymous(); a.Name != "" || !a.Admin || a.Prefixes != nil || a == Anonymous() {
		t.Errorf("Anonymous = %+v", a)
	}
	if n := testing.AllocsPerRun(100, func() { p.May("invoice:9") }); n != 0 {
		t.Errorf("May allocates %v times", n)
	}
}

func writeFile(t *testing.T, text string, mode os.FileMode) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "auth")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestLoad(t *testing.T) {
	path := writeFile(t, tokenFile, 0o600)
	tab, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if tab.Len() != 5 || tab.Warnings() != nil {
		t.Errorf("Len %d, Warnings %q", tab.Len(), tab.Warnings())
	}

	_, err = Load(writeFile(t, "ok - admin cert\nbad "+tokOrders+" admin\n", 0o600))
	var pe *ParseError
	if !errors.As(err, &pe) || pe.Line != 2 || !strings.HasSuffix(pe.File, "auth") || !strings.Contains(err.Error(), pe.File+":2: ") {
		t.Errorf("Load error = %v", err)
	}

	if _, err := Load(filepath.Join(t.TempDir(), "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load(missing) = %v", err)
	}
}

func TestLoadPermissions(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("no permission bits")
	}
	tab, err := Load(writeFile(t, "a - prefix=a from=0.0.0.0/0\n", 0o644))
	if err != nil {
		t.Fatal(err)
	}
	if w := tab.Warnings(); len(w) != 2 || !strings.Contains(w[0], "mode 0644: group or others may read") || !strings.Contains(w[1], "every IPv4") {
		t.Errorf("Warnings = %q", w)
	}
	for _, mode := range []os.FileMode{0o620, 0o602, 0o666} {
		_, err := Load(writeFile(t, tokenFile, mode))
		var pe *ParseError
		if !errors.As(err, &pe) || pe.Line != 0 || !strings.Contains(err.Error(), "may write") {
			t.Errorf("mode %o: Load error = %v", mode, err)
		}
	}
}

func TestNewTokenAndLine(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		tok := NewToken()
		if len(tok) != 43 || strings.Trim(tok, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_") != "" {
			t.Fatalf("token %q", tok)
		}
		if seen[tok] {
			t.Fatalf("token %q twice", tok)
		}
		seen[tok] = true
	}
	tok := NewToken()
	line, err := Line("svc", tok, "prefix=order:", "from=10.0.0.0/8")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(line, tok) || line != "svc "+Hash(tok)+" prefix=order: from=10.0.0.0/8" {
		t.Errorf("Line = %q", line)
	}
	tab := mustParse(t, line+"\n")
	if p, err := tab.Token("svc", tok, addr("10.0.0.1")); err != nil || !p.May("order:1") || p.May("x") {
		t.Errorf("Token = %v, %v", p, err)
	}
	if h := Hash("test"); h != "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08" {
		t.Errorf("Hash(test) = %s", h)
	}
}

func TestLineErrors(t *testing.T) {
	const tok = "s3cret-token"
	tests := []struct {
		name, token string
		perms       []string
		want        string
	}{
		{"svc", "", []string{"admin"}, "empty token"},
		{"svc", "a b", []string{"admin"}, "space"},
		{"svc", "a\x00", []string{"admin"}, "control"},
		{"s:vc", tok, []string{"admin"}, "principal name"},
		{"svc x", tok, []string{"admin"}, "principal name"},
		{"", tok, []string{"admin"}, "empty principal name"},
		{"svc", tok, nil, "grants nothing"},
		{"svc", tok, []string{"from=10.0.0.0/8"}, "grants nothing"},
		{"svc", tok, []string{"prefix=a b"}, "space"},
		{"svc", tok, []string{"prefix=a", "#admin"}, "'#'"},
		{"svc", tok, []string{""}, "empty"},
		{"svc", tok, []string{"root"}, "unknown permission"},
	}
	for _, tt := range tests {
		line, err := Line(tt.name, tt.token, tt.perms...)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Line(%q, %q, %q) = %q, %v; want %q", tt.name, tt.token, tt.perms, line, err, tt.want)
		}
		if err != nil && strings.Contains(err.Error(), tok) {
			t.Errorf("error repeats the token: %v", err)
		}
	}
}

// render writes the table back as an auth file, principals by name.
func render(tab *Table) string {
	names := make([]string, 0, len(tab.byName))
	for n := range tab.byName {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		e := tab.byName[n]
		b.WriteString(n)
		if e.hasToken {
			fmt.Fprintf(&b, " sha256:%x", e.hash)
		} else {
			b.WriteString(" -")
		}
		if e.p.Admin {
			b.WriteString(" admin")
		} else if e.p.Prefixes == nil {
			b.WriteString(" prefix=*")
		}
		for _, p := range e.p.Prefixes {
			b.WriteString(" prefix=" + p)
		}
		for _, f := range e.from {
			b.WriteString(" from=" + f.String())
		}
		if e.cert {
			b.WriteString(" cert")
		}
		for _, q := range []struct {
			key string
			n   int
		}{{"max-locks", e.p.Quota.MaxLocks}, {"max-sessions", e.p.Quota.MaxSessions}, {"max-conns", e.p.Quota.MaxConns}} {
			switch {
			case q.n == Unlimited:
				b.WriteString(" " + q.key + "=unlimited")
			case q.n != 0:
				fmt.Fprintf(&b, " %s=%d", q.key, q.n)
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

func TestRender(t *testing.T) {
	tab := mustParse(t, tokenFile)
	again := mustParse(t, render(tab))
	if render(again) != render(tab) {
		t.Errorf("render changes:\n%s\n%s", render(tab), render(again))
	}
}

func TestPrincipalByNameAndValidName(t *testing.T) {
	tab, err := Parse(strings.NewReader("a " + Hash("t") + " prefix=a:\nb - prefix=b: cert\n"))
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := tab.Principal("a"); !ok || p.Name != "a" || !p.May("a:1") || p.May("b:1") {
		t.Fatalf("Principal(a) = %+v, %v", p, ok)
	}
	if p, ok := tab.Principal("b"); !ok || p.Name != "b" {
		t.Fatalf("Principal(b) = %+v, %v", p, ok)
	}
	if _, ok := tab.Principal("c"); ok {
		t.Fatal("Principal(c) found")
	}
	for name, want := range map[string]bool{"svc-a": true, "a.b@c_d": true, "": false, "a b": false, "a:b": false,
		"a\x00b": false, strings.Repeat("x", MaxNameLen): true, strings.Repeat("x", MaxNameLen+1): false} {
		if got := ValidName(name); got != want {
			t.Errorf("ValidName(%q) = %v", name, got)
		}
	}
}

func TestSince(t *testing.T) {
	parse := func(s string) *Table {
		t.Helper()
		tab, err := Parse(strings.NewReader(s))
		if err != nil {
			t.Fatal(err)
		}
		return tab
	}
	old := parse("a " + Hash("t") + " prefix=a:\nb - prefix=b: from=10.0.0.0/8\nc " + Hash("c") + " admin\n")
	now := parse("a " + Hash("t") + " prefix=a: prefix=x:\nb - prefix=b: from=10.1.0.0/16\nd " + Hash("d") + " admin\n")
	if p, changed := now.Since(old, "a"); p == nil || changed || !p.May("x:1") {
		t.Fatalf("a: %+v %v: rights changed, credentials did not", p, changed)
	}
	if p, changed := now.Since(old, "b"); p == nil || !changed {
		t.Fatalf("b: %+v %v: from= changed", p, changed)
	}
	if p, changed := now.Since(old, "c"); p != nil || !changed {
		t.Fatalf("c: %+v %v: gone", p, changed)
	}
	if p, changed := now.Since(old, "d"); p == nil || !changed {
		t.Fatalf("d: %+v %v: new", p, changed)
	}
	if _, changed := parse("a "+Hash("u")+" prefix=a:\n").Since(old, "a"); !changed {
		t.Fatal("a new token is a change of credentials")
	}
}

func TestQuotas(t *testing.T) {
	tab := mustParse(t, "a "+Hash("t")+" prefix=a: max-locks=100 max-sessions=unlimited\n"+
		"b - prefix=b: cert max-conns=3\nc "+Hash("c")+" admin\n")
	def := Quota{MaxLocks: 7, MaxSessions: 8, MaxConns: 9}
	for name, want := range map[string]Quota{
		"a": {MaxLocks: 100, MaxSessions: Unlimited, MaxConns: 9},
		"b": {MaxLocks: 7, MaxSessions: 8, MaxConns: 3},
		"c": def,
	} {
		p, ok := tab.Principal(name)
		if !ok {
			t.Fatalf("%s missing", name)
		}
		if got := p.Quota.Or(def); got != want {
			t.Errorf("%s: quota %+v, want %+v", name, got, want)
		}
	}
	// Quotas are not credentials: changing them is no reason to
	// authenticate again.
	now := mustParse(t, "a "+Hash("t")+" prefix=a: max-locks=5\n")
	if p, changed := now.Since(tab, "a"); p == nil || changed || p.Quota.MaxLocks != 5 {
		t.Errorf("a with a new quota: %+v, credentials changed %v", p, changed)
	}
	if _, err := Line("svc", "tok", "prefix=x:", "max-locks=10"); err != nil {
		t.Errorf("Line with a quota: %v", err)
	}
}
