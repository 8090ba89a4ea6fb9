package mlock

import (
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Defaults for the zero fields of Options.
const (
	DefaultHost         = "localhost"
	DefaultPort         = 12340
	DefaultTTL          = 60 * time.Second
	DefaultDialTimeout  = 5 * time.Second
	DefaultPingInterval = 20 * time.Second
	DefaultMaxBackoff   = 5 * time.Second
)

// Options configures a Client. The names follow the original client's; the
// zero value of every field takes its default.
type Options struct {
	// Host of the server. Default "localhost".
	Host string
	// Port of the server. Default 12340.
	Port int
	// Prefix is put before every resource name (each one of a|b). It may
	// not contain '|' or a space.
	Prefix string
	// TTL is the default lease of a lock and of Extend. Default 60 s.
	TTL time.Duration
	// Timeout is the default wait for a lock, enforced by the server; 0
	// waits without limit (a context deadline still applies).
	Timeout time.Duration
	// Tolerate is the default tolerate of a lock: N > 0 fails at once when
	// a queue already holds more than N entries. 0: no limit.
	Tolerate int
	// SocketID names the session on the server. Default: 128 random bits.
	// It is a secret: whoever presents it owns the session's locks. Only
	// the first client of an address chooses it; a later client of the
	// same address with a different SocketID is refused.
	SocketID string

	// Name and Token are the client's credentials: the principal it
	// authenticates as and that principal's token, sent with every
	// (re)connect ("connect <socketId> 1.0 auth=<name>:<token>"). Both or
	// neither: without them the server identifies the client by its
	// certificate (TLS with a client certificate) or its address, or, with
	// no authentication configured, accepts it only from loopback. The name
	// may not contain ':' or white space, the token no white space. The
	// token is a secret: it is never written in an error or a log, and a
	// Secret formats as "[REDACTED]". Send it over TLS beyond loopback: a
	// plain connection carries it in clear text. Default: none.
	Name  string
	Token Secret
	// TLS, if not nil, makes the client speak TLS to the server (the
	// mlocks:// scheme). The client uses a copy with ServerName set to Host
	// if empty and MinVersion raised to TLS 1.2; RootCAs nil trusts the
	// system's roots; Certificates holds a client certificate for servers
	// that authenticate clients by certificate. The handshake is part of
	// each connection attempt, within DialTimeout. Default nil: plain TCP.
	TLS *tls.Config
	// uri names the TLS settings ParseURI read, for the session registry
	// (two parses of one URI share a session): valid while TLS is still
	// the configuration ParseURI built.
	uri uriTLS

	// DialTimeout bounds a connection attempt, and how long a call waits
	// for the connection to come back while it is down. Default 5 s.
	DialTimeout time.Duration
	// PingInterval is how often an idle connection is checked while the
	// session holds and waits for no lock: a ping goes out when nothing was
	// answered for that long, and a ping not answered within it drops the
	// connection. While it holds or waits for locks the session is kept
	// answered more often: every third of the shorter of the server's
	// session grace and the smallest ttl of the held locks (see the package
	// documentation, "Safety"). Default 20 s.
	PingInterval time.Duration
	// MaxBackoff caps the delay between reconnection attempts (which grows
	// from 50 ms, doubling, with jitter). Default 5 s.
	MaxBackoff time.Duration
	// Logger receives reconnection events. Default: discard.
	Logger *slog.Logger
}

// ParseURI parses the URI form of Options,
// mlock://[name:token@]host[:port][?param=value&...] (or mlocks:// for
// TLS), into Options. The userinfo, percent-decoded, gives Name and Token.
// The parameters, all optional:
//
//	timeout, ttl       milliseconds (Options.Timeout, Options.TTL)
//	tolerate           a count (Options.Tolerate)
//	prefix, socketId   Options.Prefix, Options.SocketID
//	tls                1 (or true) for TLS on an mlock:// URI; 0 (or false)
//	tls-ca             a PEM file of the CAs that sign the server's certificate
//	                   (default: the system's roots)
//	tls-cert, tls-key  PEM files of a client certificate and its key, both or
//	                   neither (servers that authenticate by certificate)
//	tls-server-name    the name the server's certificate must carry (default:
//	                   the host)
//
// A tls-* parameter implies TLS. ParseURI reads the files named at once.
// Unknown parameters are an error. The port defaults to 12340 with either
// scheme. Errors never contain the token.
func ParseURI(uri string) (Options, error) {
	var o Options
	u, err := url.Parse(uri)
	if err != nil {
		return o, &Error{Type: TypeRequest, Msg: "invalid URI: " + uriProblem(err)}
	}
	var useTLS, tlsOff bool
	switch u.Scheme {
	case "mlock":
	case "mlocks":
		useTLS = true
	default:
		return o, &Error{Type: TypeRequest, Msg: fmt.Sprintf("URI scheme %q: want mlock or mlocks", u.Scheme)}
	}
	if u.User != nil {
		tok, ok := u.User.Password()
		if u.User.Username() == "" || !ok || tok == "" {
			return o, &Error{Type: TypeRequest, Msg: "URI credentials: want mlock://name:token@host"}
		}
		o.Name, o.Token = u.User.Username(), Secret(tok)
	}
	o.Host = u.Hostname()
	if p := u.Port(); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil {
			return o, &Error{Type: TypeRequest, Msg: "invalid port"}
		}
		o.Port = n
	}
	ms := func(k, v string) (time.Duration, error) {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return 0, &Error{Type: TypeRequest, Msg: fmt.Sprintf("URI parameter %s=%q: want milliseconds >= 0", k, v)}
		}
		return time.Duration(n) * time.Millisecond, nil
	}
	var ut uriTLS
	for k, vs := range u.Query() {
		v := vs[len(vs)-1]
		switch k {
		case "timeout":
			o.Timeout, err = ms(k, v)
		case "ttl":
			o.TTL, err = ms(k, v)
		case "tolerate":
			o.Tolerate, err = strconv.Atoi(v)
			if err != nil || o.Tolerate < 0 {
				err = &Error{Type: TypeRequest, Msg: fmt.Sprintf("URI parameter tolerate=%q: want a count >= 0", v)}
			}
		case "prefix":
			o.Prefix = v
		case "socketId":
			o.SocketID = v
		case "tls":
			switch v {
			case "1", "true":
				useTLS = true
			case "0", "false":
				tlsOff = true
			default:
				err = &Error{Type: TypeRequest, Msg: fmt.Sprintf("URI parameter tls=%q: want 1 or 0", v)}
			}
		case "tls-ca":
			ut.ca = v
		case "tls-cert":
			ut.cert = v
		case "tls-key":
			ut.key = v
		case "tls-server-name":
			ut.serverName = v
		default:
			err = &Error{Type: TypeRequest, Msg: fmt.Sprintf("unknown URI parameter %q", k)}
		}
		if err != nil {
			return o, err
		}
	}
	if ut != (uriTLS{}) {
		useTLS = true
	}
	switch {
	case useTLS && tlsOff:
		return o, &Error{Type: TypeRequest, Msg: "URI: tls=0 with mlocks:// or a tls-* parameter"}
	case useTLS:
		if o.TLS, err = ut.config(); err != nil {
			return o, err
		}
		ut.cfg = o.TLS
		o.uri = ut
	}
	return o, o.Validate()
}

// Validate reports the first invalid field.
func (o *Options) Validate() error {
	bad := func(f string, a ...any) error { return &Error{Type: TypeRequest, Msg: fmt.Sprintf(f, a...)} }
	switch {
	case o.Port < 0 || o.Port > 65535:
		return bad("Options.Port out of range 0-65535")
	case strings.ContainsAny(o.Prefix, "| "):
		return bad(`Options.Prefix %q: prefix can not include "|" or " "`, o.Prefix)
	case o.TTL < 0:
		return bad("Options.TTL %v is negative", o.TTL)
	case o.TTL%time.Millisecond != 0:
		return bad("Options.TTL %v is not whole milliseconds", o.TTL)
	case o.Timeout < 0:
		return bad("Options.Timeout %v is negative", o.Timeout)
	case o.Tolerate < 0:
		return bad("Options.Tolerate %d is negative", o.Tolerate)
	case strings.ContainsAny(o.SocketID, " |"):
		return bad("Options.SocketID %q contains a space or '|'", o.SocketID)
	case strings.ContainsAny(o.Name, ":") || !printable(o.Name):
		return bad("Options.Name %q contains ':', white space or a control character", o.Name)
	case !printable(string(o.Token)):
		return bad("Options.Token contains white space or a control character")
	case (o.Name == "") != (o.Token == ""):
		return bad("Options.Name and Options.Token go together: both or neither")
	case o.DialTimeout < 0 || o.PingInterval < 0 || o.MaxBackoff < 0:
		return bad("Options: negative duration")
	}
	return nil
}

func (o Options) withDefaults() Options {
	if o.Host == "" {
		o.Host = DefaultHost
	}
	if o.Port == 0 {
		o.Port = DefaultPort
	}
	if o.TTL == 0 {
		o.TTL = DefaultTTL
	}
	if o.DialTimeout == 0 {
		o.DialTimeout = DefaultDialTimeout
	}
	if o.PingInterval == 0 {
		o.PingInterval = DefaultPingInterval
	}
	if o.MaxBackoff == 0 {
		o.MaxBackoff = DefaultMaxBackoff
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

func (o *Options) addr() string {
	return net.JoinHostPort(strings.ToLower(o.Host), strconv.Itoa(o.Port))
}

func randomID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
