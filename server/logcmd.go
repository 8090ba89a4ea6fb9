package server

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/mlock-dev/mlock/internal/protocol"
)

// The commands of the replicated log (cluster mode), and their formats.
//
// A command is an op byte and its fields: strings and byte strings as a
// uvarint length and the bytes, integers as uvarints (times as varints), a
// flag as one byte 0 or 1. Decoding is strict: an unknown op, a short
// field, a number not in its shortest form or trailing bytes is an error,
// so that a command has one encoding.
//
// Formats (docs/cluster.md, "Log and snapshot formats"):
//
//   - Format 1, the previous build's: no header, the op first. A client's
//     requests are its own protocol frames (opFrames), parsed again where
//     they are applied.
//   - Format 2: a header, versionMark then the format as a uvarint, then the
//     op. A client's requests are typed (opRequests): parsed once, where the
//     client is connected, with the protocol's typed Parse; applied on every
//     node by the handlers' apply step. opVersion raises the cluster version.
//   - Format 3: as format 2, and a lock with a wait timeout carries its
//     deadline (reqLockBy): the time its wait ends, on the clock of the node
//     that holds the connection. Applied at or after it, the lock is
//     answered as timed out and never queued; before it, it waits until it
//     at most. So a lock that its node answered as timed out while the log
//     had no leader is never granted later (see pipeRun.giveUp). opCancel
//     unlocks what given-up requests made all the same (their entry was
//     stamped before the deadline, or they had none).
//   - Format 4: the commands of format 3, only the header says 4. It says
//     that the build applies a rollback's lowering (an opVersion below the
//     version in force) and its pin (cluster_rollback.go): the builds
//     before the rollback read format 3 and skip neither, but as any
//     format 3 build they would keep writing format 3 after a lowering,
//     and as the leader raise the version again. So the leader lowers the
//     version only once every member said it reads format 4, and writes
//     the lowering in format 4 at least: a build that reads format 3 at
//     most stops applying at it (errFutureFormat) rather than miss it.
//     Wherever format 3 is meant below, format 4 is meant as well.
//
// A build reads every format up to logFormat and refuses a higher one with
// an error naming both (errFutureFormat): the node stops applying (see
// replica.halt), it never skips such a command. It writes the highest
// format every member reads (the cluster version, clusterState.version):
// the old form while a member of an older build is in the cluster.
const (
	logFormat1 = 1
	logFormat2 = 2
	logFormat3 = 3
	logFormat4 = 4
	// logFormat is the highest format this build reads and writes.
	logFormat = logFormat4
	// versionMark starts a command of format 2 or later: no op is 0.
	versionMark byte = 0
)

const (
	// opFrames (format 1): node, conn, seq, session, frames. Applied in
	// order for the session, if it is still attached to (node, conn).
	opFrames byte = 1
	// opAttach: node, conn, seq, session, principal. The connect of a
	// session (new or resumed) on connection conn of node.
	opAttach byte = 2
	// opDetach: node, conn, session. Starts the session's grace if it is
	// still attached to (node, conn).
	opDetach byte = 3
	// opDetachNode: node, conn (a prefix: "" for every connection). Starts
	// the grace of every session attached to node through a connection
	// whose key does not start with conn: the connections of an earlier
	// run of node (conn = its run's prefix), or of a node the leader lost
	// (conn "").
	opDetachNode byte = 4
	// opFailover: until. A new leader's first command (see docs/cluster.md).
	opFailover byte = 5
	// opHoldGrants: until. Nothing is granted before until.
	opHoldGrants byte = 6
	// opGenesis (the first leader's first command): seed (32 bytes), first
	// token (uvarint), settings (string, settings.String; absent in the
	// format 1 logs of builds before the settings were replicated). It
	// gives the replicated lock table its secret seed of lock ids and its
	// first fencing token (the time in µs, as a single node), and puts the
	// leader's settings in force: a new cluster's log determines its state
	// from its first entry on.
	opGenesis byte = 7
	// opParams: params. The leader's settings (settings.String), put in
	// force on every node for the commands that follow: the state machine
	// applies the log with them, whatever the node's own flags (a node
	// whose own differ reports it). A leader proposes it when it takes
	// over and every minute.
	opParams byte = 8
	// opRequests (format 2): node, conn, seq, session, uvarint count >= 1,
	// count typed requests (see request). Applied in order for the
	// session, if it is still attached to (node, conn).
	opRequests byte = 9
	// opVersion (format 2): uvarint version >= 1. The cluster version:
	// every member reads the log formats up to it, which every node may
	// write from the next command on. Below the version in force, it is a
	// rollback's lowering (cluster_rollback.go).
	opVersion byte = 10
	// opCancel (format 3 and later): session, uvarint count >= 1, count lock ids (16
	// bytes each). Unlocks each of the ids that is still a lock (granted or
	// waiting): the locks that requests of the session made although the
	// node that held their connection had given them up (see
	// pipeRun.giveUp). Proposed by that node, which saw them made when it
	// applied them.
	opCancel byte = 11
)

// errBadCommand is the error of a log command that does not decode.
var errBadCommand = errors.New("server: malformed log command")

// errFutureFormat is the error of a log command or snapshot written in a
// format this build does not read.
type errFutureFormat struct {
	what string // "log command", "snapshot"
	got  uint64 // its format
	max  uint64 // the highest this build reads
}

func (e *errFutureFormat) Error() string {
	return fmt.Sprintf("server: %s of format %d: this build reads %s formats up to %d: run a build that reads format %d on this node",
		e.what, e.got, e.what, e.max, e.got)
}

// logCmd is one decoded log command. Which fields count depends on op.
type logCmd struct {
	format    int // 1: no header; else the header's
	op        byte
	node      string        // the proposing node (frames, requests, attach, detach, detachnode)
	conn      string        // its connection's key (frames, requests, attach, detach); a key prefix (detachnode)
	seq       uint64        // the connection's proposal number (frames, requests, attach)
	session   string        // the engine session id (frames, requests, attach, detach)
	principal string        // attach
	until     int64         // failover, holdgrants: Unix ns
	frames    [][]byte      // frames: payloads, in order
	reqs      []request     // requests, in order
	params    string        // params, genesis
	hasParams bool          // genesis: params present (always in format 2)
	seed      [32]byte      // genesis
	first     uint64        // genesis: the first fencing token
	version   uint64        // version
	ids       []protocol.ID // cancel
}

// Kinds of typed requests (opRequests): the kind, the client's request id,
// then the fields of the protocol's typed args:
//
//	reqLock      resources, ttl, timeout, tolerate, owner, modes
//	reqTryLock   resources, ttl, owner, modes
//	reqExtend    lock id, ttl
//	reqUnlock    lock id
//	reqRenew     owner, resources, ttl
//	reqRelease   flags (1: all, 2: in), owner, resources, prefix
//	reqEvict     resources
//	reqPing      (none)
//	reqRefused   verb (its word), code (its text): a request whose parse
//	             failed where the client is connected, answered failed in
//	             its turn (and counted, as a single node counts it)
//	reqLockBy    (format 3 and later) a lock with a wait timeout: the fields of
//	             reqLock, then its deadline (varint, Unix ns, > 0); decoded
//	             as a reqLock with request.deadline set
//
// Numbers are uvarints; ttl 0 is the default lease. The lock id is the
// client's text, checked where the request is applied (an unknown id is
// answered lock not exist!).
const (
	reqLock    byte = 1
	reqTryLock byte = 2
	reqExtend  byte = 3
	reqUnlock  byte = 4
	reqRenew   byte = 5
	reqRelease byte = 6
	reqEvict   byte = 7
	reqPing    byte = 8
	reqRefused byte = 9
	reqLockBy  byte = 10
)

// request is one typed request of a client: what parseRequest makes of a
// frame, applied by applyRequest on every node (and on a single node).
type request struct {
	kind        byte
	req         []byte // the client's request id
	lock        protocol.LockArgs
	extend      protocol.ExtendArgs
	unlock      protocol.IDArgs
	renew       protocol.RenewArgs
	release     protocol.ReleaseArgs
	evict       protocol.EvictArgs
	refusedVerb protocol.Verb // refused: the command
	refusedCode protocol.Code // refused: the answer
	// deadline (a lock, format 3; 0: none): when its wait ends, Unix ns on
	// the clock of the node that holds the connection (its arrival there
	// plus its timeout).
	deadline int64
}

// verb returns the command the request is (a refusal's included).
func (r *request) verb() protocol.Verb {
	switch r.kind {
	case reqLock, reqTryLock:
		return r.lock.Verb()
	case reqExtend:
		return protocol.VerbExtend
	case reqUnlock:
		return protocol.VerbUnlock
	case reqRenew:
		return protocol.VerbRenew
	case reqRelease:
		return r.release.Verb()
	case reqEvict:
		return protocol.VerbEvict
	case reqPing:
		return protocol.VerbPing
	}
	return r.refusedVerb
}

// resources returns the resources the request names, as sent ("" for
// none), for the debug log.
func (r *request) resources() string {
	switch r.kind {
	case reqLock, reqTryLock:
		return r.lock.Resources
	case reqRenew:
		return r.renew.Resources
	case reqRelease:
		return r.release.Resources
	case reqEvict:
		return r.evict.Resources
	}
	return ""
}

// appendLogCmd encodes m onto dst in format m.format (0 is format 1).
func appendLogCmd(dst []byte, m *logCmd) []byte {
	if m.format > logFormat1 {
		dst = append(dst, versionMark)
		dst = binary.AppendUvarint(dst, uint64(m.format))
	}
	dst = append(dst, m.op)
	switch m.op {
	case opFrames:
		dst = appendConnFields(dst, m)
		dst = binary.AppendUvarint(dst, uint64(len(m.frames)))
		for _, f := range m.frames {
			dst = binary.AppendUvarint(dst, uint64(len(f)))
			dst = append(dst, f...)
		}
	case opRequests:
		dst = appendConnFields(dst, m)
		dst = binary.AppendUvarint(dst, uint64(len(m.reqs)))
		for i := range m.reqs {
			dst = appendRequest(dst, &m.reqs[i])
		}
	case opAttach:
		dst = appendConnFields(dst, m)
		dst = appendStr(dst, m.principal)
	case opDetach:
		dst = appendStr(dst, m.node)
		dst = appendStr(dst, m.conn)
		dst = appendStr(dst, m.session)
	case opDetachNode:
		dst = appendStr(dst, m.node)
		dst = appendStr(dst, m.conn)
	case opFailover, opHoldGrants:
		dst = binary.AppendVarint(dst, m.until)
	case opGenesis:
		dst = append(dst, m.seed[:]...)
		dst = binary.AppendUvarint(dst, m.first)
		if m.hasParams || m.format > logFormat1 {
			dst = appendStr(dst, m.params)
		}
	case opParams:
		dst = appendStr(dst, m.params)
	case opVersion:
		dst = binary.AppendUvarint(dst, m.version)
	case opCancel:
		dst = appendStr(dst, m.session)
		dst = binary.AppendUvarint(dst, uint64(len(m.ids)))
		for _, id := range m.ids {
			dst = append(dst, id[:]...)
		}
	}
	return dst
}

// appendConnFields appends node, conn, seq and session.
func appendConnFields(dst []byte, m *logCmd) []byte {
	dst = appendStr(dst, m.node)
	dst = appendStr(dst, m.conn)
	dst = binary.AppendUvarint(dst, m.seq)
	return appendStr(dst, m.session)
}

// appendRequest encodes one typed request.
func appendRequest(dst []byte, r *request) []byte {
	kind := r.kind
	if kind == reqLock && r.deadline != 0 {
		kind = reqLockBy
	}
	dst = append(dst, kind)
	dst = binary.AppendUvarint(dst, uint64(len(r.req)))
	dst = append(dst, r.req...)
	switch r.kind {
	case reqLock, reqTryLock:
		a := &r.lock
		dst = appendStr(dst, a.Resources)
		dst = binary.AppendUvarint(dst, uint64(a.TTL))
		if r.kind == reqLock {
			dst = binary.AppendUvarint(dst, uint64(a.Timeout))
			dst = binary.AppendUvarint(dst, uint64(a.Tolerate))
		}
		dst = appendStr(dst, a.Owner)
		dst = appendStr(dst, a.Modes)
		if kind == reqLockBy {
			dst = binary.AppendVarint(dst, r.deadline)
		}
	case reqExtend:
		dst = appendStr(dst, r.extend.ID)
		dst = binary.AppendUvarint(dst, uint64(r.extend.TTL))
	case reqUnlock:
		dst = appendStr(dst, r.unlock.ID)
	case reqRenew:
		dst = appendStr(dst, r.renew.Owner)
		dst = appendStr(dst, r.renew.Resources)
		dst = binary.AppendUvarint(dst, uint64(r.renew.TTL))
	case reqRelease:
		a := &r.release
		var flags byte
		if a.All {
			flags |= 1
		}
		if a.In {
			flags |= 2
		}
		dst = append(dst, flags)
		dst = appendStr(dst, a.Owner)
		dst = appendStr(dst, a.Resources)
		dst = appendStr(dst, a.Prefix)
	case reqEvict:
		dst = appendStr(dst, r.evict.Resources)
	case reqRefused:
		dst = appendStr(dst, r.refusedVerb.String())
		dst = appendStr(dst, r.refusedCode.Text())
	}
	return dst
}

func appendStr(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// decoder reads the fields of a log command.
type decoder struct {
	p   []byte
	bad bool
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.p)
	if n <= 0 || n > 1 && d.p[n-1] == 0 { // only the shortest form: one encoding per command
		d.bad = true
		return 0
	}
	d.p = d.p[n:]
	return v
}

// num reads a uvarint that fits an int64 (a ttl, a timeout).
func (d *decoder) num() int64 {
	v := d.uvarint()
	if v > 1<<63-1 {
		d.bad = true
		return 0
	}
	return int64(v)
}

func (d *decoder) varint() int64 {
	v, n := binary.Varint(d.p)
	if n <= 0 || n > 1 && d.p[n-1] == 0 {
		d.bad = true
		return 0
	}
	d.p = d.p[n:]
	return v
}

// byte1 reads one byte.
func (d *decoder) byte1() byte {
	if d.bad || len(d.p) == 0 {
		d.bad = true
		return 0
	}
	b := d.p[0]
	d.p = d.p[1:]
	return b
}

// bytes returns a length-prefixed byte string, aliasing the input.
func (d *decoder) bytes() []byte {
	l := d.uvarint()
	if d.bad || l > uint64(len(d.p)) {
		d.bad = true
		return nil
	}
	b := d.p[:l:l]
	d.p = d.p[l:]
	return b
}

func (d *decoder) str() string { return string(d.bytes()) }

// logFormatOf returns the format of an encoded command and its bytes from
// the op on. A format this build does not read is an *errFutureFormat.
func logFormatOf(p []byte) (int, []byte, error) {
	if len(p) == 0 {
		return 0, nil, errBadCommand
	}
	if p[0] != versionMark {
		return logFormat1, p, nil
	}
	d := decoder{p: p[1:]}
	v := d.uvarint()
	switch {
	case d.bad || v <= logFormat1:
		return 0, nil, errBadCommand
	case v > logFormat:
		return 0, nil, &errFutureFormat{what: "log command", got: v, max: logFormat}
	}
	return int(v), d.p, nil
}

// opIn reports whether op is a command of format f (format 4's are format
// 3's).
func opIn(op byte, f int) bool {
	if f == logFormat1 {
		return op >= opFrames && op <= opParams
	}
	if f == logFormat2 {
		return op >= opAttach && op <= opVersion
	}
	return op >= opAttach && op <= opCancel
}

// decodeLogCmd decodes p into m; frames alias p. A command of a format this
// build does not read is an *errFutureFormat; anything else that does not
// decode is errBadCommand.
func decodeLogCmd(p []byte, m *logCmd) error {
	*m = logCmd{}
	format, p, err := logFormatOf(p)
	if err != nil {
		return err
	}
	if len(p) == 0 || !opIn(p[0], format) {
		return errBadCommand
	}
	m.format, m.op = format, p[0]
	d := decoder{p: p[1:]}
	switch m.op {
	case opFrames:
		m.node, m.conn, m.seq, m.session = d.str(), d.str(), d.uvarint(), d.str()
		n := d.uvarint()
		if d.bad || n == 0 || n > uint64(len(d.p)) {
			return errBadCommand
		}
		m.frames = make([][]byte, 0, n)
		for range n {
			m.frames = append(m.frames, d.bytes())
		}
	case opRequests:
		m.node, m.conn, m.seq, m.session = d.str(), d.str(), d.uvarint(), d.str()
		n := d.uvarint()
		if d.bad || n == 0 || n > uint64(len(d.p)) {
			return errBadCommand
		}
		m.reqs = make([]request, n)
		for i := range m.reqs {
			decodeRequest(&d, &m.reqs[i], format)
		}
	case opAttach:
		m.node, m.conn, m.seq, m.session, m.principal = d.str(), d.str(), d.uvarint(), d.str(), d.str()
	case opDetach:
		m.node, m.conn, m.session = d.str(), d.str(), d.str()
	case opDetachNode:
		m.node, m.conn = d.str(), d.str()
	case opFailover, opHoldGrants:
		m.until = d.varint()
	case opGenesis:
		if len(d.p) < len(m.seed) {
			return errBadCommand
		}
		copy(m.seed[:], d.p)
		d.p = d.p[len(m.seed):]
		m.first = d.uvarint()
		if m.hasParams = len(d.p) > 0 || format > logFormat1; m.hasParams {
			m.params = d.str()
		}
	case opParams:
		m.params = d.str()
	case opVersion:
		m.version = d.uvarint()
		if m.version < logFormat1 {
			return errBadCommand
		}
	case opCancel:
		m.session = d.str()
		n := d.uvarint()
		if d.bad || n == 0 || n > uint64(len(d.p)/len(protocol.ID{})) {
			return errBadCommand
		}
		m.ids = make([]protocol.ID, n)
		for i := range m.ids {
			d.p = d.p[copy(m.ids[i][:], d.p):]
		}
	}
	if d.bad || len(d.p) != 0 {
		return errBadCommand
	}
	return nil
}

// decodeRequest decodes one typed request of a command of format f; a
// failure sets d.bad.
func decodeRequest(d *decoder, r *request, f int) {
	*r = request{kind: d.byte1()}
	r.req = d.bytes()
	by := r.kind == reqLockBy
	if by {
		r.kind = reqLock
		if f < logFormat3 {
			d.bad = true
		}
	}
	switch r.kind {
	case reqLock, reqTryLock:
		a := &r.lock
		a.Try = r.kind == reqTryLock
		a.Resources, a.TTL = d.str(), d.num()
		if !a.Try {
			a.Timeout, a.Tolerate = d.num(), d.num()
		}
		a.Owner, a.Modes = d.str(), d.str()
		if by {
			// One encoding: a lock without a deadline is a reqLock.
			if r.deadline = d.varint(); r.deadline == 0 {
				d.bad = true
			}
		}
	case reqExtend:
		r.extend.ID, r.extend.TTL = d.str(), d.num()
	case reqUnlock:
		r.unlock.ID = d.str()
	case reqRenew:
		r.renew.Owner, r.renew.Resources, r.renew.TTL = d.str(), d.str(), d.num()
	case reqRelease:
		flags := d.byte1()
		if flags > 3 {
			d.bad = true
		}
		a := &r.release
		a.All, a.In = flags&1 != 0, flags&2 != 0
		a.Owner, a.Resources, a.Prefix = d.str(), d.str(), d.str()
	case reqEvict:
		r.evict.Resources = d.str()
	case reqPing:
	case reqRefused:
		word, text := d.bytes(), d.bytes()
		var ok bool
		r.refusedVerb, ok = protocol.ParseVerb(word)
		r.refusedCode = protocol.CodeOf(text)
		if !ok || r.refusedVerb.String() != string(word) || r.refusedCode == protocol.CodeUnknown || r.refusedCode.Text() != string(text) {
			d.bad = true
		}
	default:
		d.bad = true
	}
}

// A command's result in the log is one flags byte. The frames of its
// answer are built after it (in clusterState.ans) and written to the
// proposing connection by the node that holds it, when it applies the
// command; they are not part of the result (nor of the de-duplication
// window), which only tells the proposer how the command ended.
const (
	ansEnd      byte = 1 << iota // the connection ends after the frames
	ansAttached                  // an attach succeeded
)
