package protocol

import (
	"bytes"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// slowWriter records each Write and holds it until released.
type slowWriter struct {
	mu      sync.Mutex
	writes  [][]byte
	entered chan struct{} // one send per Write, before it blocks
	release chan struct{} // one receive per Write
	active  atomic.Int32
	overlap atomic.Bool
	err     error
}

func (w *slowWriter) Write(p []byte) (int, error) {
	if w.active.Add(1) > 1 {
		w.overlap.Store(true)
	}
	defer w.active.Add(-1)
	w.mu.Lock()
	w.writes = append(w.writes, append([]byte(nil), p...))
	w.mu.Unlock()
	if w.entered != nil {
		w.entered <- struct{}{}
		<-w.release
	}
	return len(p), w.err
}

func TestOutboxCoalescesWhileWriting(t *testing.T) {
	o := NewOutbox(0)
	w := &slowWriter{entered: make(chan struct{}), release: make(chan struct{})}
	o.Write(Append(nil, "first"))
	done := make(chan error, 1)
	go func() { _, err := o.Flush(w); done <- err }()
	<-w.entered // the first write is under way
	for _, s := range []string{"a", "b", "c"} {
		o.Build(func(b []byte) []byte { return Append(b, s) })
		// Another flusher returns at once: the writer picks its frames up.
		if n, err := o.Flush(w); n != 0 || err != nil {
			t.Fatalf("concurrent Flush = %d, %v", n, err)
		}
	}
	if o.Len() != 3*(Overhead+1) {
		t.Fatalf("queued %d bytes", o.Len())
	}
	w.release <- struct{}{}
	<-w.entered // the second write: a, b, c together
	w.release <- struct{}{}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	want := [][]byte{Append(nil, "first"), Append(Append(Append(nil, "a"), "b"), "c")}
	if len(w.writes) != 2 || !bytes.Equal(w.writes[0], want[0]) || !bytes.Equal(w.writes[1], want[1]) {
		t.Fatalf("writes = %q, want %q", w.writes, want)
	}
	if o.Len() != 0 {
		t.Fatal("left bytes queued")
	}
}

func TestOutboxConcurrentFlushersNeverOverlap(t *testing.T) {
	o := NewOutbox(0)
	var w slowWriter
	var total bytes.Buffer
	var mu sync.Mutex
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				f := Append(nil, string(rune('a'+g)), string(rune('0'+i%10)))
				mu.Lock()
				total.Write(f)
				mu.Unlock()
				o.Write(f)
				if _, err := o.Flush(&w); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	o.Flush(&w)
	if w.overlap.Load() {
		t.Fatal("two writes ran at once")
	}
	var got int
	for _, b := range w.writes {
		for len(b) > 0 {
			_, n, _, err := Next(b, 100)
			if err != nil || n == 0 {
				t.Fatalf("a write holds a torn frame: %v", err)
			}
			b = b[n:]
			got += n
		}
	}
	if got != total.Len() {
		t.Fatalf("wrote %d bytes, queued %d", got, total.Len())
	}
}

func TestOutboxLimit(t *testing.T) {
	o := NewOutbox(20)
	if o.Write(make([]byte, 15)) {
		t.Fatal("over below the limit")
	}
	if !o.Write(make([]byte, 10)) {
		t.Fatal("not over past the limit")
	}
	if o.Len() != 0 {
		t.Fatal("the queue of a dead box is kept")
	}
	if o.Write([]byte("x")) || o.Build(func(b []byte) []byte { return append(b, "y"...) }) || o.Len() != 0 {
		t.Fatal("a dead box takes writes or reports again")
	}
	var w slowWriter
	if n, err := o.Flush(&w); n != 0 || err != nil || len(w.writes) != 0 {
		t.Fatal("a dead box writes")
	}
	o.Reset()
	if o.Write([]byte("z")) || o.Len() != 1 {
		t.Fatal("Reset does not revive the box")
	}
	if !o.Build(func(b []byte) []byte { return append(b, make([]byte, 30)...) }) {
		t.Fatal("Build past the limit")
	}
}

func TestOutboxWriteError(t *testing.T) {
	o := NewOutbox(0)
	boom := errors.New("boom")
	w := &slowWriter{err: boom}
	o.Write([]byte("abc"))
	if n, err := o.Flush(w); n != 3 || !errors.Is(err, boom) {
		t.Fatalf("Flush = %d, %v", n, err)
	}
	// A later Flush writes again (the caller usually closes the connection).
	o.Write([]byte("d"))
	w.err = nil
	if n, err := o.Flush(w); n != 1 || err != nil {
		t.Fatalf("Flush after an error = %d, %v", n, err)
	}
}

func TestOutboxResetDuringWrite(t *testing.T) {
	o := NewOutbox(0)
	w := &slowWriter{entered: make(chan struct{}), release: make(chan struct{})}
	o.Write([]byte("old"))
	done := make(chan struct{})
	go func() { o.Flush(w); close(done) }()
	<-w.entered
	o.Write([]byte("stale"))
	o.Reset()
	w.release <- struct{}{}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Flush did not return")
	}
	if len(w.writes) != 1 || string(w.writes[0]) != "old" {
		t.Fatalf("writes = %q", w.writes)
	}
}

func TestOutboxTryFlushKeepsWhatIsNotWritten(t *testing.T) {
	o := NewOutbox(0)
	o.Write([]byte("abcdef"))
	var got []byte
	// The socket takes 4 bytes; meanwhile another frame is queued.
	done, err := o.TryFlush(func(b []byte) (int, error) {
		got = append(got, b[:4]...)
		o.Write([]byte("gh")) // a caller queues while the write is under way
		return 4, nil
	})
	if done || err != nil {
		t.Fatalf("TryFlush = %v, %v; want false, nil", done, err)
	}
	if o.Len() != 4 {
		t.Fatalf("queued %d bytes, want 4", o.Len())
	}
	// A full socket takes nothing: everything stays, in order.
	if done, err := o.TryFlush(func([]byte) (int, error) { return 0, nil }); done || err != nil {
		t.Fatalf("TryFlush on a full socket = %v, %v", done, err)
	}
	var w bytes.Buffer
	if _, err := o.Flush(&w); err != nil {
		t.Fatal(err)
	}
	if all := string(got) + w.String(); all != "abcdefgh" {
		t.Fatalf("written %q, want abcdefgh", all)
	}
	// Everything written: done.
	o.Write([]byte("ij"))
	if done, err := o.TryFlush(func(b []byte) (int, error) { return len(b), nil }); !done || err != nil || o.Len() != 0 {
		t.Fatalf("TryFlush = %v, %v with %d bytes left", done, err, o.Len())
	}
	// A write error is returned; the bytes are lost.
	o.Write([]byte("kl"))
	boom := errors.New("boom")
	if done, err := o.TryFlush(func([]byte) (int, error) { return 0, boom }); done || !errors.Is(err, boom) || o.Len() != 0 {
		t.Fatalf("TryFlush = %v, %v with %d bytes left", done, err, o.Len())
	}
}

func TestOutboxTryFlushLeavesAFlushUnderWay(t *testing.T) {
	o := NewOutbox(0)
	w := &slowWriter{entered: make(chan struct{}), release: make(chan struct{})}
	o.Write([]byte("first"))
	flushed := make(chan error, 1)
	go func() { _, err := o.Flush(w); flushed <- err }()
	<-w.entered
	o.Write([]byte("second"))
	called := false
	if done, err := o.TryFlush(func(b []byte) (int, error) { called = true; return len(b), nil }); !done || err != nil || called {
		t.Fatalf("TryFlush during a Flush = %v, %v (wrote: %v)", done, err, called)
	}
	w.release <- struct{}{}
	<-w.entered // the Flush writes what was queued meanwhile
	w.release <- struct{}{}
	if err := <-flushed; err != nil {
		t.Fatal(err)
	}
	if len(w.writes) != 2 || string(w.writes[1]) != "second" {
		t.Fatalf("writes %q", w.writes)
	}
}
