package server

import (
	"bytes"
	"errors"
	"strings"
	"time"

	"github.com/mlock-dev/mlock/internal/core"
	"github.com/mlock-dev/mlock/internal/protocol"
)

// anonymousOwner is the owner of Medusa's anonymous locks: recorded for
// release and releaseall, never re-entrant.
const anonymousOwner = "*"

// Every text the server sends is a protocol.Code: the wire texts, byte for
// byte, live in internal/protocol, and so does the mapping of engine errors
// to them (engineFailure).

// handle runs one command inside a core batch and reports whether the
// connection is ending.
func (c *conn) handle(tx *core.Tx, f [][]byte) bool {
	s := c.srv
	verb, _ := protocol.ParseVerb(f[0]) // not a command: the zero Verb
	if c.sess == nil {
		if c.evicted {
			return true // evicted before its handshake: told, and closing
		}
		if verb != protocol.VerbConnect {
			c.sendError(protocol.CodeConnectFirst)
			return true
		}
		return c.connect(tx, f)
	}
	var req []byte
	if len(f) > 1 {
		req = f[1]
	}
	switch verb {
	case protocol.VerbLock:
		c.lock(tx, req, f, false)
	case protocol.VerbTryLock:
		c.lock(tx, req, f, true)
	case protocol.VerbExtend:
		c.extend(tx, req, f)
	case protocol.VerbUnlock:
		var a protocol.IDArgs
		if code := a.Parse(f); code != protocol.CodeUnknown {
			c.failed(req, code)
			return false
		}
		id, ok := c.lockID(tx, a.ID)
		if !ok {
			c.failed(req, protocol.CodeLockNotExist)
			return false
		}
		if r := tx.Apply(&core.Command{Op: core.OpUnlock, ID: id, Session: c.sess.id}); r.Err != nil {
			c.failedErr(req, r.Err)
			return false
		}
		c.ok(req, []byte("done"))
		s.noteUnlocked(tx.Now())
	case protocol.VerbPing:
		c.ok(req, []byte("pong"))
	case protocol.VerbStatus:
		detail := c.sess.p.Admin
		if detail && !s.allowListing(tx, c.sess.p.Name) {
			c.failed(req, protocol.CodeRateLimited)
			return false
		}
		c.ok(req, s.statusJSON(tx, detail))
	case protocol.VerbLocks:
		c.locks(tx, req, f)
	case protocol.VerbEvict:
		c.evict(tx, req, f)
	case protocol.VerbCluster:
		c.failed(req, protocol.CodeNotCluster) // a cluster node decides it in decide
	case protocol.VerbRelease, protocol.VerbReleaseIn, protocol.VerbReleaseAll, protocol.VerbReleaseAllIn:
		c.release(tx, req, verb, f)
	case protocol.VerbRenew:
		c.renew(tx, req, f)
	case protocol.VerbBye:
		c.bye()
		return true
	case protocol.VerbConnect:
		c.sendError(protocol.CodeDuplicateConnect)
		return true
	default:
		c.failed(req, protocol.CodeInvalidMessage)
	}
	return false
}

// release handles "release <req> <owner> <resources>" and "releaseall <req>
// <owner>", and their confined forms releasein and releaseallin (a prefix
// last). release answers true or false, releaseall the number of locks
// released.
func (c *conn) release(tx *core.Tx, req []byte, verb protocol.Verb, f [][]byte) {
	s := c.srv
	var a protocol.ReleaseArgs
	if code := a.Parse(verb, f); code != protocol.CodeUnknown {
		c.failed(req, code)
		return
	}
	owner, ok := c.owner(req, a.Owner)
	if !ok {
		return
	}
	if a.All {
		r := tx.Apply(&core.Command{Op: core.OpReleaseAll, Owner: owner, Prefix: a.Prefix})
		s.payload = protocol.AppendInt(s.payload[:0], int64(r.N))
		c.ok(req, s.payload)
		return
	}
	r := tx.Apply(&core.Command{Op: core.OpRelease, Owner: owner, Resources: s.splitResources(a.Resources), Prefix: a.Prefix})
	if r.OK {
		c.ok(req, []byte("true"))
	} else {
		c.ok(req, []byte("false"))
	}
}

// bye handles "bye <req>" (extension): the client has marked every lock of
// its session lost and is done with the connection, which ends without an
// answer (after what is queued for it is written). During a shutdown it is
// the only confirmation that the client heard that its locks are gone: one
// that merely closes may have closed for its own reasons (a ping timeout, a
// proxy) without reading the expired pushes. Outside a shutdown it is just a
// close: the session keeps its locks for its grace period, as after any
// other end of the connection. It runs in a core batch.
func (c *conn) bye() {
	if c.told && c.sess != nil {
		c.sess.confirmed = true
	}
	c.finish()
}

// connect handles "connect <socketId> <apiVersion>".
func (c *conn) connect(tx *core.Tx, f [][]byte) bool {
	s := c.srv
	switch {
	case len(f) < 2 || len(f[1]) == 0:
		c.sendError(protocol.CodeSocketIDRequired)
		return true
	case len(f) < 3 || len(f[2]) == 0:
		c.sendError(protocol.CodeAPIVersionRequired)
		return true
	case len(f[1]) > s.cfg.MaxSocketIDLen:
		c.sendError(protocol.CodeSocketIDTooLong)
		return true
	case bytes.IndexByte(f[1], 0) >= 0: // the scope separator
		c.sendError(protocol.CodeInvalidSocketID)
		return true
	}
	if s.closing {
		c.sendError(protocol.CodeShuttingDown)
		return true
	}
	cred, hasCred := authField(f[3:])
	p, code := s.principalFor(c, cred, hasCred)
	if p == nil {
		s.counters.authFailed++
		s.logRefusal(tx.Now(), "connect refused: "+code.Text(), "remote", c.remote, "tls", s.tlsConf != nil)
		c.park = s.crowdedLocked(c) // limits.go: the tarpit
		s.leavePreLocked(c)         // done with its handshake: its slot is free now
		c.sendError(code)
		return true
	}
	id := scope(p, string(f[1]))
	sess := s.liveSession(tx, id)
	resumed := sess != nil
	if !s.connQuotaLocked(tx, c, p, !resumed, resumed && sess.c != nil && sess.c.counted == p.Name) {
		return true
	}
	if sess == nil {
		if len(s.sessions) >= s.set.MaxSessions {
			s.counters.sessionsRefused++
			s.logRefusal(tx.Now(), "connect refused: too many sessions", "remote", c.remote, "sessions", len(s.sessions))
			c.sendError(protocol.CodeTooManySessions)
			return true
		}
		sess = &session{id: id, p: p, hash: s.shortHash(id)}
		s.sessions[id] = sess
	} else {
		sess.p = p // the rights in force now (the auth file may have been reloaded)
	}
	if old := sess.c; old != nil && resumed {
		// The old connection may be half-open: the new one takes over. The
		// session moves without a detach, so its grace does not start:
		// takeover never shortens what its client may believe.
		old.sess = nil
		old.sendError(protocol.CodeTakenOver)
		s.log.Info("session taken over by a new connection", "session", sess.hash, "old", old.remote, "new", c.remote)
	}
	resumed = tx.Apply(&core.Command{Op: core.OpAttach, Session: id}).OK && resumed
	if sess.c == nil {
		s.online++
	}
	sess.c = c
	c.sess = sess
	s.leavePreLocked(c)
	c.authed = true // the reader sets the idle deadline
	s.scratch = protocol.AppendConnected(s.scratch[:0], resumed, s.set.graceMs())
	c.write(s.scratch)
	if len(sess.offline) > 0 {
		c.write(sess.offline)
		sess.offline = nil
	}
	sess.pruned = false
	if resumed {
		s.reannounce(tx, sess)
	}
	s.log.Debug("session connected", "session", sess.hash, "principal", p.Name, "remote", c.remote, "resumed", resumed)
	return false
}

// liveSession returns the session id if it is still alive, or nil. A
// detached session's grace may be over while the deadline timer has not run
// yet: what is due is processed first, and a session the engine closed is
// forgotten, so that the connect starts a new one. The old one's events of
// this batch, its end included, stay its own (eventLocked).
func (s *Server) liveSession(tx *core.Tx, id string) *session {
	sess := s.sessions[id]
	if sess == nil || sess.c != nil {
		return sess
	}
	tx.Apply(&core.Command{Op: core.OpTick})
	if tx.HasSession(id) {
		return sess
	}
	delete(s.sessions, id)
	if s.ended == nil {
		s.ended = make(map[string]*session)
	}
	s.ended[id] = sess
	return nil
}

// reannounce tells a resumed session again of its held and evicted locks.
// A push written to the old connection just before it died is lost; an
// evicted lock ends at the eviction plus the grace, which the answers of
// the new connection would let its holder outlive. Clients ignore a locked
// for a lock they already hold or do not wait for, and an expired for a
// lock they do not hold.
func (s *Server) reannounce(tx *core.Tx, sess *session) {
	tx.SessionLocks(sess.id, func(li core.LockInfo) {
		switch {
		case li.Revoked:
			s.push(sess, protocol.PushEvicted, li.ID)
		case li.Granted:
			s.pushLocked(sess, li.ID, li.Deadline, li.Token)
		}
	})
}

// lock handles "lock <req> <resources> <ttl> <timeout> <tolerate> [owner
// [modes]]" and "trylock <req> <resources> <ttl> [owner [modes]]". An empty
// owner is none; absent or empty modes take every resource exclusively.
func (c *conn) lock(tx *core.Tx, req []byte, f [][]byte, try bool) {
	s := c.srv
	var a protocol.LockArgs
	if code := a.Parse(f, try); code != protocol.CodeUnknown {
		c.failed(req, code)
		return
	}
	ttl, ok := s.ttlOf(a.TTL)
	if !ok {
		c.failed(req, protocol.CodeInvalidTTL)
		return
	}
	if a.Timeout > int64(s.set.MaxTimeout/time.Millisecond) {
		c.failed(req, protocol.CodeInvalidTimeout)
		return
	}
	cmd := core.Command{Op: core.OpLock, Request: core.Request{Session: c.sess.id, TTL: ttl, Try: try,
		Timeout: time.Duration(a.Timeout) * time.Millisecond, Tolerate: int(a.Tolerate)}}
	r := &cmd.Request
	if a.Owner != "" {
		owner, ok := c.owner(req, a.Owner)
		if !ok {
			return
		}
		r.NoReentry = a.Owner == anonymousOwner
		r.Owner = owner
	}
	r.Resources = s.splitResources(a.Resources)
	if !c.may(req, r.Resources) {
		return
	}
	if !c.trusted && !s.lockQuotaLocked(tx, c.sess.p) {
		// A cluster node checks it where the client is connected (decide).
		s.counters.quotaRefused++
		c.failed(req, protocol.CodeQuotaLocks)
		return
	}
	if s.modeBuf, ok = protocol.ParseModes(s.modeBuf[:0], []byte(a.Modes), len(r.Resources)); !ok {
		c.failed(req, protocol.CodeInvalidMode)
		return
	}
	r.Modes = s.modeBuf
	res := tx.Apply(&cmd)
	if err := res.Err; err != nil {
		switch {
		case errors.Is(err, core.ErrTolerate):
			s.counters.intolerance++
		case errors.Is(err, core.ErrServerFull):
			s.counters.serverFull++
		}
		c.failedErr(req, err)
		return
	}
	g := res.Grant
	s.noteAccepted(tx, &g, a.Resources)
	s.scratch = protocol.AppendOKID(s.scratch[:0], req, g.ID)
	c.write(s.scratch)
	if g.Granted {
		s.pushLocked(c.sess, g.ID, g.ExpiresAt, g.Token)
	}
}

// extend handles "extend <req> <lockId> <ttl>". A principal that may no
// longer lock one of the lock's resources (the auth file was reloaded) is
// answered permission denied! naming it.
//
// Every extend answered failed counts in extendFailedCount, also one refused
// here before the engine (a missing argument, a bad ttl, a malformed lock id
// or another principal's), except permission denied! (counted as forbidden;
// a cluster node refuses it before the log).
func (c *conn) extend(tx *core.Tx, req []byte, f [][]byte) {
	s := c.srv
	var a protocol.ExtendArgs
	code := a.Parse(f)
	ttl, ok := s.ttlOf(a.TTL)
	var id core.ID
	switch {
	case code == protocol.CodeUnknown && !ok:
		code = protocol.CodeInvalidTTL
	case code == protocol.CodeUnknown:
		var found bool
		if id, found = c.lockID(tx, a.ID); !found {
			code = protocol.CodeLockNotExist
		}
	}
	if code != protocol.CodeUnknown {
		c.extendRefused(tx)
		c.failed(req, code)
		return
	}
	if p := c.sess.p; !p.Admin && p.Prefixes != nil && !c.trusted {
		// The rights in force now: a reload may have taken the lock's
		// resources away from the principal.
		if li, found := tx.Lookup(id); found && !c.may(req, li.Resources) {
			return
		}
	}
	r := tx.Apply(&core.Command{Op: core.OpExtend, ID: id, TTL: ttl, Session: c.sess.id})
	if r.Err != nil {
		c.failedErr(req, r.Err)
		return
	}
	s.payload = protocol.AppendInt(s.payload[:0], r.ExpiresAt/int64(time.Millisecond))
	c.ok(req, s.payload)
}

// extendRefused counts an extend refused before the engine as failed: it
// extends core.NoID, which the engine does not find. In a cluster it runs
// in the apply, on every node alike.
func (c *conn) extendRefused(tx *core.Tx) {
	tx.Apply(&core.Command{Op: core.OpExtend, ID: core.NoID, TTL: time.Second, Session: c.sess.id})
}

// renew handles "renew <req> <owner> <resources> <ttl>": the owner's granted
// lock on exactly resources (in any order, duplicates folded) gets a new
// expiry, keeping its id, token and session. The answer is
// "<expiresAtMs> <token>"; an owner that holds no such lock (also after a
// release of some of them, and for the anonymous owner) gets lock not
// exist!, a principal that may no longer lock one of the resources
// permission denied!. Renewing uses no token and pushes nothing.
func (c *conn) renew(tx *core.Tx, req []byte, f [][]byte) {
	s := c.srv
	var a protocol.RenewArgs
	if code := a.Parse(f); code != protocol.CodeUnknown {
		c.failed(req, code)
		return
	}
	ttl, ok := s.ttlOf(a.TTL)
	if !ok {
		c.failed(req, protocol.CodeInvalidTTL)
		return
	}
	owner, ok := c.owner(req, a.Owner)
	if !ok {
		return
	}
	resources := s.splitResources(a.Resources)
	if !c.may(req, resources) { // a reload may have taken them away
		return
	}
	r := tx.Apply(&core.Command{Op: core.OpRenew, Owner: owner, Resources: resources,
		TTL: ttl, Session: c.sess.id})
	if r.Err != nil {
		c.failedErr(req, r.Err)
		return
	}
	b := protocol.AppendInt(s.payload[:0], r.Grant.ExpiresAt/int64(time.Millisecond))
	b = append(b, ' ')
	s.payload = protocol.AppendUint(b, r.Grant.Token)
	c.ok(req, s.payload)
}

// owner returns the engine name of an owner sent by c's client, scoped to
// its principal; an owner holding the scope separator (a NUL byte) is
// answered "invalid owner!".
func (c *conn) owner(req []byte, o string) (string, bool) {
	if strings.IndexByte(o, 0) >= 0 {
		c.failed(req, protocol.CodeInvalidOwner)
		return "", false
	}
	return scope(c.sess.p, o), true
}

// lockID parses a lock id and checks that the lock, if it exists, belongs to
// c's principal: a lock of another principal does not exist for it.
func (c *conn) lockID(tx *core.Tx, b string) (core.ID, bool) {
	id, ok := protocol.ParseID([]byte(b))
	if !ok {
		return id, false
	}
	li, found := tx.Lookup(id)
	if found {
		if p, _ := unscope(li.Session); p != c.sess.p.Name {
			return id, false
		}
	}
	c.srv.noteLock(&li, c.sess.id)
	return id, true
}

// may checks that c's principal may lock every resource, and answers
// "permission denied!" naming the first it may not.
func (c *conn) may(req []byte, resources []string) bool {
	p := c.sess.p
	if p.Admin || c.trusted {
		return true
	}
	for _, r := range resources {
		if !p.May(r) {
			s := c.srv
			s.counters.forbidden++
			s.scratch = protocol.AppendFailed(s.scratch[:0], req, protocol.CodeForbidden, r)
			c.write(s.scratch)
			return false
		}
	}
	return true
}

// evict handles "evict <req> <resources>" (extension, administrators only):
// the granted lock holding each resource is released whole, whoever holds
// it, and its session is told. The answer is the number of locks released.
func (c *conn) evict(tx *core.Tx, req []byte, f [][]byte) {
	s := c.srv
	if !c.sess.p.Admin && !c.trusted {
		s.counters.forbidden++
		c.failed(req, protocol.CodeForbidden)
		return
	}
	var a protocol.EvictArgs
	if code := a.Parse(f); code != protocol.CodeUnknown {
		c.failed(req, code)
		return
	}
	r := tx.Apply(&core.Command{Op: core.OpEvict, Resources: s.splitResources(a.Resources)})
	if r.Err != nil {
		c.failedErr(req, r.Err)
		return
	}
	s.log.Info("evicted", "resources", a.Resources, "locks", r.N, "by", c.sess.p.Name, "remote", c.remote)
	s.payload = protocol.AppendInt(s.payload[:0], int64(r.N))
	c.ok(req, s.payload)
}

// locks handles "locks <req> [<prefix> [<limit> [<after>]]]" (prefix "|":
// none): one page of
// the queues whose name starts with prefix and comes after after, in name
// order. An administrator sees every queue; anyone else only queues under
// a prefix it may lock, and other principals' entries without owner,
// token, lock or session.
func (c *conn) locks(tx *core.Tx, req []byte, f [][]byte) {
	s := c.srv
	arg := func(i int) string {
		if i < len(f) {
			return string(f[i])
		}
		return ""
	}
	prefix, after := arg(2), arg(4)
	if prefix == "|" {
		prefix = "" // no name holds '|': the placeholder for "no prefix" before a limit
	}
	limit := s.cfg.StatusLimit
	if l := arg(3); l != "" && l != "0" {
		n, ok := protocol.Int([]byte(l))
		if !ok || n < 0 {
			c.failed(req, protocol.CodeInvalidMessage)
			return
		}
		limit = int(min(n, int64(limit)))
	}
	p := c.sess.p
	if !p.Admin && !p.May(prefix) {
		s.counters.forbidden++
		s.scratch = protocol.AppendFailed(s.scratch[:0], req, protocol.CodeForbidden, prefix)
		c.write(s.scratch)
		return
	}
	if !s.allowListing(tx, p.Name) {
		c.failed(req, protocol.CodeRateLimited)
		return
	}
	c.ok(req, s.locksJSON(tx, p, prefix, after, limit))
}

// ttlOf returns the lease of a parsed ttl in ms: 0 (unset) is the
// default; more than the longest lease is refused.
func (s *Server) ttlOf(ms int64) (time.Duration, bool) {
	if ms == 0 {
		return s.set.DefaultTTL, true
	}
	if ms > int64(s.set.MaxTTL/time.Millisecond) {
		return 0, false
	}
	return time.Duration(ms) * time.Millisecond, true
}

// splitResources splits "a|b|c" into s.resBuf. The names share one string.
func (s *Server) splitResources(all string) []string {
	s.resBuf = s.resBuf[:0]
	for {
		i := strings.IndexByte(all, '|')
		if i < 0 {
			s.resBuf = append(s.resBuf, all)
			return s.resBuf
		}
		s.resBuf = append(s.resBuf, all[:i])
		all = all[i+1:]
	}
}

// ok answers "result <req> success <payload>". It runs in a core batch.
func (c *conn) ok(req, payload []byte) {
	s := c.srv
	s.scratch = protocol.AppendOK(s.scratch[:0], req, payload)
	c.write(s.scratch)
}

// failed answers "result <req> failed <text of code>". It runs in a core
// batch.
func (c *conn) failed(req []byte, code protocol.Code) {
	s := c.srv
	s.noteFailure()
	s.scratch = protocol.AppendFailed(s.scratch[:0], req, code, "")
	c.write(s.scratch)
}

// failedErr answers with the code of an engine error: a busy or
// owner-conflict refusal names its resource after the text (an extension:
// only extension commands get them); can not tolerate! stays as the 1.0
// server sends it. It runs in a core batch.
func (c *conn) failedErr(req []byte, err error) {
	s := c.srv
	s.noteFailure()
	code, detail := engineFailure(err)
	s.scratch = protocol.AppendFailed(s.scratch[:0], req, code, detail)
	c.write(s.scratch)
}
