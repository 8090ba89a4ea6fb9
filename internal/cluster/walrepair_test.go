package cluster

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/hashicorp/raft"
	raftwal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/fs"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/hashicorp/raft-wal/segment"
)

// TestTornSealUndone: the append that fills a segment failed part way (a
// full disk): the index block's frame header is in the file, not the block.
// raft-wal takes the file for sealed, and a start then failed ("failed to
// read segment index: EOF"); repairSealedTail cuts the torn seal off, and
// the log opens with every entry before the failed write and takes appends.
func TestTornSealUndone(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	last := fillSegmentLosingRotation(t, dir)
	// Tear the seal: the file ends just after the index frame's header, as
	// a write cut off by a full disk leaves it (nothing preallocated).
	m0 := &metadb.BoltMetaDB{}
	st, err := m0.Load(dir)
	m0.Close()
	if err != nil {
		t.Fatal(err)
	}
	tail := st.Segments[len(st.Segments)-1]
	sw, err := segment.NewFiler(dir, fs.New()).RecoverTail(tail)
	if err != nil {
		t.Fatal(err)
	}
	sealed, indexStart, err := sw.Sealed()
	sw.Close()
	if err != nil || !sealed {
		t.Fatalf("the filled segment is not sealed: %v %v", sealed, err)
	}
	if err := os.Truncate(filepath.Join(dir, segment.FileName(tail)), int64(indexStart)); err != nil {
		t.Fatal(err)
	}

	meta := &metadb.BoltMetaDB{}
	repaired, err := repairSealedTail(dir, meta)
	if err != nil || !repaired {
		t.Fatalf("repairSealedTail = %v, %v", repaired, err)
	}
	w, err := raftwal.Open(dir, raftwal.WithMetaStore(meta), raftwal.WithSegmentSize(8192))
	if err != nil {
		t.Fatalf("open after the repair: %v", err)
	}
	defer w.Close()
	got, err := w.LastIndex()
	if err != nil || got == 0 || got > last+1 {
		t.Fatalf("last index after the repair: %d, %v (stored through %d)", got, err, last)
	}
	checkEntries(t, w, got)
	if err := w.StoreLogs([]*raft.Log{{Index: got + 1, Term: 1, Data: []byte("x")}}); err != nil {
		t.Fatalf("append after the repair: %v", err)
	}
}
