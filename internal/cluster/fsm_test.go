package cluster

import (
	"bytes"
	"testing"
)

func TestEntryRoundTrip(t *testing.T) {
	t.Parallel()
	for _, e := range []entry{
		{kind: entryBatch, now: 42},
		{kind: entryBatch, now: -1, cmds: [][]byte{[]byte("a"), {}, []byte("ccc")}},
		{kind: entryLeader, now: 7, leaderID: "n1", client: "h:1", cmds: [][]byte{[]byte("failover")}},
	} {
		b := appendEntry(nil, &e)
		if len(e.cmds) > 0 && len(b) > entrySize(e.cmds)+len(e.leaderID)+len(e.client)+20 {
			t.Fatalf("entrySize too small")
		}
		got, err := decodeEntry(b)
		if err != nil {
			t.Fatal(err)
		}
		if got.kind != e.kind || got.now != e.now || got.leaderID != e.leaderID || got.client != e.client ||
			len(got.cmds) != len(e.cmds) {
			t.Fatalf("got %+v, want %+v", got, e)
		}
		for i := range e.cmds {
			if !bytes.Equal(got.cmds[i], e.cmds[i]) {
				t.Fatalf("cmd %d: %q, want %q", i, got.cmds[i], e.cmds[i])
			}
		}
		for cut := range len(b) {
			if _, err := decodeEntry(b[:cut]); err == nil {
				t.Fatalf("truncated entry (%d of %d bytes) decoded", cut, len(b))
			}
		}
	}
}

func FuzzDecodeEntry(f *testing.F) {
	f.Add(appendEntry(nil, &entry{kind: entryBatch, now: 1, cmds: [][]byte{[]byte("x")}}))
	f.Add(appendEntry(nil, &entry{kind: entryLeader, now: 2, leaderID: "a", client: "b"}))
	f.Fuzz(func(t *testing.T, p []byte) {
		e, err := decodeEntry(p)
		if err != nil {
			return
		}
		b := appendEntry(nil, &e)
		e2, err := decodeEntry(b)
		if err != nil {
			t.Fatalf("re-encoded entry does not decode: %v", err)
		}
		if b2 := appendEntry(nil, &e2); !bytes.Equal(b, b2) {
			t.Fatalf("encoding not stable: %x vs %x", b, b2)
		}
	})
}
