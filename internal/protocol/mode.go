package protocol

import (
	"bytes"
	"strconv"
)

// Mode is how a request takes one resource. The zero value is exclusive.
//
// A resource's queue admits, in FIFO order, each entry that is compatible
// with every entry ahead of it; a request is granted once it is admitted on
// all its resources. A set of entries is compatible when it has at most one
// entry, or none of them is exclusive and, for a semaphore (Of > 0), their
// Permits add up to at most Of. Shared is one permit of an unbounded count:
// readers never exclude each other.
type Mode struct {
	// Permits is the number of permits taken: 0 for exclusive (everything),
	// 1 for shared, 1..Of for a semaphore of Of permits.
	Permits uint32
	// Of is the resource's number of permits: 0 (unbounded) for shared and
	// exclusive. Every shared or permits entry of one queue has the same Of
	// (the server refuses a newcomer that disagrees).
	Of uint32
}

// The two common modes; Permits(k, n) is the third kind.
var (
	Exclusive = Mode{}
	Shared    = Mode{Permits: 1}
)

// MaxPermits is the largest permit count of a semaphore.
const MaxPermits = 1_000_000_000

// Valid reports whether m is exclusive, shared, or k of n permits with
// 1 <= k <= n <= MaxPermits.
func (m Mode) Valid() bool {
	switch {
	case m.Of == 0:
		return m.Permits <= 1
	default:
		return m.Permits >= 1 && m.Permits <= m.Of && m.Of <= MaxPermits
	}
}

// Exclusive reports whether m is the exclusive mode.
func (m Mode) Exclusive() bool { return m.Permits == 0 }

// String returns the wire form of m: "x", "s" or "k/n".
func (m Mode) String() string { return string(m.AppendText(nil)) }

// AppendText appends the wire form of m to b.
func (m Mode) AppendText(b []byte) []byte {
	switch {
	case m.Permits == 0:
		return append(b, 'x')
	case m.Of == 0:
		return append(b, 's')
	}
	b = strconv.AppendUint(b, uint64(m.Permits), 10)
	b = append(b, '/')
	return strconv.AppendUint(b, uint64(m.Of), 10)
}

// ParseMode parses the wire form of a mode: "x" (exclusive), "s" (shared)
// or "k/n" (k of n permits, 1 <= k <= n <= MaxPermits, decimal without
// sign or leading zeros). It reports false for anything else, and never
// allocates.
func ParseMode(b []byte) (Mode, bool) {
	switch string(b) {
	case "x":
		return Exclusive, true
	case "s":
		return Shared, true
	}
	for i, c := range b {
		if c != '/' {
			continue
		}
		k, ok1 := parseCount(b[:i])
		n, ok2 := parseCount(b[i+1:])
		m := Mode{Permits: k, Of: n}
		return m, ok1 && ok2 && n > 0 && m.Valid()
	}
	return Mode{}, false
}

// parseCount parses 1..MaxPermits in decimal, without sign or leading zero.
func parseCount(b []byte) (uint32, bool) {
	if len(b) == 0 || len(b) > 10 || b[0] == '0' {
		return 0, false
	}
	var v uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + uint64(c-'0')
	}
	if v > MaxPermits {
		return 0, false
	}
	return uint32(v), true
}

// ParseModes parses the modes argument of lock and trylock (an extension):
// one mode for every resource, or one per resource separated by '|', each
// "x" (exclusive), "s" (shared) or "k/n" (k of n permits). nres is the
// number of resources the request names (duplicates included). It appends
// the modes to dst and returns it; an empty argument appends nothing (every
// resource exclusive, as in 1.0). It reports false for a malformed mode or
// a count other than 1 or nres. It allocates only when dst is too short.
func ParseModes(dst []Mode, b []byte, nres int) ([]Mode, bool) {
	if len(b) == 0 {
		return dst, true
	}
	n := 0
	for {
		i := bytes.IndexByte(b, '|')
		f := b
		if i >= 0 {
			f = b[:i]
		}
		m, ok := ParseMode(f)
		if !ok || n == nres {
			return dst, false
		}
		dst = append(dst, m)
		n++
		if i < 0 {
			break
		}
		b = b[i+1:]
	}
	return dst, n == 1 || n == nres
}

// AppendModes appends the wire form of modes (see ParseModes) to b.
func AppendModes(b []byte, modes []Mode) []byte {
	for i, m := range modes {
		if i > 0 {
			b = append(b, '|')
		}
		b = m.AppendText(b)
	}
	return b
}
