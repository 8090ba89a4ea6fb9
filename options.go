package mlock

import (
	"cmp"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mlock-dev/mlock/internal/protocol"
)

// Defaults for the zero fields of Options.
const (
	DefaultHost         = "localhost"
	DefaultPort         = protocol.DefaultPort
	DefaultTTL          = protocol.DefaultTTL
	DefaultDialTimeout  = 5 * time.Second
	DefaultPingInterval = 20 * time.Second
	DefaultMaxBackoff   = 5 * time.Second
)

// Options configures a Client. The names follow the original client's; the
// zero value of every field takes its default.
type Options struct {
	// Host of the server. Default "localhost". Host and Port name one
	// server; Addrs names several.
	Host string
	// Port of the server. Default 12340. With Addrs, the port of the
	// addresses that give none.
	Port int
	// Addrs are the addresses of the nodes of one cluster, each "host",
	// "host:port", an IPv6 literal ("::1", "[::1]" or "[::1]:12340"); the
	// port defaults to Port (12340). When set, Host must be empty. The
	// Client keeps one session across the nodes: it connects to the first
	// address, and when the connection drops (or an attempt fails) it tries
	// the next one in turn and resumes the session there (see the package
	// documentation, "Several servers"). An address given twice (same host,
	// letter case aside, and port) is an error. Default: Host and Port.
	Addrs []string
	// Prefix is put before every resource name (each one of a|b). It may
	// not contain '|' or a space.
	Prefix string
	// TTL is the default lease of a lock and of Extend. Default 60 s.
	TTL time.Duration
	// Timeout is the default wait for a lock, enforced by the server; 0
	// waits without limit (a context deadline still applies), as the seed's
	// client does. (The locking module's ExecuteOptions.Timeout 0 is 5 s
	// instead, as in Medusa.)
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
	// mlocks:// scheme). The client uses a copy with ServerName set to the
	// host of the address it dials (Host, or each node's of Addrs) if empty,
	// and MinVersion raised to TLS 1.2; RootCAs nil trusts the
	// system's roots; Certificates holds a client certificate for servers
	// that authenticate clients by certificate. The handshake is part of
	// each connection attempt, within DialTimeout. Default nil: plain TCP.
	TLS *tls.Config
	// uri names the TLS settings ParseURI read, for the session registry
	// (two parses of one URI share a session): valid while TLS is still
	// the configuration ParseURI built.
	uri uriTLS

	// DialTimeout bounds a connection attempt, and how long a call waits
	// for the connection to come back while it is down; a Lock whose wait
	// timeout is shorter waits at most that, then fails with ErrTimeout
	// (its cause the connection's error), and a Lock that waited for the
	// connection asks the server for what is left of its timeout.
	// Default 5 s.
	DialTimeout time.Duration
	// PingInterval is how often an idle connection is checked while the
	// session holds and waits for no lock: a ping goes out when nothing was
	// answered for that long, and a ping not answered within it drops the
	// connection. While it holds or waits for locks the session is kept
	// answered more often: every third of the shorter of the server's
	// session grace and the smallest ttl of the held locks (see the package
	// documentation, "Safety"). Default 20 s.
	PingInterval time.Duration
	// StayOnNode keeps the session on the node it connected to. By default,
	// with Addrs, the session's first connection asks the node to name the
	// cluster's leader ("want=leader"); when a follower that created the
	// session names one of Addrs (compared as written, letter case aside),
	// the session moves to the leader at once: every request then saves the
	// follower's forwarding hop and its wait to learn that the entry is
	// committed (a client on the leader measured 1.5 to 3 times the cycles
	// of one on a follower; docs/cluster.md). A move is one more connect,
	// never a failure: if the leader does not answer, the session goes back
	// to the follower and stays. Later connections (after a drop) stay on
	// the node they reach. Only the first Client of a session chooses it.
	StayOnNode bool
	// MaxBackoff caps the delay between reconnection attempts (which grows
	// from 50 ms, doubling, with jitter). Default 5 s.
	MaxBackoff time.Duration
	// Logger receives reconnection events. Default: discard.
	Logger *slog.Logger

	// clock is the session's clock (nil: the system's); set by the
	// package's tests.
	clock clock
}

// ParseURI parses the URI form of Options,
// mlock://[name:token@]host[:port][,host[:port]...][?param=value&...] (or
// mlocks:// for TLS), into Options. One address gives Host and Port;
// several, separated by commas, give Addrs, as "host:port" with the port
// filled in (each defaults to 12340; an IPv6 literal goes in brackets:
// [::1]:12340): the nodes of one cluster (see Options.Addrs). An empty
// address (h1,,h2) and an address given twice are errors. The userinfo,
// percent-decoded, gives Name and Token.
// The parameters, all optional:
//
//	timeout, ttl       milliseconds, or a duration such as 5s or 1m30s
//	                   (Options.Timeout, Options.TTL)
//	tolerate           a count (Options.Tolerate)
//	prefix, socketId   Options.Prefix, Options.SocketID
//	stay-on-node       1 (or true): Options.StayOnNode (default 0)
//	tls                1 (or true) for TLS on an mlock:// URI; 0 (or false)
//	tls-ca             a PEM file of the CAs that sign the server's certificate
//	                   (default: the system's roots)
//	tls-cert, tls-key  PEM files of a client certificate and its key, both or
//	                   neither (servers that authenticate by certificate)
//	tls-server-name    the name the server's certificate must carry (default:
//	                   the host of the address dialled)
//
// A tls-* parameter implies TLS. ParseURI reads the files named at once.
// Unknown parameters are an error. The port defaults to 12340 with either
// scheme. Errors never contain the token.
func ParseURI(uri string) (Options, error) {
	var o Options
	// net/url takes one host: the list is cut out, and the rest parsed
	// with a placeholder host.
	hosts, rest := splitHostList(uri)
	u, err := url.Parse(rest)
	if err != nil {
		return o, &Error{Type: TypeRequest, Msg: "invalid URI: " + uriProblem(err)}
	}
	var useTLS bool
	switch u.Scheme {
	case "mlock":
	case "mlocks":
		useTLS = true
	default:
		return o, &Error{Type: TypeRequest, Msg: fmt.Sprintf("URI scheme %q: want mlock or mlocks", u.Scheme)}
	}
	if (u.Path != "" && u.Path != "/") || u.Fragment != "" {
		// mlock://host/db: there are no databases; refuse what is not used.
		return o, &Error{Type: TypeRequest, Msg: "invalid URI: a path or fragment after the address is not used by mlock"}
	}
	if u.User != nil {
		tok, ok := u.User.Password()
		if u.User.Username() == "" || !ok || tok == "" {
			return o, &Error{Type: TypeRequest, Msg: "URI credentials: want mlock://name:token@host"}
		}
		o.Name, o.Token = u.User.Username(), Secret(tok)
	}
	if err := o.setHosts(hosts); err != nil {
		return o, err
	}
	ut, flag, err := o.setParams(u.Query())
	if err != nil {
		return o, err
	}
	useTLS = useTLS || flag == 1
	tlsOff := flag == 0
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

// setHosts sets the address (Host, Port) or addresses (Addrs) of a URI's
// host list.
func (o *Options) setHosts(hosts []string) error {
	var err error
	if len(hosts) == 1 {
		if o.Host, o.Port, err = uriHost(hosts[0]); err != nil {
			return &Error{Type: TypeRequest, Msg: "invalid URI: " + err.Error()}
		}
	} else {
		o.Addrs = make([]string, len(hosts))
		for i, h := range hosts {
			host, port, err := uriHost(h)
			if err == nil && host == "" {
				err = errors.New("empty address")
			}
			if err != nil {
				// The address is not quoted: a URI missing its '@' has the
				// token where the port goes.
				return &Error{Type: TypeRequest, Msg: fmt.Sprintf("invalid URI: address %d of %d: %v", i+1, len(hosts), err)}
			}
			o.Addrs[i] = net.JoinHostPort(host, strconv.Itoa(cmp.Or(port, DefaultPort)))
		}
	}
	return nil
}

// uriMs parses the value v of URI parameter k: a bare number is
// milliseconds, as in the seed; a Go duration (5s, 1m30s) is accepted too,
// as redis:// URLs do.
func uriMs(k, v string) (time.Duration, error) {
	if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
		return time.Duration(n) * time.Millisecond, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d >= 0 {
		return d, nil
	}
	return 0, &Error{Type: TypeRequest, Msg: fmt.Sprintf("URI parameter %s=%q: want milliseconds >= 0 or a duration such as 5s", k, v)}
}

// setParams sets the options of a URI's query parameters. It returns the
// tls-* parameters and what tls= says: 1 on, 0 off, -1 not given.
func (o *Options) setParams(q url.Values) (ut uriTLS, tls int, err error) {
	tls = -1
	for k, vs := range q {
		v := vs[len(vs)-1]
		switch k {
		case "timeout":
			o.Timeout, err = uriMs(k, v)
		case "ttl":
			o.TTL, err = uriMs(k, v)
		case "tolerate":
			o.Tolerate, err = strconv.Atoi(v)
			if err != nil || o.Tolerate < 0 {
				err = &Error{Type: TypeRequest, Msg: fmt.Sprintf("URI parameter tolerate=%q: want a count >= 0", v)}
			}
		case "prefix":
			o.Prefix = v
		case "stay-on-node":
			switch v {
			case "1", "true":
				o.StayOnNode = true
			case "0", "false":
				o.StayOnNode = false
			default:
				err = &Error{Type: TypeRequest, Msg: fmt.Sprintf("URI parameter stay-on-node=%q: want 1 or 0", v)}
			}
		case "socketId":
			o.SocketID = v
		case "tls":
			switch v {
			case "1", "true":
				tls = 1
			case "0", "false":
				tls = 0
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
			return ut, tls, err
		}
	}
	return ut, tls, nil
}

// splitHostList cuts the list of hosts out of a URI's authority: it
// returns the list, split at its commas (one empty host if there is none),
// and the URI with the list replaced by a placeholder host. A string that
// is not scheme://... is returned whole, for net/url to refuse.
func splitHostList(uri string) (hosts []string, rest string) {
	i := strings.Index(uri, "://")
	if i < 0 {
		return []string{""}, uri
	}
	start := i + 3
	end := len(uri)
	if j := strings.IndexAny(uri[start:], "/?#"); j >= 0 {
		end = start + j
	}
	at := start
	if j := strings.LastIndexByte(uri[start:end], '@'); j >= 0 {
		at = start + j + 1
	}
	return strings.Split(uri[at:end], ","), uri[:at] + "h" + uri[end:]
}

// uriHost parses one host[:port] of a URI's list (an IPv6 literal in
// brackets) with net/url's rules. Its errors do not quote it.
func uriHost(h string) (host string, port int, err error) {
	u, err := url.Parse("mlock://" + h)
	switch {
	case err != nil:
		return "", 0, errors.New(uriProblem(err))
	case u.User != nil || u.Path != "" || u.RawQuery != "" || u.Fragment != "":
		return "", 0, errors.New("invalid host")
	}
	if p := u.Port(); p != "" {
		if port, err = strconv.Atoi(p); err != nil || port > 65535 {
			return "", 0, errors.New("invalid port")
		}
	}
	return u.Hostname(), port, nil
}

// node is one server address of a session.
type node struct {
	host string // as given: the TLS ServerName by default
	addr string // host:port, the host in lower case: dialled, and in errors and the registry's key
}

// nodes returns the addresses o names: Addrs, or Host and Port (o has its
// defaults). An invalid or duplicate address is an error.
func (o *Options) nodes() ([]node, error) {
	if len(o.Addrs) == 0 {
		h := cmp.Or(o.Host, DefaultHost)
		return []node{{host: h, addr: net.JoinHostPort(strings.ToLower(h), strconv.Itoa(cmp.Or(o.Port, DefaultPort)))}}, nil
	}
	ns := make([]node, 0, len(o.Addrs))
	seen := make(map[string]bool, len(o.Addrs))
	for i, a := range o.Addrs {
		host, port, err := splitAddr(a)
		if err != nil {
			return nil, &Error{Type: TypeRequest, Msg: fmt.Sprintf("Options.Addrs[%d] %q: %v", i, a, err)}
		}
		n := node{host: host, addr: net.JoinHostPort(strings.ToLower(host), strconv.Itoa(cmp.Or(port, o.Port, DefaultPort)))}
		if seen[n.addr] {
			return nil, &Error{Type: TypeRequest, Msg: fmt.Sprintf("Options.Addrs: %s given twice", n.addr)}
		}
		seen[n.addr] = true
		ns = append(ns, n)
	}
	return ns, nil
}

// splitAddr splits one address of Options.Addrs: host, host:port, or an
// IPv6 literal, bare or in brackets, with or without a port. Port 0: none
// given.
func splitAddr(a string) (host string, port int, err error) {
	switch {
	case a == "":
		return "", 0, errors.New("empty address")
	case net.ParseIP(a) != nil: // 10.0.0.1, ::1
		return a, 0, nil
	case strings.HasPrefix(a, "[") && strings.HasSuffix(a, "]"):
		host = a[1 : len(a)-1]
	case strings.HasPrefix(a, "[") || strings.Contains(a, ":"):
		var p string
		if host, p, err = net.SplitHostPort(a); err != nil {
			return "", 0, errors.New("want host, host:port or [IPv6]:port")
		}
		if port, err = strconv.Atoi(p); err != nil || port < 0 || port > 65535 {
			return "", 0, errors.New("invalid port")
		}
	default:
		host = a
	}
	if host == "" || !printable(host) || strings.ContainsAny(host, "[]/@,?#") ||
		strings.Contains(host, ":") && net.ParseIP(strings.SplitN(host, "%", 2)[0]) == nil {
		return "", 0, errors.New("invalid host")
	}
	return host, port, nil
}

// Validate reports the first invalid field.
func (o *Options) Validate() error {
	bad := func(f string, a ...any) error { return &Error{Type: TypeRequest, Msg: fmt.Sprintf(f, a...)} }
	switch {
	case o.Port < 0 || o.Port > 65535:
		return bad("Options.Port out of range 0-65535")
	case len(o.Addrs) > 0 && o.Host != "":
		return bad("Options.Host and Options.Addrs: give one or the other")
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
	_, err := o.nodes()
	return err
}

func (o Options) withDefaults() Options {
	if len(o.Addrs) == 0 {
		if o.Host == "" {
			o.Host = DefaultHost
		}
		if o.Port == 0 {
			o.Port = DefaultPort
		}
	} else {
		o.Addrs = slices.Clone(o.Addrs) // the caller's slice may change
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

func randomID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
