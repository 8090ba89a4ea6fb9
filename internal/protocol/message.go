package protocol

import (
	"bytes"
	"errors"
)

// MsgKind is the kind of a message from the server.
type MsgKind uint8

const (
	MsgConnected MsgKind = iota + 1 // connected <apiVersion> [new|resumed [<graceMs> [leader=<addr>]]]
	MsgError                        // error <text>: the server closes the connection
	MsgResult                       // result <req> success <payload> | result <req> failed <reason>
	MsgLocked                       // locked <lockId> <expiresAtMs> [<token>]
	MsgTimeout                      // timeout <lockId>
	MsgExpired                      // expired <lockId> [released]
)

// Message is one parsed message from the server. Byte slices alias the
// parsed payload (valid as long as it is); strings are copies, set only on
// failures and errors.
type Message struct {
	Kind MsgKind
	// Req is a result's request id.
	Req []byte
	// OK reports a success; Payload is then its payload ("" allowed).
	OK      bool
	Payload []byte
	// Code is the reason of a failed result or the text of an error; Detail
	// is what follows a known reason after one space (the busy resource),
	// or the whole reason when it is unknown (Code == CodeUnknown).
	Code   Code
	Detail string
	// ID is the lock id of a locked, timeout or expired push.
	ID []byte
	// ExpiresAtMs and Token are a grant's expiry (Unix ms) and fencing
	// token (0 if the server sent none).
	ExpiresAtMs int64
	Token       uint64
	// Resumed: "connected ... resumed": the session and its locks were kept.
	Resumed bool
	// GraceMs is the session grace period the server announced in
	// "connected 1.0 new|resumed <graceMs>", or -1 if it announced none.
	GraceMs int64
	// Leader is the client address of the cluster's leader that a follower
	// named in "connected 1.0 new|resumed <graceMs> leader=<addr>"; "" if none.
	Leader string
	// Released: "expired <id> released": released by its owner, not expired.
	Released bool
	// Shutdown: "expired <id> shutdown": the server is shutting down.
	Shutdown bool
	// Evicted: "expired <id> evicted": an administrator revoked the lock.
	Evicted bool
	// Text is an error message's text.
	Text string
}

// ErrBadMessage is returned by ParseMessage for a message it does not
// understand. A client skips such a message.
var ErrBadMessage = errors.New("protocol: malformed message")

// cut splits b at the first space.
func cut(b []byte) (before, after []byte, found bool) {
	if i := bytes.IndexByte(b, ' '); i >= 0 {
		return b[:i], b[i+1:], true
	}
	return b, nil, false
}

// ParseMessage parses one frame payload from the server. It allocates only
// for the strings of failures and errors. Unknown messages, and known ones
// with missing or malformed fields, fail with ErrBadMessage.
func ParseMessage(p []byte) (Message, error) {
	var m Message
	word, rest, _ := cut(p)
	switch string(word) {
	case "result":
		req, rest, ok := cut(rest)
		if !ok {
			return m, ErrBadMessage
		}
		status, payload, _ := cut(rest)
		m.Kind, m.Req = MsgResult, req
		switch string(status) {
		case "success":
			m.OK, m.Payload = true, payload
		case "failed":
			m.Code, m.Detail = reason(payload)
		default:
			return Message{}, ErrBadMessage
		}
	case "locked":
		id, rest, ok := cut(rest)
		if !ok || len(id) == 0 {
			return m, ErrBadMessage
		}
		exp, tok, hasTok := cut(rest)
		n, ok := Int(exp)
		if !ok {
			return m, ErrBadMessage
		}
		m.Kind, m.ID, m.ExpiresAtMs = MsgLocked, id, n
		if hasTok {
			if m.Token, ok = Uint(tok); !ok {
				return Message{}, ErrBadMessage
			}
		}
	case "timeout", "expired":
		id, extra, more := cut(rest)
		if len(id) == 0 {
			return m, ErrBadMessage
		}
		m.Kind, m.ID = MsgExpired, id
		if string(word) == "timeout" {
			m.Kind = MsgTimeout
		} else if more {
			m.Released = string(extra) == "released"
			m.Shutdown = string(extra) == "shutdown"
			m.Evicted = string(extra) == "evicted"
		}
	case "connected":
		_, rest, _ := cut(rest)
		mode, rest, hasGrace := cut(rest)
		m.Kind, m.Resumed, m.GraceMs = MsgConnected, string(mode) == "resumed", -1
		if hasGrace {
			grace, extra, _ := cut(rest)
			if n, ok := Int(grace); ok && n >= 0 {
				m.GraceMs = n
			}
			if l, ok := bytes.CutPrefix(extra, []byte("leader=")); ok {
				l, _, _ = cut(l)
				m.Leader = string(l)
			}
		}
	case "error":
		m.Kind, m.Code, m.Text = MsgError, CodeOf(rest), string(rest)
	default:
		return m, ErrBadMessage
	}
	return m, nil
}

// reason splits a failure reason into its code and detail.
func reason(b []byte) (Code, string) {
	if c := CodeOf(b); c != CodeUnknown {
		return c, ""
	}
	// "<text> <detail>": every text ends with "! ".
	if i := bytes.Index(b, []byte("! ")); i >= 0 {
		if c := CodeOf(b[:i+1]); c.HasDetail() {
			return c, string(b[i+2:])
		}
	}
	return CodeUnknown, string(b)
}
