package server

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/mlock-dev/mlock/internal/auth"
	"github.com/mlock-dev/mlock/internal/core"
	"github.com/mlock-dev/mlock/internal/protocol"
)

// Principals and isolation.
//
// Every session belongs to one principal, fixed at connect. The engine
// knows nothing of principals: the server scopes the names it hands the
// engine. A session's engine id is the principal's name, a NUL byte and the
// socketId; an owner is scoped the same way (the engine refuses a space in
// an owner, so the separator cannot be the wire's). A principal's name has
// no NUL, and a name is split at its first NUL, so two principals never
// share a session or an owner, and a principal reaches another's locks
// neither by owner (release, releaseall, renew, re-entry) nor by socketId.
// Lock ids, which are secrets, are checked too: a lock of another principal
// "does not exist". Without credentials configured there is one principal,
// anonymous (the empty name, every right), and names are not scoped at all;
// so that no anonymous name can spell a scoped one, a socketId or owner
// holding a NUL byte is refused.

// anyone is the anonymous principal of a server without credentials: it may
// lock anything and administer.
var anyone = auth.Anonymous()

// scopeSep separates a principal's name from a name it uses.
const scopeSep = "\x00"

// scope returns the engine name of a session id or owner of principal p.
func scope(p *auth.Principal, name string) string {
	if p.Name == "" {
		return name
	}
	return p.Name + scopeSep + name
}

// unscope splits an engine name into its principal's name and the name the
// principal knows.
func unscope(name string) (principal, rest string) {
	if i := strings.Index(name, scopeSep); i >= 0 {
		return name[:i], name[i+1:]
	}
	return "", name
}

// credentialed reports whether the server has credentials configured: an
// auth file or client certificates. Without, it is in protected mode
// unless Config.Insecure.
func (s *Server) credentialed() bool {
	return s.cfg.AuthFile != "" || s.cfg.TLSClientCAFile != ""
}

// protectedRefuses reports whether protected mode refuses a client at ip
// that has no credentials: no auth file, not Insecure, not loopback. With
// an auth file the principals decide instead.
func (s *Server) protectedRefuses(ip netip.Addr) bool {
	return s.auth.Load() == nil && !s.cfg.Insecure && ip.IsValid() && !ip.Unmap().IsLoopback()
}

// principalFor decides who a connect is: by token (cred, "name:token"), by
// verified client certificate, by address, or anonymous (only on a server
// without credentials, in protected mode or Insecure). It returns the
// code of the connection error otherwise. It runs in a core batch.
func (s *Server) principalFor(c *conn, cred []byte, hasCred bool) (*auth.Principal, protocol.Code) {
	tab := s.auth.Load()
	switch {
	case hasCred:
		if tab == nil {
			return nil, protocol.CodeAuthNotConfigured
		}
		name, token, ok := strings.Cut(string(cred), ":")
		if !ok {
			return nil, protocol.CodeAuthFailed
		}
		p, err := tab.Token(name, token, c.ip)
		if err != nil {
			return nil, protocol.CodeAuthFailed
		}
		return p, 0
	case c.certName != "":
		if tab == nil {
			if !auth.ValidName(c.certName) {
				return nil, protocol.CodeAuthFailed // not usable as a principal's name
			}
			return &auth.Principal{Name: c.certName}, 0
		}
		if p, ok := tab.Cert(c.certName); ok {
			return p, 0
		}
		return nil, protocol.CodeAuthFailed
	case tab != nil:
		if p, ok := tab.Address(c.ip); ok {
			return p, 0
		}
		return nil, protocol.CodeAuthRequired
	case s.credentialed():
		// Client certificates are the credentials: a client without one
		// is nobody, on loopback too.
		return nil, protocol.CodeAuthRequired
	case s.protectedRefuses(c.ip):
		return nil, protocol.CodeProtectedMode
	}
	return anyone, 0
}

// hasField reports whether one of a connect's extension fields is want.
func hasField(f [][]byte, want string) bool {
	for _, x := range f {
		if string(x) == want {
			return true
		}
	}
	return false
}

// authField returns the credential of a connect's extension fields
// (auth=<name>:<token>), and whether there is one. Other fields are
// ignored.
func authField(f [][]byte) ([]byte, bool) {
	for _, x := range f {
		if len(x) >= 5 && string(x[:5]) == "auth=" {
			return x[5:], true
		}
	}
	return nil, false
}

// Reload reads the auth file, the TLS certificate and key and the client CA
// file again (mlockd does it on SIGHUP). New connections see the result;
// established ones keep their TLS session, and their sessions take the new
// rights and quotas of their principal. On an error nothing changes for
// that part: a bad auth file keeps the old principals, a bad certificate
// the old one, a bad client CA file the old CAs.
func (s *Server) Reload() error {
	var errs []error
	if s.cfg.AuthFile != "" {
		if tab, err := s.loadAuth(); err != nil {
			errs = append(errs, err)
		} else {
			old := s.auth.Swap(tab)
			s.log.Info("auth file reloaded", "path", s.cfg.AuthFile, "principals", tab.Len())
			s.batch(func(*core.Tx) { s.applyAuthLocked(old, tab) })
		}
	}
	if s.certs != nil {
		if err := s.certs.Reload(); err != nil {
			errs = append(errs, fmt.Errorf("server: reloading the TLS certificate: %w", err))
		} else {
			s.log.Info("TLS certificate reloaded", "cert", s.cfg.TLSCertFile, "client-ca", s.cfg.TLSClientCAFile)
		}
	}
	return errors.Join(errs...)
}

// applyAuthLocked brings the sessions in line with a reloaded auth file. A
// session's principal takes its new rights at once. The connections of a
// principal that is gone are told "authentication failed!" and closed; those
// of a principal whose credentials changed (token, from=, cert) are closed
// without a word, so that their clients connect again and prove who they are
// (the 1.0 client gives up for good on an error frame, but reconnects after
// a close). Either way the session keeps its grace period, as after any
// disconnection: its client may still believe in its locks until then. It
// runs in a core batch.
func (s *Server) applyAuthLocked(old, tab *auth.Table) {
	for _, sess := range s.sessions {
		name := sess.p.Name
		if name == "" || old == nil {
			continue
		}
		p, changed := tab.Since(old, name)
		if p == nil {
			sess.p = &auth.Principal{Name: name, Prefixes: []string{}} // no rights
			if c := sess.c; c != nil {
				s.log.Warn("principal removed from the auth file: connection closed", "principal", name, "remote", c.remote)
				c.sendError(protocol.CodeAuthFailed)
			}
			continue
		}
		sess.p = p
		if c := sess.c; c != nil && changed {
			s.log.Info("credentials changed in the auth file: connection closed to authenticate again", "principal", name, "remote", c.remote)
			c.finish()
		}
	}
}

// loadAuth loads Config.AuthFile and logs its warnings.
func (s *Server) loadAuth() (*auth.Table, error) {
	tab, err := auth.Load(s.cfg.AuthFile)
	if err != nil {
		return nil, fmt.Errorf("server: auth file: %w", err)
	}
	for _, w := range tab.Warnings() {
		s.log.Warn("auth file: "+w, "path", s.cfg.AuthFile)
	}
	return tab, nil
}

// setupSecurity loads the credentials and TLS configuration in New and logs
// the mode the server runs in.
func (s *Server) setupSecurity() error {
	cfg := &s.cfg
	if cfg.AuthFile != "" {
		tab, err := s.loadAuth()
		if err != nil {
			return err
		}
		s.auth.Store(tab)
	}
	if cfg.TLSCertFile != "" {
		tc, certs, err := auth.ServerConfig(cfg.TLSCertFile, cfg.TLSKeyFile, cfg.TLSClientCAFile)
		if err != nil {
			return fmt.Errorf("server: TLS: %w", err)
		}
		s.tlsConf, s.certs = tc, certs
	}
	switch {
	case s.credentialed():
		s.log.Info("authentication on", "auth-file", cfg.AuthFile, "client-certificates", cfg.TLSClientCAFile != "",
			"tls", s.tlsConf != nil)
	case cfg.Insecure:
		s.log.Warn("insecure: no credentials configured and clients are accepted from any address; anyone who reaches the server can take, release and list every lock")
	default:
		s.log.Info("protected mode: no credentials configured, so only clients on loopback are accepted (configure an auth file, or --insecure)")
	}
	return nil
}

// checkListener refuses to serve a listener beyond loopback without
// credentials, unless Config.Insecure.
func (s *Server) checkListener(addr net.Addr) error {
	if s.credentialed() || s.cfg.Insecure {
		return nil
	}
	ta, ok := addr.(*net.TCPAddr)
	if !ok {
		return nil // not TCP (a test's pipe, a unix socket): reachable locally only
	}
	if ip, ok := netip.AddrFromSlice(ta.IP); ok && ip.Unmap().IsLoopback() {
		return nil
	}
	return fmt.Errorf("server: listening on %s without credentials: configure an auth file (--auth-file) or client certificates, or accept the risk with --insecure", addr)
}

// ipKey is the key a connection counts under for MaxConnsPerIP: its IPv4
// address, or its IPv6 /64 (one host is given a whole /64); the zero Addr,
// not counted, for loopback and connections that are not TCP.
func ipKey(ip netip.Addr) netip.Addr {
	switch {
	case !ip.IsValid() || ip.IsLoopback():
		return netip.Addr{}
	case ip.Is6():
		p, _ := ip.Prefix(64)
		return p.Addr()
	}
	return ip
}

// remoteIP returns the IP of a connection's peer, the zero Addr if it has
// none: a connection that is not TCP (a unix socket, an in-process pipe) is
// local, and no per-address limit or rule applies to it.
func remoteIP(nc net.Conn) netip.Addr {
	if ta, ok := nc.RemoteAddr().(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(ta.IP); ok {
			return ip.Unmap()
		}
	}
	return netip.Addr{}
}

// handshake runs the TLS handshake of c, bounded by the auth timeout, and
// records the name of a verified client certificate. by is the end of the
// auth timeout. A client that does
// not speak TLS is told so in clear text.
func (c *conn) handshake(tc *tls.Conn, by time.Time) error {
	s := c.srv
	_ = tc.SetDeadline(by)
	err := tc.Handshake()
	if err != nil {
		var rh tls.RecordHeaderError
		if errors.As(err, &rh) && rh.Conn != nil {
			_ = rh.Conn.SetWriteDeadline(time.Now().Add(time.Second))
			_, _ = rh.Conn.Write(protocol.AppendError(nil, protocol.CodeTLSRequired))
		}
		s.log.Debug("TLS handshake failed", "remote", c.remote, "err", err)
		return err
	}
	_ = tc.SetWriteDeadline(time.Time{})
	c.certName = auth.VerifiedName(tc.ConnectionState())
	return nil
}

// allowListing takes one token of the detailed status and locks rate of
// the principal of c: each principal has a bucket of its own (StatusRate per
// second, as many in a burst), so that one cannot use up another's,
// administrators included. It runs in a core batch.
func (s *Server) allowListing(tx *core.Tx, name string) bool {
	rate := s.cfg.StatusRate
	if rate >= int(^uint(0)>>1) {
		return true
	}
	b := s.buckets[name]
	if b == nil {
		if len(s.buckets) >= maxBuckets {
			clear(s.buckets) // principals come from the auth file: this only guards against growth
		}
		b = &bucket{tokens: float64(rate), last: tx.Now()}
		s.buckets[name] = b
	}
	if !b.take(tx.Now(), rate) {
		s.counters.rateLimited++
		return false
	}
	return true
}

// bucket is a token bucket of listings.
type bucket struct {
	tokens float64
	last   int64 // ns
}

// take refills b at rate tokens a second, up to rate, for the time since
// its last take (now in ns, on the core's clock; a clock that went back
// refills nothing), then takes one token if there is one.
func (b *bucket) take(now int64, rate int) bool {
	if now > b.last {
		b.tokens = min(float64(rate), b.tokens+float64(now-b.last)/float64(time.Second)*float64(rate))
		b.last = now
	}
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// maxBuckets bounds the listing buckets kept (one per principal name).
const maxBuckets = 10_000

// logRefusal logs a refused connection or connect, at most once a second
// (with the count of those not logged since): refusals can be made by
// anyone who reaches the port, and must not flood the log. It runs in a
// core batch.
func (s *Server) logRefusal(now int64, msg string, attrs ...any) {
	r := &s.refusalLog
	if now-r.last < int64(time.Second) {
		r.dropped++
		return
	}
	if r.dropped > 0 {
		attrs = append(attrs, "not-logged-since", r.dropped)
	}
	r.last, r.dropped = now, 0
	s.log.Warn(msg, attrs...)
}

// HTTPAdmin reports whether an HTTP request comes from an administrator of
// the auth file: an admin principal's bearer token ("Authorization: Bearer
// <name>:<token>"), its name and token as Basic credentials, or, on a TLS
// listener with client CAs, a verified client certificate of an admin
// principal marked cert. A token is accepted only from its principal's
// from= networks, as on the lock port. Without an auth file nobody is (no
// principal administers). It is safe for concurrent use.
func (s *Server) HTTPAdmin(r *http.Request) bool {
	tab := s.auth.Load()
	if tab == nil {
		return false
	}
	if r.TLS != nil {
		if name := auth.VerifiedName(*r.TLS); name != "" {
			if p, ok := tab.Cert(name); ok && p.Admin {
				return true
			}
		}
	}
	name, token, ok := r.BasicAuth()
	if !ok {
		cred, bearer := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !bearer {
			return false
		}
		if name, token, ok = strings.Cut(strings.TrimSpace(cred), ":"); !ok {
			return false
		}
	}
	var ip netip.Addr
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		ip = ap.Addr().Unmap()
	}
	p, err := tab.Token(name, token, ip)
	return err == nil && p.Admin
}

// TLSConfig returns the TLS configuration of the lock listener (its
// certificate and client CAs, reloaded by Reload), for another listener of
// the same server (mlockd's HTTP one); nil without Config.TLSCertFile. The
// caller must not modify it: clone it to change it.
func (s *Server) TLSConfig() *tls.Config { return s.tlsConf }
