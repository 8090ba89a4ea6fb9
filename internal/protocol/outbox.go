package protocol

import (
	"io"
	"sync"
)

// maxSpare is the largest written buffer an Outbox keeps for reuse.
const maxSpare = 64 << 10

// Outbox is the coalescing writer of one connection, used by the server and
// the client alike: any goroutine queues frames, and Flush writes everything
// queued in as few writes as possible. While one goroutine writes, the
// others' frames gather in the queue and go out together in its next write.
//
// An Outbox is safe for concurrent use; its mutex is held only to queue or
// to swap buffers, never during a write.
type Outbox struct {
	mu      sync.Mutex
	out     []byte // guarded by mu: bytes waiting to be written
	spare   []byte // guarded by mu: the buffer of the last write, for reuse
	writing bool   // guarded by mu: a Flush is writing
	dead    bool   // guarded by mu: passed its limit
	limit   int
}

// NewOutbox returns an empty Outbox that holds at most limit queued bytes
// (limit <= 0: no limit).
func NewOutbox(limit int) *Outbox { return &Outbox{limit: limit} }

// Write queues frame bytes (copied). It reports over when this write took
// the queue past the limit: the queue is then dropped and the box is dead,
// and later writes are dropped without a report (until Reset). The caller
// should close the connection.
func (o *Outbox) Write(frame []byte) (over bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.dead {
		return false
	}
	o.out = append(o.out, frame...)
	return o.checkLocked()
}

// Build queues what fn appends to the queue it is given, in place (fn must
// only append, and must not keep the slice). It runs fn under the box's
// mutex: fn must be quick and must not call the Outbox. over is as for
// Write.
func (o *Outbox) Build(fn func([]byte) []byte) (over bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.dead {
		return false
	}
	o.out = fn(o.out)
	return o.checkLocked()
}

func (o *Outbox) checkLocked() bool {
	if o.limit > 0 && len(o.out) > o.limit {
		o.dead = true
		o.out = nil
		return true
	}
	return false
}

// Flush writes what is queued to w, looping until the queue is empty, and
// returns the bytes written. If another goroutine is flushing, it returns
// (0, nil) at once: that flush writes what was queued meanwhile. A write
// error is returned at once; the bytes of the failed write are lost.
func (o *Outbox) Flush(w io.Writer) (n int, err error) {
	// A blocking writer writes all it is given or fails (io.Writer's
	// contract), so TryFlush never leaves anything queued through it.
	_, err = o.TryFlush(func(b []byte) (int, error) {
		k, err := w.Write(b)
		n += k
		return k, err
	})
	return n, err
}

// TryFlush is Flush through a write that may give up without blocking: w
// writes a prefix of what it is given (a non-blocking socket write) and
// returns its length. What w leaves stays queued, at the front, and done
// is false: a Flush (or TryFlush) must write it later. done is true when
// the queue was written, or when another goroutine is flushing (it writes
// what was queued meanwhile). A write error is returned at once; the bytes
// of the failed write are lost.
func (o *Outbox) TryFlush(w func([]byte) (int, error)) (done bool, err error) {
	for {
		o.mu.Lock()
		if o.writing || len(o.out) == 0 {
			o.mu.Unlock()
			return true, nil
		}
		o.writing = true
		buf := o.out
		o.out, o.spare = o.spare[:0], nil
		o.mu.Unlock()

		k, err := w(buf)
		k = min(max(k, 0), len(buf))

		o.mu.Lock()
		o.writing = false
		if err == nil && k < len(buf) && !o.dead {
			// Put the rest back in front of what was queued meanwhile.
			later := o.out
			o.out = append(append(buf[:0], buf[k:]...), later...)
			if cap(later) <= maxSpare {
				o.spare = later[:0]
			}
			o.mu.Unlock()
			return false, nil
		}
		if cap(buf) <= maxSpare {
			o.spare = buf[:0]
		}
		o.mu.Unlock()
		if err != nil {
			return false, err
		}
	}
}

// Reset drops the queued bytes and revives a dead box (the connection was
// replaced). A Flush under way finishes its current write.
func (o *Outbox) Reset() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.out = o.out[:0]
	o.dead = false
}

// Len returns the number of queued bytes.
func (o *Outbox) Len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.out)
}
