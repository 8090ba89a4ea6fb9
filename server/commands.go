package server

import (
	"bytes"
	"errors"
	"strings"
	"time"

	"github.com/mlock-dev/mlock/internal/auth"
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
		if s.overCapLocked(tx.Now(), c) {
			return true // past a limit of established connections (limits.go)
		}
		if verb != protocol.VerbConnect {
			c.sendError(protocol.CodeConnectFirst)
			return true
		}
		return c.connect(tx, f)
	}
	req := requestID(f)
	switch verb {
	case protocol.VerbLock, protocol.VerbTryLock, protocol.VerbExtend, protocol.VerbUnlock, protocol.VerbPing,
		protocol.VerbRenew, protocol.VerbRelease, protocol.VerbReleaseIn, protocol.VerbReleaseAll, protocol.VerbReleaseAllIn:
		var r request
		parseRequest(verb, f, &r)
		c.applyRequest(tx, &r)
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
		if !c.sess.p.Admin && !c.trusted {
			s.counters.forbidden++
			c.failed(req, protocol.CodeForbidden)
			return false
		}
		var r request
		parseRequest(verb, f, &r)
		c.applyRequest(tx, &r)
	case protocol.VerbCluster:
		c.failed(req, protocol.CodeNotCluster) // a cluster node decides it in decide
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

// requestID returns the request id of a frame's fields (the field after
// the verb), nil if there is none.
func requestID(f [][]byte) []byte {
	if len(f) > 1 {
		return f[1]
	}
	return nil
}

// parseRequest is the parse step of the commands that change the lock
// table, and of ping: it fills r from the fields of a frame of verb with
// the protocol's typed Parse. Arguments that do not parse make r a refusal
// (reqRefused, with the code to answer), answered in its turn by
// applyRequest. It reports false for any other verb. A single node parses
// and applies at once; a cluster node parses where the client is
// connected and every node applies the request from the log.
func parseRequest(verb protocol.Verb, f [][]byte, r *request) bool {
	*r = request{req: requestID(f)}
	code := protocol.CodeUnknown
	switch verb {
	case protocol.VerbLock, protocol.VerbTryLock:
		r.kind = reqLock
		if verb == protocol.VerbTryLock {
			r.kind = reqTryLock
		}
		code = r.lock.Parse(f, verb == protocol.VerbTryLock)
	case protocol.VerbExtend:
		r.kind, code = reqExtend, r.extend.Parse(f)
	case protocol.VerbUnlock:
		r.kind, code = reqUnlock, r.unlock.Parse(f)
	case protocol.VerbRenew:
		r.kind, code = reqRenew, r.renew.Parse(f)
	case protocol.VerbRelease, protocol.VerbReleaseIn, protocol.VerbReleaseAll, protocol.VerbReleaseAllIn:
		r.kind, code = reqRelease, r.release.Parse(verb, f)
	case protocol.VerbEvict:
		r.kind, code = reqEvict, r.evict.Parse(f)
	case protocol.VerbPing:
		r.kind = reqPing
	default:
		return false
	}
	if code != protocol.CodeUnknown {
		*r = request{kind: reqRefused, req: r.req, refusedVerb: verb, refusedCode: code}
	}
	return true
}

// applyRequest is the apply step of a parsed request (parseRequest): the
// checks that need the state (the settings in force, the lock ids, the
// principal's rights where they are checked here) and the engine. It runs
// in a core batch, on a single node and on every node of a cluster alike.
func (c *conn) applyRequest(tx *core.Tx, r *request) {
	switch r.kind {
	case reqLock, reqTryLock:
		c.applyLock(tx, r.req, &r.lock, r.deadline)
	case reqExtend:
		c.applyExtend(tx, r.req, &r.extend)
	case reqUnlock:
		c.applyUnlock(tx, r.req, &r.unlock)
	case reqRenew:
		c.applyRenew(tx, r.req, &r.renew)
	case reqRelease:
		c.applyRelease(tx, r.req, &r.release)
	case reqEvict:
		c.applyEvict(tx, r.req, &r.evict)
	case reqPing:
		c.ok(r.req, []byte("pong"))
	case reqRefused:
		c.refused(tx, r.req, r.refusedVerb, r.refusedCode)
	}
}

// refused answers a request refused before the engine with code. An extend
// counts as failed (extendFailedCount), as every extend answered failed.
func (c *conn) refused(tx *core.Tx, req []byte, verb protocol.Verb, code protocol.Code) {
	if verb == protocol.VerbExtend {
		c.extendRefused(tx)
	}
	c.failed(req, code)
}

// applyUnlock is the apply step of "unlock <req> <lockId>".
func (c *conn) applyUnlock(tx *core.Tx, req []byte, a *protocol.IDArgs) {
	s := c.srv
	id, ok := c.lockID(tx, a.ID)
	if !ok {
		c.failed(req, protocol.CodeLockNotExist)
		return
	}
	if r := tx.Apply(&core.Command{Op: core.OpUnlock, ID: id, Session: c.sess.id}); r.Err != nil {
		c.failedErr(req, r.Err)
		return
	}
	c.ok(req, []byte("done"))
	s.noteUnlocked(tx.Now())
}

// applyRelease is the apply step of "release <req> <owner> <resources>" and "releaseall <req>
// <owner>", and their confined forms releasein and releaseallin (a prefix
// last). release answers true or false, releaseall the number of locks
// released.
func (c *conn) applyRelease(tx *core.Tx, req []byte, a *protocol.ReleaseArgs) {
	s := c.srv
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

// connectArgs are the arguments of "connect <socketId> <apiVersion>
// [<field>...]".
type connectArgs struct {
	socketID []byte
	fields   [][]byte // after the api version: auth=<name>:<token>, want=leader; others are ignored
}

// parseConnect is the parse step of connect, on a single node and on a
// cluster node alike: the arguments, or the code of the error to answer.
func (s *Server) parseConnect(f [][]byte) (connectArgs, protocol.Code) {
	const socketAt, apiAt = 1, 2 // after the verb
	switch {
	case len(f) <= socketAt || len(f[socketAt]) == 0:
		return connectArgs{}, protocol.CodeSocketIDRequired
	case len(f) <= apiAt || len(f[apiAt]) == 0:
		return connectArgs{}, protocol.CodeAPIVersionRequired
	case len(f[socketAt]) > s.cfg.MaxSocketIDLen:
		return connectArgs{}, protocol.CodeSocketIDTooLong
	case bytes.IndexByte(f[socketAt], 0) >= 0: // the scope separator
		return connectArgs{}, protocol.CodeInvalidSocketID
	}
	return connectArgs{socketID: f[socketAt], fields: f[apiAt+1:]}, protocol.CodeUnknown
}

// connect handles "connect <socketId> <apiVersion>".
func (c *conn) connect(tx *core.Tx, f [][]byte) bool {
	s := c.srv
	a, code := s.parseConnect(f)
	if code != protocol.CodeUnknown {
		c.sendError(code)
		return true
	}
	if s.closing {
		c.sendError(protocol.CodeShuttingDown)
		return true
	}
	cred, hasCred := authField(a.fields)
	p, code := s.principalFor(c, cred, hasCred)
	if p == nil {
		s.counters.authFailed++
		s.logRefusal(tx.Now(), "connect refused: "+code.Text(), "remote", c.remote, "tls", s.tlsConf != nil)
		c.park = s.crowdedLocked(c) // limits.go: the tarpit
		s.leavePreLocked(c)         // done with its handshake: its slot is free now
		c.sendError(code)
		return true
	}
	sess, resumed := c.takeSession(tx, p, scope(p, string(a.socketID)))
	if sess == nil {
		return true
	}
	if old := sess.c; old != nil && resumed {
		// The old connection may be half-open: the new one takes over. The
		// session moves without a detach, so its grace does not start:
		// takeover never shortens what its client may believe.
		old.sess = nil
		old.sendError(protocol.CodeTakenOver)
		s.log.Info("session taken over by a new connection", "session", sess.hash, "old", old.remote, "new", c.remote)
	}
	resumed = tx.Apply(&core.Command{Op: core.OpAttach, Session: sess.id}).OK && resumed
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

// takeSession returns the session id that a connect of c by p attaches:
// the one that exists (resumed), or a new one. Nil: refused (a quota, the
// number of sessions), and answered.
func (c *conn) takeSession(tx *core.Tx, p *auth.Principal, id string) (*session, bool) {
	s := c.srv
	sess := s.sessions[id]
	if sess != nil && sess.c == nil {
		// The session's grace may be over while the deadline timer has
		// not run yet: process what is due, and if the engine closed the
		// session, this connect starts a new one. The old one's events
		// of this batch, its end included, stay its own (eventLocked).
		tx.Apply(&core.Command{Op: core.OpTick})
		if !tx.HasSession(id) {
			delete(s.sessions, id)
			if s.ended == nil {
				s.ended = make(map[string]*session)
			}
			s.ended[id] = sess
			sess = nil
		}
	}
	resumed := sess != nil
	if !s.connQuotaLocked(tx, c, p, !resumed, resumed && sess.c != nil && sess.c.counted == p.Name) {
		return nil, false
	}
	if sess == nil {
		if len(s.sessions) >= s.set.MaxSessions {
			s.counters.sessionsRefused++
			s.logRefusal(tx.Now(), "connect refused: too many sessions", "remote", c.remote, "sessions", len(s.sessions))
			c.sendError(protocol.CodeTooManySessions)
			return nil, false
		}
		sess = &session{id: id, p: p, hash: s.shortHash(id)}
		s.sessions[id] = sess
	} else {
		sess.p = p // the rights in force now (the auth file may have been reloaded)
	}
	return sess, resumed
}

// applyLock is the apply step of "lock <req> <resources> <ttl> <timeout>
// <tolerate> [owner [modes]]" and "trylock <req> <resources> <ttl> [owner
// [modes]]". An empty owner is none; absent or empty modes take every
// resource exclusively.
//
// deadline (a cluster's format 3 lock, else 0) is when the lock's wait ends,
// in Unix ns: applied at or after it, the lock is answered as one that timed
// out in its queue (a result with a lock id that names nothing, then
// "timeout" with it) and is never queued; before it, it waits until it at
// most. Both answers are frames for the proposing connection only: nothing
// of the replicated state depends on the id.
func (c *conn) applyLock(tx *core.Tx, req []byte, a *protocol.LockArgs, deadline int64) {
	s := c.srv
	try := a.Try
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
	if deadline != 0 {
		if r.Timeout = time.Duration(deadline - tx.Now()); r.Timeout <= 0 {
			s.scratch = appendTimedOut(s.scratch[:0], req)
			c.write(s.scratch)
			return
		}
	}
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
	if c.made != nil {
		*c.made = append(*c.made, g.ID)
	}
	s.noteAccepted(tx, &g, a.Resources)
	s.scratch = protocol.AppendOKID(s.scratch[:0], req, g.ID)
	c.write(s.scratch)
	if g.Granted {
		s.pushLocked(c.sess, g.ID, g.ExpiresAt, g.Token)
	}
}

// applyExtend is the apply step of "extend <req> <lockId> <ttl>". A principal that may no
// longer lock one of the lock's resources (the auth file was reloaded) is
// answered permission denied! naming it.
//
// Every extend answered failed counts in extendFailedCount, also one refused
// here before the engine (a missing argument, a bad ttl, a malformed lock id
// or another principal's), except permission denied! (counted as forbidden;
// a cluster node refuses it before the log).
func (c *conn) applyExtend(tx *core.Tx, req []byte, a *protocol.ExtendArgs) {
	s := c.srv
	ttl, ok := s.ttlOf(a.TTL)
	var id core.ID
	code := protocol.CodeInvalidTTL
	if ok {
		var found bool
		if id, found = c.lockID(tx, a.ID); found {
			code = protocol.CodeUnknown
		} else {
			code = protocol.CodeLockNotExist
		}
	}
	if code != protocol.CodeUnknown {
		c.refused(tx, req, protocol.VerbExtend, code)
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

// applyRenew is the apply step of "renew <req> <owner> <resources> <ttl>": the owner's granted
// lock on exactly resources (in any order, duplicates folded) gets a new
// expiry, keeping its id, token and session. The answer is
// "<expiresAtMs> <token>"; an owner that holds no such lock (also after a
// release of some of them, and for the anonymous owner) gets lock not
// exist!, a principal that may no longer lock one of the resources
// permission denied!. Renewing uses no token and pushes nothing.
func (c *conn) applyRenew(tx *core.Tx, req []byte, a *protocol.RenewArgs) {
	s := c.srv
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

// applyEvict is the apply step of "evict <req> <resources>" (extension,
// administrators only, checked before the parse step): the granted lock
// holding each resource is released whole, whoever holds it, and its
// session is told. The answer is the number of locks released.
func (c *conn) applyEvict(tx *core.Tx, req []byte, a *protocol.EvictArgs) {
	s := c.srv
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
	// The arguments after the verb and the request id, in order.
	var args [3]string
	for i := range args {
		if j := i + 2; j < len(f) {
			args[i] = string(f[j])
		}
	}
	prefix, l, after := args[0], args[1], args[2]
	if prefix == "|" {
		prefix = "" // no name holds '|': the placeholder for "no prefix" before a limit
	}
	limit := s.cfg.StatusLimit
	if l != "" && l != "0" {
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
