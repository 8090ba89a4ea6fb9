package locking

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"sync"
)

// MemoryID is the id of the built-in memory provider in a Module.
const MemoryID = "memory"

// Module routes the locking calls to providers registered by id, as Medusa's
// Locking Module does. The default provider is the one registered as
// default, else the only one registered, else the built-in memory provider
// (created on first use). A Module is safe for concurrent use.
type Module struct {
	mu        sync.Mutex
	providers map[string]Provider // guarded by mu
	order     []string            // guarded by mu: registration order
	explicit  string              // guarded by mu: the id registered as default
	closed    bool                // guarded by mu
}

// NewModule returns a Module with no provider registered.
func NewModule() *Module { return &Module{providers: map[string]Provider{}} }

// Register adds p under id. isDefault makes it the default provider (the
// last one registered so wins). It fails for an empty or taken id.
func (m *Module) Register(id string, p Provider, isDefault bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case id == "":
		return errors.New("locking: a provider needs an id")
	case m.providers[id] != nil:
		return fmt.Errorf("locking: provider id %q is already registered", id)
	case p == nil:
		return fmt.Errorf("locking: provider %q is nil", id)
	}
	m.providers[id] = p
	m.order = append(m.order, id)
	if isDefault {
		m.explicit = id
	}
	return nil
}

// DefaultID returns the id of the default provider.
func (m *Module) DefaultID() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.defaultLocked()
}

func (m *Module) defaultLocked() string {
	switch {
	case m.explicit != "":
		return m.explicit
	case len(m.order) == 1:
		return m.order[0]
	}
	return MemoryID
}

// Provider returns the provider registered as id ("": the default).
func (m *Module) Provider(id string) (Provider, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	if id == "" {
		id = m.defaultLocked()
	}
	if p := m.providers[id]; p != nil {
		return p, nil
	}
	if id == MemoryID {
		p := NewMemory()
		m.providers[id] = p
		return p, nil
	}
	return nil, &Error{Kind: ErrNoProvider, Msg: "Unable to retrieve the locking provider with id: " + id}
}

// Execute runs job under keys on opts.Provider. See the function Execute.
func (m *Module) Execute(ctx context.Context, keys []string, job Job, opts ExecuteOptions) error {
	p, err := m.Provider(opts.Provider)
	if err != nil {
		return err
	}
	return Execute(ctx, p, keys, job, opts)
}

// ExecuteLease is Execute for a job that wants the Lease it runs under: its
// Token fences the job's writes (see package fence). See the function
// ExecuteLease.
func (m *Module) ExecuteLease(ctx context.Context, keys []string, job func(ctx context.Context, l Lease) error, opts ExecuteOptions) error {
	p, err := m.Provider(opts.Provider)
	if err != nil {
		return err
	}
	return ExecuteLease(ctx, p, keys, job, opts)
}

// Acquire takes keys on opts.Provider.
func (m *Module) Acquire(ctx context.Context, keys []string, opts AcquireOptions) (Lease, error) {
	p, err := m.Provider(opts.Provider)
	if err != nil {
		return Lease{}, err
	}
	return p.Acquire(ctx, keys, opts)
}

// Release releases keys on opts.Provider.
func (m *Module) Release(ctx context.Context, keys []string, opts ReleaseOptions) (bool, error) {
	p, err := m.Provider(opts.Provider)
	if err != nil {
		return false, err
	}
	return p.Release(ctx, keys, opts)
}

// ReleaseAll releases every lock of opts.OwnerID on opts.Provider.
func (m *Module) ReleaseAll(ctx context.Context, opts ReleaseOptions) error {
	p, err := m.Provider(opts.Provider)
	if err != nil {
		return err
	}
	return p.ReleaseAll(ctx, opts)
}

// Close closes every provider, going on past failures, and returns them
// joined.
func (m *Module) Close() error {
	m.mu.Lock()
	m.closed = true
	ids := make([]string, 0, len(m.providers))
	for id := range m.providers {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	ps := m.providers
	m.providers = map[string]Provider{}
	m.mu.Unlock()
	var errs []error
	for _, id := range ids {
		if err := ps[id].Close(); err != nil {
			errs = append(errs, fmt.Errorf("closing the locking provider %q: %w", id, err))
		}
	}
	return errors.Join(errs...)
}

// OpenFunc opens a provider from a URL.
type OpenFunc func(ctx context.Context, u *url.URL) (Provider, error)

var schemes = struct {
	sync.Mutex
	m map[string]OpenFunc
}{m: map[string]OpenFunc{
	"memory": func(context.Context, *url.URL) (Provider, error) { return NewMemory(), nil },
}}

// RegisterScheme makes Open handle URLs of scheme. Provider packages call it
// from init: import them (blank import is enough) to open their URLs.
func RegisterScheme(scheme string, open OpenFunc) {
	schemes.Lock()
	defer schemes.Unlock()
	schemes.m[scheme] = open
}

// Open opens a provider from a URL: "memory:" (built in), "mlock://host:port"
// (package locking/mlockd), "redis://host:port/db" (package locking/redis),
// "etcd://host:port" (package locking/etcd). A package registers its scheme
// when it is imported.
func Open(ctx context.Context, rawURL string) (Provider, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("locking: provider URL: %w", err)
	}
	schemes.Lock()
	open := schemes.m[u.Scheme]
	schemes.Unlock()
	if open == nil {
		return nil, fmt.Errorf("locking: no provider for URL scheme %q (import its package)", u.Scheme)
	}
	return open(ctx, u)
}
