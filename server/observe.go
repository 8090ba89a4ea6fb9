package server

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/mlock-dev/mlock/internal/auth"
	"github.com/mlock-dev/mlock/internal/buildinfo"
	"github.com/mlock-dev/mlock/internal/core"
	"github.com/mlock-dev/mlock/internal/protocol"
	"github.com/mlock-dev/mlock/server/observe"
)

// Defaults of the story logs' thresholds.
const (
	DefaultLogSlowWait         = time.Second // a waiter granted after waiting longer is logged
	DefaultLogLongQueue        = 100         // a request queued behind at least this many entries is logged
	storyLogEvery              = 10 * time.Second
	readyLag            uint64 = 1000 // committed entries a node may have left to apply and be ready
)

// obsState is what the server counts for its metrics and story logs. It
// is guarded by the core, except the atomic fields: the hot path adds to
// plain fields under the lock it already holds, and a scrape copies them
// in one batch.
type obsState struct {
	debug    bool   // log every command (the logger has debug enabled); set in New
	failed   uint64 // failure answers: how observeCommand tells a command's outcome
	requests [observe.MaxVerbs][2]uint64
	wait     observe.Durations // request to grant
	hold     observe.Durations // grant to end
	depth    observe.Depths    // entries ahead at enqueue
	// since is when the lock lockID found last was granted, if it is the
	// caller's own (0: none, or waiting): an unlock's hold time.
	since      int64
	framesOut  uint64
	lost       uint64 // sessions lost (grace ended)
	lostHeld   int    // locks of the session being dropped in this batch
	lostWait   int    // waiting requests of the session being dropped
	slowLog    storyLog
	queueLog   storyLog
	bytesIn    atomic.Uint64
	bytesOut   atomic.Uint64
	slowWait   int64 // ns; 0: off
	longQueue  int   // 0: off
	verbNames  [observe.MaxVerbs]string
	adminPrinc *auth.Principal // the view of the HTTP API: every principal's entries
}

// storyLog rate-limits one kind of info log: at most one every
// storyLogEvery, telling how many were not logged since.
type storyLog struct {
	last    int64
	dropped int
}

// allow reports whether to log now, and how many were not logged since the
// last one.
func (l *storyLog) allow(now int64) (bool, int) {
	if l.last != 0 && now-l.last < int64(storyLogEvery) {
		l.dropped++
		return false, 0
	}
	n := l.dropped
	l.last, l.dropped = now, 0
	return true, n
}

// initObs sets up the metrics' state. It runs in New.
func (s *Server) initObs() {
	o := &s.obs
	o.debug = s.log.Enabled(context.Background(), slog.LevelDebug)
	o.slowWait = int64(max(s.cfg.LogSlowWait, 0))
	o.longQueue = max(s.cfg.LogLongQueue, 0)
	for v := range o.verbNames {
		o.verbNames[v] = protocol.Verb(v).String()
	}
	o.verbNames[0] = "other"
	o.adminPrinc = &auth.Principal{Admin: true}
}

// observeCommand handles one command (handle) and counts it by kind and
// outcome; at debug level it logs it. It runs in a core batch.
func (c *conn) observeCommand(tx *core.Tx, f [][]byte) bool {
	s := c.srv
	o := &s.obs
	failed, forbidden := o.failed, s.counters.forbidden
	stop := c.handle(tx, f)
	v, _ := protocol.ParseVerb(f[0])
	if int(v) >= observe.MaxVerbs {
		v = 0
	}
	out := observe.OK
	if o.failed != failed || s.counters.forbidden != forbidden || (stop && v != protocol.VerbBye) {
		out = observe.Failed
	}
	o.requests[v][out]++
	if o.debug {
		var r request
		parseRequest(v, f, &r)
		s.logCommand(c, v, r.resources(), out)
	}
	return stop
}

// observeDecide decides one frame on a node of a cluster (decide) and
// counts what the node settles itself: ping, status, locks, a connect, a
// bye, a refusal. What goes through the log is counted where it is applied
// (observeCommand, on every node). It runs in a core batch.
func (c *conn) observeDecide(tx *core.Tx, f [][]byte, payload []byte) (item, bool) {
	s := c.srv
	o := &s.obs
	failed, forbidden := o.failed, s.counters.forbidden
	it, stop := c.decide(tx, f, payload)
	if it.frame != nil {
		return it, stop
	}
	v, _ := protocol.ParseVerb(f[0])
	if int(v) >= observe.MaxVerbs {
		v = 0
	}
	out := observe.OK
	if o.failed != failed || s.counters.forbidden != forbidden || it.end {
		out = observe.Failed
	}
	o.requests[v][out]++
	if o.debug {
		var r request
		parseRequest(v, f, &r)
		s.logCommand(c, v, r.resources(), out)
	}
	return it, stop
}

// logCommand logs one command at debug level: its kind, outcome, session
// (hashed) and resources, never a lock id or socketId.
func (s *Server) logCommand(c *conn, v protocol.Verb, resources string, out int) {
	attrs := []any{"cmd", s.obs.verbNames[v], "ok", out == observe.OK, "remote", c.remote}
	if c.sess != nil {
		attrs = append(attrs, "session", c.sess.hash)
	}
	if resources != "" {
		attrs = append(attrs, "resources", resources)
	}
	s.log.Debug("command", attrs...)
}

// noteFailure counts a failure answer. It runs in a core batch.
func (s *Server) noteFailure() { s.obs.failed++ }

// noteLock remembers, for an unlock, when the lock li was granted if it is
// session's own. It runs in a core batch.
func (s *Server) noteLock(li *core.LockInfo, session string) {
	s.obs.since = 0
	if li != nil && li.Granted && li.Session == session {
		s.obs.since = li.GrantedAt
	}
}

// noteUnlocked ends the hold of the lock noteLock saw. It runs in a core
// batch.
func (s *Server) noteUnlocked(now int64) {
	if s.obs.since != 0 {
		s.obs.hold.Observe(now - s.obs.since)
		s.obs.since = 0
	}
}

// noteAccepted counts an accepted lock request: the entries ahead of it,
// a grant at once as a wait of 0, and logs a long queue. It runs in a core
// batch.
func (s *Server) noteAccepted(tx *core.Tx, g *core.Grant, resources string) {
	o := &s.obs
	if g.Renewed {
		return
	}
	o.depth.Observe(int64(g.Ahead))
	if g.Granted {
		o.wait.Observe(0)
	}
	if o.longQueue > 0 && g.Ahead >= o.longQueue {
		if ok, n := o.queueLog.allow(tx.Now()); ok {
			s.log.Info("long queue: a request waits behind many", "resources", resources, "ahead", g.Ahead,
				"threshold", o.longQueue, "not-logged-since", n)
		}
	}
}

// observeEvents counts what a batch's events tell: waits that end in a
// grant, holds that end, sessions lost (logged with the locks they
// freed), slow hand-offs (logged). It runs in onBatch, before the events
// are turned into pushes.
func (s *Server) observeEvents(tx *core.Tx, events []core.Event) {
	o := &s.obs
	now := tx.Now()
	for i := range events {
		e := &events[i]
		switch e.Kind {
		case core.Granted:
			w := now - e.Since
			o.wait.Observe(w)
			if o.slowWait > 0 && w > o.slowWait {
				s.logSlowHandoff(tx, e, w)
			}
		case core.Expired:
			if !e.Revoked && e.Since != 0 {
				o.hold.Observe(now - e.Since)
			}
		case core.Released:
			if !e.Partial && !e.Moved && e.Since != 0 {
				o.hold.Observe(now - e.Since)
			}
		case core.Dropped:
			if e.Held {
				o.lostHeld++
				if e.Since != 0 {
					o.hold.Observe(now - e.Since)
				}
			} else {
				o.lostWait++
			}
		case core.SessionClosed:
			// A session that held and waited for nothing lost nothing: every
			// client that exits without a shutdown ends so. Only the others
			// are counted and logged at info level.
			lost := o.lostHeld+o.lostWait > 0
			if !lost && !o.debug {
				break
			}
			attrs := []any{"locks-freed", o.lostHeld, "requests-dropped", o.lostWait}
			if sess := s.sessions[e.Session]; sess != nil {
				attrs = append([]any{"session", sess.hash}, attrs...)
				if sess.p != nil && sess.p.Name != "" {
					attrs = append(attrs, "principal", sess.p.Name)
				}
			}
			if lost {
				o.lost++
				s.log.Info("session lost: its client did not come back within the session grace", attrs...)
			} else {
				s.log.Debug("session ended: its client did not come back within the session grace; it held nothing", attrs...)
			}
			o.lostHeld, o.lostWait = 0, 0
		}
	}
}

// logSlowHandoff logs (rate-limited) a waiter granted after a long wait.
func (s *Server) logSlowHandoff(tx *core.Tx, e *core.Event, w int64) {
	ok, n := s.obs.slowLog.allow(tx.Now())
	if !ok {
		return
	}
	attrs := []any{"waited", time.Duration(w).Round(time.Millisecond), "threshold", time.Duration(s.obs.slowWait),
		"not-logged-since", n}
	if li, found := tx.Lookup(e.ID); found {
		attrs = append(attrs, "resources", joinResources(li.Resources))
	}
	if sess := s.sessions[e.Session]; sess != nil {
		attrs = append(attrs, "session", sess.hash)
	}
	s.log.Info("slow hand-off: a waiter was granted after a long wait", attrs...)
}

func joinResources(r []string) string {
	n := 0
	for _, x := range r {
		n += len(x) + 1
	}
	b := make([]byte, 0, n)
	for i, x := range r {
		if i > 0 {
			b = append(b, '|')
		}
		b = append(b, x...)
	}
	return string(b)
}

// obsSource is the server as the HTTP endpoints see it.
type obsSource struct{ s *Server }

// HTTPHandler returns the handler of mlockd's HTTP endpoints (see package
// server/observe): metrics, health and readiness, the live page and its
// JSON API. The API shows every principal's locks, as an administrator
// sees them, with lock ids cut to 8 hex digits and sessions as keyed
// hashes: never a whole lock id or socketId. On a server with credentials
// (Config.AuthFile or TLSClientCAFile) every endpoint but /healthz and
// /readyz (and /metrics with opt.OpenMetrics) is for administrators only
// (HTTPAdmin), unless opt.Authorize says otherwise; without, the handler
// has no authentication: serve it where only operators and monitoring
// reach it. Close the handler when done with it (it samples rates every
// second).
func (s *Server) HTTPHandler(opt observe.Options) *observe.Handler {
	if opt.Authorize == nil && s.credentialed() {
		opt.Authorize = s.HTTPAdmin
	}
	return observe.New(obsSource{s}, opt)
}

// Snapshot copies the counters in one batch; a cluster's view is read
// after it (never from raft under the core's lock).
func (src obsSource) Snapshot(snap *observe.Snapshot) {
	s := src.s
	s.batch(func(tx *core.Tx) {
		st := tx.Stats()
		o := &s.obs
		snap.Version, snap.Start = buildinfo.Version, s.start
		snap.Requests, snap.VerbNames = o.requests, o.verbNames
		snap.Wait, snap.Hold, snap.Depth = o.wait, o.hold, o.depth
		snap.Grants, snap.Timeouts, snap.Expiries, snap.Unlocks, snap.Evictions = st.Granted, st.TimedOut, st.Expired, st.Unlocked, st.Evicted
		snap.TolerateRefusals = s.counters.intolerance
		snap.BusyRefusals = st.Refused - min(st.Refused, s.counters.intolerance)
		snap.ServerFull, snap.Forbidden, snap.RateLimited = s.counters.serverFull, s.counters.forbidden, s.counters.rateLimited
		snap.QuotaRefusals = s.counters.quotaRefused
		snap.Extends, snap.ExtendFails = st.Extended, st.ExtendFails
		snap.Dropped, snap.SessionsLost = st.Dropped, o.lost
		snap.Held, snap.Waiting, snap.Queues, snap.Entries = st.Held, st.Live-st.Held, st.Queues, st.Entries
		snap.Sessions, snap.Online, snap.Conns = st.Sessions, s.online, len(s.conns)
		if s.cl != nil {
			// Sessions attached to another node are online there.
			for _, sess := range s.sessions {
				if sess.c == nil && sess.node != "" {
					snap.Online++
				}
			}
		}
		snap.ConnsAccepted, snap.ConnsRejected = s.counters.conns, s.counters.rejected+s.counters.rejectedPerIP+s.counters.evicted+s.counters.poolRefused
		snap.ConnsPerIPRefused, snap.ConnsEvicted, snap.MaxConnsRefused = s.counters.rejectedPerIP, s.counters.evicted+s.counters.poolRefused, s.counters.rejected
		snap.FramesIn, snap.FramesOut = s.framesIn.Load(), o.framesOut
		snap.BytesIn, snap.BytesOut = o.bytesIn.Load(), o.bytesOut.Load()
		snap.LastToken = st.LastToken
		snap.Quiet = st.HoldUntil > tx.Now()
		if lim := tx.TokenLimit(); s.dir != nil && lim != 0 {
			snap.Disk = &observe.DiskSnapshot{TokensLeft: lim - min(lim, st.LastToken+1)}
		}
	})
	if snap.Disk != nil {
		d := s.diskState()
		snap.Disk.Healthy, snap.Disk.Errors = !d.failing, d.errors
	}
	if s.cl == nil {
		return
	}
	st := s.cl.node.Status()
	cs := &observe.ClusterSnapshot{Role: string(st.Role), Term: st.Term, LastIndex: st.LastIndex,
		CommitIndex: st.CommitIndex, AppliedIndex: st.AppliedIndex, LeaderKnown: st.Leader.ID != ""}
	if st.Role != "leader" {
		heard := st.LastContact
		if heard.IsZero() {
			heard = s.start // not heard from a leader in this run: not "just now"
		}
		cs.LastContact = time.Since(heard)
	}
	for _, p := range st.Peers {
		cs.Peers = append(cs.Peers, observe.Peer{ID: p.ID, Failing: p.Failing, Stale: s.peerStale(p) != ""})
	}
	snap.Cluster = cs
}

// Status is the detailed status document, as `mlock status` shows it to an
// administrator.
func (src obsSource) Status() *protocol.Status {
	s := src.s
	var doc *protocol.Status
	s.batch(func(tx *core.Tx) { doc = s.status(tx, true) })
	if s.cl != nil {
		doc.Cluster = s.cl.status.Load()
	}
	return doc
}

// Cluster is the node's view of its cluster, nil on a single node.
func (src obsSource) Cluster() *protocol.StatusCluster {
	if src.s.cl == nil {
		return nil
	}
	return src.s.cl.status.Load()
}

// Locks is one page of the locks listing, as an administrator sees it.
func (src obsSource) Locks(prefix, after string, limit int) *protocol.Locks {
	s := src.s
	doc := &protocol.Locks{Queues: []protocol.LocksQueue{}}
	s.batch(func(tx *core.Tx) {
		now := tx.Now()
		doc.Next = tx.QueuesPage(prefix, after, min(limit, s.cfg.StatusLimit), s.cfg.StatusLimit, func(q core.QueueInfo) bool {
			if len(q.Entries) < q.Len {
				doc.Truncated = true
			}
			doc.Queues = append(doc.Queues, s.locksQueue(now, s.obs.adminPrinc, q))
			return true
		})
	})
	doc.Truncated = doc.Truncated || doc.Next != ""
	return doc
}

// Busiest is the n longest queues with prefix, as an administrator sees
// them.
func (src obsSource) Busiest(prefix string, n, entries int) ([]protocol.LocksQueue, int) {
	s := src.s
	var out []protocol.LocksQueue
	matched := 0
	s.batch(func(tx *core.Tx) {
		now := tx.Now()
		matched = tx.Busiest(prefix, n, entries, func(q core.QueueInfo) bool {
			out = append(out, s.locksQueue(now, s.obs.adminPrinc, q))
			return true
		})
	})
	return out, matched
}

// Ready reports whether the server serves locks: it listens and is not
// shutting down; in a cluster, it is a member, a leader is known and this node has applied
// the log to within readyLag entries of what is committed. A quiet start
// is ready: requests queue and are granted when it ends.
func (src obsSource) Ready() (bool, string) {
	s := src.s
	s.mu.Lock()
	listening := len(s.listeners) > 0
	s.mu.Unlock()
	switch {
	case s.closed.Load():
		return false, "shutting down"
	case !listening:
		return false, "not listening yet"
	case s.cl == nil:
		if d := s.diskState(); d.failing {
			return false, "data directory not writable (" + d.lastErr + "): lock requests are refused once the tokens the mark on disk covers are used up"
		}
		return true, ""
	case s.cl.removed.Load():
		return false, "removed from the cluster: serves no client until added again"
	case s.cl.storeFailed.Load() != "":
		return false, "the Raft directory cannot be written (" + s.cl.storeFailed.Load() + "): this node stopped (fail-stop); restart it once its disk works"
	case s.cl.halted.Load() != "":
		return false, "stopped applying the log: " + s.cl.halted.Load()
	}
	st := s.cl.node.Status()
	switch {
	case st.Role == "shutdown":
		return false, "cluster node stopped"
	case st.Leader.ID == "":
		return false, "no known leader"
	case st.CommitIndex > st.AppliedIndex+readyLag:
		return false, "catching up: " + itoa(st.CommitIndex-st.AppliedIndex) + " committed entries not applied yet"
	}
	return true, ""
}

func itoa(n uint64) string { return string(protocol.AppendUint(nil, n)) }
