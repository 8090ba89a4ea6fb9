package server

import (
	"errors"

	"github.com/mlock-dev/mlock/internal/core"
	"github.com/mlock-dev/mlock/internal/protocol"
)

// engineCodes maps the errors of the core (the engine's sentinels)
// to codes.
var engineCodes = [...]struct {
	err  error
	code protocol.Code
}{
	{core.ErrBusy, protocol.CodeBusy},
	{core.ErrNotFound, protocol.CodeLockNotExist},
	{core.ErrTolerate, protocol.CodeCannotTolerate},
	{core.ErrOwnerConflict, protocol.CodeOwnerConflict},
	{core.ErrInvalidResource, protocol.CodeInvalidResource},
	{core.ErrTooManyResources, protocol.CodeTooManyResources},
	{core.ErrInvalidTTL, protocol.CodeInvalidTTL},
	{core.ErrInvalidTimeout, protocol.CodeInvalidTimeout},
	{core.ErrInvalidTolerate, protocol.CodeInvalidTolerate},
	{core.ErrInvalidOwner, protocol.CodeInvalidOwner},
	{core.ErrQueueFull, protocol.CodeQueueFull},
	{core.ErrSessionLimit, protocol.CodeSessionLimit},
	{core.ErrNotGranted, protocol.CodeNotLockedYet},
	{core.ErrServerFull, protocol.CodeServerFull},
	{core.ErrNoTokens, protocol.CodeNoTokens},
	{core.ErrInvalidMode, protocol.CodeInvalidMode},
	{core.ErrPermitsConflict, protocol.CodePermitsConflict},
	{core.ErrModeChange, protocol.CodeModeChange},
}

// engineCode returns the code of an engine (or core) error: the sentinel
// itself or any error wrapping it (errors.Is). Errors with no wire text
// (ErrUnknownSession, anything else) give CodeUnknown.
func engineCode(err error) protocol.Code {
	if err == nil {
		return protocol.CodeUnknown
	}
	for _, e := range engineCodes {
		if err == e.err {
			return e.code
		}
	}
	for _, e := range engineCodes {
		if errors.Is(err, e.err) {
			return e.code
		}
	}
	return protocol.CodeUnknown
}

// engineFailure returns what a failed result says for an engine (or core)
// error: its code, and the detail AppendFailed writes after the text: the
// resource of a *core.ResourceError for the codes that carry one, the
// error's own text for an error with no code, "" otherwise.
func engineFailure(err error) (protocol.Code, string) {
	c := engineCode(err)
	switch {
	case c == protocol.CodeUnknown && err != nil:
		return c, err.Error()
	case c.HasDetail():
		var re *core.ResourceError
		if errors.As(err, &re) {
			return c, re.Resource
		}
	}
	return c, ""
}
