package server

import (
	"net"
	"net/netip"
	"sort"
	"sync"
	"time"

	"github.com/mlock-dev/mlock/internal/auth"
	"github.com/mlock-dev/mlock/internal/core"
	"github.com/mlock-dev/mlock/internal/protocol"
)

// Pre-handshake connections.
//
// A connection is "pre-handshake" (unauthenticated) from its accept until
// its connect succeeds: the TLS handshake and the connect frame. Holding
// one costs its client a socket and nothing else, so they are bounded
// twice:
//
//   - Per address (MaxUnauthenticatedPerIP, loopback addresses included,
//     each on its own; IPv6 by /64): a newcomer from an address at its cap
//     is refused at once ("too many connections from this address!"),
//     before any goroutine or buffer is made for it. An address can only
//     crowd out itself, and its excess costs an accept and a close: the
//     listener's queue, which every newcomer waits in, drains fast.
//   - In all (MaxUnauthenticated): a newcomer when the pool is full (an
//     attacker over more addresses than MaxUnauthenticated /
//     MaxUnauthenticatedPerIP) is not refused: it evicts the oldest
//     pre-handshake connection of any address. Attackers keep reopening; a
//     client that completes its connect within a round trip is in before
//     its turn to be the oldest comes.
//   - MaxConns: a newcomer when the server is at MaxConns evicts the oldest
//     pre-handshake connection if there is one, and is refused only when
//     every connection is authenticated.
//
// An evicted connection is told "too many connections!" (in clear text
// only: a TLS client mid-handshake is closed) and closed; a connect it had
// sent is not handled. The pool is two intrusive lists of conns, oldest
// first: every pre-handshake connection, and those of one address. All of
// it is guarded by the core.

// preList is a list of pre-handshake connections, oldest first.
type preList struct {
	head, tail *conn
	n          int
}

// preLinks are a conn's links in the pool's two lists.
type preLinks struct {
	prev, next   *conn // in Server.pre
	aprev, anext *conn // in Server.preByIP[key]
	key          netip.Addr
}

// preKey is the key a connection counts under for MaxUnauthenticatedPerIP:
// its address (loopback included, 127.0.0.2 apart from 127.0.0.1), or its
// IPv6 /64; the zero Addr, not counted per address, for a connection that
// is not TCP.
func preKey(ip netip.Addr) netip.Addr {
	switch {
	case !ip.IsValid():
		return netip.Addr{}
	case ip.Is6():
		p, _ := ip.Prefix(64)
		return p.Addr()
	}
	return ip
}

// enterPreLocked adds c, just accepted, to the pool.
func (s *Server) enterPreLocked(c *conn) {
	c.unauthed = true
	s.unauthed++
	l := &c.pre
	l.key = preKey(c.ip)
	l.prev = s.pre.tail
	if s.pre.tail != nil {
		s.pre.tail.pre.next = c
	} else {
		s.pre.head = c
	}
	s.pre.tail = c
	s.pre.n++
	if !l.key.IsValid() {
		return
	}
	a := s.preByIP[l.key]
	if a == nil {
		a = &preList{}
		s.preByIP[l.key] = a
	}
	l.aprev = a.tail
	if a.tail != nil {
		a.tail.pre.anext = c
	} else {
		a.head = c
	}
	a.tail = c
	a.n++
}

// leavePreLocked removes c from the pool (its connect succeeded, it was
// evicted or it ended); nothing if it is not in it.
func (s *Server) leavePreLocked(c *conn) {
	if !c.unauthed {
		return
	}
	c.unauthed = false
	s.unauthed--
	l := &c.pre
	if l.prev != nil {
		l.prev.pre.next = l.next
	} else {
		s.pre.head = l.next
	}
	if l.next != nil {
		l.next.pre.prev = l.prev
	} else {
		s.pre.tail = l.prev
	}
	s.pre.n--
	if a := s.preByIP[l.key]; a != nil {
		if l.aprev != nil {
			l.aprev.pre.anext = l.anext
		} else {
			a.head = l.anext
		}
		if l.anext != nil {
			l.anext.pre.aprev = l.aprev
		} else {
			a.tail = l.aprev
		}
		if a.n--; a.n == 0 {
			delete(s.preByIP, l.key)
		}
	}
	*l = preLinks{}
}

// preFullLocked reports whether ip's address is at its cap of
// pre-handshake connections.
func (s *Server) preFullLocked(ip netip.Addr) bool {
	key := preKey(ip)
	if !key.IsValid() {
		return false
	}
	a := s.preByIP[key]
	return a != nil && a.n >= s.cfg.MaxUnauthenticatedPerIP
}

// evictLocked ends c, a pre-handshake connection, to make room for a
// newcomer: "too many connections!" on plain TCP, then the close. Its
// reader, which may hold a connect read before the eviction, handles
// nothing more (handle, decide).
func (s *Server) evictLocked(now int64, c *conn) {
	s.leavePreLocked(c)
	c.evicted = true
	s.evicting++
	s.counters.evicted++
	s.logRefusal(now, "connection evicted before its handshake: the pre-handshake pool is full", "remote", c.remote)
	if s.tlsConf == nil && !c.plain {
		c.sendError(protocol.CodeTooManyConnections)
		return
	}
	// A TLS client mid-handshake cannot read a clear-text error; a plain
	// status request writes its own answer.
	c.finish()
	c.nc.Close()
}

// Quotas per principal.
//
// A principal's quota (auth.Quota: its line's max-locks=, max-sessions=,
// max-conns=, else the server's defaults) caps its live lock requests and
// its sessions, counted by the engine over the sessions scoped to it (so on
// a cluster, over every node), and its authenticated connections (on a
// cluster, on each node). A principal at a quota is refused what would go
// past it, with a text of its own; nobody else is. The anonymous principal
// (a server without credentials) has no quota: the server-wide caps apply.
// A reload changes the quota of established sessions at once; what a
// principal already holds past a lowered quota is kept (locks, sessions,
// connections), and new requests, sessions and connections are refused
// until it is under the quota again.

// defaultQuota returns the server's default quota (Config.PrincipalMax*):
// a zero field is half the server-wide cap, a negative one none.
func defaultQuota(cfg *Config) auth.Quota {
	def := func(v, wide int) int {
		switch {
		case v < 0, v == 0 && wide <= 0:
			return auth.Unlimited
		case v == 0:
			return max(wide/2, 1)
		}
		return v
	}
	return auth.Quota{
		MaxLocks:    def(cfg.PrincipalMaxLocks, cfg.MaxLocks),
		MaxSessions: def(cfg.PrincipalMaxSessions, cfg.MaxSessions),
		MaxConns:    def(cfg.PrincipalMaxConns, cfg.MaxConns),
	}
}

// quotaOf returns the quota in force for p: its line's, else the
// server's defaults. The anonymous principal has none.
func (s *Server) quotaOf(p *auth.Principal) auth.Quota {
	if p.Name == "" {
		return auth.Quota{MaxLocks: auth.Unlimited, MaxSessions: auth.Unlimited, MaxConns: auth.Unlimited}
	}
	return p.Quota.Or(s.defQuota)
}

// over reports whether used is at a quota n (Unlimited: never).
func over(used, n int) bool { return n > 0 && used >= n }

// connQuotaLocked checks the quotas of p for a connect on c: its
// connections, and its sessions if the connect starts one (newSession).
// replacing: the connect takes its session over from another connection
// here, which then ends, so that one is not counted (a client that
// reconnects past a half-open connection is not refused its own session).
// On success it counts c against p's connections; false: refused
// (answered, and counted).
func (s *Server) connQuotaLocked(tx *core.Tx, c *conn, p *auth.Principal, newSession, replacing bool) bool {
	if p.Name == "" {
		return true
	}
	q := s.quotaOf(p)
	code := protocol.CodeUnknown
	used := s.pconns[p.Name]
	if replacing {
		used--
	}
	switch {
	case over(used, q.MaxConns):
		code = protocol.CodeQuotaConns
	case newSession && over(tx.GroupSessions(p.Name), q.MaxSessions):
		code = protocol.CodeQuotaSessions
	default:
		if c.counted == "" {
			c.counted = p.Name
			s.pconns[p.Name]++
		}
		return true
	}
	s.counters.quotaRefused++
	s.logRefusal(tx.Now(), "connect refused: "+code.Text(), "principal", p.Name, "remote", c.remote)
	c.sendError(code)
	return false
}

// uncountLocked takes c off its principal's connections.
func (s *Server) uncountLocked(c *conn) {
	if c.counted == "" {
		return
	}
	if s.pconns[c.counted]--; s.pconns[c.counted] <= 0 {
		delete(s.pconns, c.counted)
	}
	c.counted = ""
}

// lockQuotaLocked reports whether p may add a lock request: under its
// max-locks. It runs in a core batch.
func (s *Server) lockQuotaLocked(tx *core.Tx, p *auth.Principal) bool {
	if p.Name == "" {
		return true
	}
	return !over(tx.GroupRequests(p.Name), s.quotaOf(p).MaxLocks)
}

// principalsStatus lists every principal with a session or a connection
// here, with its use and its quota in force (at most limit of them, by
// name). It runs in a core batch.
func (s *Server) principalsStatus(tx *core.Tx, limit int) (map[string]protocol.StatusPrincipal, bool) {
	names := map[string]bool{}
	for name := range s.pconns {
		names[name] = true
	}
	for id := range s.sessions {
		if name, _ := unscope(id); name != "" {
			names[name] = true
		}
	}
	sorted := make([]string, 0, len(names))
	for name := range names {
		sorted = append(sorted, name)
	}
	sort.Strings(sorted)
	truncated := len(sorted) > limit
	if truncated {
		sorted = sorted[:limit]
	}
	tab := s.auth.Load()
	out := make(map[string]protocol.StatusPrincipal, len(sorted))
	for _, name := range sorted {
		p := &auth.Principal{Name: name}
		if tab != nil {
			if tp, ok := tab.Principal(name); ok {
				p = tp
			}
		}
		q := s.quotaOf(p)
		out[name] = protocol.StatusPrincipal{
			Locks: tx.GroupRequests(name), Sessions: tx.GroupSessions(name), Conns: s.pconns[name],
			MaxLocks: max(q.MaxLocks, 0), MaxSessions: max(q.MaxSessions, 0), MaxConns: max(q.MaxConns, 0),
		}
	}
	return out, truncated
}

// The tarpit.
//
// A connection refused for its address's cap of pre-handshake connections
// ("too many connections from this address!"), or whose connect is refused
// for its credentials ("authentication required!", "authentication
// failed!", protected mode) while its address has other pre-handshake
// connections or sockets in the tarpit (crowdedLocked), is told so at once,
// but its
// socket is closed only at the end of its auth timeout, AuthTimeout after
// its accept (or sooner when the tarpit holds tarpitMax of them); any other
// refusal closes at once. An attacker that holds and reopens connections as
// fast as they are closed would otherwise cycle them as fast as the server
// can accept, and every newcomer, healthy or not, waits in the listener's
// one queue behind them. Held, a refused socket costs a file descriptor
// and no goroutine (its reader has stopped; nothing more it sends is
// read); a client that reads the error closes it itself.

// crowdedLocked reports whether c's address has another pre-handshake
// connection than c, or a socket in the tarpit: a refused connect then goes
// to the tarpit too. A lone client refused (a wrong token, say) is closed
// at once.
func (s *Server) crowdedLocked(c *conn) bool {
	if a := s.preByIP[c.pre.key]; c.unauthed && a != nil && a.n >= 2 {
		return true
	}
	return s.tarpit.holds(preKey(c.ip))
}

// tarpitMax caps the sockets the tarpit holds; past it the oldest is closed.
const tarpitMax = 10_000

// tarpit holds refused sockets until their time is up, oldest first.
type tarpit struct {
	mu      sync.Mutex
	q       []parked           // from head on; guarded by mu
	head    int                // guarded by mu
	running bool               // the sweeper runs; guarded by mu
	byIP    map[netip.Addr]int // sockets held, by preKey; guarded by mu
}

type parked struct {
	nc    net.Conn
	key   netip.Addr
	until time.Time
}

// holds reports whether the tarpit holds a socket of key's address.
func (tp *tarpit) holds(key netip.Addr) bool {
	if !key.IsValid() {
		return false
	}
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return tp.byIP[key] > 0
}

// dropLocked closes the oldest socket held. tp.mu is held.
func (tp *tarpit) dropLocked() {
	p := tp.q[tp.head]
	p.nc.Close()
	if tp.byIP[p.key]--; tp.byIP[p.key] <= 0 {
		delete(tp.byIP, p.key)
	}
	tp.q[tp.head] = parked{}
	tp.head++
}

// park holds nc, a connection from ip, until d from now, and starts the
// sweeper if it is not running. After the server closed it closes nc at
// once.
func (s *Server) park(nc net.Conn, ip netip.Addr, d time.Duration) {
	tp := &s.tarpit
	tp.mu.Lock()
	if s.closed.Load() {
		tp.mu.Unlock()
		nc.Close()
		return
	}
	if len(tp.q)-tp.head >= tarpitMax {
		tp.dropLocked()
	}
	key := preKey(ip)
	if tp.byIP == nil {
		tp.byIP = make(map[netip.Addr]int)
	}
	tp.byIP[key]++
	tp.q = append(tp.q, parked{nc: nc, key: key, until: time.Now().Add(d)})
	start := !tp.running
	tp.running = true
	if start {
		s.wg.Add(1)
	}
	tp.mu.Unlock()
	if start {
		go s.sweep()
	}
}

// sweep closes the parked sockets whose time is up, every 50 ms, until the
// tarpit is empty or the server is closed (then it closes them all).
func (s *Server) sweep() {
	defer s.wg.Done()
	tp := &s.tarpit
	for {
		time.Sleep(50 * time.Millisecond)
		now := time.Now()
		closed := s.closed.Load()
		tp.mu.Lock()
		for tp.head < len(tp.q) && (closed || !now.Before(tp.q[tp.head].until)) {
			tp.dropLocked()
		}
		if tp.head > len(tp.q)/2 {
			n := copy(tp.q, tp.q[tp.head:])
			clear(tp.q[n:])
			tp.q, tp.head = tp.q[:n], 0
		}
		if len(tp.q) == 0 {
			tp.running = false
			tp.mu.Unlock()
			return
		}
		tp.mu.Unlock()
	}
}
