package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/mlock-dev/mlock/internal/cluster"
	"github.com/mlock-dev/mlock/internal/core"
)

// Rollback (docs/cluster.md, "Rollback"), as etcd's downgrade: the
// operator lowers the cluster version to what the previous release reads
// (mlock cluster rollback --to 1), then replaces the nodes one at a time
// with that release while the cluster serves.
//
//   - The leader checks that the lowering is possible (rollbackRefusal):
//     every member runs a build that applies it (it said, on a forwarding
//     connection still open, that it reads log format 4, the mark of the
//     builds that apply a lowering, and the version in force; and the
//     leader reaches it), the settings
//     in force are ones the previous release reads alike, and the target is
//     the previous release's format. Else it is refused with the reason.
//     What the previous release reads of the state: the lock table's and
//     the sessions' snapshot encodings are those of v0.1.0 (snapshot format
//     2 is written below version 2), and format 1 carries every request (as
//     the client's frames); what formats 3 and 4 add is the cluster version
//     itself, the wait deadline of a lock request (applied where it is
//     proposed, then a deadline of the table as any) and the cancel of the
//     locks of given-up requests (below version 3 not written: those locks
//     end with their leases, as in a mixed cluster of an upgrade).
//   - The lowering is an opVersion below the version in force, written in
//     the format in force, format 4 at least (a build before the rollback,
//     which would not apply it as one, stops at it instead: see
//     logFormat4), and applied by every node through the apply path
//     of any opVersion (setVersionLocked), at its index: every rule gated
//     on the version (the formats written, the late grants of the lock
//     table) changes at that entry on every node alike. A node that applies
//     it writes the lower formats from the next command on, keeps
//     "<version> rollback" in its versionFile, lowers its raft handshake
//     (MLRAFT1, which the previous release speaks; cluster.Config.Lowered
//     reaches a member that has not applied the lowering yet), and the
//     version is pinned: the leader does not raise it again on its own
//     (raiseVersion) until a raise is applied (mlock cluster rollback
//     --cancel, refused while a member does not read the higher format).
//   - A node of the previous release opened on a node's raft directory
//     restores its latest snapshot and replays the log after it, skipping
//     what it cannot decode: so, once it applied the lowering, every node
//     takes a snapshot past the last command of format 2 or more it applied
//     (rollbackLoop), and says it is ready (ClusterStatus.RollbackReady)
//     while none came after. Such commands stop within moments: every node
//     writes the format it has applied; a follower's in flight when it
//     applied the lowering still arrive in the higher format.

// rollbackQuiet is how long after the last command of format 2 or more
// that a node with a lowered version applied it takes its snapshot.
const rollbackQuiet = 500 * time.Millisecond

// rollbackState is a node's progress after a lowering: whether a command
// that the previous release cannot read was applied since the snapshot
// that covers the lowering.
type rollbackState struct {
	mu     sync.Mutex
	dirty  bool      // a command of format 2 or more was applied after the last snapshot asked for
	taking bool      // the snapshot asked for is being taken
	highAt time.Time // when the last one was applied
}

// sawHigh records that a command of format 2 or more was applied (the
// lowering included) while the version is pinned low.
func (r *rollbackState) sawHigh(now time.Time) {
	r.mu.Lock()
	r.dirty, r.highAt = true, now
	r.mu.Unlock()
}

// lowered records the lowering's apply (itself a command of format 2 or
// more).
func (r *rollbackState) lowered() { r.sawHigh(time.Now()) }

// take reports whether a snapshot is due at now (dirty, and quiet for
// rollbackQuiet), and marks it taken.
func (r *rollbackState) take(now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.dirty || now.Sub(r.highAt) < rollbackQuiet {
		return false
	}
	r.dirty, r.taking = false, true
	return true
}

// taken records the end of the snapshot asked for: ok, it is in the raft
// directory; else it is asked for again.
func (r *rollbackState) taken(ok bool) {
	r.mu.Lock()
	r.taking = false
	if !ok {
		r.dirty = true
	}
	r.mu.Unlock()
}

// clean reports whether no command of format 2 or more was applied since
// the last snapshot asked for, and that snapshot is in the raft directory.
func (r *rollbackState) clean() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.dirty && !r.taking
}

// noteApplied runs after the apply of an entry's commands ms: while the
// version is pinned low, one of format 2 or more makes a new snapshot due.
func (cl *clusterState) noteApplied(ms []logCmd) {
	if !cl.pinned.Load() || cl.versionNow.Load() >= logFormat2 {
		return
	}
	for i := range ms {
		if ms[i].format >= logFormat2 {
			cl.rollback.sawHigh(time.Now())
			return
		}
	}
}

// rollbackReady reports whether the previous release may be started on
// this node's raft directory: the version is pinned at 1, the handshake
// says it, this node has applied the lowering (again, if it restarted on
// an older snapshot), and a snapshot covers every command of a higher
// format this node applied.
func (cl *clusterState) rollbackReady() bool {
	return cl.pinned.Load() && cl.versionNow.Load() == logFormat1 && cl.raftVersion() == logFormat1 &&
		cl.halted.Load() == "" && cl.at.Load() >= cl.pinAt.Load() && cl.rollback.clean()
}

// rollbackLoop takes the snapshots that rollbackState asks for, until the
// server shuts down.
func (s *Server) rollbackLoop() {
	cl := s.cl
	defer cl.bg.Done()
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-cl.ctx.Done():
			return
		case <-t.C:
		}
		if !cl.pinned.Load() || !cl.rollback.take(time.Now()) {
			continue
		}
		err := cl.node.Snapshot()
		cl.rollback.taken(err == nil || errors.Is(err, raft.ErrNothingNewToSnapshot))
		switch {
		case err == nil:
			s.log.Info("cluster: a snapshot past the rollback's lowering is taken: the previous release may open this node's raft directory",
				"version", cl.versionNow.Load())
		case errors.Is(err, raft.ErrNothingNewToSnapshot):
			// The last snapshot covers every entry applied.
		default:
			if cl.ctx.Err() == nil {
				s.log.Warn("cluster: the snapshot past the rollback's lowering failed (tried again)", "err", err)
			}
		}
	}
}

// rollbackReq is an operator's rollback request: lower the cluster version
// to to (dry: only check that it can be), or (cancel) raise it again to
// the highest format every member reads, lifting the pin.
type rollbackReq struct {
	to          int
	dry, cancel bool
}

// parseRollback reads the arguments of "cluster <req> rollback": "<to>",
// "<to> check" or "cancel".
func parseRollback(f [][]byte) (rollbackReq, bool) {
	if len(f) == 1 && string(f[0]) == "cancel" {
		return rollbackReq{cancel: true}, true
	}
	if len(f) < 1 || len(f) > 2 || len(f) == 2 && string(f[1]) != "check" {
		return rollbackReq{}, false
	}
	to, err := strconv.Atoi(string(f[0]))
	if err != nil || to < 0 || strconv.Itoa(to) != string(f[0]) {
		return rollbackReq{}, false
	}
	return rollbackReq{to: to, dry: len(f) == 2}, true
}

// String is the request's body on a forwarding connection (fwdRollback),
// which parseRollback reads.
func (r rollbackReq) String() string {
	switch {
	case r.cancel:
		return "cancel"
	case r.dry:
		return strconv.Itoa(r.to) + " check"
	}
	return strconv.Itoa(r.to)
}

// errRollback is the error of a refused rollback; its text says why.
type errRollback struct{ why string }

func (e *errRollback) Error() string { return e.why }

// rollbackHere runs r on this node, which must lead (else
// cluster.ErrNotLeader). A lowering or a raise that is in force already
// succeeds (a request asked again after an unknown outcome).
func (s *Server) rollbackHere(ctx context.Context, r rollbackReq) error {
	cl := s.cl
	if !cl.node.IsLeader() {
		return cluster.ErrNotLeader
	}
	if why := cl.halted.Load(); why != "" {
		return &errRollback{"this node stopped applying the log: " + why}
	}
	peers := cl.node.Status().Peers
	v := int(cl.versionNow.Load())
	if r.cancel {
		to, why := s.raiseRefusal(peers)
		switch {
		case why != "":
			return &errRollback{why}
		case to <= v && !cl.pinned.Load():
			return nil // raised already
		case to <= v:
			return &errRollback{fmt.Sprintf("the cluster version is %d and no higher format is read by every member", v)}
		}
		return s.proposeVersion(ctx, to, to)
	}
	if r.to == v && cl.pinned.Load() {
		return nil // lowered already
	}
	if why := s.rollbackRefusal(r.to, peers); why != "" {
		return &errRollback{why}
	}
	if r.dry {
		return nil
	}
	// Every member said it reads rollbackFormat (rollbackRefusal).
	return s.proposeVersion(ctx, max(cl.writeFormat(), rollbackFormat), r.to)
}

// rollbackFormat is the lowest log format of the builds that apply a
// rollback's lowering (see logFormat4).
const rollbackFormat = logFormat4

// proposeVersion proposes an opVersion of version in format f, and waits
// until this node applied it.
func (s *Server) proposeVersion(ctx context.Context, f, version int) error {
	cl := s.cl
	cmd := cluster.DedupCommand("", 0, appendLogCmd(nil, &logCmd{format: f, op: opVersion, version: uint64(version)}))
	if _, err := cl.node.Propose(ctx, cmd); err != nil {
		return err
	}
	if int(cl.versionNow.Load()) != version {
		return &errRollback{fmt.Sprintf("the cluster version is %d, not %d: another change came first", cl.versionNow.Load(), version)}
	}
	verb := "raised"
	if cl.pinned.Load() {
		verb = "lowered by a rollback"
	}
	s.log.Warn("cluster: the cluster version is "+verb+" by the operator", "version", version)
	return nil
}

// rollbackRefusal returns why the cluster version cannot be lowered to to
// now ("": it can), on the leader, with the members peers.
func (s *Server) rollbackRefusal(to int, peers []cluster.Peer) string {
	cl := s.cl
	v := int(cl.versionNow.Load())
	switch {
	case to != logFormat1:
		return fmt.Sprintf("cannot roll back to version %d: only version 1 (the log format of v0.1.0) is supported", to)
	case v <= to:
		return fmt.Sprintf("the cluster version is %d already: nothing to roll back", v)
	}
	var below []string
	why := cl.liveFormats(peers, "", func(id string, f int) {
		switch {
		case f < v:
			below = append(below, fmt.Sprintf("member %s reads log formats up to %d, below the cluster version %d", id, f, v))
		case f < rollbackFormat:
			below = append(below, fmt.Sprintf("member %s reads log formats up to %d: its build cannot apply a rollback's lowering "+
				"(a build that can reads log format %d: run this build on it)", id, f, rollbackFormat))
		}
	})
	if own := cl.ownFormat(); own < rollbackFormat {
		below = append(below, fmt.Sprintf("the leader %s reads log formats up to %d: its build cannot apply a rollback's lowering", cl.id, own))
	}
	why = append(why, below...)
	if len(why) > 0 {
		slices.Sort(why)
		return strings.Join(why, "; ") + ": every member must apply the lowering (start it, or remove it, then ask again)"
	}
	var set settings
	s.batch(func(*core.Tx) { set = s.set })
	if err := prevReleaseSettings(set); err != nil {
		return "the settings in force are not ones v0.1.0 reads alike: " + err.Error()
	}
	return ""
}

// raiseRefusal returns the highest log format every member reads (the
// version a cancel raises to), or why it cannot be known: a member not
// reached, or silent lately (v0.1.0 says nothing).
func (s *Server) raiseRefusal(peers []cluster.Peer) (int, string) {
	cl := s.cl
	to := cl.ownFormat()
	why := cl.liveFormats(peers, " (v0.1.0 says nothing)", func(_ string, f int) { to = min(to, f) })
	if len(why) > 0 {
		slices.Sort(why)
		return 0, strings.Join(why, "; ") + ": run this build on every member before the version is raised again"
	}
	return to, ""
}

// liveFormats calls each with the id and the formats of every other
// member reached that said which log formats it reads on a connection still
// open, and returns why each other member did not (not reached, silent
// lately, followed by silentNote, or its word said on a connection closed
// since), in no order.
func (cl *clusterState) liveFormats(peers []cluster.Peer, silentNote string, each func(id string, format int)) []string {
	var why []string
	for _, p := range peers {
		f, known := cl.memberFormatLive(p.ID)
		switch {
		case p.ID == cl.id:
		case p.Failing:
			why = append(why, fmt.Sprintf("member %s is not reached (its heartbeats fail)", p.ID))
		case !known:
			if said, fresh := cl.memberFormat(p.ID); fresh {
				// It said so lately, but on a connection that has closed
				// since: it may have been restarted on another build.
				why = append(why, fmt.Sprintf("member %s said it reads log formats up to %d on a forwarding connection "+
					"that has closed since (perhaps restarted on another build; it says them again on its next one, "+
					"within %v)", p.ID, said, announceEvery))
				continue
			}
			why = append(why, fmt.Sprintf("member %s has not said which log formats it reads lately%s", p.ID, silentNote))
		default:
			each(p.ID, f)
		}
	}
	return why
}

// prevSettingNames are the replicated settings v0.1.0 knows (it ignores
// any other: a setting it does not know would be in force on the nodes of
// this build only).
var prevSettingNames = []string{"dedup-window", "default-ttl", "max-entries", "max-locks", "max-locks-per-session",
	"max-name-bytes", "max-name-len", "max-offline-bytes", "max-queue-len", "max-resources", "max-session-bytes",
	"max-sessions", "max-timeout", "max-ttl", "session-grace"}

// prevReleaseSettings reports settings that v0.1.0 would not put in force
// alike: a replicated setting it does not know, or a value its checks
// refuse (it then keeps its own, and its state departs from the others').
func prevReleaseSettings(st settings) error {
	for _, kv := range strings.Fields(st.String()) {
		name, _, _ := strings.Cut(kv, "=")
		if !slices.Contains(prevSettingNames, name) {
			return fmt.Errorf("setting %s is not known to v0.1.0", name)
		}
	}
	switch {
	case st.DedupWindow <= 0 || st.DedupWindow > 1<<30:
		return fmt.Errorf("dedup-window %d is out of v0.1.0's range", st.DedupWindow)
	case st.DefaultTTL <= 0 || st.MaxTTL <= 0 || st.MaxTimeout <= 0:
		return errors.New("default-ttl, max-ttl and max-timeout must be positive for v0.1.0")
	case st.DefaultTTL > st.MaxTTL:
		return fmt.Errorf("default-ttl %v is above max-ttl %v", st.DefaultTTL, st.MaxTTL)
	case st.SessionGrace == 0 || st.SessionGrace > 0 && st.SessionGrace < time.Millisecond:
		return fmt.Errorf("session-grace %v is out of v0.1.0's range", st.SessionGrace)
	case st.MaxSessions <= 0 || st.MaxOfflineBytes <= 0:
		return errors.New("max-sessions and max-offline-bytes must be positive for v0.1.0")
	}
	return nil
}

// memberFormatLive is memberFormat, counting only what member id said on
// a forwarding connection that is still open (else format 1, not known): a
// member restarted on another build (v0.1.0 says nothing) is not taken at
// the word of its previous run.
func (cl *clusterState) memberFormatLive(id string) (int, bool) {
	if id == cl.id {
		return cl.ownFormat(), true
	}
	f, known := cl.memberFormat(id)
	if !known {
		return logFormat1, false
	}
	cl.formats.mu.Lock()
	via := cl.formats.said[id].via
	cl.formats.mu.Unlock()
	if via == nil {
		return logFormat1, false
	}
	select {
	case <-via.done:
		return logFormat1, false
	default:
		return f, true
	}
}
