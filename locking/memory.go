package locking

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/mlock-dev/mlock/internal/locktable"
)

// memoryMaxTTL stands for "no expiry" in the memory provider.
const memoryMaxTTL = 100 * 365 * 24 * time.Hour

// Memory is the in-process provider: mlock's lock engine behind a mutex.
// Waiters queue FIFO per key and are woken by the grant, never by polling.
// Locks taken without Expire never expire. Create it with NewMemory.
type Memory struct {
	start time.Time

	mu      sync.Mutex
	tab     *locktable.Table               // guarded by mu
	waiters map[locktable.ID]*memoryWaiter // guarded by mu
	timer   *time.Timer                    // guarded by mu
	timerAt int64                          // guarded by mu
	closed  chan struct{}
	once    sync.Once
}

type memoryWaiter struct {
	granted chan struct{}
	token   uint64
}

const memorySession = "local"

// NewMemory returns an empty memory provider.
func NewMemory() *Memory {
	m := &Memory{start: time.Now(), waiters: map[locktable.ID]*memoryWaiter{}, closed: make(chan struct{})}
	tab, err := locktable.New(locktable.Config{
		MaxTTL: memoryMaxTTL, MaxLocksPerSession: -1, MaxQueueLen: -1,
		OnEvent: m.onEvent,
	})
	if err != nil {
		panic(err) // the configuration above is valid
	}
	m.tab = tab
	m.tab.Attach(m.now(), memorySession)
	m.timer = time.AfterFunc(time.Hour, m.onTimer)
	m.timer.Stop()
	return m
}

func (m *Memory) now() int64 { return m.start.UnixNano() + int64(time.Since(m.start)) }

// onEvent runs under mu.
func (m *Memory) onEvent(e locktable.Event) {
	if e.Kind != locktable.Granted {
		return
	}
	if w := m.waiters[e.ID]; w != nil {
		delete(m.waiters, e.ID)
		w.token = e.Token
		close(w.granted)
	}
}

// armLocked keeps one timer at the earliest deadline.
func (m *Memory) armLocked() {
	if at, ok := m.tab.NextDeadline(); ok && (m.timerAt == 0 || at < m.timerAt) {
		m.timerAt = at
		m.timer.Reset(time.Duration(at - m.now()))
	}
}

func (m *Memory) onTimer() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.timerAt = 0
	m.tab.Advance(m.now())
	m.armLocked()
}

func (m *Memory) isClosed() bool {
	select {
	case <-m.closed:
		return true
	default:
		return false
	}
}

// Acquire takes every key or none. See Provider.
func (m *Memory) Acquire(ctx context.Context, keys []string, opts AcquireOptions) (Lease, error) {
	keys, err := Keys(keys)
	if err != nil {
		return Lease{}, err
	}
	if m.isClosed() {
		return Lease{}, ErrClosed
	}
	owner := Owner(opts.OwnerID)
	ttl := opts.Expire
	if ttl <= 0 || ttl > memoryMaxTTL {
		ttl = memoryMaxTTL
	}
	req := locktable.Request{Session: memorySession, Resources: keys, TTL: ttl, Owner: owner,
		NoReentry: owner == AnonymousOwner, Try: !opts.AwaitQueue}
	m.mu.Lock()
	g, err := m.tab.Lock(m.now(), &req)
	if err != nil {
		key := keys[0]
		for _, k := range keys {
			if m.tab.QueueLen(k) > 0 {
				key = k
				break
			}
		}
		m.mu.Unlock()
		if errors.Is(err, locktable.ErrBusy) || errors.Is(err, locktable.ErrOwnerConflict) {
			return Lease{}, ConflictError(key)
		}
		return Lease{}, &Error{Kind: ErrInvalidKey, Msg: err.Error(), Err: err}
	}
	m.armLocked()
	if g.Granted {
		m.mu.Unlock()
		if g.Renewed {
			return Lease{}, nil
		}
		return Lease{Token: g.Token}, nil
	}
	w := &memoryWaiter{granted: make(chan struct{})}
	m.waiters[g.ID] = w
	m.mu.Unlock()
	select {
	case <-w.granted:
		return Lease{Token: w.token}, nil
	case <-ctx.Done():
	case <-m.closed:
	}
	m.mu.Lock()
	delete(m.waiters, g.ID)
	_ = m.tab.Unlock(m.now(), g.ID) // leaves the queues, or gives back a grant that just landed
	m.armLocked()
	m.mu.Unlock()
	if m.isClosed() {
		return Lease{}, ErrClosed
	}
	return Lease{}, WaitError(ctx)
}

// Renew renews owner's lock on exactly keys. See Provider.
func (m *Memory) Renew(ctx context.Context, keys []string, owner string, expire time.Duration) (bool, error) {
	keys, err := Keys(keys)
	if err != nil {
		return false, err
	}
	if expire <= 0 || expire > memoryMaxTTL {
		expire = memoryMaxTTL
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	g, err := m.tab.Lock(m.now(), &locktable.Request{Session: memorySession, Resources: keys, TTL: expire,
		Owner: Owner(owner), NoReentry: Owner(owner) == AnonymousOwner, Try: true})
	if err != nil {
		return false, nil
	}
	if !g.Renewed {
		// The keys were free: the lease had been lost. Do not take them.
		_ = m.tab.Unlock(m.now(), g.ID)
		return false, nil
	}
	m.armLocked()
	return true, nil
}

// Release releases owner's lock on each key. See Provider.
func (m *Memory) Release(ctx context.Context, keys []string, opts ReleaseOptions) (bool, error) {
	keys, err := Keys(keys)
	if err != nil {
		return false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	ok := m.tab.Release(m.now(), Owner(opts.OwnerID), keys)
	m.armLocked()
	return ok, nil
}

// ReleaseAll releases every lock of the owner (without owner: the
// anonymous locks).
func (m *Memory) ReleaseAll(ctx context.Context, opts ReleaseOptions) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.tab.ReleaseAll(m.now(), Owner(opts.OwnerID))
	m.armLocked()
	return nil
}

// Execute runs job under keys. See RunExecute.
func (m *Memory) Execute(ctx context.Context, keys []string, job Job, opts ExecuteOptions) error {
	return RunExecute(ctx, m, keys, job, opts)
}

// Close wakes every waiter with ErrClosed and stops the timer.
func (m *Memory) Close() error {
	m.once.Do(func() {
		close(m.closed)
		m.mu.Lock()
		m.timer.Stop()
		m.mu.Unlock()
	})
	return nil
}
