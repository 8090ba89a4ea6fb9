package server

import (
	"bytes"
	"testing"
)

// FuzzLogCmd: decoding never panics, and what decodes encodes back to the
// same bytes.
func FuzzLogCmd(f *testing.F) {
	for _, m := range []logCmd{
		{op: opFrames, node: "n1", conn: "n1/ab/1", seq: 3, session: "s", frames: [][]byte{[]byte("lock 1 a 100 0 0"), []byte("unlock 2 x")}},
		{op: opAttach, node: "n2", conn: "k", seq: 1, session: "p\x00s", principal: "p"},
		{op: opDetach, node: "n", conn: "k", session: "s"},
		{op: opDetachNode, node: "n", conn: "n/x/"},
		{op: opFailover, until: 1 << 60},
		{op: opHoldGrants, until: -5},
	} {
		f.Add(appendLogCmd(nil, &m))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var m logCmd
		if decodeLogCmd(b, &m) != nil {
			return
		}
		if got := appendLogCmd(nil, &m); !bytes.Equal(got, b) {
			t.Fatalf("re-encoded %x, want %x", got, b)
		}
	})
}
