package protocol

import "strings"

// ValidName is the one rule for resource names, which the client checks
// before it sends and the engine checks again: not empty, no space, no '|'
// (the separator of a request's resources), and at most maxLen bytes (no
// length limit if maxLen <= 0). It does not allocate.
func ValidName(name string, maxLen int) bool {
	return name != "" && (maxLen <= 0 || len(name) <= maxLen) &&
		strings.IndexByte(name, ' ') < 0 && strings.IndexByte(name, '|') < 0
}

// ValidOwner is the rule for the owner names the clients (Go and Node.js)
// send: the rule of resource names (ValidName). The server accepts more on
// the wire, for the original clients: any bytes but a space (the field
// separator) and a NUL (the scope separator). No length limit if maxLen <=
// 0. js/test/fixtures/rules.json holds the cases both clients are tested
// against.
func ValidOwner(owner string, maxLen int) bool { return ValidName(owner, maxLen) }
