package auth

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"runtime"
	"strings"
)

// MaxNameLen is the longest principal name, in bytes.
const MaxNameLen = 64

// maxLine is the longest line of an auth file, in bytes.
const maxLine = 64 << 10

// A ParseError is an error in an auth file. It never holds a credential.
type ParseError struct {
	File string // the path given to Load; "" from Parse
	Line int    // 1-based; 0 for an error of the whole file
	Msg  string
}

func (e *ParseError) Error() string {
	switch {
	case e.File != "" && e.Line > 0:
		return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg)
	case e.File != "":
		return e.File + ": " + e.Msg
	case e.Line > 0:
		return fmt.Sprintf("line %d: %s", e.Line, e.Msg)
	}
	return e.Msg
}

// Load reads the auth file at path (see the package documentation).
//
// Permissions, on systems other than Windows: a file that group or others
// may write is refused (anyone could add a principal); a file that they may
// read is accepted with a warning (Table.Warnings), as it holds only hashes
// of tokens. Errors are those of os.Open and read, or a *ParseError that
// names the file.
func Load(path string) (*Table, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	var warn string
	if runtime.GOOS != "windows" {
		mode := fi.Mode().Perm()
		if mode&0o022 != 0 {
			return nil, &ParseError{File: path, Msg: fmt.Sprintf("mode %04o: group or others may write the auth file; chmod go-w it", mode)}
		}
		if mode&0o044 != 0 {
			warn = fmt.Sprintf("%s: mode %04o: group or others may read the auth file; chmod 600 it", path, mode)
		}
	}
	t, err := Parse(f)
	if err != nil {
		var pe *ParseError
		if errors.As(err, &pe) {
			pe.File = path
		}
		return nil, err
	}
	if warn != "" {
		t.warnings = append([]string{warn}, t.warnings...)
	}
	return t, nil
}

// Parse reads an auth file (see the package documentation). The error is a
// *ParseError for a wrong line, naming the line, or the reader's error.
// Lines are at most 64 KiB.
func Parse(r io.Reader) (*Table, error) {
	t := &Table{byName: make(map[string]*entry)}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxLine)
	n := 0
	for sc.Scan() {
		n++
		fields := splitFields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		e, err := parseLine(fields)
		if err != nil {
			return nil, &ParseError{Line: n, Msg: err.Error()}
		}
		e.line = n
		if old, dup := t.byName[e.p.Name]; dup {
			return nil, &ParseError{Line: n, Msg: fmt.Sprintf("principal %q is already defined on line %d", e.p.Name, old.line)}
		}
		if !e.hasToken {
			for _, net := range e.from {
				for _, a := range t.byAddr {
					if a.net.Overlaps(net) {
						other := t.byName[a.p.Name]
						return nil, &ParseError{Line: n, Msg: fmt.Sprintf("from=%s overlaps from=%s of the token-less principal %q (line %d): an address must decide one principal", net, a.net, other.p.Name, other.line)}
					}
				}
			}
			for _, net := range e.from {
				t.byAddr = append(t.byAddr, addrEntry{net: net, p: &e.p})
				if net.Bits() == 0 {
					t.warnings = append(t.warnings, fmt.Sprintf("line %d: the token-less principal %q covers every %s address", n, e.p.Name, family(net)))
				}
			}
		}
		t.byName[e.p.Name] = e
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, &ParseError{Line: n + 1, Msg: fmt.Sprintf("line longer than %d bytes", maxLine)}
		}
		return nil, err
	}
	return t, nil
}

func family(p netip.Prefix) string {
	if p.Addr().Is4() {
		return "IPv4"
	}
	return "IPv6"
}

// splitFields splits a line on spaces, tabs and carriage returns, and drops
// a comment: the field that begins with '#' and the rest of the line.
func splitFields(line string) []string {
	fields := strings.FieldsFunc(line, func(r rune) bool { return r == ' ' || r == '\t' || r == '\r' })
	for i, f := range fields {
		if strings.HasPrefix(f, "#") {
			return fields[:i]
		}
	}
	return fields
}

const credHint = `the credential must be "sha256:<64 hex digits>" (the SHA-256 of the token) or "-"; tokens are not stored in plain text: "mlock token <name> <permission>..." prints a new token and its line`

// parseLine parses the fields of one non-empty line. Its errors never
// repeat the credential field.
func parseLine(fields []string) (*entry, error) {
	if len(fields) < 2 {
		// The one field may be a misplaced token: do not repeat it.
		return nil, errors.New("a single field; want a name, a credential and permissions")
	}
	name := fields[0]
	if err := checkName(name); err != nil {
		return nil, err
	}
	e := &entry{p: Principal{Name: name}}
	switch cred := fields[1]; {
	case cred == "-":
	case strings.HasPrefix(cred, "sha256:"):
		h := cred[len("sha256:"):]
		if len(h) != 2*sha256.Size {
			return nil, fmt.Errorf("principal %q: the sha256 credential must have 64 hex digits", name)
		}
		if _, err := hex.Decode(e.hash[:], []byte(h)); err != nil {
			return nil, fmt.Errorf("principal %q: the sha256 credential must have 64 hex digits", name)
		}
		e.hasToken = true
	default:
		return nil, fmt.Errorf("principal %q: %s", name, credHint)
	}
	all := false
	seen := make(map[string]bool)
	for i, perm := range fields[2:] {
		key, val, hasVal := strings.Cut(perm, "=")
		switch {
		case perm == "admin":
			e.p.Admin = true
		case perm == "cert":
			e.cert = true
		case key == "prefix" && hasVal:
			if err := checkPrefix(val); err != nil {
				return nil, fmt.Errorf("principal %q: %v", name, err)
			}
			if val == "*" {
				all = true
			} else if !seen[val] {
				seen[val] = true
				e.p.Prefixes = append(e.p.Prefixes, val)
			}
		case key == "from" && hasVal:
			net, err := parseFrom(val)
			if err != nil {
				return nil, fmt.Errorf("principal %q: %v", name, err)
			}
			if !containsPrefix(e.from, net) {
				e.from = append(e.from, net)
			}
		case hasVal && (key == "max-locks" || key == "max-sessions" || key == "max-conns"):
			n, err := parseQuota(key, val)
			if err != nil {
				return nil, fmt.Errorf("principal %q: %v", name, err)
			}
			q := &e.p.Quota
			at := map[string]*int{"max-locks": &q.MaxLocks, "max-sessions": &q.MaxSessions, "max-conns": &q.MaxConns}[key]
			if *at != 0 {
				return nil, fmt.Errorf("principal %q: %s= is given twice", name, key)
			}
			*at = n
		case hasVal:
			return nil, fmt.Errorf("principal %q: unknown permission %q (field %d); want %s", name, key+"=", i+3, permissions)
		default:
			return nil, fmt.Errorf("principal %q: unknown permission (field %d); want %s", name, i+3, permissions)
		}
	}
	if !e.p.Admin && !all && len(e.p.Prefixes) == 0 {
		return nil, fmt.Errorf("principal %q grants nothing: give prefix=<p>, prefix=* or admin", name)
	}
	if e.p.Admin || all {
		e.p.Prefixes = nil
	}
	if !e.hasToken && len(e.from) == 0 && !e.cert {
		return nil, fmt.Errorf("principal %q has no token (\"-\") and can be reached neither by address (from=) nor by certificate (cert)", name)
	}
	return e, nil
}

// permissions lists what may follow a credential, for errors.
const permissions = "prefix=<p>, admin, from=<net>, cert, max-locks=<n>, max-sessions=<n> or max-conns=<n>"

// parseQuota parses the value of a quota: 1 to MaxQuota, or "unlimited".
func parseQuota(key, val string) (int, error) {
	if val == "unlimited" {
		return Unlimited, nil
	}
	n := 0
	for i := 0; i < len(val); i++ {
		if val[i] < '0' || val[i] > '9' || n > MaxQuota {
			return 0, fmt.Errorf("%s=: want a number from 1 to %d, or unlimited", key, MaxQuota)
		}
		n = n*10 + int(val[i]-'0')
	}
	if n < 1 || n > MaxQuota {
		// The value is not repeated: it may be a misplaced secret.
		return 0, fmt.Errorf("%s=: want a number from 1 to %d, or unlimited", key, MaxQuota)
	}
	return n, nil
}

func containsPrefix(nets []netip.Prefix, p netip.Prefix) bool {
	for _, n := range nets {
		if n == p {
			return true
		}
	}
	return false
}

// checkName reports whether name may name a principal.
func checkName(name string) error {
	if len(name) > MaxNameLen {
		return fmt.Errorf("principal name longer than %d bytes", MaxNameLen)
	}
	for i := 0; i < len(name); i++ {
		if !nameByte(name[i]) {
			// The name field may be a misplaced secret: do not repeat it.
			return fmt.Errorf("principal name: byte %d is not one of [A-Za-z0-9._@-]", i+1)
		}
	}
	if name == "" {
		return errors.New("empty principal name")
	}
	return nil
}

func nameByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '@' || c == '-'
}

// checkPrefix reports whether p may follow prefix=.
func checkPrefix(p string) error {
	if p == "" {
		return errors.New("empty prefix=; write prefix=* for every resource")
	}
	if p == "*" {
		return nil
	}
	if strings.Contains(p, "*") {
		return fmt.Errorf("prefix=%s: prefixes are literal and '*' is allowed only alone (prefix=*); write prefix=order: for order:*", p)
	}
	for i := 0; i < len(p); i++ {
		if p[i] < 0x20 || p[i] == 0x7f {
			return fmt.Errorf("prefix=%q holds a control character", p)
		}
	}
	return nil
}

// parseFrom parses the value of from=: a CIDR with no host bits set, or an
// address. IPv4-mapped IPv6 is turned into IPv4.
func parseFrom(s string) (netip.Prefix, error) {
	var p netip.Prefix
	if strings.Contains(s, "/") {
		var err error
		p, err = netip.ParsePrefix(s)
		if err != nil {
			return p, fmt.Errorf("from=%s: not a CIDR (10.0.0.0/8, fd00::/8) or an address", s)
		}
		if m := p.Masked(); m != p {
			return p, fmt.Errorf("from=%s has host bits set; did you mean from=%s?", s, m)
		}
	} else {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return p, fmt.Errorf("from=%s: not a CIDR (10.0.0.0/8, fd00::/8) or an address", s)
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	if p.Addr().Is4In6() {
		// Masked to fewer than 96 bits, an address is not IPv4-mapped:
		// here p.Bits() >= 96.
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	return p, nil
}
