package locktable

import (
	"strings"

	"github.com/mlock-dev/mlock/internal/protocol"
)

// CheckName applies the one rule for resource names (protocol.ValidName): not empty, no space, no '|', and
// at most maxLen bytes (no length limit if maxLen <= 0). It returns
// ErrInvalidResource, unwrapped, for a name that breaks the rule, and nil
// otherwise. It does not allocate.
func CheckName(name string, maxLen int) error {
	if !protocol.ValidName(name, maxLen) {
		return ErrInvalidResource
	}
	return nil
}

// checkOwner reports whether owner is a valid owner name (the empty owner
// included).
func (t *Table) checkOwner(owner string) bool {
	return len(owner) <= t.maxName && strings.IndexByte(owner, ' ') < 0
}

// distinct returns the number of distinct names in res. It costs O(k²),
// k <= MaxResources, and does not allocate.
func distinct(res []string) int {
	n := 0
	for i, r := range res {
		dup := false
		for _, p := range res[:i] {
			if p == r {
				dup = true
				break
			}
		}
		if !dup {
			n++
		}
	}
	return n
}
