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
// one costs its client a socket and nothing else, so they are bounded in
// all, and the rule that makes room keeps one address, or a few, from
// keeping the others out:
//
//   - Nobody is refused while the pool has room: below MaxUnauthenticated
//     pre-handshake connections (and MaxConns connections), every
//     newcomer is let in, whatever its address and however many
//     connections that address has in the pool.
//   - A newcomer when the pool is full, or the server at MaxConns, evicts
//     one pre-handshake connection: the oldest of the address that holds
//     the most of the pool (ties: the address whose oldest is oldest).
//     When its own address holds as much of the pool as that one, the
//     newcomer is refused instead (with the pool's text, or MaxConns's,
//     "too many connections!", when the pool has room), at the cost of an
//     accept and the tarpit: evicting would trade one of the largest
//     holders' connections for another, at the cost of a connection made
//     and one ended (what an attacker reopening as fast as it is closed
//     would otherwise make the server do, on every connection).
//     An attacker holding the pool from one address, or from fifty, holds
//     more of it than any address of legitimate clients, whose connections
//     leave the pool a round trip after they came: the attacker's are the
//     ones evicted. Addresses count each on its own (loopback addresses
//     too, 127.0.0.2 apart from 127.0.0.1), IPv6 by /64; connections that
//     are not TCP count together under the zero address.
//   - MaxUnauthenticatedPerIP (default: the pool's size) is the most one
//     address holds: its newcomer past it evicts that address's oldest.
//   - An evicted connection is told "too many unauthenticated
//     connections!" (in clear text only: a TLS client mid-handshake is
//     closed) and its reader is stopped; a connect it had sent is not
//     handled. Its socket goes to the tarpit while its address has other
//     pre-handshake connections or sockets in the tarpit (crowdedLocked):
//     an attacker's, which reopens it as soon as it is closed, is held
//     until its auth timeout; a client that reads the error closes it
//     itself and tries again at once.
//   - The limits of established connections (MaxConnsPerIP, MaxConns when
//     every connection is authenticated) are not applied at the accept but
//     at the first frame (overCap): a cluster node's forwarding link, which
//     proves itself with the cluster's secret, is let in past them and is
//     not counted against them; a client's connect is refused with the
//     limit's text.
//
// The pool is two intrusive lists of conns, oldest first: every
// pre-handshake connection, and those of one address; the addresses' lists
// are in a heap by their length (admission.top). All of it is guarded by
// the core: entering, leaving and evicting cost O(log A), A the addresses
// in the pool.

// preList is a list of pre-handshake connections, oldest first.
type preList struct {
	head, tail *conn
	n          int
	key        netip.Addr // the address's key (preKey); a list of one address only
	idx        int        // its place in admission.top; a list of one address only
}

// preLinks are a conn's links in the pool's two lists.
type preLinks struct {
	prev, next   *conn // in Server.pre
	aprev, anext *conn // in Server.preByIP[key]
	key          netip.Addr
	seq          uint64 // its order of entry: lower is older
}

// admission is the state of admission beside the pool's lists. It is
// guarded by the core.
type admission struct {
	top   []*preList // the addresses' lists, a heap: the one holding the most first (above)
	seq   uint64     // the last preLinks.seq given
	links int        // connections in Server.conns that are cluster forwarding links
}

// before reports whether address list a is evicted from before b: it
// holds more, or as many and its oldest is older.
func (a *preList) before(b *preList) bool {
	return a.n > b.n || a.n == b.n && a.head.pre.seq < b.head.pre.seq
}

func (ad *admission) swap(i, j int) {
	ad.top[i], ad.top[j] = ad.top[j], ad.top[i]
	ad.top[i].idx, ad.top[j].idx = i, j
}

// fix restores the heap after the list at i changed.
func (ad *admission) fix(i int) {
	for i > 0 { // up
		p := (i - 1) / 2
		if !ad.top[i].before(ad.top[p]) {
			break
		}
		ad.swap(i, p)
		i = p
	}
	for { // down
		l, m := 2*i+1, i
		if l < len(ad.top) && ad.top[l].before(ad.top[m]) {
			m = l
		}
		if r := l + 1; r < len(ad.top) && ad.top[r].before(ad.top[m]) {
			m = r
		}
		if m == i {
			return
		}
		ad.swap(i, m)
		i = m
	}
}

// push adds list a to the heap.
func (ad *admission) push(a *preList) {
	a.idx = len(ad.top)
	ad.top = append(ad.top, a)
	ad.fix(a.idx)
}

// remove takes list a out of the heap.
func (ad *admission) remove(a *preList) {
	i, last := a.idx, len(ad.top)-1
	if i != last {
		ad.swap(i, last)
	}
	ad.top[last] = nil
	ad.top = ad.top[:last]
	if i != last {
		ad.fix(i)
	}
	a.idx = -1
}

// preKey is the key a connection counts under in the pool: its address
// (loopback included, 127.0.0.2 apart from 127.0.0.1), or its IPv6 /64;
// the zero Addr for a connection that is not TCP.
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
	s.adm.seq++
	l.seq = s.adm.seq
	l.prev = s.pre.tail
	if s.pre.tail != nil {
		s.pre.tail.pre.next = c
	} else {
		s.pre.head = c
	}
	s.pre.tail = c
	s.pre.n++
	a := s.preByIP[l.key]
	if a == nil {
		a = &preList{key: l.key}
		s.preByIP[l.key] = a
	}
	l.aprev = a.tail
	if a.tail != nil {
		a.tail.pre.anext = c
	} else {
		a.head = c
	}
	a.tail = c
	if a.n++; a.n == 1 {
		s.adm.push(a)
	} else {
		s.adm.fix(a.idx)
	}
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
			s.adm.remove(a)
			delete(s.preByIP, l.key)
		} else {
			s.adm.fix(a.idx)
		}
	}
	*l = preLinks{}
}

// victimLocked returns the pre-handshake connection a newcomer from ip
// evicts, nil if it evicts none: when the pool is full or the server at
// MaxConns (full), the oldest of the address holding the most of the pool;
// else, when ip's address holds MaxUnauthenticatedPerIP, its oldest.
// refuse: the pool is full and ip's own address holds as much of it as
// the victim's: the newcomer is refused instead (refuseLocked).
func (s *Server) victimLocked(ip netip.Addr, full bool) (v *conn, refuse bool) {
	if len(s.adm.top) == 0 {
		return nil, false
	}
	own := s.preByIP[preKey(ip)]
	if full || s.unauthed >= s.cfg.MaxUnauthenticated {
		top := s.adm.top[0]
		return top.head, own != nil && own.n >= top.n
	}
	if own != nil && own.n >= s.preCapPerIP() {
		return own.head, false
	}
	return nil, false
}

// refuseNewcomerLocked counts and logs the refusal of a newcomer whose own
// address holds the most of the pre-handshake pool when the pool is full,
// or the server at MaxConns, and returns the text it is told: an eviction
// would only trade one of that address's connections for another, at the
// cost of making a connection and ending one (an attacker reopening as
// fast as it is closed pays the accept and the tarpit instead). The text
// and the count are the full pool's (pool_full) when the pool is full,
// else MaxConns's (max_conns).
func (s *Server) refuseNewcomerLocked(now int64, remote net.Addr) protocol.Code {
	if s.unauthed < s.cfg.MaxUnauthenticated {
		s.counters.rejected++
		s.logRefusal(now, "connection refused: "+protocol.CodeTooManyConnections.Text()+" (its address holds the most of the pre-handshake pool)",
			"remote", remote, "refused-total", s.counters.rejected)
		return protocol.CodeTooManyConnections
	}
	s.counters.poolRefused++
	s.logRefusal(now, "connection refused: "+protocol.CodeEvicted.Text()+" (its address holds the most of the full pool)",
		"remote", remote, "refused-total", s.counters.poolRefused)
	return protocol.CodeEvicted
}

// preCapPerIP is the most of the pool one address holds
// (MaxUnauthenticatedPerIP: 0 is MaxUnauthenticated, negative none).
func (s *Server) preCapPerIP() int {
	switch n := s.cfg.MaxUnauthenticatedPerIP; {
	case n == 0:
		return s.cfg.MaxUnauthenticated
	case n < 0:
		return noLimit
	default:
		return n
	}
}

// evictLocked ends c, a pre-handshake connection, to make room for a
// newcomer: "too many unauthenticated connections!" on plain TCP, then the
// close, or the tarpit when its address is crowded. Its reader is stopped
// (its read deadline set to now) and handles nothing more, a connect read
// before the eviction included (handle, decideHandshake).
func (s *Server) evictLocked(now int64, c *conn) {
	s.leavePreLocked(c)
	c.evicted = true
	s.evicting++
	s.counters.evicted++
	s.logRefusal(now, "connection evicted before its handshake: "+protocol.CodeEvicted.Text(), "remote", c.remote,
		"evicted-total", s.counters.evicted)
	if c.plain {
		// A plain status request writes its own answer.
		c.finish()
		c.nc.Close()
		return
	}
	if s.tlsConf != nil {
		// A TLS client mid-handshake cannot read a clear-text error.
		c.finish()
		c.nc.Close()
		return
	}
	c.park = s.crowdedLocked(c)
	c.stopRead()
	c.sendError(protocol.CodeEvicted)
}

// overCapLocked refuses a client's first frame on a connection let in past
// MaxConnsPerIP or MaxConns (accept: c.overCap) with that limit's text,
// and reports whether it did. A cluster's forwarding hello is decided
// before (acceptForward): the cluster's own links are never refused by a
// client limit.
func (s *Server) overCapLocked(now int64, c *conn) bool {
	code := c.overCap
	if code == protocol.CodeUnknown {
		return false
	}
	total := &s.counters.rejected
	if code == protocol.CodeTooManyFromAddr {
		total = &s.counters.rejectedPerIP
	}
	*total++
	s.logRefusal(now, "connect refused: "+code.Text(), "remote", c.remote, "refused-total", *total)
	c.park = s.crowdedLocked(c) // the tarpit
	s.leavePreLocked(c)
	c.sendError(code)
	return true
}

// linkLocked makes c, whose forwarding hello was accepted, one of the
// cluster's own links: out of the pool, and counted neither per address
// nor against MaxConns.
func (s *Server) linkLocked(c *conn) {
	s.leavePreLocked(c)
	c.overCap = protocol.CodeUnknown
	if c.link {
		return
	}
	c.link = true
	s.adm.links++
	if key := ipKey(c.ip); key.IsValid() {
		if s.perIP[key]--; s.perIP[key] <= 0 {
			delete(s.perIP, key)
		}
	}
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
// A connection evicted from the pre-handshake pool ("too many
// unauthenticated connections!"), one refused at its first frame for a
// limit of established connections ("too many connections from this
// address!", "too many connections!"), or one whose connect is refused for
// its credentials ("authentication required!", "authentication failed!",
// protected mode), while its address has other pre-handshake connections
// or sockets in the tarpit (crowdedLocked), is told so at once, but its
// socket is closed only at the end of its auth timeout, AuthTimeout after
// its accept (or sooner when the tarpit holds tarpitMax of them); any other
// refusal closes at once. An attacker that holds and reopens connections as
// fast as they are closed would otherwise cycle them as fast as the server
// can accept, and every newcomer, healthy or not, waits in the listener's
// one queue behind them. Held, a refused socket costs a file descriptor
// and no goroutine (its reader has stopped; nothing more it sends is
// read); a client that reads the error closes it itself. A lone client
// (its address has nothing else in the pool or the tarpit) is closed at
// once.

// crowdedLocked reports whether c's address has another pre-handshake
// connection than c, or a socket in the tarpit: a refused connect, or an
// evicted connection, then goes to the tarpit too. A lone client refused
// (a wrong token, say) is closed at once.
func (s *Server) crowdedLocked(c *conn) bool {
	key := preKey(c.ip)
	if a := s.preByIP[key]; a != nil {
		others := a.n
		if c.unauthed {
			others-- // c itself
		}
		if others > 0 {
			return true
		}
	}
	return s.tarpit.holds(key)
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
