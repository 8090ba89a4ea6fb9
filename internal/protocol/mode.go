package protocol

import (
	"bytes"

	"github.com/mlock-dev/mlock/internal/core"
)

// ParseModes parses the modes argument of lock and trylock (an extension):
// one mode for every resource, or one per resource separated by '|', each
// "x" (exclusive), "s" (shared) or "k/n" (k of n permits). nres is the
// number of resources the request names (duplicates included). It appends
// the modes to dst and returns it; an empty argument appends nothing (every
// resource exclusive, as in 1.0). It reports false for a malformed mode or
// a count other than 1 or nres. It allocates only when dst is too short.
func ParseModes(dst []core.Mode, b []byte, nres int) ([]core.Mode, bool) {
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
		m, ok := core.ParseMode(f)
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
func AppendModes(b []byte, modes []core.Mode) []byte {
	for i, m := range modes {
		if i > 0 {
			b = append(b, '|')
		}
		b = m.AppendText(b)
	}
	return b
}
