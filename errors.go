package mlock

import (
	"errors"
	"strings"

	"github.com/mlock-dev/mlock/internal/protocol"
)

// ErrorType classifies an Error. The first four are the types of the
// original mlock client.
type ErrorType string

const (
	// TypeConnection: the server could not be reached, the connection broke
	// while the call was in flight, or the server closed the connection.
	TypeConnection ErrorType = "connection"
	// TypeRequest: the server (or the client, before sending) refused the
	// request's arguments.
	TypeRequest ErrorType = "request"
	// TypeTolerate: a queue was longer than the request's tolerate, or a
	// try-lock found the resources taken.
	TypeTolerate ErrorType = "tolerate"
	// TypeTimeout: the wait for a lock passed its timeout or its context's
	// deadline.
	TypeTimeout ErrorType = "timeout"
	// TypeLost: a held lock is gone: it expired, was released by its owner
	// elsewhere, or its session was lost (server restart, grace period over).
	TypeLost ErrorType = "lost"
	// TypeCanceled: the caller gave the call up by cancelling its context
	// (errors.Is(err, context.Canceled) holds too). A context's deadline is
	// TypeTimeout.
	TypeCanceled ErrorType = "canceled"
)

// Error is the error of every client call. Msg is the server's reason
// (for example "can not tolerate!", or "authentication failed!" for a
// refused connection) or the client's; Resource is the
// resource the server named as busy or conflicting, if it named one; Node,
// for an error of Type connection, is the address (host:port) of the
// server it concerns, if it concerns one (a refused or failed connection,
// a connection lost with the call in flight); Err,
// if set, is the cause (a network error, ctx.Err(), or one of the cause
// sentinels below: ErrBusy, ErrOwnerConflict, ErrNotHeld, ErrClosed, ...).
// A call that found no node of a cluster reachable has Node empty and an
// Err that names each node with its last error (errors.Is and errors.As
// see each of them).
//
// errors.Is(err, ErrTimeout) (and the other sentinels of the same type)
// reports whether err is an *Error of that type; errors.Is(err, ErrBusy)
// (and the other causes) whether that is its cause.
type Error struct {
	Type     ErrorType
	Msg      string
	Resource string
	Node     string
	Err      error

	code  protocol.Code // the server's reason, if it gave one
	fatal bool          // a failed connection attempt that retrying at once will not cure (see permanent)
}

// Error returns one line: "mlock: <type> error at <node>: <msg>
// (<resource>): <cause>", leaving out what is not set, the node when Msg
// names it already, and the cause when it is one of this package's
// sentinels and Msg already says it.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("mlock: ")
	b.WriteString(string(e.Type))
	b.WriteString(" error")
	if e.Node != "" && !strings.Contains(e.Msg, e.Node) {
		b.WriteString(" at ")
		b.WriteString(e.Node)
	}
	if e.Msg != "" {
		b.WriteString(": ")
		b.WriteString(e.Msg)
	}
	if e.Resource != "" {
		b.WriteString(" (")
		b.WriteString(e.Resource)
		b.WriteString(")")
	}
	if e.Err != nil {
		if sentinel(e.Err) {
			if e.Msg == "" {
				b.WriteString(": ")
				b.WriteString(strings.TrimPrefix(e.Err.Error(), "mlock: "))
			}
		} else {
			b.WriteString(": ")
			// A cause that is an error of this package says "mlock:" once,
			// at the front.
			b.WriteString(strings.TrimPrefix(e.Err.Error(), "mlock: "))
		}
	}
	return b.String()
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Is makes the type sentinels match every Error of their type.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Msg == "" && t.Err == nil && t.Resource == "" && t.Node == "" && t.Type == e.Type
}

// Sentinels for errors.Is, one per ErrorType.
var (
	ErrConnection = &Error{Type: TypeConnection}
	ErrRequest    = &Error{Type: TypeRequest}
	ErrTolerate   = &Error{Type: TypeTolerate}
	ErrTimeout    = &Error{Type: TypeTimeout}
	ErrLost       = &Error{Type: TypeLost}
	ErrCanceled   = &Error{Type: TypeCanceled}
)

// Causes carried in Error.Err.
var (
	// ErrBusy: a try-lock found a resource taken (Type tolerate; Resource
	// names it).
	ErrBusy = errors.New("mlock: resource is locked")
	// ErrOwnerConflict: the owner already holds a lock that overlaps the
	// request without being the same set of resources; queueing would wait
	// behind itself (Type request; Resource names the resource).
	ErrOwnerConflict = errors.New("mlock: owner holds an overlapping lock")
	// ErrPermitsConflict: the request takes a resource as a semaphore of n
	// permits (or shared) while requests with another n are queued on it
	// (Type request; Resource names the resource). See Permits.
	ErrPermitsConflict = errors.New("mlock: permits do not match")
	// ErrModeChange: the owner holds exactly these resources, in other
	// modes; a re-entry can not upgrade a shared lock to exclusive (or the
	// reverse). Unlock it and ask again (Type request; Resource names the
	// resource).
	ErrModeChange = errors.New("mlock: lock mode can not change")
	// ErrNotHeld: Client.Renew found no lock of the owner on exactly those
	// resources (Type request).
	ErrNotHeld = errors.New("mlock: owner does not hold the lock")
	// ErrClosed: the client was closed (Type connection).
	ErrClosed = errors.New("mlock: client closed")
	// ErrSessionLost: the server no longer knows the session (it restarted,
	// or the connection was down longer than its grace period), it is
	// shutting down, or nothing was answered on the session for its grace
	// period so that it may have dropped it (Type lost, for held locks;
	// waiting requests are asked again on the new session).
	ErrSessionLost = errors.New("mlock: session lost")
	// ErrExpired: the server reported that a held lock is gone (it expired,
	// or was released by its owner), or its lease ran out without word from
	// the server (Type lost).
	ErrExpired = errors.New("mlock: lock expired")
	// ErrReleased: the server reported that a held lock was released by its
	// owner through Release or ReleaseAll, wholly or in part, unlocked by id
	// from another session, or evicted by an administrator (Type lost).
	ErrReleased = errors.New("mlock: lock released by its owner")
	// ErrAuth: the server refused the connection's credentials (Type
	// connection; Msg is the server's text): "authentication required!"
	// (it wants credentials: Options.Name and Options.Token, or a client
	// certificate), "authentication failed!" (unknown name or wrong token),
	// "authentication is not configured!" (credentials sent to a server
	// without authentication), or protected mode (a server without
	// authentication accepts only loopback clients).
	ErrAuth = errors.New("mlock: authentication refused")
	// ErrTLS: the TLS settings of the client and the server do not match, or
	// the TLS handshake failed (Type connection): the server requires TLS
	// (use mlocks://), does not speak it, presented a certificate the client
	// does not trust, or refused the client's certificate. For a handshake
	// failure the error of crypto/tls (or crypto/x509) is in the chain too.
	ErrTLS = errors.New("mlock: TLS mismatch or handshake failure")
	// ErrRefused: the server refused the connection for a limit (Type
	// connection; Msg is the server's text): too many connections (from
	// this address), too many sessions, or the principal's quota of
	// sessions or connections is reached.
	ErrRefused = errors.New("mlock: connection refused by the server")
	// ErrForbidden: the client's principal may not lock that resource (Type
	// request; Resource names it, when the server does) or run that command
	// (locks of others, Evict: administrators only).
	ErrForbidden = errors.New("mlock: permission denied")
	// ErrRateLimited: the server answers detailed Status and Locks only so
	// often, server-wide; try again later (Type request).
	ErrRateLimited = errors.New("mlock: too many requests")
	// ErrServerFull: a server-wide limit on locks, queue entries or bytes
	// of names is reached (Type request).
	ErrServerFull = errors.New("mlock: server is full")
	// ErrQuota: the client's principal holds as many lock requests as its
	// quota allows (max-locks in the server's auth file; Type request).
	ErrQuota = errors.New("mlock: the principal's lock quota is reached")
	// ErrNotCluster: ClusterJoin or ClusterRemove asked of a server that
	// is not a cluster node (Type request).
	ErrNotCluster = errors.New("mlock: not a cluster node")
)

// causeError carries a cause sentinel and the error behind it (a
// crypto/tls error, say): errors.Is and errors.As see both; it reads as the
// error.
type causeError struct {
	sentinel, err error
}

func (e *causeError) Error() string   { return e.err.Error() }
func (e *causeError) Unwrap() []error { return []error{e.sentinel, e.err} }

// nodeError is the last error of a connection attempt to one node.
type nodeError struct {
	addr string
	err  error
}

func (e *nodeError) Error() string {
	var me *Error
	if errors.As(e.err, &me) && e.err == error(me) {
		// Without the "mlock: connection error at <node>" of its own.
		msg := me.Msg
		if me.Err != nil && (!sentinel(me.Err) || msg == "") {
			msg = strings.TrimPrefix(strings.TrimPrefix(msg+": "+me.Err.Error(), ": "), "mlock: ")
		}
		return e.addr + ": " + msg
	}
	return e.addr + ": " + e.err.Error()
}

func (e *nodeError) Unwrap() error { return e.err }

// nodeErrors are the last errors of the nodes of a cluster, none
// reachable: one line, "<node>: <error>; <node>: <error>...".
type nodeErrors []error

func (e nodeErrors) Error() string {
	var b strings.Builder
	for i, err := range e {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(err.Error())
	}
	return b.String()
}

func (e nodeErrors) Unwrap() []error { return e }

// errNotTried stands for a node whose first attempt is under way or to come.
var errNotTried = errors.New("no attempt finished yet")

func sentinel(err error) bool {
	switch err {
	case ErrBusy, ErrOwnerConflict, ErrPermitsConflict, ErrModeChange, ErrNotHeld, ErrClosed, ErrSessionLost, ErrExpired, ErrReleased,
		ErrAuth, ErrTLS, ErrRefused, ErrForbidden, ErrRateLimited, ErrServerFull, ErrQuota, ErrNotCluster, ErrScopeUnsupported:
		return true
	}
	return false
}

// failure maps a failed result of a command to an Error, by its code.
func failure(m *protocol.Message, v protocol.Verb) *Error {
	e := &Error{Type: TypeRequest, Msg: m.Code.Text(), code: m.Code}
	switch {
	case m.Code == protocol.CodeUnknown:
		e.Msg = m.Detail
	case m.Code == protocol.CodeClusterChange:
		if m.Detail != "" {
			e.Msg += " " + m.Detail
		}
	case m.Code.HasDetail():
		e.Resource = m.Detail
	}
	if m.Code.Class() == protocol.ClassTolerate {
		e.Type = TypeTolerate
	}
	switch m.Code {
	case protocol.CodeBusy:
		e.Err = ErrBusy
	case protocol.CodeOwnerConflict:
		e.Err = ErrOwnerConflict
	case protocol.CodePermitsConflict:
		e.Err = ErrPermitsConflict
	case protocol.CodeModeChange:
		e.Err = ErrModeChange
	case protocol.CodeForbidden:
		e.Err = ErrForbidden
	case protocol.CodeRateLimited:
		e.Err = ErrRateLimited
	case protocol.CodeServerFull:
		e.Err = ErrServerFull
	case protocol.CodeQuotaLocks:
		e.Err = ErrQuota
	case protocol.CodeNotCluster:
		e.Err = ErrNotCluster
	case protocol.CodeLockNotExist:
		if v == protocol.VerbRenew {
			e.Err = ErrNotHeld
		}
	case protocol.CodeInvalidTTL:
		// The 1.0 text says nothing of the range.
		e.Msg += " (want a whole number of milliseconds from 1 to the server's longest lease, --max-ttl, 24h by default)"
	case protocol.CodeInvalidTimeout:
		e.Msg += " (want a whole number of milliseconds from 0 to the server's --max-timeout, 24h by default)"
	}
	return e
}

// refusal maps the server's answer "error <text>" to a connect to an Error
// of Type connection naming the node addr. Every such answer but "server
// shutting down!", "auth timeout!" and "too many unauthenticated
// connections!" (an eviction from a full pool) is a refusal that will not change by
// retrying at once: the session retries at its longest backoff and fails
// the calls waiting for the connection with it (see
// session.refusedLocked).
func refusal(m *protocol.Message, addr string) *Error {
	// An auth timeout says the server did not get the connect in time (a
	// connection held up on its way), an eviction that the server's pool
	// of connections before their connect was full: the next attempt may
	// well get in. A cluster node that cannot read the cluster's log sends
	// its client to another node.
	e := &Error{Type: TypeConnection, Msg: m.Text, Node: addr, code: m.Code,
		fatal: m.Code != protocol.CodeAuthTimeout && m.Code != protocol.CodeEvicted && m.Code != protocol.CodeStaleNode}
	switch m.Code {
	case protocol.CodeAuthRequired, protocol.CodeAuthFailed, protocol.CodeAuthNotConfigured, protocol.CodeProtectedMode:
		e.Err = ErrAuth
	case protocol.CodeTLSRequired:
		e.Msg = "the server requires TLS (use mlocks:// or Options.TLS): " + m.Text
		e.Err = ErrTLS
	case protocol.CodeTooManyConnections, protocol.CodeTooManyFromAddr, protocol.CodeTooManySessions,
		protocol.CodeQuotaSessions, protocol.CodeQuotaConns, protocol.CodeEvicted:
		e.Err = ErrRefused
	}
	return e
}

// permanent returns the Error of a failed connection attempt that
// retrying at once will not cure: a refusal by the server (see refusal) or
// a TLS mismatch.
func permanent(err error) (*Error, bool) {
	var e *Error
	if errors.As(err, &e) && e.fatal {
		return e, true
	}
	return nil, false
}
