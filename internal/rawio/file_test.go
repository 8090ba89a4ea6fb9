package rawio

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// File writes where it is told, syncs, and its errors are os's.
func TestFileWriteAtAndSync(t *testing.T) {
	path := filepath.Join(t.TempDir(), "seg")
	of, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	f := NewFile(of)
	if fileSupported && f.rc == nil {
		t.Fatal("raw calls supported here but not used")
	}
	if n, err := f.WriteAt([]byte("hello"), 0); n != 5 || err != nil {
		t.Fatalf("WriteAt = %d, %v", n, err)
	}
	big := bytes.Repeat([]byte("x"), maxIO+123) // more than one system call
	if n, err := f.WriteAt(big, 4096); n != len(big) || err != nil {
		t.Fatalf("WriteAt big = %d, %v", n, err)
	}
	if n, err := f.WriteAt(nil, 10); n != 0 || err != nil {
		t.Fatalf("WriteAt nothing = %d, %v", n, err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("x"), -1); err == nil {
		t.Fatal("a negative offset was accepted")
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 4096+len(big) || string(got[:5]) != "hello" || !bytes.Equal(got[4096:], big) || got[5] != 0 {
		t.Fatalf("file holds %d bytes, not what was written", len(got))
	}
	if err := f.Sync(); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("Sync after Close = %v, want os.ErrClosed", err)
	}
	if _, err := f.WriteAt([]byte("x"), 0); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("WriteAt after Close = %v, want os.ErrClosed", err)
	}
	ro, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if _, err := NewFile(ro).WriteAt([]byte("x"), 0); err == nil {
		t.Fatal("a write to a read-only file succeeded")
	}
}
