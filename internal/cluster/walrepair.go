package cluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/raft-wal/fs"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/hashicorp/raft-wal/segment"
	"github.com/hashicorp/raft-wal/types"
)

// repairSealedTail finishes a segment rotation the WAL began and did not
// record. The append that fills a segment writes the segment's index block
// (the file is then sealed) and the rotation that records the seal and
// starts the next segment commits to the meta store afterwards; a crash (or
// a failed commit) between the two leaves the meta store naming a sealed
// file as the open tail, and raft-wal v0.4.1 then refuses every later
// append ("segment is sealed"), after every restart. Open calls this before
// the WAL opens: it records the seal and a new, empty tail segment after it,
// exactly as the rotation would have (raft-wal creates the missing file). It
// changes nothing in any other state. meta is loaded from dir (and stays
// open for the WAL).
func repairSealedTail(dir string, meta *metadb.BoltMetaDB) (repaired bool, err error) {
	st, err := meta.Load(dir)
	if err != nil || len(st.Segments) == 0 {
		return false, err
	}
	tail := st.Segments[len(st.Segments)-1]
	if !tail.SealTime.IsZero() {
		return false, nil
	}
	w, err := segment.NewFiler(dir, fs.New()).RecoverTail(tail)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil // recorded but never created: the WAL creates it
	}
	if err != nil {
		return false, err
	}
	sealed, indexStart, err := w.Sealed()
	last := w.LastIndex()
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err != nil || !sealed {
		return false, err
	}
	if last < tail.BaseIndex {
		return false, fmt.Errorf("cluster: log segment %d is sealed with no entries", tail.ID)
	}
	now := time.Now()
	seal := tail
	seal.SealTime = now
	seal.MaxIndex = last
	seal.IndexStart = indexStart
	if err := readSealed(dir, seal); err != nil {
		// The seal did not complete: a write that failed part way (a full
		// disk) left the index block's frame header and not the block.
		// raft-wal still takes the file for sealed, and then fails at every
		// start. Nothing of that write was acknowledged (its commit frame
		// is not there): cut the file before the index frame, and the tail
		// is an open segment again, with every committed entry.
		path := filepath.Join(dir, segment.FileName(tail))
		if terr := os.Truncate(path, int64(indexStart)-frameHeaderLen); terr != nil {
			return false, fmt.Errorf("cluster: log segment %d: its seal did not complete (%v), and cutting it off failed: %w", tail.ID, err, terr)
		}
		return true, nil
	}
	tail = seal
	st.Segments[len(st.Segments)-1] = tail
	st.Segments = append(st.Segments, types.SegmentInfo{
		ID:         st.NextSegmentID,
		BaseIndex:  last + 1,
		MinIndex:   last + 1,
		SizeLimit:  tail.SizeLimit,
		Codec:      tail.Codec,
		CreateTime: now,
	})
	st.NextSegmentID++
	return true, meta.CommitState(st)
}

// frameHeaderLen is raft-wal's frame header size (segment/format.go).
const frameHeaderLen = 8

// readSealed reads the index block and the last entry of the segment info,
// sealed: an error if its seal did not complete.
func readSealed(dir string, info types.SegmentInfo) error {
	r, err := segment.NewFiler(dir, fs.New()).Open(info)
	if err != nil {
		return err
	}
	defer r.Close()
	buf, err := r.GetLog(info.MaxIndex)
	if err != nil {
		return err
	}
	buf.Close()
	return nil
}
