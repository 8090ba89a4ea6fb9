package server

import (
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/mlock-dev/mlock/internal/auth"
	"github.com/mlock-dev/mlock/internal/core"
	"github.com/mlock-dev/mlock/internal/protocol"
	"github.com/mlock-dev/mlock/server/observe"
)

// clusterTestHooks are the tests' handles on one node (ClusterConfig's
// testHooks; nil outside tests). A test's cluster shares one value among
// its nodes, so that tests of different clusters run side by side.
type clusterTestHooks struct {
	// apply, if set before the node starts, sees every entry it applies.
	apply func(node string, now int64, cmds [][]byte)
	// ownFormat, if set before the node starts, replaces the highest log
	// format the node says it reads (and so writes at most): a node of an
	// older build. 0 keeps the build's.
	ownFormat func(id string) int
	// holdTicks keeps a leader from proposing ticks: a deadline is
	// processed by the next entry, whatever it is. The leader then sees no
	// deadline, so its notices count as quiet (a read index may leave out
	// one that runs a deadline): no ping of such a test may rely on them.
	holdTicks atomic.Bool
	// noLeaderWait, if set before the node starts, replaces the bound of
	// the same name (5 s).
	noLeaderWait time.Duration
	// noProposeNext: as the leader, the node answers fwdProposeNext as a
	// kind it does not know, as a leader of an older build does.
	noProposeNext bool
	// noReads: as the leader, the node answers fwdRead as a kind it does
	// not know, as a leader of an older build does (its followers' pings
	// go through the log).
	noReads bool
	// dropForwarded: as the leader, the node neither queues nor answers
	// the log commands forwarded to it (a leader whose log has stalled).
	dropForwarded atomic.Bool
	// storeFault, if set, is called before each write of a node's Raft log
	// and stable stores (cluster.Config.WriteFault), with the node's id.
	storeFault atomic.Pointer[func(node, store string) error]
}

// smHook is the state machine the node drives: the de-duplication window
// around the replica, and the tests' hook.
type smHook struct{ cl *clusterState }

func (h smHook) Apply(now int64, cmds [][]byte) [][]byte {
	if hk := h.cl.cfg.testHooks; hk != nil && hk.apply != nil {
		hk.apply(h.cl.id, now, cmds)
	}
	return h.cl.dedup.Apply(now, cmds)
}
func (h smHook) At(index uint64)           { h.cl.at.Store(index) }
func (h smHook) Snapshot() ([]byte, error) { return h.cl.dedup.Snapshot() }
func (h smHook) Restore(b []byte) error    { return h.cl.dedup.Restore(b) }

// replica is the server's cluster.StateMachine (wrapped in a cluster.Dedup):
// the core in manual mode, the sessions (principal's name, attached node
// and connection, offline pushes, pruned) and the genesis flag. Apply runs
// every command in one core batch at the entry's time; a command proposed
// by a connection of this node writes its answer, then its pushes, to
// that connection.
type replica struct{ s *Server }

func (r *replica) Apply(now int64, cmds [][]byte) [][]byte {
	s := r.s
	out := make([][]byte, len(cmds))
	if s.cl.halted.Load() != "" {
		return out // stopped: see halt
	}
	if s.cl.held && s.cl.at.Load() > s.cl.pinAt.Load() {
		s.releaseVersion() // past the lowering: the version it kept was older
	}
	ms, ok := s.decodeEntry(cmds)
	if !ok {
		return out
	}
	// A failover is applied at the time of the previous entry, before this
	// entry's time processes what is due: after a long election, or a
	// restart of the whole cluster, the deadlines that passed meanwhile
	// are moved to the end of the window instead of running first.
	for i := range ms {
		if ms[i].op == opFailover {
			c := s.core()
			c.BatchAt(c.Now(), func(tx *core.Tx) { tx.Apply(&core.Command{Op: core.OpFailover, Until: ms[i].until}) })
		}
	}
	var genesis *logCmd
	s.core().BatchAt(now, func(tx *core.Tx) {
		if len(cmds) == 0 {
			tx.Apply(&core.Command{Op: core.OpTick})
			return
		}
		for i := range ms {
			switch ms[i].op {
			case 0, opGenesis: // skipped (logged); the genesis replaces the core below
				out[i] = []byte{0}
				if ms[i].op == opGenesis {
					genesis = &ms[i]
				}
			default:
				out[i] = s.applyLocked(tx, &ms[i])
			}
		}
	})
	if genesis != nil {
		s.applyGenesis(now, genesis)
	}
	s.cl.noteApplied(ms)
	return out
}

// decodeEntry decodes the commands of one entry before any is applied. A
// command that does not decode is logged and skipped (op 0); one of a
// format this build does not read stops the node before the entry
// (halt): false.
func (s *Server) decodeEntry(cmds [][]byte) ([]logCmd, bool) {
	ms := make([]logCmd, len(cmds))
	for i, b := range cmds {
		err := decodeLogCmd(b, &ms[i])
		var future *errFutureFormat
		switch {
		case errors.As(err, &future):
			s.halt(err)
			return nil, false
		case err != nil:
			s.log.Error("cluster: log command does not decode: skipped", "err", err)
			ms[i] = logCmd{}
		}
	}
	return ms, true
}

// applyGenesis replaces the empty core of a new cluster with one seeded by
// the command, with the settings it carries in force (once: a repeat does
// nothing). A genesis of an earlier version, without settings, keeps the
// node's own in force until the first opParams.
func (s *Server) applyGenesis(now int64, m *logCmd) {
	cl := s.cl
	seed, first, params, hasParams := m.seed, m.first, m.params, m.hasParams
	old := s.core()
	fresh := false
	var set settings
	old.Batch(func(*core.Tx) { fresh, set = !cl.genesis, s.set })
	if !fresh {
		return
	}
	if hasParams {
		st, err := parseSettings(params, set)
		if err != nil {
			s.log.Error("cluster: genesis: the leader's settings do not apply: the node's own stay in force", "err", err)
		} else {
			set = st
		}
	}
	c, err := s.newCore(set, nil, &seed, first)
	if err != nil {
		s.log.Error("cluster: genesis", "err", err)
		return
	}
	c.BatchAt(now, func(*core.Tx) {})
	changed := false
	old.Batch(func(*core.Tx) {
		cl.genesis = true
		changed = s.set != set
		s.set = set
		cl.dedup.SetWindow(set.DedupWindow)
		s.corep.Store(c)
	})
	old.Close()
	if changed {
		s.log.Info("cluster: settings in force (the first leader's)", "settings", set.String())
	}
}

// applyLocked applies one log command and returns its answer.
func (s *Server) applyLocked(tx *core.Tx, m *logCmd) []byte {
	cl := s.cl
	cl.ans = append(cl.ans[:0], 0)
	switch m.op {
	case opFrames, opRequests:
		s.applySessionLocked(tx, m)
	case opAttach:
		s.applyAttachLocked(tx, m)
	case opDetach:
		if sess := s.sessions[m.session]; sess != nil && sess.node == m.node && sess.key == m.conn {
			s.detachLocked(tx, sess)
		}
	case opDetachNode:
		var ids []string
		for id, sess := range s.sessions {
			if sess.node == m.node && (m.conn == "" || !hasPrefix(sess.key, m.conn)) {
				ids = append(ids, id)
			}
		}
		slices.Sort(ids) // deterministic
		for _, id := range ids {
			s.detachLocked(tx, s.sessions[id])
		}
		if len(ids) > 0 {
			s.log.Info("cluster: sessions of a node detached", "node", m.node, "sessions", len(ids))
		}
	case opFailover:
		n := tx.Apply(&core.Command{Op: core.OpFailover, Until: m.until}).N
		s.log.Debug("cluster: failover", "until", time.Unix(0, m.until), "deadlines-moved", n)
	case opHoldGrants:
		tx.Apply(&core.Command{Op: core.OpHoldGrants, Until: m.until})
	case opParams:
		s.applyParamsLocked(tx, m.params)
	case opVersion:
		s.setVersionLocked(int(min(m.version, logFormat)))
	case opCancel:
		s.applyCancelLocked(tx, m)
	}
	// The rule of late grants follows the cluster version, whichever way
	// a command moved it, from the next command on.
	tx.SetLateGrants(lateGrants(cl.version))
	s.deliverPushesLocked()
	return []byte{cl.ans[0]}
}

// lateGrants reports whether the engine grants a waiter freed after its
// wait deadline (locktable.Config.LateGrants) at cluster version v: below
// log format 3 a member may run a build that does (every build before
// format 3 did), so every replica keeps that rule; from format 3 on every
// member's build times such a waiter out instead, as a single server does.
func lateGrants(v int) bool { return v < logFormat3 }

// setVersionLocked puts cluster version v in force (an opVersion, or a
// snapshot's): every node may write the log formats up to it from now on.
// It goes down only by a rollback (an opVersion below the version in
// force, or the snapshot of a cluster that applied one): the version is
// then pinned (the leader no longer raises it on its own) and the raft
// handshake lowered with it; a raise lifts the pin.
//
// A pinned node that applies an entry, or restores a snapshot, from below
// the lowering's index (pinAt: restarted on a snapshot older than the
// lowering, it replays the log up to it again) puts v in force in the
// replicated state only (the rule of late grants, its snapshots): it
// keeps writing, saying and keeping the version it was pinned at, so it
// never writes a format that a member already running the previous
// release skips. The lowering, applied again at its index, finds it so.
func (s *Server) setVersionLocked(v int) {
	cl := s.cl
	if v == cl.version {
		return
	}
	lower := v < cl.version
	cl.version = v
	if pin := cl.pinAt.Load(); cl.pinned.Load() && pin > 0 && cl.at.Load() < pin {
		if !cl.held {
			s.log.Info("cluster: applying what came before the rollback's lowering: this node keeps the pinned version until it applies the lowering again",
				"version", v, "pinned", cl.versionNow.Load(), "index", cl.at.Load(), "lowering", pin)
		}
		cl.held = true
		return
	}
	s.putVersion(v, lower)
}

// releaseVersion ends a hold (see setVersionLocked): an entry past the
// lowering's index is applied, so the replicated version is that of state
// newer than the lowering (a snapshot of unknown index was restored).
func (s *Server) releaseVersion() {
	cl := s.cl
	cl.held = false
	if now := int(cl.versionNow.Load()); cl.version != now {
		s.putVersion(cl.version, cl.version < now)
	}
}

// putVersion makes v the version this node writes, says and keeps; lower:
// by a rollback (pinned, at the index being applied).
func (s *Server) putVersion(v int, lower bool) {
	cl := s.cl
	cl.held = false
	if lower {
		// Not ready for the previous release (rollbackReady) until a
		// snapshot covers this command: marked before the version shows.
		cl.rollback.lowered()
	}
	at := uint64(0)
	if lower {
		at = cl.at.Load()
	}
	if cl.cfg.Dir != "" && (lower || int64(v) > cl.versionFloor.Load() || cl.pinned.Load()) {
		// Kept for the raft handshake of this node's next start, before
		// it has applied the log again (see raftVersion); written before
		// the version is in force here.
		if err := writeVersionFile(cl.cfg.Dir, versionState{version: v, pinned: lower, at: at}); err != nil {
			s.log.Warn("cluster: cannot keep the cluster version for the next start", "err", err)
		} else {
			cl.versionFloor.Store(int64(v))
		}
	}
	cl.pinAt.Store(at)
	cl.pinned.Store(lower)
	cl.versionNow.Store(int64(v))
	if lower {
		s.log.Warn("cluster: cluster version lowered by a rollback: pinned until mlock cluster rollback --cancel",
			"version", v, "this-build-reads", logFormat, "index", at)
		return
	}
	s.log.Info("cluster: cluster version in force", "version", v, "this-build-reads", logFormat)
}

// halt stops this node's state machine for good (until it restarts with a
// build that reads the log): it met a command it cannot read (err, which
// names the format and the one this build reads up to). It applies nothing
// more, takes no snapshot (the entries stay in its log, to be applied by
// that build), closes its clients' connections and serves none.
func (s *Server) halt(err error) {
	cl := s.cl
	if cl.halted.Load() != "" {
		return
	}
	cl.halted.Store(err.Error())
	s.log.Error("cluster: this node stops applying the log: it cannot read a command the leader wrote; "+
		"its clients go to other nodes. Restart it with a build that reads the log", "err", err)
	s.batch(func(*core.Tx) {
		for c := range s.conns {
			if !c.forward {
				c.finish()
			}
		}
	})
}

// stateParams is the canonical text of this node's own settings that
// applying the log depends on (limits, grace, default TTL, the
// de-duplication window): what it proposes while it leads (the genesis,
// opParams), and so puts in force on every node.
func (s *Server) stateParams() string {
	return settingsOf(&s.cfg).String()
}

// applyParamsLocked applies an opParams command: the leader's settings are
// in force from the next command on, on every node, this one's own flags
// aside (the engine's limits and grace, the handlers' limits, the
// de-duplication window). Settings that do not parse or are out of range
// change nothing (on every node alike).
func (s *Server) applyParamsLocked(tx *core.Tx, text string) {
	st, err := parseSettings(text, s.set)
	switch {
	case err != nil:
		s.log.Error("cluster: the leader's settings do not apply: the ones in force stay", "err", err, "in-force", s.set.String())
	case st != s.set:
		if err := tx.SetLimits(st.engineConfig()); err != nil { // validated: not expected
			s.log.Error("cluster: the leader's settings do not apply: the ones in force stay", "err", err)
			break
		}
		s.set = st
		s.cl.dedup.SetWindow(st.DedupWindow)
		s.log.Info("cluster: settings in force (the leader's)", "settings", st.String(), "proposed", time.Unix(0, tx.Now()))
	}
	s.checkParamsLocked(text, tx.Now())
}

// checkParamsLocked compares the leader's settings (an opParams command
// applied at time at) with this node's own flags and reports the
// differences: the leader's are in force, this node's would be only while
// it leads (an error in the log, once for each new difference, unless the
// command is older than two rounds of them: a log replayed after every
// node's settings changed; clusterState.paramsDiffer).
func (s *Server) checkParamsLocked(leader string, at int64) {
	cl := s.cl
	mine := strings.Fields(s.stateParams())
	theirs := strings.Fields(leader)
	var diff []string
	for _, kv := range mine {
		if !slices.Contains(theirs, kv) {
			name, _, _ := strings.Cut(kv, "=")
			other := "unset"
			for _, o := range theirs {
				if n, v, _ := strings.Cut(o, "="); n == name {
					other = v
				}
			}
			diff = append(diff, kv+" (leader: "+other+")")
		}
	}
	msg := strings.Join(diff, ", ")
	if msg != "" && msg != cl.paramsDiffer.Load() && time.Since(time.Unix(0, at)) < 2*paramsEvery {
		s.log.Error("cluster: this node's settings differ from the leader's: the leader's are in force on every "+
			"node; this node's flags count only while it leads, and then change the limits, grace, default TTL and "+
			"de-duplication window of the whole cluster: give every node the same",
			"differ", msg, "proposed", time.Unix(0, at))
	}
	cl.paramsDiffer.Store(msg)
}

func hasPrefix(s, p string) bool { return len(s) >= len(p) && s[:len(p)] == p }

// detachLocked starts sess's grace: it is attached nowhere.
func (s *Server) detachLocked(tx *core.Tx, sess *session) {
	sess.node, sess.key = "", ""
	s.rebindLocked(sess, false)
	tx.Apply(&core.Command{Op: core.OpDetach, Session: sess.id})
}

// localConn returns this node's connection of a command, nil if it was
// proposed elsewhere or the connection is gone.
func (s *Server) localConn(m *logCmd) *conn {
	if m.node != s.cl.id {
		return nil
	}
	return s.cl.conns[m.conn]
}

// rebindLocked makes sess.c follow the replicated attachment: the local
// connection of (node, key) if it is here, else none. A connection that
// loses the session is closed: told "taken over" if another connection
// took it (takeover), silently otherwise (its client connects again).
func (s *Server) rebindLocked(sess *session, takeover bool) {
	var want *conn
	if sess.node == s.cl.id {
		want = s.cl.conns[sess.key]
	}
	if sess.c == want {
		if want == nil && (sess.p == nil || sess.p.Name != sess.pname) {
			sess.p = &auth.Principal{Name: sess.pname}
		}
		return
	}
	if old := sess.c; old != nil {
		old.sess = nil
		sess.c = nil
		s.online--
		if takeover {
			old.sendError(protocol.CodeTakenOver)
			s.log.Info("session taken over by a new connection", "session", sess.hash, "old", old.remote)
		} else {
			old.finish()
		}
	}
	if want != nil {
		if want.sess != nil && want.sess != sess {
			want.sess.c = nil
			s.online--
		}
		sess.c = want
		want.sess = sess
		sess.p = want.p
		s.online++
	}
	if sess.c == nil && (sess.p == nil || sess.p.Name != sess.pname) {
		sess.p = &auth.Principal{Name: sess.pname} // rights count only where it is attached
	}
}

// applyAttachLocked is connect, applied: the session (new, or resumed
// with its offline pushes and its held locks announced again) moves to the
// connection, taking it over from any other.
func (s *Server) applyAttachLocked(tx *core.Tx, m *logCmd) {
	cl := s.cl
	local := s.localConn(m)
	sess := s.sessions[m.session]
	if sess != nil && sess.node == "" {
		// The session's grace may be over at the entry's time while no tick
		// processed it yet (the entry came first): process what is due, and
		// if the engine closed the session, this attach starts a new one.
		// The old one's events of this batch, its end included, stay its
		// own (eventLocked). Every node applies the same entry at the same
		// time: every node decides alike.
		tx.Apply(&core.Command{Op: core.OpTick})
		if !tx.HasSession(m.session) {
			delete(s.sessions, m.session)
			if s.ended == nil {
				s.ended = make(map[string]*session)
			}
			s.ended[m.session] = sess
			sess = nil
		}
	}
	resumed := sess != nil
	if sess == nil {
		if len(s.sessions) >= s.set.MaxSessions {
			s.counters.sessionsRefused++
			cl.ans = protocol.AppendError(cl.ans, protocol.CodeTooManySessions)
			cl.ans[0] = ansEnd
			s.answerLocked(local, m.seq, cl.ans[1:], true)
			return
		}
		sess = &session{id: m.session, hash: s.shortHash(m.session)}
		s.sessions[m.session] = sess
	}
	sess.pname = m.principal
	resumed = tx.Apply(&core.Command{Op: core.OpAttach, Session: m.session}).OK && resumed
	moved := sess.node != "" && (sess.node != m.node || sess.key != m.conn)
	sess.node, sess.key = m.node, m.conn
	s.rebindLocked(sess, moved)
	cl.ans[0] = ansAttached
	cl.ans = protocol.AppendConnectedLeader(cl.ans, resumed, s.set.graceMs(), s.leaderHint(local))
	cl.ans = append(cl.ans, sess.offline...)
	sess.offline = nil
	sess.pruned = false
	s.answerLocked(local, m.seq, cl.ans[1:], false)
	if resumed {
		// As connect: the held locks announced again, and those evicted
		// told again (an evicted lock ends at the eviction plus the grace,
		// which the new connection's answers would let its holder outlive).
		tx.SessionLocks(m.session, func(li core.LockInfo) {
			switch {
			case li.Revoked:
				s.push(sess, protocol.PushEvicted, li.ID)
			case li.Granted:
				s.pushLocked(sess, li.ID, li.Deadline, li.Token)
			}
		})
	}
}

// leaderHint is the leader's client address for the connected answer to
// local, this node's connection (nil: none here), if its connect asked for
// it ("want=leader": a client that reads the hint; an older parser would
// take the grace word for something else): the client may move there
// and save every request the forwarding hop and the follower's wait for the
// commit index. "" on the leader, without a local connection, or while no
// leader is known. Only this node's answer carries it (the replicated
// result is the flags byte), so it need not be deterministic.
func (s *Server) leaderHint(local *conn) string {
	if local == nil || !local.wantLeader {
		return ""
	}
	info, _ := s.cl.node.Leader()
	if info.ID == "" || info.ID == s.cl.id {
		return ""
	}
	return info.ClientAddr
}

// answerLocked writes frames to c, the proposing connection, unless its
// answer to proposal seq was written already (from the proposal's result,
// when this node applies later than the leader).
func (s *Server) answerLocked(c *conn, seq uint64, frames []byte, end bool) {
	if c == nil || c.answered >= seq {
		return
	}
	c.setAnswered(seq)
	c.write(frames)
	if end {
		c.finish()
	}
}

// applySessionLocked runs a connection's requests of one log command, in
// order: the typed requests of format 2 (opRequests) with the apply step
// of a single node's handlers, or the client frames of format 1 (opFrames),
// parsed with the typed Parse of a single node and applied alike. Rights
// were checked where the client is connected. A connection that no longer
// holds its session (taken over, detached) is closed instead.
func (s *Server) applySessionLocked(tx *core.Tx, m *logCmd) {
	cl := s.cl
	local := s.localConn(m)
	sess := s.sessions[m.session]
	if sess == nil || sess.node != m.node || sess.key != m.conn {
		cl.ans[0] = ansEnd
		if local != nil && local.answered < m.seq {
			local.finish()
		}
		return
	}
	ac := &cl.ac
	*ac = conn{srv: s, sess: sess, trusted: true, capture: &cl.ans, remote: "cluster"}
	var made []protocol.ID
	if s.givenUpLocked(m) {
		ac.made = &made
	}
	n := len(m.reqs)
	if m.op == opFrames {
		n = len(m.frames)
	}
	for i := range n {
		at := len(cl.ans)
		if m.op == opFrames {
			cl.fields = protocol.Split(cl.fields[:0], m.frames[i])
			if len(cl.fields) == 0 {
				continue
			}
			ac.observeCommand(tx, cl.fields)
		} else {
			ac.observeRequest(tx, &m.reqs[i])
		}
		if local != nil && local.answered < m.seq {
			local.write(cl.ans[at:]) // the answer, then its pushes
		}
		s.deliverPushesLocked()
		if ac.ended {
			cl.ans[0] = ansEnd
			if local != nil && local.answered < m.seq {
				local.finish()
			}
			// The connection ends here: its later commands (already on
			// their way, pipelined) find the session detached and are
			// ignored, as a single server drops what follows the frame
			// that closed the connection. The detach its end proposes
			// finds nothing left to do.
			s.detachLocked(tx, sess)
			break
		}
	}
	if local != nil && local.answered < m.seq {
		local.setAnswered(m.seq)
	}
	ac.capture, ac.made = nil, nil
	if len(made) > 0 {
		s.queueCancelLocked(cancelJob{key: m.conn, seq: m.seq, session: m.session, ids: made})
	}
}

// setAnswered records that this node's apply wrote the answer to the
// connection's proposal seq (under the core's lock), and wakes its pipeline
// if it waits for it (see pipeline.applied).
func (c *conn) setAnswered(seq uint64) {
	c.answered = seq
	if c.pipe != nil {
		select {
		case c.pipe.applied <- struct{}{}:
		default:
		}
	}
}

// observeRequest applies one typed request of the log (applyRequest) and
// counts it by kind and outcome, as observeCommand counts a frame. It runs
// in a core batch.
func (c *conn) observeRequest(tx *core.Tx, r *request) {
	s := c.srv
	o := &s.obs
	failed, forbidden := o.failed, s.counters.forbidden
	c.applyRequest(tx, r)
	v := r.verb()
	if int(v) >= observe.MaxVerbs {
		v = 0
	}
	out := observe.OK
	if o.failed != failed || s.counters.forbidden != forbidden {
		out = observe.Failed
	}
	o.requests[v][out]++
	if o.debug {
		s.logCommand(c, v, r.resources(), out)
	}
}
