package redis

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// Timing of the restart detector.
const (
	// watchInterval is the background check of the run_id while locks are
	// held.
	watchInterval = time.Second
	// runIDFresh is how long a run_id read stays good enough to attribute
	// a new lock to it without reading it again.
	runIDFresh = time.Second
)

// errNoRunID marks a server whose INFO gives no run_id: detection is off.
var errNoRunID = errors.New("redis provider: INFO server has no run_id")

// runID reads the run_id of the server behind rdb: a random id every
// start of a Redis process, so a change means a restart or a failover.
func runID(ctx context.Context, rdb *goredis.Client) (string, error) {
	s, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return "", err
	}
	for line := range strings.SplitSeq(s, "\n") {
		if v, ok := strings.CutPrefix(line, "run_id:"); ok {
			if v = strings.TrimSpace(v); v != "" {
				return v, nil
			}
		}
	}
	return "", errNoRunID
}

// runWatch remembers under which run_id of the server each lock of this
// provider was taken, and reports every lock taken under an earlier run_id
// lost (closes its channel) once the run_id changes. While it tracks locks a
// goroutine reads the run_id every watchInterval. It is safe for concurrent
// use.
type runWatch struct {
	info     func(ctx context.Context) (string, error)
	interval time.Duration

	mu      sync.Mutex
	id      string                      // guarded by mu: the last run_id read, "" if none yet
	readAt  time.Time                   // guarded by mu: when id was last confirmed
	off     bool                        // guarded by mu: the server has no run_id: detection is off
	held    map[string]map[string]*held // guarded by mu: by owner, then by the keys '|'-joined
	running bool                        // guarded by mu: the background checker runs
	stop    chan struct{}               // closed by close
	done    chan struct{}               // closed when the background checker ends; guarded by mu
	closed  bool                        // guarded by mu
}

// held is a lock taken by this provider.
type held struct {
	runID string
	lost  chan struct{} // closed when gone is set
	gone  bool          // reported lost: the server changed since it was taken
	until time.Time     // the lease's end counted from before the acquisition; zero: no expiry
}

func newRunWatch(info func(ctx context.Context) (string, error)) *runWatch {
	return &runWatch{info: info, interval: watchInterval, held: map[string]map[string]*held{}, stop: make(chan struct{})}
}

// current returns the run_id to attribute a new lock to: the cached one if
// read within runIDFresh, else a fresh read. "" (and no error) when
// detection is off. A restart between the read and the acquisition makes
// the new lock count as taken before it: reported lost, which is safe.
func (w *runWatch) current(ctx context.Context) (string, error) {
	w.mu.Lock()
	if w.off || (w.id != "" && time.Since(w.readAt) < runIDFresh) {
		id := w.id
		w.mu.Unlock()
		return id, nil
	}
	w.mu.Unlock()
	if err := w.check(ctx); err != nil {
		return "", err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.id, nil
}

// check reads the run_id and, if it changed, reports every lock taken
// under another one lost. A network error is returned (the outcome is
// unknown); a server without run_id turns detection off.
func (w *runWatch) check(ctx context.Context) error {
	id, err := w.info(ctx)
	var rerr goredis.Error
	if errors.Is(err, errNoRunID) || (errors.As(err, &rerr) && !errors.Is(err, context.Canceled)) {
		w.mu.Lock()
		w.off = true
		w.mu.Unlock()
		return nil
	}
	if err != nil {
		return err
	}
	w.observe(id)
	return nil
}

// observe records run_id id, read just now.
func (w *runWatch) observe(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.id != id {
		for _, hs := range w.held {
			for _, h := range hs {
				if !h.gone && h.runID != id {
					h.gone = true
					close(h.lost)
				}
			}
		}
	}
	w.id, w.readAt = id, time.Now()
}

// track records a lock of owner on keys taken under runID, whose lease of
// ttl (0: none) was requested at sent, and returns its loss channel (nil
// when detection is off). A lock already tracked (a renewal through
// Acquire) keeps its channel.
func (w *runWatch) track(owner string, keys []string, runID string, ttl time.Duration, sent time.Time) <-chan struct{} {
	if runID == "" {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil
	}
	var until time.Time
	if ttl > 0 {
		until = sent.Add(ttl)
	}
	k := strings.Join(keys, "|")
	hs := w.held[owner]
	if h := hs[k]; h != nil && !h.gone && h.runID == runID {
		h.until = until
		return h.lost
	}
	h := &held{runID: runID, lost: make(chan struct{}), until: until}
	if hs == nil {
		hs = map[string]*held{}
		w.held[owner] = hs
	}
	hs[k] = h
	if runID != w.id {
		h.gone = true // the server changed since: lost already
		close(h.lost)
		return h.lost
	}
	if !w.running {
		w.running = true
		w.done = make(chan struct{})
		go w.loop(w.done)
	}
	return h.lost
}

// renewed moves the end of a tracked lock of owner on keys after a
// renewal sent at sent, and reports false if it was reported lost. A lock
// not tracked here (taken by another process) is left to the renewal
// script.
func (w *runWatch) renewed(owner string, keys []string, ttl time.Duration, sent time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	h := w.held[owner][strings.Join(keys, "|")]
	switch {
	case h == nil:
		return true
	case h.gone:
		return false
	case ttl > 0:
		h.until = sent.Add(ttl)
	default:
		h.until = time.Time{}
	}
	return true
}

// forget stops tracking owner's locks that overlap keys (released); every
// lock of owner if keys is nil.
func (w *runWatch) forget(owner string, keys []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	hs := w.held[owner]
	if hs == nil {
		return
	}
	delete(hs, strings.Join(keys, "|"))
	for k := range hs {
		if keys == nil || overlaps(strings.Split(k, "|"), keys) {
			delete(hs, k)
		}
	}
	if len(hs) == 0 {
		delete(w.held, owner)
	}
}

func overlaps(a, b []string) bool {
	for _, x := range a {
		for _, y := range b {
			if x == y {
				return true
			}
		}
	}
	return false
}

// loop checks the run_id every interval while locks are tracked, and drops
// the locks whose lease ran out.
func (w *runWatch) loop(done chan struct{}) {
	defer close(done)
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), w.interval)
		_ = w.check(ctx) // unknown outcomes: the next tick tries again
		cancel()
		w.mu.Lock()
		now, live := time.Now(), 0
		for owner, hs := range w.held {
			for k, h := range hs {
				if !h.until.IsZero() && now.After(h.until) {
					delete(hs, k) // expired: nothing to report any more
				} else if !h.gone {
					live++
				}
			}
			if len(hs) == 0 {
				delete(w.held, owner)
			}
		}
		if live == 0 || w.off {
			w.running = false
			w.mu.Unlock()
			return
		}
		w.mu.Unlock()
	}
}

// close stops the background checker and waits for it.
func (w *runWatch) close() {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	w.closed = true
	close(w.stop)
	done := w.done
	w.mu.Unlock()
	if done != nil {
		<-done
	}
}
