package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// TokenBytes is the number of random bytes of a NewToken token.
const TokenBytes = 32

// NewToken returns a new random token: 256 bits from crypto/rand, in
// base64url without padding (43 bytes of [A-Za-z0-9_-]).
func NewToken() string {
	b := make([]byte, TokenBytes)
	rand.Read(b) // never fails (it crashes the program instead)
	return base64.RawURLEncoding.EncodeToString(b)
}

// Hash returns the credential of token as the auth file holds it:
// "sha256:" and the 64 lowercase hex digits of its SHA-256.
func Hash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Line returns the auth-file line (without a newline) that gives the
// principal name the token and the permissions, for example
//
//	Line("orders", NewToken(), "prefix=order:")
//
// The token is stored only as its hash. The error says what the auth file
// would refuse: a bad name or permission, a line that grants nothing, or a
// token that is empty or holds a space or a control character (the wire
// could not carry it). It never repeats the token.
func Line(name, token string, perms ...string) (string, error) {
	if token == "" {
		return "", errors.New("auth: empty token")
	}
	for i := 0; i < len(token); i++ {
		if c := token[i]; c <= ' ' || c == 0x7f {
			return "", errors.New("auth: the token holds a space or a control character")
		}
	}
	for _, p := range perms {
		if p == "" || strings.ContainsAny(p, " \t\r\n#") {
			return "", fmt.Errorf("auth: permission %q: empty, or holds a space or '#'", p)
		}
	}
	fields := append([]string{name, Hash(token)}, perms...)
	if _, err := parseLine(fields); err != nil {
		return "", fmt.Errorf("auth: %v", err)
	}
	return strings.Join(fields, " "), nil
}
