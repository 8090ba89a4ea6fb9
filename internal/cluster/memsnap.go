package cluster

import (
	"bytes"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// memSnaps is the snapshot store of a node kept in memory (Config.Dir ""):
// raft's InmemSnapshotStore, whose snapshot becomes the latest only once
// written whole. raft's makes a snapshot the latest when it is created, so
// a leader sending the latest snapshot to a follower while the next one is
// being written read it half written (and the race detector saw the
// buffer read and written at once); a cancelled one stayed the latest.
type memSnaps struct {
	mu    sync.Mutex
	inner *raft.InmemSnapshotStore
}

func newMemSnaps() *memSnaps { return &memSnaps{inner: raft.NewInmemSnapshotStore()} }

// memSink buffers a snapshot until Close hands it whole to the store.
type memSink struct {
	s        *memSnaps
	version  raft.SnapshotVersion
	index    uint64
	term     uint64
	conf     raft.Configuration
	confIdx  uint64
	trans    raft.Transport
	buf      bytes.Buffer
	id       string
	finished bool
}

func (s *memSnaps) Create(version raft.SnapshotVersion, index, term uint64, conf raft.Configuration,
	confIdx uint64, trans raft.Transport) (raft.SnapshotSink, error) {
	// Its ID until Close: raft's form (term-index-milliseconds); Close
	// takes the one the inner store gives it.
	id := fmt.Sprintf("%d-%d-%d", term, index, time.Now().UnixMilli())
	return &memSink{s: s, version: version, index: index, term: term, conf: conf, confIdx: confIdx, trans: trans,
		id: id}, nil
}

func (s *memSnaps) List() ([]*raft.SnapshotMeta, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inner.List()
}

func (s *memSnaps) Open(id string) (*raft.SnapshotMeta, io.ReadCloser, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inner.Open(id)
}

func (k *memSink) Write(p []byte) (int, error) { return k.buf.Write(p) }
func (k *memSink) ID() string                  { return k.id }

// Close makes the snapshot the store's latest, whole.
func (k *memSink) Close() error {
	if k.finished {
		return nil
	}
	k.finished = true
	k.s.mu.Lock()
	defer k.s.mu.Unlock()
	sink, err := k.s.inner.Create(k.version, k.index, k.term, k.conf, k.confIdx, k.trans)
	if err != nil {
		return err
	}
	k.id = sink.ID()
	if _, err := sink.Write(k.buf.Bytes()); err != nil {
		return err
	}
	return sink.Close()
}

// Cancel drops the snapshot: the store's latest stays what it was.
func (k *memSink) Cancel() error {
	k.finished = true
	return nil
}
