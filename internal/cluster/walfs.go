package cluster

import (
	"os"

	"github.com/hashicorp/raft-wal/fs"
	"github.com/hashicorp/raft-wal/types"
	"github.com/mlock-dev/mlock/internal/rawio"
)

// walFS is raft-wal's file system (fs.FS) with the segment files' writes and fsyncs as raw system
// calls (rawio.File): each stored batch of entries is one pwrite and one fsync, and through the
// runtime's syscall path the first of them after an idle moment woke Go's monitor thread, which then
// polled every 20 µs while the node worked: about a quarter of a node's CPU under load on a small
// virtual machine (docs/benchmarks.md). Raft waits for the fsync anyway (an entry is acknowledged
// only once it is on disk), so holding the P meanwhile costs nothing that waiting does not.
type walFS struct{ *fs.FS }

var _ types.VFS = walFS{}

// Create creates a segment file as fs.FS does (preallocated; its first Sync also syncs the
// directory, through fs.File).
func (v walFS) Create(dir, name string, size uint64) (types.WritableFile, error) {
	wf, err := v.FS.Create(dir, name, size)
	if err != nil {
		return nil, err
	}
	f, ok := wf.(*fs.File)
	if !ok {
		return wf, nil
	}
	return &newSegment{f: f, raw: rawio.NewFile(&f.File)}, nil
}

// OpenWriter opens an existing segment file for appending.
func (v walFS) OpenWriter(dir, name string) (types.WritableFile, error) {
	wf, err := v.FS.OpenWriter(dir, name)
	if err != nil {
		return nil, err
	}
	f, ok := wf.(*os.File)
	if !ok {
		return wf, nil
	}
	return rawio.NewFile(f), nil
}

// newSegment is a segment file created by this process: the first Sync goes through fs.File (it
// also syncs the directory, so that the new file survives a crash), the later ones are raw.
type newSegment struct {
	f      *fs.File
	raw    *rawio.File
	synced bool // the first Sync succeeded; owned by raft-wal's writer (one at a time)
}

func (s *newSegment) WriteAt(p []byte, off int64) (int, error) { return s.raw.WriteAt(p, off) }
func (s *newSegment) ReadAt(p []byte, off int64) (int, error)  { return s.f.ReadAt(p, off) }
func (s *newSegment) Close() error                             { return s.f.Close() }

func (s *newSegment) Sync() error {
	if s.synced {
		return s.raw.Sync()
	}
	if err := s.f.Sync(); err != nil {
		return err
	}
	s.synced = true
	return nil
}
