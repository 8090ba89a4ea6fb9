package server

import (
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/mlock-dev/mlock/internal/core"
	"github.com/mlock-dev/mlock/internal/datadir"
)

// The data directory's token high-water mark.
//
// Every token a single server gives is below the mark on disk: the engine's
// token limit (core.Tx.SetTokenLimit) is the mark, and is raised only after
// a write of a higher mark has succeeded. The batches note the last token
// given (onBatch) and, once fewer than half a block is left below the mark,
// wake the marker goroutine (markLoop), which writes the mark outside the
// core's lock. A write that fails (a full, failing or read-only disk) is
// tried again with a backoff (markRetryMin doubling to markRetryMax) until
// one succeeds; meanwhile the tokens the mark on disk covers are still
// given, and once they are used up a new lock request is refused with
// "no fencing token: data directory not writable!" (core.ErrNoTokens) and a
// waiter that becomes grantable waits. While a write is only under way
// (healthy), a request at the limit queues and waits for it. /readyz, status and the metrics say
// the disk is failing from the first failed write until one succeeds.

// markRetryMin and markRetryMax bound the backoff between two tries of a
// failed write of the mark.
const (
	markRetryMin = 100 * time.Millisecond
	markRetryMax = 5 * time.Second
	// markRemind is how often the log says again that writes still fail.
	markRemind = time.Minute
)

// diskHealth is what the server knows of its data directory's writes.
// Without a data directory it stays healthy.
type diskHealth struct {
	failing  bool      // the last write of the mark failed
	errors   uint64    // writes of the mark that failed, in all
	since    time.Time // the first failure of the current run of them
	lastErr  string    // the last write's error, while failing
	reminded time.Time // the last log line about it
}

// diskState returns a copy of the data directory's health.
func (s *Server) diskState() diskHealth {
	s.diskMu.Lock()
	defer s.diskMu.Unlock()
	return s.disk
}

// kickMarkLocked wakes the marker when the mark must move. It runs in
// onBatch, under the core's lock: it writes nothing.
func (s *Server) kickMarkLocked(tx *core.Tx) {
	last := tx.LastToken()
	s.lastToken.Store(last)
	if s.dir.MarkDue(last) {
		select {
		case s.markKick <- struct{}{}:
		default:
		}
	}
}

// markLoop writes the token mark when a batch asks for it, and again with
// a backoff while the writes fail; after each write that succeeds it
// raises the engine's token limit to the new mark. It ends when the
// server stops (markStop) or the directory is closed.
func (s *Server) markLoop() {
	defer s.wg.Done()
	var backoff time.Duration
	for {
		if backoff == 0 {
			select {
			case <-s.markKick:
			case <-s.markStop:
				return
			}
		} else {
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-s.markStop:
				t.Stop()
				return
			}
		}
		last := s.lastToken.Load()
		err := s.dir.ReserveTokens(last)
		if errors.Is(err, datadir.ErrClosed) {
			return
		}
		if err != nil {
			if backoff == 0 {
				// From now on, a request that would need a token the mark
				// does not cover is refused, not queued (before the state
				// says the disk fails: whoever reads that sees refusals).
				s.batch(func(tx *core.Tx) { tx.SetTokenLimit(tx.TokenLimit(), true) })
			}
			backoff = min(max(2*backoff, markRetryMin), markRetryMax)
			s.markFailed(err, last, backoff)
			continue
		}
		backoff = 0
		mark := s.dir.TokenMark()
		s.markSaved(mark)
		s.batch(func(tx *core.Tx) {
			if l := tx.TokenLimit(); l != 0 {
				tx.SetTokenLimit(max(mark, l), false)
			}
		})
		if s.dir.MarkDue(s.lastToken.Load()) {
			select {
			case s.markKick <- struct{}{}:
			default:
			}
		}
	}
}

// markFailed records and logs a failed write of the mark: the first of a
// run of failures at error level, then a reminder with the count at most
// every markRemind.
func (s *Server) markFailed(err error, last uint64, retry time.Duration) {
	now := time.Now()
	s.diskMu.Lock()
	d := &s.disk
	d.errors++
	d.lastErr = diskReason(err)
	first := !d.failing
	remind := !first && now.Sub(d.reminded) >= markRemind
	if first {
		d.failing, d.since = true, now
	}
	if first || remind {
		d.reminded = now
	}
	n, since := d.errors, d.since
	s.diskMu.Unlock()
	mark := s.dir.TokenMark()
	left := mark - min(mark, last+1)
	switch {
	case first:
		s.log.Error("data directory: writing the token high-water mark failed: tokens up to the mark on disk are still given, then lock requests are refused until a write succeeds; retrying",
			"err", err, "data-dir", s.dir.Path(), "mark", mark, "last-token", last, "tokens-left", left, "retry-in", retry)
	case remind:
		s.log.Error("data directory: the token high-water mark still cannot be written",
			"err", err, "failed-writes", n, "for", now.Sub(since).Round(time.Second), "tokens-left", left)
	}
}

// markSaved records a write of the mark that succeeded, and logs the end
// of a run of failures.
func (s *Server) markSaved(mark uint64) {
	s.diskMu.Lock()
	d := &s.disk
	was, since, n := d.failing, d.since, d.errors
	d.failing, d.lastErr, d.since = false, "", time.Time{}
	s.diskMu.Unlock()
	if was {
		s.log.Warn("data directory: the token high-water mark is written again; granting as usual",
			"mark", mark, "failed-writes", n, "after", time.Since(since).Round(time.Millisecond))
	}
}

// diskReason is what status and /readyz say of a failed write: the
// system's words for its errno ("no space left on device"), without the
// file's path.
func diskReason(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	return "write failed"
}

// clusterStoreFailed is a cluster node's reaction to a failed write of its
// Raft log or stable store (cluster.Config.OnStoreFailure; the node logs it
// and closes itself, so that the others lead): the server stops serving
// too. Its clients' connections end (they go to other nodes), it accepts
// no new one, /readyz is 503, and Failed is closed: mlockd then exits with
// an error, for its supervisor to restart it once the disk works. It is
// called from a raft goroutine, so it only starts that work.
func (s *Server) clusterStoreFailed(err error) {
	cl := s.cl
	cl.storeFailed.Store(diskReason(err))
	cl.halted.Store("the Raft directory cannot be written: " + diskReason(err))
	s.failOnce.Do(func() {
		s.failErr = fmt.Errorf("server: the Raft directory cannot be written: %w", err)
		close(s.failed)
	})
	go s.batch(func(*core.Tx) {
		for c := range s.conns {
			if !c.forward {
				c.finish()
			}
		}
	})
}

// Failed is closed when the server can no longer serve and must be
// restarted: a cluster node whose Raft directory could not be written
// (FailedErr says why). It is never closed on a single server, whose
// failing data directory is a state it recovers from (see disk.go).
func (s *Server) Failed() <-chan struct{} { return s.failed }

// FailedErr returns why Failed was closed, or nil.
func (s *Server) FailedErr() error {
	select {
	case <-s.failed:
		return s.failErr
	default:
		return nil
	}
}
