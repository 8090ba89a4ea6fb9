package protocol

import (
	"bytes"
	"reflect"
	"testing"
)

// frameFields returns the fields of the payload of the one frame in b.
func frameFields(t testing.TB, b []byte) [][]byte {
	t.Helper()
	p, n, _, err := Next(b, 1<<20)
	if err != nil || n != len(b) {
		t.Fatalf("Next(%q) = %q, %d, %v", b, p, n, err)
	}
	return Split(nil, p)
}

func TestArgsRoundTrip(t *testing.T) {
	cmds := []Command{
		&LockArgs{Resources: "a|b", TTL: 5000, Timeout: 10000, Tolerate: 3},
		&LockArgs{Resources: "a", TTL: 1, Owner: "o"},
		&LockArgs{Resources: "a|b", TTL: 7, Modes: "s|2/5"},
		&LockArgs{Try: true, Resources: "a", TTL: 9},
		&LockArgs{Try: true, Resources: "a", TTL: 9, Owner: "me", Modes: "x"},
		&ExtendArgs{ID: "0123456789abcdef0123456789abcdef", TTL: 300},
		&IDArgs{ID: "0123456789abcdef0123456789abcdef"},
		&RenewArgs{Owner: "o", Resources: "a|b", TTL: 60000},
		&ReleaseArgs{Owner: "o", Resources: "a|b"},
		&ReleaseArgs{In: true, Owner: "o", Resources: "a", Prefix: "p:"},
		&ReleaseArgs{All: true, Owner: "o"},
		&ReleaseArgs{All: true, In: true, Owner: "o", Prefix: ""},
		&EvictArgs{Resources: "a|b"},
	}
	for _, c := range cmds {
		f := frameFields(t, AppendTyped(nil, 42, c))
		if v, ok := ParseVerb(f[0]); !ok || v != c.Verb() {
			t.Fatalf("%T: verb %q, want %v", c, f[0], c.Verb())
		}
		if seq, ok := ParseSeq(f[1]); !ok || seq != 42 {
			t.Fatalf("%T: request id %q", c, f[1])
		}
		got, code := parseAs(c.Verb(), f)
		if code != CodeUnknown {
			t.Fatalf("%T %+v: parse failed with %v", c, c, code)
		}
		if !reflect.DeepEqual(got, c) {
			t.Errorf("round trip of %+v gave %+v", c, got)
		}
	}
}

// parseAs parses f with the typed args of v.
func parseAs(v Verb, f [][]byte) (Command, Code) {
	switch v {
	case VerbLock, VerbTryLock:
		var a LockArgs
		return &a, a.Parse(f, v == VerbTryLock)
	case VerbExtend:
		var a ExtendArgs
		return &a, a.Parse(f)
	case VerbUnlock:
		var a IDArgs
		return &a, a.Parse(f)
	case VerbRenew:
		var a RenewArgs
		return &a, a.Parse(f)
	case VerbRelease, VerbReleaseIn, VerbReleaseAll, VerbReleaseAllIn:
		var a ReleaseArgs
		return &a, a.Parse(v, f)
	case VerbEvict:
		var a EvictArgs
		return &a, a.Parse(f)
	}
	return nil, CodeInvalidMessage
}

func TestArgsRefusals(t *testing.T) {
	tests := []struct {
		frame string
		want  Code
	}{
		{"lock 1 a 0 1 1", CodeInvalidTTL},
		{"lock 1 a -5 1 1", CodeInvalidTTL},
		{"lock 1 a x 1 1", CodeInvalidTTL},
		{"lock 1 a 5 -1 1", CodeInvalidTimeout},
		{"lock 1 a 5 1 y", CodeInvalidTolerate},
		{"lock 1", CodeInvalidResource},
		{"lock 1 a undefined null NaN", CodeUnknown}, // unset: the defaults
		{"trylock 1 a 5 o s", CodeUnknown},
		{"extend 1", CodeMissingArguments},
		{"extend 1 id 0", CodeInvalidTTL},
		{"unlock 1", CodeMissingArguments},
		{"renew 1 o", CodeMissingArguments},
		{"renew 1  a 5", CodeMissingArguments},
		{"renew 1 o a -1", CodeInvalidTTL},
		{"release 1 o", CodeMissingArguments},
		{"releasein 1 o a", CodeMissingArguments},
		{"releaseall 1", CodeMissingArguments},
		{"releaseallin 1 o", CodeMissingArguments},
		{"releaseallin 1 o ", CodeUnknown}, // an empty prefix: everything
		{"evict 1", CodeMissingArguments},
	}
	for _, tc := range tests {
		f := Split(nil, []byte(tc.frame))
		v, _ := ParseVerb(f[0])
		if _, code := parseAs(v, f); code != tc.want {
			t.Errorf("%q: %v, want %v", tc.frame, code, tc.want)
		}
	}
}

// FuzzArgs parses arbitrary frames with every typed parser: no panic, and a
// frame that parses is written back by AppendArgs to one that parses to the
// same arguments.
func FuzzArgs(f *testing.F) {
	for _, s := range []string{"lock 1 a|b 5000 100 2 owner s|1/3", "trylock 2 a 1", "extend 3 abc 5",
		"unlock 4 abc", "renew 5 o a 10", "release 6 o a", "releasein 7 o a p", "releaseall 8 o",
		"releaseallin 9 o p", "evict 10 a|b", "lock 1 a undefined null NaN"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		if bytes.IndexByte(payload, '\n') >= 0 {
			return // a frame's payload holds no newline
		}
		fields := Split(nil, payload)
		if len(fields) < 2 {
			return
		}
		v, ok := ParseVerb(fields[0])
		if !ok {
			return
		}
		a, code := parseAs(v, fields)
		if a == nil || code != CodeUnknown {
			return
		}
		again, code := parseAs(v, frameFields(t, AppendTyped(nil, 1, a)))
		if code != CodeUnknown || !reflect.DeepEqual(again, a) {
			t.Fatalf("%q parsed to %+v, written back and parsed to %+v (%v)", payload, a, again, code)
		}
	})
}
