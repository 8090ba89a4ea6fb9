package protocol

import (
	"strconv"
	"strings"
	"testing"
)

func TestParseVerb(t *testing.T) {
	for v := VerbConnect; v < numVerbs; v++ {
		for _, w := range []string{v.String(), strings.ToUpper(v.String())} {
			if got, ok := ParseVerb([]byte(w)); !ok || got != v {
				t.Errorf("ParseVerb(%q) = %v, %v; want %v", w, got, ok, v)
			}
		}
	}
	for _, bad := range []string{"", "lockx", "releaseallx", "releaseallinx", "releasei", "loc", "lock ", "r\u00e9new"} {
		if v, ok := ParseVerb([]byte(bad)); ok {
			t.Errorf("ParseVerb(%q) = %v", bad, v)
		}
	}
	if Verb(0).String() != "" || Verb(200).String() != "" {
		t.Error("String of a non-command")
	}
}

func TestAppendCommand(t *testing.T) {
	got := AppendCommand(nil, VerbLock, "r1", "a|b", "5000", "0", "0", "w1")
	if string(got[4:]) != "lock r1 a|b 5000 0 0 w1\n" || int(got[3]) != len(got) {
		t.Fatalf("frame = %q", got)
	}
	got = AppendCommandSeq(nil, VerbPing, 71)
	if string(got[4:]) != "ping 1z\n" {
		t.Fatalf("frame = %q", got)
	}
}

func TestParseSeq(t *testing.T) {
	for _, n := range []uint64{0, 1, 35, 36, 1 << 40, 1<<64 - 1} {
		s := strconv.FormatUint(n, 36)
		if got, ok := ParseSeq([]byte(s)); !ok || got != n {
			t.Errorf("ParseSeq(%q) = %d, %v", s, got, ok)
		}
	}
	for _, bad := range []string{"", "01", "A", "-1", "1 ", "3w5e11264sgsg" /* 2^64 */, "zzzzzzzzzzzzzz"} {
		if n, ok := ParseSeq([]byte(bad)); ok {
			t.Errorf("ParseSeq(%q) = %d", bad, n)
		}
	}
}
