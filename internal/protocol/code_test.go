package protocol

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/mlock-dev/mlock/internal/core"
)

func TestCodeTable(t *testing.T) {
	doc, err := os.ReadFile("../../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]Code{}
	for c := CodeUnknown + 1; c < numCodes; c++ {
		text := c.Text()
		if text == "" || !strings.HasSuffix(text, "!") || strings.Count(text, "!") != 1 {
			t.Errorf("code %d: text %q (every text ends with its only '!')", c, text)
		}
		if prev, dup := seen[text]; dup {
			t.Errorf("codes %d and %d share %q", prev, c, text)
		}
		seen[text] = c
		if got := CodeOf([]byte(text)); got != c {
			t.Errorf("CodeOf(%q) = %d, want %d", text, got, c)
		}
		if !strings.Contains(string(doc), "`"+text+"`") && !strings.Contains(string(doc), "`error "+text+"`") {
			t.Errorf("%q is not in docs/protocol.md", text)
		}
	}
	if CodeOf([]byte("shoule connect first!")) != CodeConnectFirst || CodeOf([]byte("nope")) != CodeUnknown {
		t.Error("CodeOf")
	}
	if CodeUnknown.Text() != "" || CodeUnknown.String() != "unknown" || Code(255).Text() != "" {
		t.Error("unknown code")
	}
}

func TestClass(t *testing.T) {
	for c := CodeUnknown; c < numCodes; c++ {
		want := ClassRequest
		switch c {
		case CodeCannotTolerate, CodeBusy:
			want = ClassTolerate
		case CodeLockNotExist:
			want = ClassNotFound
		}
		if c.Class() != want {
			t.Errorf("%v: class %d, want %d", c, c.Class(), want)
		}
	}
}

func TestEngineCode(t *testing.T) {
	for _, e := range engineCodes {
		if got := EngineCode(e.err); got != e.code {
			t.Errorf("EngineCode(%v) = %v, want %v", e.err, got, e.code)
		}
		wrapped := fmt.Errorf("%w: some-resource", e.err)
		if got := EngineCode(wrapped); got != e.code {
			t.Errorf("EngineCode(wrapped %v) = %v", e.err, got)
		}
	}
	for _, err := range []error{nil, core.ErrUnknownSession, errors.New("other")} {
		if got := EngineCode(err); got != CodeUnknown {
			t.Errorf("EngineCode(%v) = %v", err, got)
		}
	}
}

func TestEngineFailure(t *testing.T) {
	tests := []struct {
		err    error
		code   Code
		detail string
	}{
		{&core.ResourceError{Err: core.ErrBusy, Resource: "order:1"}, CodeBusy, "order:1"},
		{&core.ResourceError{Err: core.ErrOwnerConflict, Resource: "k"}, CodeOwnerConflict, "k"},
		{&core.ResourceError{Err: core.ErrTolerate, Resource: "k"}, CodeCannotTolerate, ""},
		{core.ErrBusy, CodeBusy, ""},
		{core.ErrNotFound, CodeLockNotExist, ""},
		{core.ErrUnknownSession, CodeUnknown, core.ErrUnknownSession.Error()},
	}
	for _, tc := range tests {
		c, d := EngineFailure(tc.err)
		if c != tc.code || d != tc.detail {
			t.Errorf("EngineFailure(%v) = %v, %q; want %v, %q", tc.err, c, d, tc.code, tc.detail)
		}
	}
}
