// Package mlockd is the locking provider backed by an mlockd server through
// the Go client: multi-key acquisitions are single atomic requests on the
// server's FIFO queues, waiters are woken by the server's push (no polling),
// and every acquisition carries a fencing token.
//
// Importing the package registers the "mlock" URL scheme with locking.Open:
//
//	p, err := locking.Open(ctx, "mlock://localhost:12340")
//
// Caveats: a lock acquired without Expire lasts the server's longest lease
// (24 h by default), and ends earlier if the process's session ends (its
// connection stays down past the server's grace period).
package mlockd

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/locking"
)

func init() {
	locking.RegisterScheme("mlock", func(_ context.Context, u *url.URL) (locking.Provider, error) {
		return Open(u.String())
	})
}

// MaxExpire stands for "no expiry": the server's default longest lease.
const MaxExpire = 24 * time.Hour

// Provider implements locking.Provider over an mlock.Client. It is safe for
// concurrent use.
type Provider struct {
	c     *mlock.Client
	owned bool // Close closes c

	mu    sync.Mutex
	held  map[string]*mlock.Lock // by owner and keys; for Renew
	swept int
}

// New returns a provider using c, which must have no prefix. Close does not
// close c.
func New(c *mlock.Client) *Provider {
	return &Provider{c: c, held: map[string]*mlock.Lock{}}
}

// Open returns a provider with its own client for an mlock:// URI (see
// mlock.ParseURI); Close closes that client.
func Open(uri string) (*Provider, error) {
	c, err := mlock.New(uri)
	if err != nil {
		return nil, err
	}
	p := New(c)
	p.owned = true
	return p, nil
}

func handleKey(owner string, keys []string) string { return owner + "\x00" + strings.Join(keys, "|") }

func expireOf(d time.Duration) time.Duration {
	if d <= 0 || d > MaxExpire {
		return MaxExpire
	}
	return max(d.Round(time.Millisecond), time.Millisecond)
}

// Acquire takes every key or none. See locking.Provider.
func (p *Provider) Acquire(ctx context.Context, keys []string, opts locking.AcquireOptions) (locking.Lease, error) {
	keys, err := locking.Keys(keys)
	if err != nil {
		return locking.Lease{}, err
	}
	owner := locking.Owner(opts.OwnerID)
	lo := &mlock.LockOptions{TTL: expireOf(opts.Expire), Timeout: -1, Tolerate: -1, Owner: owner}
	var l *mlock.Lock
	if opts.AwaitQueue {
		l, err = p.c.LockAll(ctx, keys, lo)
	} else {
		l, err = p.c.TryLock(ctx, strings.Join(keys, "|"), lo)
	}
	if err != nil {
		return locking.Lease{}, p.mapError(ctx, keys, err)
	}
	p.mu.Lock()
	p.held[handleKey(owner, keys)] = l
	if len(p.held) > 2*p.swept+64 {
		for k, h := range p.held {
			if h.Err() != nil {
				delete(p.held, k)
			}
		}
		p.swept = len(p.held)
	}
	p.mu.Unlock()
	return locking.Lease{Token: l.Token()}, nil
}

// mapError turns client errors into the module's.
func (p *Provider) mapError(ctx context.Context, keys []string, err error) error {
	var me *mlock.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
		return locking.WaitError(ctx)
	case errors.Is(err, mlock.ErrBusy), errors.As(err, &me) && me.Msg == "owner holds an overlapping lock!":
		return locking.ConflictError(p.busyKey(ctx, keys))
	}
	return err
}

// busyKey names the first of keys that is held or queued.
func (p *Provider) busyKey(ctx context.Context, keys []string) string {
	if len(keys) == 1 {
		return keys[0]
	}
	prefix := keys[0]
	for _, k := range keys[1:] {
		for !strings.HasPrefix(k, prefix) {
			prefix = prefix[:len(prefix)-1]
		}
	}
	ls, err := p.c.Locks(ctx, prefix)
	if err != nil {
		return keys[0]
	}
	busy := map[string]bool{}
	for _, q := range ls.Queues {
		busy[q.Resource] = len(q.Entries) > 0
	}
	for _, k := range keys {
		if busy[k] {
			return k
		}
	}
	return keys[0]
}

// Renew extends owner's lock on exactly keys, acquired through this
// provider. See locking.Provider.
func (p *Provider) Renew(ctx context.Context, keys []string, owner string, expire time.Duration) (bool, error) {
	keys, err := locking.Keys(keys)
	if err != nil {
		return false, err
	}
	hk := handleKey(locking.Owner(owner), keys)
	p.mu.Lock()
	l := p.held[hk]
	p.mu.Unlock()
	if l == nil {
		return false, nil
	}
	if _, err := l.Extend(ctx, expireOf(expire)); err != nil {
		if errors.Is(err, mlock.ErrLost) || errors.Is(err, mlock.ErrRequest) {
			p.mu.Lock()
			delete(p.held, hk)
			p.mu.Unlock()
			return false, nil
		}
		return false, err
	}
	return true, nil
}

// Release releases owner's lock on each key. See locking.Provider.
func (p *Provider) Release(ctx context.Context, keys []string, opts locking.ReleaseOptions) (bool, error) {
	keys, err := locking.Keys(keys)
	if err != nil {
		return false, err
	}
	owner := locking.Owner(opts.OwnerID)
	hk := handleKey(owner, keys)
	p.mu.Lock()
	l := p.held[hk]
	delete(p.held, hk)
	p.mu.Unlock()
	if l != nil && l.Err() == nil {
		// The lock this provider took for owner on exactly these keys:
		// unlock it by id, which also retires the client's handle.
		if err := l.Unlock(ctx); err == nil {
			return true, nil
		}
	}
	return p.c.Release(ctx, owner, strings.Join(keys, "|"))
}

// ReleaseAll releases every lock of the owner (without owner: the
// anonymous locks).
func (p *Provider) ReleaseAll(ctx context.Context, opts locking.ReleaseOptions) error {
	_, err := p.c.ReleaseAll(ctx, locking.Owner(opts.OwnerID))
	return err
}

// Execute runs job under keys. See locking.RunExecute.
func (p *Provider) Execute(ctx context.Context, keys []string, job locking.Job, opts locking.ExecuteOptions) error {
	return locking.RunExecute(ctx, p, keys, job, opts)
}

// Close closes the client if the provider opened it.
func (p *Provider) Close() error {
	if p.owned {
		return p.c.Close()
	}
	return nil
}
