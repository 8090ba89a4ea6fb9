package server

import (
	"encoding/binary"
	"errors"
)

// The commands of the replicated log (cluster mode). Each is one byte of
// op and its fields: strings and byte strings as a uvarint length and the
// bytes, integers as uvarints (times as varints). Decoding is strict: an
// unknown op, a short field or trailing bytes is an error.
//
// A frames command carries the client's own protocol frames (lock,
// trylock, extend, unlock, renew, release, releaseall, evict), already
// past the checks that need the proposing node's configuration (rights,
// administration). The frame is the most compact encoding of the command
// there is, and applying it runs the very handler a single node runs, so
// the two modes cannot drift apart.
const (
	// opFrames: node, conn, seq, session, frames. Applied in order for the
	// session, if it is still attached to (node, conn).
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
	// opParams: params. The leader's settings (settings.String), put in
	// force on every node for the commands that follow: the state machine
	// applies the log with them, whatever the node's own flags (a node
	// whose own differ reports it). A leader proposes it when it takes
	// over and every minute. (7 is the genesis, opGenesis.)
	opParams byte = 8
)

// errBadCommand is the error of a log command that does not decode.
var errBadCommand = errors.New("server: malformed log command")

// logCmd is one decoded log command. Which fields count depends on op.
type logCmd struct {
	op        byte
	node      string   // the proposing node (frames, attach, detach, detachnode)
	conn      string   // its connection's key (frames, attach, detach); a key prefix (detachnode)
	seq       uint64   // the connection's proposal number (frames, attach)
	session   string   // the engine session id (frames, attach, detach)
	principal string   // attach
	until     int64    // failover, holdgrants: Unix ns
	frames    [][]byte // frames: payloads, in order
	params    string   // params
}

// appendLogCmd encodes m onto dst.
func appendLogCmd(dst []byte, m *logCmd) []byte {
	dst = append(dst, m.op)
	switch m.op {
	case opFrames:
		dst = appendStr(dst, m.node)
		dst = appendStr(dst, m.conn)
		dst = binary.AppendUvarint(dst, m.seq)
		dst = appendStr(dst, m.session)
		dst = binary.AppendUvarint(dst, uint64(len(m.frames)))
		for _, f := range m.frames {
			dst = binary.AppendUvarint(dst, uint64(len(f)))
			dst = append(dst, f...)
		}
	case opAttach:
		dst = appendStr(dst, m.node)
		dst = appendStr(dst, m.conn)
		dst = binary.AppendUvarint(dst, m.seq)
		dst = appendStr(dst, m.session)
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
	case opParams:
		dst = appendStr(dst, m.params)
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

func (d *decoder) varint() int64 {
	v, n := binary.Varint(d.p)
	if n <= 0 || n > 1 && d.p[n-1] == 0 {
		d.bad = true
		return 0
	}
	d.p = d.p[n:]
	return v
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

// decodeLogCmd decodes p into m; frames alias p.
func decodeLogCmd(p []byte, m *logCmd) error {
	*m = logCmd{}
	if len(p) == 0 {
		return errBadCommand
	}
	m.op = p[0]
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
	case opAttach:
		m.node, m.conn, m.seq, m.session, m.principal = d.str(), d.str(), d.uvarint(), d.str(), d.str()
	case opDetach:
		m.node, m.conn, m.session = d.str(), d.str(), d.str()
	case opDetachNode:
		m.node, m.conn = d.str(), d.str()
	case opFailover, opHoldGrants:
		m.until = d.varint()
	case opParams:
		m.params = d.str()
	default:
		return errBadCommand
	}
	if d.bad || len(d.p) != 0 {
		return errBadCommand
	}
	return nil
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
