package mlock

import (
	"crypto/rand"
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

// ParseURI parses the seed's URI form,
// mlock://host:port?timeout=5000&ttl=3000&prefix=order:&tolerate=3&socketId=x,
// into Options. timeout and ttl are in milliseconds; unknown parameters are
// an error.
func ParseURI(uri string) (Options, error) {
	var o Options
	u, err := url.Parse(uri)
	if err != nil {
		return o, &Error{Type: TypeRequest, Msg: "invalid URI", Err: err}
	}
	if u.Scheme != "mlock" {
		return o, &Error{Type: TypeRequest, Msg: fmt.Sprintf("URI scheme %q: want mlock", u.Scheme)}
	}
	o.Host = u.Hostname()
	if p := u.Port(); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil {
			return o, &Error{Type: TypeRequest, Msg: "invalid port " + p}
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
		default:
			err = &Error{Type: TypeRequest, Msg: fmt.Sprintf("unknown URI parameter %q", k)}
		}
		if err != nil {
			return o, err
		}
	}
	return o, o.Validate()
}

// Validate reports the first invalid field.
func (o *Options) Validate() error {
	bad := func(f string, a ...any) error { return &Error{Type: TypeRequest, Msg: fmt.Sprintf(f, a...)} }
	switch {
	case o.Port < 0 || o.Port > 65535:
		return bad("Options.Port %d out of range", o.Port)
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
