package mlock

import (
	"errors"
	"fmt"
)

// ErrorType classifies an Error. The first four are the types of the
// original mlock client.
type ErrorType string

const (
	// TypeConnection: the server could not be reached, the connection broke
	// while the call was in flight, or the server closed the connection.
	TypeConnection ErrorType = "connection"
	// TypeRequest: the server (or the client, before sending) refused the
	// request's arguments; also a wait cancelled through its context.
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
)

// Error is the error of every client call. Msg is the server's reason
// (for example "can not tolerate!") or the client's; Err, if set, is the
// cause (a network error, ctx.Err(), ErrBusy, ErrClosed).
//
// errors.Is(err, ErrTimeout) (and the other sentinels of the same type)
// reports whether err is an *Error of that type.
type Error struct {
	Type ErrorType
	Msg  string
	Err  error
}

func (e *Error) Error() string {
	switch {
	case e.Msg != "" && e.Err != nil:
		return fmt.Sprintf("mlock: %s error: %s: %v", e.Type, e.Msg, e.Err)
	case e.Err != nil:
		return fmt.Sprintf("mlock: %s error: %v", e.Type, e.Err)
	}
	return fmt.Sprintf("mlock: %s error: %s", e.Type, e.Msg)
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Is makes the type sentinels match every Error of their type.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Msg == "" && t.Err == nil && t.Type == e.Type
}

// Sentinels for errors.Is, one per ErrorType.
var (
	ErrConnection = &Error{Type: TypeConnection}
	ErrRequest    = &Error{Type: TypeRequest}
	ErrTolerate   = &Error{Type: TypeTolerate}
	ErrTimeout    = &Error{Type: TypeTimeout}
	ErrLost       = &Error{Type: TypeLost}
)

// Causes carried in Error.Err.
var (
	// ErrBusy: a try-lock found a resource taken (Type tolerate).
	ErrBusy = errors.New("mlock: resource is locked")
	// ErrClosed: the client was closed (Type connection).
	ErrClosed = errors.New("mlock: client closed")
	// ErrSessionLost: the server no longer knows the session: it restarted,
	// or the connection was down longer than its grace period (Type lost
	// for held locks, connection for waiting ones).
	ErrSessionLost = errors.New("mlock: session lost")
	// ErrExpired: the server reported that a held lock expired (Type lost).
	ErrExpired = errors.New("mlock: lock expired")
)

// Server failure texts the client maps to types. The server's complete list
// is in docs/protocol.md.
const (
	txtTolerate = "can not tolerate!"
	txtBusy     = "resource is locked!"
	txtNotExist = "lock not exist!"
)

// serverError maps a "result ... failed <text>" to an Error.
func serverError(text string) *Error {
	switch text {
	case txtTolerate:
		return &Error{Type: TypeTolerate, Msg: text}
	case txtBusy:
		return &Error{Type: TypeTolerate, Msg: text, Err: ErrBusy}
	}
	return &Error{Type: TypeRequest, Msg: text}
}
