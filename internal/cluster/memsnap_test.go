package cluster

import (
	"io"
	"testing"

	"github.com/hashicorp/raft"
)

// A snapshot kept in memory becomes the latest only once written whole: a
// reader meanwhile gets the one before, whole; a cancelled one is never
// seen.
func TestMemSnapsLatestOnlyWhenWhole(t *testing.T) {
	s := newMemSnaps()
	write := func(index uint64, body string, close bool) raft.SnapshotSink {
		t.Helper()
		k, err := s.Create(raft.SnapshotVersionMax, index, 1, raft.Configuration{}, 1, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := k.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
		if close {
			if err := k.Close(); err != nil {
				t.Fatal(err)
			}
		}
		return k
	}
	latest := func() (uint64, string) {
		t.Helper()
		metas, err := s.List()
		if err != nil || len(metas) != 1 {
			t.Fatalf("List: %v, %v", metas, err)
		}
		meta, rc, err := s.Open(metas[0].ID)
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		b, _ := io.ReadAll(rc)
		return meta.Index, string(b)
	}
	write(10, "ten", true)
	half := write(20, "twen", false) // being written
	done := make(chan struct{})
	go func() { // a leader sending the latest meanwhile
		defer close(done)
		for range 100 {
			if i, b := latest(); i != 10 || b != "ten" {
				t.Errorf("while 20 is written: latest %d %q, want 10 \"ten\"", i, b)
				return
			}
		}
	}()
	for range 100 {
		half.Write([]byte("."))
	}
	<-done
	if err := half.Close(); err != nil {
		t.Fatal(err)
	}
	if i, b := latest(); i != 20 || len(b) != 104 {
		t.Fatalf("after Close: latest %d (%d bytes), want 20 (104 bytes)", i, len(b))
	}
	cancelled := write(30, "thirty", false)
	if err := cancelled.Cancel(); err != nil {
		t.Fatal(err)
	}
	if i, _ := latest(); i != 20 {
		t.Fatalf("after a cancelled snapshot: latest %d, want 20", i)
	}
}
