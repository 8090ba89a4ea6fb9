package locking

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/mlock-dev/mlock/internal/core"
)

// memoryMaxTTL stands for "no expiry" in the memory provider.
const memoryMaxTTL = 100 * 365 * 24 * time.Hour

// Memory is the in-process provider: mlock's lock service core (the same
// engine, timer and events as mlockd) without the network. Waiters queue FIFO
// per key and are woken by the grant, never by polling. Locks taken without
// Expire never expire. Create it with NewMemory.
//
// Memory.Namespace gives providers over the same locks whose keys live
// under a namespace, as Redis providers with different Namespaces on one
// Redis: their ReleaseAll never reaches another namespace's locks.
type Memory struct {
	*memoryTable
	ns   string // put before every key; the scope of releases
	view bool   // made by Namespace: Close leaves the table open
}

// memoryTable is the state the providers of one NewMemory share.
type memoryTable struct {
	core    *core.Core
	waiters map[core.ID]*memoryWaiter // guarded by the core's lock (batches and OnBatch)
	closed  chan struct{}
	once    sync.Once
}

type memoryWaiter struct {
	granted chan struct{}
	token   uint64 // set before granted is closed
}

const memorySession = "local"

// NewMemory returns an empty memory provider.
func NewMemory() *Memory {
	m := &Memory{memoryTable: &memoryTable{waiters: map[core.ID]*memoryWaiter{}, closed: make(chan struct{})}}
	c, err := core.New(core.Config{
		Engine: core.EngineConfig{MaxTTL: memoryMaxTTL, MaxLocksPerSession: -1, MaxQueueLen: -1,
			MaxLocks: -1, MaxEntries: -1, MaxNameBytes: -1, MaxSessionBytes: -1},
		OnBatch: m.onBatch,
	})
	if err != nil {
		panic(err) // the configuration above is valid
	}
	m.core = c
	c.Apply(&core.Command{Op: core.OpAttach, Session: memorySession})
	return m
}

// Namespace returns a provider over m's locks whose keys are put under ns
// (m's own namespace, "" for NewMemory's, then ns): Acquire, Renew and
// Release name ns+key, conflicts name the key without it, and ReleaseAll
// releases only the owner's locks on keys under it (a lock across the
// edge keeps its keys outside). Its Close does nothing: close m. ns must
// hold no space and no '|'.
func (m *Memory) Namespace(ns string) *Memory {
	return &Memory{memoryTable: m.memoryTable, ns: m.ns + ns, view: true}
}

// keys normalizes keys and puts them under m's namespace.
func (m *Memory) keys(keys []string) ([]string, error) {
	keys, err := normalizeKeys(keys)
	if err != nil || m.ns == "" {
		return keys, err
	}
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = m.ns + k
	}
	return out, nil
}

// onBatch wakes the waiters granted in a batch. It runs under the core's
// lock.
func (m *memoryTable) onBatch(_ *core.Tx, events []core.Event) {
	for _, e := range events {
		if e.Kind != core.Granted {
			continue
		}
		if w := m.waiters[e.ID]; w != nil {
			delete(m.waiters, e.ID)
			w.token = e.Token
			close(w.granted)
		}
	}
}

func (m *memoryTable) isClosed() bool {
	select {
	case <-m.closed:
		return true
	default:
		return false
	}
}

// Acquire takes every key or none. See Provider. The owner asking again for
// exactly the keys it holds renews the lease; the Lease then carries the
// lock's original token.
func (m *Memory) Acquire(ctx context.Context, keys []string, opts AcquireOptions) (Lease, error) {
	keys, err := m.keys(keys)
	if err != nil {
		return Lease{}, err
	}
	if m.isClosed() {
		return Lease{}, ErrClosed
	}
	owner := ownerOf(opts.OwnerID)
	ttl := opts.Expire
	if ttl <= 0 || ttl > memoryMaxTTL {
		ttl = memoryMaxTTL
	}
	cmd := core.Command{Op: core.OpLock, Request: core.Request{Session: memorySession, Resources: keys, TTL: ttl,
		Owner: owner, NoReentry: owner == AnonymousOwner, Try: !opts.AwaitQueue}}
	var r core.Result
	var w *memoryWaiter
	m.core.Batch(func(tx *core.Tx) {
		r = tx.Apply(&cmd)
		if r.Err == nil && !r.Grant.Granted {
			// Registered in the same batch: the grant comes in a later one.
			w = &memoryWaiter{granted: make(chan struct{})}
			m.waiters[r.Grant.ID] = w
		}
	})
	if r.Err != nil {
		var re *core.ResourceError
		if errors.As(r.Err, &re) && (errors.Is(r.Err, core.ErrBusy) || errors.Is(r.Err, core.ErrOwnerConflict)) {
			return Lease{}, conflictError(strings.TrimPrefix(re.Resource, m.ns))
		}
		return Lease{}, invalidKeyError(r.Err)
	}
	if w == nil {
		return Lease{Token: r.Grant.Token}, nil
	}
	select {
	case <-w.granted:
		return Lease{Token: w.token}, nil
	case <-ctx.Done():
	case <-m.closed:
	}
	m.core.Batch(func(tx *core.Tx) {
		delete(m.waiters, r.Grant.ID)
		// Leaves the queues, or gives back a grant that just landed.
		tx.Apply(&core.Command{Op: core.OpUnlock, ID: r.Grant.ID, Session: memorySession})
	})
	if m.isClosed() {
		return Lease{}, ErrClosed
	}
	return Lease{}, waitError(ctx)
}

// Renew renews owner's lock on exactly keys: its lease is set to expire
// after expire (0: never), keeping its token. False if owner no longer holds
// exactly those keys, also after a Release of some of them. See Provider.
func (m *Memory) Renew(ctx context.Context, keys []string, owner string, expire time.Duration) (bool, error) {
	keys, err := m.keys(keys)
	if err != nil {
		return false, err
	}
	if expire <= 0 || expire > memoryMaxTTL {
		expire = memoryMaxTTL
	}
	r := m.core.Apply(&core.Command{Op: core.OpRenew, Owner: ownerOf(owner), Resources: keys, TTL: expire,
		Session: memorySession})
	return r.Err == nil, nil
}

// Release releases owner's lock on each key. See Provider.
func (m *Memory) Release(ctx context.Context, keys []string, opts ReleaseOptions) (bool, error) {
	keys, err := m.keys(keys)
	if err != nil {
		return false, err
	}
	r := m.core.Apply(&core.Command{Op: core.OpRelease, Owner: ownerOf(opts.OwnerID), Resources: keys, Prefix: m.ns})
	return r.OK, nil
}

// ReleaseAll releases every lock of the owner (without owner: the
// anonymous locks) on the keys of m's namespace.
func (m *Memory) ReleaseAll(ctx context.Context, opts ReleaseOptions) error {
	m.core.Apply(&core.Command{Op: core.OpReleaseAll, Owner: ownerOf(opts.OwnerID), Prefix: m.ns})
	return nil
}

// Close wakes every waiter with ErrClosed and stops the core's timer; on
// a provider made by Namespace it does nothing.
func (m *Memory) Close() error {
	if m.view {
		return nil
	}
	m.once.Do(func() {
		close(m.closed)
		m.core.Close()
	})
	return nil
}
