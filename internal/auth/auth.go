// Package auth holds the principals of mlockd: who a connection is and what
// it may do. It reads the auth file (Parse, Load), checks credentials
// (Table.Token, Table.Address, Table.Cert), makes tokens and auth-file lines
// (NewToken, Line), and builds the server's TLS configuration with a
// certificate that can be reloaded without dropping connections
// (ServerConfig, CertReloader).
//
// # The auth file
//
// One principal per line; blank lines are ignored and a field that begins
// with '#' starts a comment that runs to the end of the line. Fields are
// separated by spaces or tabs:
//
//	<name> <credential> <permission>...
//
// name is 1 to 64 bytes of [A-Za-z0-9._@-]. It holds no ':' and no space:
// the wire carries credentials as "auth=<name>:<token>".
//
// credential is "sha256:<64 hex digits>", the SHA-256 of the token (tokens
// are hashed at rest; Line writes such a line), or "-" for a principal
// without a token, reached only by address (from=) or by client certificate
// (cert). A plain-text token is refused.
//
// The permissions:
//
//	prefix=<p>  may lock the resources whose name starts with p (literal,
//	            repeatable); prefix=* is every resource
//	admin       detailed status, every principal's locks, evict; implies
//	            every resource
//	from=<net>  a CIDR (10.0.0.0/8) or an address (10.1.2.3), repeatable.
//	            For a "-" credential: the addresses this token-less
//	            principal covers (for 1.0 clients, which cannot send a
//	            token). For a token: the only addresses the token is
//	            accepted from. IPv4 clients, IPv4-mapped IPv6 ones included,
//	            match IPv4 ranges only.
//	cert        a client certificate that verifies against the server's
//	            client CA and whose name (CertName) is this principal's
//	            name also reaches it; from= does not restrict it
//	max-locks=<n>, max-sessions=<n>, max-conns=<n>
//	            the principal's quotas (Quota): live lock requests, sessions
//	            and connections; n is 1 to 1 000 000 000, or "unlimited".
//	            Without one the server's default for it applies
//
// A line must grant something (a prefix or admin); a "-" credential needs
// from= or cert; names are unique; the from= networks of two different
// token-less principals may not overlap, so that an address decides one
// principal. Errors (*ParseError) name the line and never repeat a
// credential.
//
// Example:
//
//	# name       credential          permissions
//	orders       sha256:9f86d08...   prefix=order: prefix=invoice:
//	ops          sha256:2c26b46...   admin from=10.0.0.0/8
//	legacy       -                   prefix=batch: from=192.168.7.0/24
//	worker-1     -                   prefix=job: cert
//
// # Principals
//
// Without an auth file a server has one principal, Anonymous, with every
// right. The server keeps each principal's owners and sessions apart; this
// package only says who a connection is and what it may lock.
package auth

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"net/netip"
	"slices"
	"strings"
)

// ErrAuthFailed is the error of Table.Token for every refused credential:
// an unknown name, a wrong token, a principal without a token, or an
// address the token is not accepted from. The cases are not told apart.
var ErrAuthFailed = errors.New("auth: authentication failed")

// A Principal is who a connection is and what it may do. The principals of
// a Table are shared by every caller and must not be modified.
type Principal struct {
	// Name is the principal's name, "" for Anonymous.
	Name string
	// Admin allows detailed status, every principal's locks and evict,
	// and every resource.
	Admin bool
	// Prefixes are the literal prefixes of the resources the principal may
	// lock; nil is every resource.
	Prefixes []string
	// Quota is what the principal may make the server hold, from its line
	// (max-locks=, max-sessions=, max-conns=).
	Quota Quota
}

// Unlimited is the value of a Quota field set to "unlimited".
const Unlimited = -1

// MaxQuota is the largest number a quota may be set to.
const MaxQuota = 1_000_000_000

// A Quota caps what one principal may make the server hold, over all its
// sessions and connections. A field is 0 when the principal's line does
// not set it (the server's default applies), Unlimited for "unlimited",
// else 1 to MaxQuota.
type Quota struct {
	// MaxLocks caps the principal's live lock requests, held and waiting.
	MaxLocks int
	// MaxSessions caps its sessions, connected or in their grace period.
	MaxSessions int
	// MaxConns caps its authenticated connections.
	MaxConns int
}

// Or returns q with each field that is not set (0) taken from def.
func (q Quota) Or(def Quota) Quota {
	if q.MaxLocks == 0 {
		q.MaxLocks = def.MaxLocks
	}
	if q.MaxSessions == 0 {
		q.MaxSessions = def.MaxSessions
	}
	if q.MaxConns == 0 {
		q.MaxConns = def.MaxConns
	}
	return q
}

// Anonymous returns the principal of a server without an auth file: name
// "", admin, every resource. Each call returns a new value.
func Anonymous() *Principal { return &Principal{Admin: true} }

// May reports whether p may lock the resource: p is an admin, has every
// resource, or has a prefix of it. It takes O(len(p.Prefixes)) prefix
// comparisons and does not allocate.
func (p *Principal) May(resource string) bool {
	if p.Admin || p.Prefixes == nil {
		return true
	}
	for _, pre := range p.Prefixes {
		if strings.HasPrefix(resource, pre) {
			return true
		}
	}
	return false
}

// entry is one line of the auth file.
type entry struct {
	p        Principal
	hash     [sha256.Size]byte // SHA-256 of the token; meaningful if hasToken
	hasToken bool
	from     []netip.Prefix // canonical (masked, IPv4 unmapped)
	cert     bool
	line     int
}

// addrEntry is one from= network of a token-less principal.
type addrEntry struct {
	net netip.Prefix
	p   *Principal
}

// A Table is the parsed auth file. It is immutable: its methods are safe
// for concurrent use. Parse and Load make one; the zero Table has no
// principal.
type Table struct {
	byName   map[string]*entry
	byAddr   []addrEntry // from= networks of token-less principals; disjoint
	warnings []string
}

// Len returns the number of principals.
func (t *Table) Len() int { return len(t.byName) }

// Warnings returns what the server should log about the file: a file that
// group or others may read, a token-less principal that covers every
// address. Nil when there is nothing to say.
func (t *Table) Warnings() []string { return t.warnings }

// Token returns the principal named name if token is its token and, when
// its line has from=, addr is in one of those networks. Every refusal is
// ErrAuthFailed. The token is compared in constant time (its SHA-256
// against the stored one), and an unknown name costs the same hash and
// comparison as a known one. addr may be IPv4-mapped IPv6 and may carry a
// zone; the zero Addr is in no network.
func (t *Table) Token(name, token string, addr netip.Addr) (*Principal, error) {
	sum := sha256.Sum256([]byte(token))
	var want [sha256.Size]byte // compared against for unknown names
	e, found := t.byName[name]
	if found {
		want = e.hash
	}
	match := subtle.ConstantTimeCompare(sum[:], want[:]) == 1
	if !found || !e.hasToken || !match || token == "" {
		return nil, ErrAuthFailed
	}
	if len(e.from) > 0 && !contains(e.from, addr) {
		return nil, ErrAuthFailed
	}
	return &e.p, nil
}

// Address returns the token-less principal whose from= networks hold addr,
// if any; at most one does. It takes O(number of such networks). addr may
// be IPv4-mapped IPv6 and may carry a zone.
func (t *Table) Address(addr netip.Addr) (*Principal, bool) {
	addr = canonAddr(addr)
	if !addr.IsValid() {
		return nil, false
	}
	for _, a := range t.byAddr {
		if a.net.Contains(addr) {
			return a.p, true
		}
	}
	return nil, false
}

// Cert returns the principal named name if its line has cert. name is the
// name of a client certificate that verified (see VerifiedName); the
// principal's from= networks do not apply.
func (t *Table) Cert(name string) (*Principal, bool) {
	e, ok := t.byName[name]
	if !ok || !e.cert {
		return nil, false
	}
	return &e.p, true
}

// Principal returns the principal named name, however it is reached. A
// server uses it on reload to update, or end, the sessions of a principal
// whose line changed or went away.
func (t *Table) Principal(name string) (*Principal, bool) {
	e, ok := t.byName[name]
	if !ok {
		return nil, false
	}
	return &e.p, true
}

// Since compares the principal named name in t with its line in old (the
// table t replaces): p is its principal in t (nil if it is gone), and
// credChanged reports that the way to prove it changed: its token, its
// from= networks or its cert mark. A server updates the rights of the
// principal's sessions to p, and makes the connections of a principal whose
// credentials changed authenticate again.
func (t *Table) Since(old *Table, name string) (p *Principal, credChanged bool) {
	e, ok := t.byName[name]
	if !ok {
		return nil, true
	}
	var o *entry
	if old != nil {
		o = old.byName[name]
	}
	if o == nil {
		return &e.p, true
	}
	return &e.p, e.hash != o.hash || e.hasToken != o.hasToken || e.cert != o.cert || !slices.Equal(e.from, o.from)
}

// ValidName reports whether name can be a principal's name: 1 to
// MaxNameLen bytes of [A-Za-z0-9._@-]. A client certificate's name that is
// not one is no principal.
func ValidName(name string) bool { return checkName(name) == nil }

func canonAddr(a netip.Addr) netip.Addr { return a.Unmap().WithZone("") }

func contains(nets []netip.Prefix, addr netip.Addr) bool {
	addr = canonAddr(addr)
	if !addr.IsValid() {
		return false
	}
	for _, n := range nets {
		if n.Contains(addr) {
			return true
		}
	}
	return false
}
