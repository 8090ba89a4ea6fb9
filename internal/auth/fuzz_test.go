package auth

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

// FuzzParse checks that Parse never panics, that its errors are
// *ParseErrors that do not repeat the credential of the wrong line, and
// that a table it accepts renders to a file that parses to the same table
// and answers its lookups consistently.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"",
		"# comment\n\n",
		tokenFile,
		"a - prefix=a from=0.0.0.0/0\nb - prefix=b from=::/0\n",
		"a - admin from=10.0.0.0/8\nb - admin from=10.1.0.0/16\n",
		"legacy - prefix=batch: from=::ffff:192.168.8.0/120 from=2001:db8::1 cert\n",
		"alice s3cret-token-in-plain-text prefix=a\n",
		"alice sha256:" + strings.Repeat("A", 64) + " prefix=* prefix=x # c\r\n",
		"alice - prefix=a from=10.0.0.1/8\n",
		"x " + hashOrders + " prefix=x cert from=10.0.0.0/8\nx - admin cert\n",
		"q " + hashOrders + " prefix=q max-locks=10 max-sessions=unlimited max-conns=0012\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		tab, err := Parse(strings.NewReader(text))
		if err != nil {
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("error %T %v, want *ParseError", err, err)
			}
			checkNoCredential(t, text, pe)
			return
		}
		out := render(tab)
		again, err := Parse(strings.NewReader(out))
		if err != nil {
			t.Fatalf("the rendered table does not parse: %v\n%s", err, out)
		}
		if r := render(again); r != out {
			t.Fatalf("render changes:\n%s\n%s", out, r)
		}
		for name, e := range tab.byName {
			if e.p.Name != name {
				t.Fatalf("entry %q named %q", name, e.p.Name)
			}
			if checkName(name) != nil {
				t.Fatalf("bad name %q accepted", name)
			}
			if !e.p.Admin && e.p.Prefixes != nil && len(e.p.Prefixes) == 0 {
				t.Fatalf("%q: empty prefix list", name)
			}
			for _, pre := range e.p.Prefixes {
				if !e.p.May(pre) || !e.p.May(pre+"x") {
					t.Fatalf("%q may not lock its own prefix %q", name, pre)
				}
			}
			if p, ok := tab.Cert(name); ok != e.cert || (ok && p != &e.p) {
				t.Fatalf("Cert(%q) = %v, %v; cert is %v", name, p, ok, e.cert)
			}
			if !e.hasToken && len(e.from) == 0 && !e.cert {
				t.Fatalf("%q cannot be reached", name)
			}
			if _, err := tab.Token(name, "", netip.Addr{}); err != ErrAuthFailed {
				t.Fatalf("empty token for %q: %v", name, err)
			}
			for _, n := range e.from {
				if n != n.Masked() || n.Addr().Is4In6() || n.Addr().Zone() != "" {
					t.Fatalf("%q: network %v not canonical", name, n)
				}
				p, ok := tab.Address(n.Addr())
				switch {
				case !e.hasToken && (!ok || p != &e.p):
					t.Fatalf("Address(%v) = %v, %v; want %q", n.Addr(), p, ok, name)
				case ok && tab.byName[p.Name].hasToken:
					t.Fatalf("Address(%v) gave %q, which has a token", n.Addr(), p.Name)
				}
			}
		}
	})
}

// checkNoCredential fails if the error repeats the credential field of the
// line it names. Only credentials that appear once in the text and are long
// enough not to be found by chance are checked.
func checkNoCredential(t *testing.T, text string, pe *ParseError) {
	lines := strings.Split(text, "\n")
	if pe.Line < 1 || pe.Line > len(lines) {
		return
	}
	fields := splitFields(lines[pe.Line-1])
	if len(fields) < 2 {
		return
	}
	cred := fields[1]
	if len(cred) < 12 || strings.Count(text, cred) != 1 || strings.Contains(credHint, cred) {
		return
	}
	if strings.Contains(pe.Error(), cred) {
		t.Fatalf("error repeats the credential %q: %v", cred, pe)
	}
}
