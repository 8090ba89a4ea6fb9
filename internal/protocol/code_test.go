package protocol

import (
	"os"
	"strings"
	"testing"
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
