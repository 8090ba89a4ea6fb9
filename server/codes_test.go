package server

import (
	"errors"
	"fmt"
	"testing"

	"github.com/mlock-dev/mlock/internal/core"
	"github.com/mlock-dev/mlock/internal/protocol"
)

func TestEngineCode(t *testing.T) {
	t.Parallel()
	for _, e := range engineCodes {
		if got := engineCode(e.err); got != e.code {
			t.Errorf("engineCode(%v) = %v, want %v", e.err, got, e.code)
		}
		wrapped := fmt.Errorf("%w: some-resource", e.err)
		if got := engineCode(wrapped); got != e.code {
			t.Errorf("engineCode(wrapped %v) = %v", e.err, got)
		}
	}
	for _, err := range []error{nil, core.ErrUnknownSession, errors.New("other")} {
		if got := engineCode(err); got != protocol.CodeUnknown {
			t.Errorf("engineCode(%v) = %v", err, got)
		}
	}
}

func TestEngineFailure(t *testing.T) {
	t.Parallel()
	tests := []struct {
		err    error
		code   protocol.Code
		detail string
	}{
		{&core.ResourceError{Err: core.ErrBusy, Resource: "order:1"}, protocol.CodeBusy, "order:1"},
		{&core.ResourceError{Err: core.ErrOwnerConflict, Resource: "k"}, protocol.CodeOwnerConflict, "k"},
		{&core.ResourceError{Err: core.ErrTolerate, Resource: "k"}, protocol.CodeCannotTolerate, ""},
		{core.ErrBusy, protocol.CodeBusy, ""},
		{core.ErrNotFound, protocol.CodeLockNotExist, ""},
		{core.ErrUnknownSession, protocol.CodeUnknown, core.ErrUnknownSession.Error()},
	}
	for _, tc := range tests {
		c, d := engineFailure(tc.err)
		if c != tc.code || d != tc.detail {
			t.Errorf("engineFailure(%v) = %v, %q; want %v, %q", tc.err, c, d, tc.code, tc.detail)
		}
	}
}
