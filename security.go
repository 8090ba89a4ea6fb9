package mlock

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"syscall"
)

// Credentials and TLS: the secret that stays out of logs, the TLS
// configuration of a URI, the errors of a TLS handshake, and the key that
// tells sessions apart in the registry.

// Secret is a string that does not show in logs: it formats with fmt (every
// verb), log/slog and encoding/json as "[REDACTED]" ("" when empty).
// string(s) is its value.
type Secret string

const redacted = "[REDACTED]"

// String returns "[REDACTED]", or "" for the empty Secret.
func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return redacted
}

// GoString is String, quoted, for %#v.
func (s Secret) GoString() string { return `"` + s.String() + `"` }

// LogValue is String, for log/slog.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// MarshalJSON is String, as a JSON string.
func (s Secret) MarshalJSON() ([]byte, error) { return []byte(`"` + s.String() + `"`), nil }

// printable reports whether s holds no white space and no control
// character: it fits in one field of a frame.
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c == 0x7f {
			return false
		}
	}
	return true
}

// uriProblem says what is wrong with a URI that net/url refused, without
// quoting it: the URI may hold a token.
func uriProblem(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var ee url.EscapeError
	var he url.InvalidHostError
	switch {
	case errors.As(err, &ee):
		return "invalid percent-escape"
	case errors.As(err, &he):
		return "invalid host"
	case strings.HasPrefix(err.Error(), "invalid port"):
		return "invalid port"
	}
	return "malformed"
}

// uriTLS is the TLS part of a URI: the files and name it gives, and the
// configuration ParseURI built from them.
type uriTLS struct {
	ca, cert, key, serverName string
	cfg                       *tls.Config
}

// config builds the TLS configuration of the URI's parameters.
func (ut uriTLS) config() (*tls.Config, error) {
	bad := func(f string, a ...any) error { return &Error{Type: TypeRequest, Msg: fmt.Sprintf(f, a...)} }
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: ut.serverName}
	if ut.ca != "" {
		pem, err := os.ReadFile(ut.ca)
		if err != nil {
			return nil, &Error{Type: TypeRequest, Msg: "URI parameter tls-ca", Err: err}
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, bad("URI parameter tls-ca: no PEM certificate in %s", ut.ca)
		}
		c.RootCAs = pool
	}
	switch {
	case (ut.cert == "") != (ut.key == ""):
		return nil, bad("URI parameters tls-cert and tls-key go together: both or neither")
	case ut.cert != "":
		kp, err := tls.LoadX509KeyPair(ut.cert, ut.key)
		if err != nil {
			return nil, &Error{Type: TypeRequest, Msg: "URI parameters tls-cert, tls-key", Err: err}
		}
		c.Certificates = []tls.Certificate{kp}
	}
	return c, nil
}

// tlsConfig returns the session's copy of cfg (nil for plain TCP) for the
// node host: ServerName defaults to host, MinVersion is TLS 1.2 at least.
func tlsConfig(cfg *tls.Config, host string) *tls.Config {
	if cfg == nil {
		return nil
	}
	c := cfg.Clone()
	if c.ServerName == "" {
		c.ServerName = host
	}
	c.MinVersion = max(c.MinVersion, tls.VersionTLS12)
	return c
}

// shareKey names the session o's Client shares in the registry: the set
// of addresses (sorted: Clients naming the nodes of a cluster in another
// order share a session), the principal and the TLS settings, so that
// Clients with other credentials or another TLS configuration get a
// session of their own. The token appears only as a keyed hash, with a key
// that lives only in this process.
func shareKey(o *Options, nodes []node) string {
	var b strings.Builder
	b.WriteString(addrSet(nodes))
	if o.Name != "" {
		b.WriteString(" auth=")
		b.WriteString(o.Name)
		b.WriteByte(':')
		b.WriteString(tokenTag(o.Token))
	}
	switch {
	case o.TLS == nil:
	case o.TLS == o.uri.cfg: // as ParseURI built it: two parses of one URI share
		fmt.Fprintf(&b, " tls=%q,%q,%q,%q", o.uri.ca, o.uri.cert, o.uri.key, o.uri.serverName)
	default:
		fmt.Fprintf(&b, " tls=%p", o.TLS)
	}
	if o.clock != nil {
		fmt.Fprintf(&b, " clock=%p", o.clock) // a test's session of its own
	}
	return b.String()
}

var tagKey = func() []byte {
	k := make([]byte, 32)
	_, _ = rand.Read(k)
	return k
}()

// tokenTag is a keyed hash of a token: equal tokens have equal tags in
// this process, and a tag tells nothing about its token elsewhere.
func tokenTag(t Secret) string {
	m := hmac.New(sha256.New, tagKey)
	m.Write([]byte(t))
	return hex.EncodeToString(m.Sum(nil)[:16])
}

// handshakeError turns the failure of a TLS handshake with addr into an
// Error of Type connection wrapping ErrTLS and err. A server that answers
// the client's hello with something that is not TLS does not speak it; a
// certificate that does not verify or an alert from the server is a
// mismatch of configurations: both are permanent (see permanent). A
// connection that ends during the handshake is not: the server may be
// restarting.
func handshakeError(addr string, err error) *Error {
	cause := &causeError{sentinel: ErrTLS, err: err}
	var rh tls.RecordHeaderError
	var ce *tls.CertificateVerificationError
	var ue x509.UnknownAuthorityError
	var he x509.HostnameError
	var ie x509.CertificateInvalidError
	var oe *net.OpError
	switch {
	case errors.As(err, &rh):
		return &Error{Type: TypeConnection, Msg: "the server " + addr + " does not speak TLS (a plain mlock:// server?)", Node: addr, Err: cause, fatal: true}
	case errors.As(err, &ce), errors.As(err, &ue), errors.As(err, &he), errors.As(err, &ie):
		return &Error{Type: TypeConnection, Msg: "the certificate of " + addr + " does not verify", Node: addr, Err: cause, fatal: true}
	case errors.As(err, &oe) && oe.Op == "remote error":
		return &Error{Type: TypeConnection, Msg: "the server " + addr + " refused the TLS handshake", Node: addr, Err: cause, fatal: true}
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET):
		return &Error{Type: TypeConnection, Msg: "the server " + addr + " closed the connection during the TLS handshake (does it speak TLS?)", Node: addr, Err: cause}
	}
	return &Error{Type: TypeConnection, Msg: "TLS handshake with " + addr, Node: addr, Err: cause}
}
