package cluster

import (
	"bytes"
	"math"
	"slices"
	"testing"

	"github.com/hashicorp/raft"
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

// indexSM is a state machine that records the indexes it is told (At).
type indexSM struct {
	*lockedSM
	at []uint64
}

func (s *indexSM) At(index uint64) { s.at = append(s.at, index) }

// The state machine is told the index of each command entry before its
// Apply, and of the snapshot it restores (0 while another snapshot is open
// for reading, as a leader sending one: not known).
func TestFSMTellsIndex(t *testing.T) {
	sm := &indexSM{lockedSM: newLockedSM(false)}
	f := &fsm{sm: sm, applied: make(chan struct{}, 1)}
	f.armed.Store(math.MinInt64)
	cmd := appendEntry(nil, &entry{kind: entryBatch, now: 1, cmds: [][]byte{[]byte("x")}})
	f.Apply(&raft.Log{Index: 7, Type: raft.LogCommand, Data: cmd})
	f.ApplyBatch([]*raft.Log{{Index: 8, Type: raft.LogNoop}, {Index: 9, Type: raft.LogCommand, Data: cmd}})
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	store := indexedSnaps{newMemSnaps(), f}
	sink, err := store.Create(raft.SnapshotVersionMax, 42, 1, raft.Configuration{}, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := snap.Persist(sink); err != nil {
		t.Fatal(err)
	}
	_, rc, err := store.Open(sink.ID())
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Restore(rc); err != nil {
		t.Fatal(err)
	}
	rc.Close() // raft closes it too: once counts
	_, other, err := store.Open(sink.ID())
	if err != nil {
		t.Fatal(err)
	}
	_, rc, err = store.Open(sink.ID())
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Restore(rc); err != nil {
		t.Fatal(err)
	}
	other.Close()
	if want := []uint64{7, 9, 42, 0}; !slices.Equal(sm.at, want) {
		t.Fatalf("indexes told: %v, want %v", sm.at, want)
	}
	if f.opened != 0 {
		t.Fatalf("%d snapshots still counted open", f.opened)
	}
}
