package protocol

import (
	"bytes"
	"testing"
)

func TestParseModes(t *testing.T) {
	tests := []struct {
		in   string
		nres int
		want string // AppendModes of the result; "!" refused
	}{
		{"", 3, ""},
		{"s", 3, "s"},
		{"x|s|2/5", 3, "x|s|2/5"},
		{"x|s", 3, "!"},
		{"x|s|s|s", 3, "!"},
		{"s|", 2, "!"},
		{"|s", 2, "!"},
		{"r", 1, "!"},
		{"0/5", 1, "!"},
		{"6/5", 1, "!"},
		{"5/5", 1, "5/5"},
		{"S", 1, "!"},
	}
	for _, tc := range tests {
		ms, ok := ParseModes(nil, []byte(tc.in), tc.nres)
		got := "!"
		if ok {
			got = string(AppendModes(nil, ms))
		}
		if got != tc.want {
			t.Errorf("ParseModes(%q, %d) = %q, want %q", tc.in, tc.nres, got, tc.want)
		}
	}
	buf, in := make([]Mode, 0, 8), []byte("x|s|2/5")
	if n := testing.AllocsPerRun(100, func() { _, _ = ParseModes(buf[:0], in, 3) }); n != 0 {
		t.Fatalf("ParseModes allocates %v times", n)
	}
}

// FuzzParseModes: never a panic, and what parses prints back as it was
// read, up to a single mode standing for all.
func FuzzParseModes(f *testing.F) {
	for _, s := range []string{"", "x", "s|s", "1/2|x|s", "99/100", "x||s", "1/0", "4294967297/1"} {
		f.Add([]byte(s), uint8(3))
	}
	f.Fuzz(func(t *testing.T, b []byte, nres uint8) {
		ms, ok := ParseModes(nil, b, int(nres))
		if !ok {
			return
		}
		if len(ms) != 0 && len(ms) != 1 && len(ms) != int(nres) {
			t.Fatalf("%q: %d modes for %d resources", b, len(ms), nres)
		}
		for _, m := range ms {
			if !m.Valid() {
				t.Fatalf("%q: invalid mode %+v", b, m)
			}
		}
		if out := AppendModes(nil, ms); !bytes.Equal(out, b) {
			t.Fatalf("%q prints back as %q", b, out)
		}
	})
}
