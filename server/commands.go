package server

import (
	"errors"
	"strings"
	"time"

	"github.com/mlock-dev/mlock/internal/locktable"
	"github.com/mlock-dev/mlock/internal/wire"
)

// Wire texts. The first group is the original server's, kept byte for byte;
// the rest are this server's additions. docs/protocol.md lists them all.
const (
	txtTTL           = "ttl should be integer!"
	txtTolerate      = "can not tolerate!"
	txtNotExist      = "lock not exist!"
	txtNotLocked     = "not locked yet!"
	txtConnectFirst  = "should connect first!"
	txtInvalid       = "invalid message!"
	txtDupConnect    = "duplicate connect!"
	txtSocketID      = "socketId is required!"
	txtAPIVersion    = "apiVersion is required!"
	txtAuthTimeout   = "auth timeout!"
	txtTimeout       = "timeout should be integer!"
	txtTolerateInt   = "tolerate should be integer!"
	txtResource      = "invalid resource!"
	txtTooMany       = "too many resources!"
	txtBusy          = "resource is locked!"
	txtQueueFull     = "queue is full!"
	txtSessionLimit  = "too many locks in this session!"
	txtOwner         = "invalid owner!"
	txtOwnerConflict = "owner holds an overlapping lock!"
	txtBadFrame      = "invalid frame!"
	txtLongFrame     = "frame too large!"
	txtTooManyConns  = "too many connections!"
	txtTakenOver     = "session taken over by a new connection!"
	txtSocketIDLong  = "socketId is too long!"
	txtArgs          = "missing arguments!"
)

// anonymousOwner is the owner of Medusa's anonymous locks: recorded for
// release and releaseall, never re-entrant.
const anonymousOwner = "*"

// engineText maps engine errors to wire texts.
var engineText = map[error]string{
	locktable.ErrInvalidResource:  txtResource,
	locktable.ErrTooManyResources: txtTooMany,
	locktable.ErrInvalidTTL:       txtTTL,
	locktable.ErrInvalidTimeout:   txtTimeout,
	locktable.ErrInvalidTolerate:  txtTolerateInt,
	locktable.ErrInvalidOwner:     txtOwner,
	locktable.ErrTolerate:         txtTolerate,
	locktable.ErrBusy:             txtBusy,
	locktable.ErrQueueFull:        txtQueueFull,
	locktable.ErrSessionLimit:     txtSessionLimit,
	locktable.ErrNotFound:         txtNotExist,
	locktable.ErrNotGranted:       txtNotLocked,
	locktable.ErrOwnerConflict:    txtOwnerConflict,
}

func errText(err error) string {
	if t, ok := engineText[err]; ok {
		return t
	}
	return err.Error()
}

// handle runs one command. It runs under srv.mu and reports whether the
// connection is ending.
func (c *conn) handle(f [][]byte) bool {
	s := c.srv
	cmd := f[0]
	if c.sess == nil {
		if !wire.Lower(cmd, "connect") {
			c.sendError(txtConnectFirst)
			return true
		}
		return c.connect(f)
	}
	var req []byte
	if len(f) > 1 {
		req = f[1]
	}
	now := s.now()
	switch {
	case wire.Lower(cmd, "lock"):
		c.lock(now, req, f, false)
	case wire.Lower(cmd, "trylock"):
		c.lock(now, req, f, true)
	case wire.Lower(cmd, "extend"):
		c.extend(now, req, f)
	case wire.Lower(cmd, "unlock"):
		if len(f) < 3 {
			c.failed(req, txtArgs)
			return false
		}
		id, ok := locktable.ParseID(f[2])
		if !ok {
			c.failed(req, txtNotExist)
			return false
		}
		if err := s.tab.Unlock(now, id); err != nil {
			c.failed(req, errText(err))
			return false
		}
		c.result(req, "done")
	case wire.Lower(cmd, "ping"):
		c.result(req, "pong")
	case wire.Lower(cmd, "status"):
		c.resultBytes(req, s.statusJSON(now))
	case wire.Lower(cmd, "locks"):
		prefix := ""
		if len(f) > 2 {
			prefix = string(f[2])
		}
		c.resultBytes(req, s.locksJSON(now, prefix))
	case wire.Lower(cmd, "release"):
		if len(f) < 4 || len(f[2]) == 0 || len(f[3]) == 0 {
			c.failed(req, txtArgs)
			return false
		}
		ok := s.tab.Release(now, string(f[2]), s.splitResources(f[3]))
		if ok {
			c.result(req, "true")
		} else {
			c.result(req, "false")
		}
	case wire.Lower(cmd, "releaseall"):
		if len(f) < 3 || len(f[2]) == 0 {
			c.failed(req, txtArgs)
			return false
		}
		n := s.tab.ReleaseAll(now, string(f[2]))
		s.payload = wire.AppendInt(s.payload[:0], int64(n))
		c.resultBytes(req, s.payload)
	case wire.Lower(cmd, "connect"):
		c.sendError(txtDupConnect)
		return true
	default:
		c.failed(req, txtInvalid)
	}
	return false
}

// connect handles "connect <socketId> <apiVersion>".
func (c *conn) connect(f [][]byte) bool {
	s := c.srv
	switch {
	case len(f) < 2 || len(f[1]) == 0:
		c.sendError(txtSocketID)
		return true
	case len(f) < 3 || len(f[2]) == 0:
		c.sendError(txtAPIVersion)
		return true
	case len(f[1]) > s.cfg.MaxSocketIDLen:
		c.sendError(txtSocketIDLong)
		return true
	}
	id := string(f[1])
	sess := s.sessions[id]
	resumed := sess != nil
	if sess == nil {
		sess = &session{id: id, hash: s.shortHash(id)}
		s.sessions[id] = sess
	} else if old := sess.c; old != nil {
		// The old connection may be half-open: the new one takes over.
		old.sess = nil
		old.sendError(txtTakenOver)
		s.log.Info("session taken over by a new connection", "session", sess.hash, "old", old.remote, "new", c.remote)
	}
	resumed = s.tab.Attach(s.now(), id) && resumed
	sess.c = c
	c.sess = sess
	_ = c.nc.SetReadDeadline(time.Time{})
	if resumed {
		s.scratch = wire.Append(s.scratch[:0], "connected 1.0 resumed")
	} else {
		s.scratch = wire.Append(s.scratch[:0], "connected 1.0 new")
	}
	c.write(s.scratch)
	if len(sess.offline) > 0 {
		c.write(sess.offline)
		sess.offline = nil
	}
	if resumed {
		// A push written to the old connection just before it died is lost;
		// announce the session's held locks again. Clients ignore a locked
		// for a lock they already hold or do not wait for.
		s.tab.SessionLocks(id, func(li locktable.LockInfo) {
			if li.Granted {
				s.pushLocked(sess, li.ID, li.Deadline, li.Token)
			}
		})
	}
	s.log.Debug("session connected", "session", sess.hash, "remote", c.remote, "resumed", resumed)
	return false
}

// lock handles "lock <req> <resources> <ttl> <timeout> <tolerate> [owner]"
// and "trylock <req> <resources> <ttl> [owner]".
func (c *conn) lock(now int64, req []byte, f [][]byte, try bool) {
	s := c.srv
	arg := func(i int) []byte {
		if i < len(f) {
			return f[i]
		}
		return nil
	}
	ttl, ok := s.ttlArg(arg(3))
	if !ok {
		c.failed(req, txtTTL)
		return
	}
	r := locktable.Request{Session: c.sess.id, TTL: ttl, Try: try}
	ownerAt := 4
	if !try {
		ownerAt = 6
		to := arg(4)
		if !wire.Unset(to) {
			n, ok := wire.Int(to)
			if !ok || n < 0 || n > int64(s.cfg.MaxTimeout/time.Millisecond) {
				c.failed(req, txtTimeout)
				return
			}
			r.Timeout = time.Duration(n) * time.Millisecond
		}
		if tol := arg(5); !wire.Unset(tol) {
			n, ok := wire.Int(tol)
			if !ok || n < 0 {
				c.failed(req, txtTolerateInt)
				return
			}
			r.Tolerate = int(min(n, 1<<31))
		}
	}
	if o := arg(ownerAt); len(o) > 0 {
		r.Owner = string(o)
		r.NoReentry = r.Owner == anonymousOwner
	}
	if len(f) < 3 {
		c.failed(req, txtResource)
		return
	}
	r.Resources = s.splitResources(f[2])
	g, err := s.tab.Lock(now, &r)
	if err != nil {
		if errors.Is(err, locktable.ErrTolerate) {
			s.counters.intolerance++
		}
		c.failed(req, errText(err))
		return
	}
	b, st := wire.Begin(s.scratch[:0])
	b = append(b, "result "...)
	b = append(b, req...)
	b = append(b, " success "...)
	b = g.ID.AppendText(b)
	s.scratch = wire.End(b, st)
	c.write(s.scratch)
	if g.Granted {
		s.pushLocked(c.sess, g.ID, g.ExpiresAt, g.Token)
	}
}

// extend handles "extend <req> <lockId> <ttl>".
func (c *conn) extend(now int64, req []byte, f [][]byte) {
	s := c.srv
	if len(f) < 3 {
		c.failed(req, txtArgs)
		return
	}
	var ttlArg []byte
	if len(f) > 3 {
		ttlArg = f[3]
	}
	ttl, ok := s.ttlArg(ttlArg)
	if !ok {
		c.failed(req, txtTTL)
		return
	}
	id, ok := locktable.ParseID(f[2])
	if !ok {
		c.failed(req, txtNotExist)
		return
	}
	exp, err := s.tab.Extend(now, id, ttl)
	if err != nil {
		c.failed(req, errText(err))
		return
	}
	s.payload = wire.AppendInt(s.payload[:0], exp/int64(time.Millisecond))
	c.resultBytes(req, s.payload)
}

// ttlArg parses a ttl in ms; a missing one is the default.
func (s *Server) ttlArg(b []byte) (time.Duration, bool) {
	if wire.Unset(b) {
		return s.cfg.DefaultTTL, true
	}
	n, ok := wire.Int(b)
	if !ok || n <= 0 || n > int64(s.cfg.MaxTTL/time.Millisecond) {
		return 0, false
	}
	return time.Duration(n) * time.Millisecond, true
}

// splitResources splits "a|b|c" into s.resBuf. The names share one string.
func (s *Server) splitResources(b []byte) []string {
	all := string(b)
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

func (c *conn) result(req []byte, payload string) { c.answer(req, " success ", payload, nil) }

// resultBytes is result for a payload built elsewhere than s.scratch.
func (c *conn) resultBytes(req, payload []byte) { c.answer(req, " success ", "", payload) }

func (c *conn) failed(req []byte, text string) { c.answer(req, " failed ", text, nil) }

// answer writes "result <req><status><text><data>".
func (c *conn) answer(req []byte, status, text string, data []byte) {
	s := c.srv
	b, st := wire.Begin(s.scratch[:0])
	b = append(b, "result "...)
	b = append(b, req...)
	b = append(b, status...)
	b = append(b, text...)
	b = append(b, data...)
	s.scratch = wire.End(b, st)
	c.write(s.scratch)
}
