// Package mlockd is the locking provider backed by an mlockd server through
// the Go client: multi-key acquisitions are single atomic requests on the
// server's FIFO queues, waiters are woken by the server's push (no polling),
// and every acquisition carries a fencing token. Renew is the server's
// renew-by-owner: the provider keeps no state of its own.
//
// Importing the package registers the "mlock" and "mlocks" (TLS) URL schemes
// with locking.Open:
//
//	p, err := locking.Open(ctx, "mlock://localhost:12340")
//
// The way of a call: Provider.Acquire → mlock.Client.LockAll (or
// TryLockAll without AwaitQueue) → the server's lock (or trylock) command →
// the lock service core → the engine; a refusal comes back as an
// *mlock.Error naming the busy resource, turned into the module's
// ErrConflict for that key.
//
// Every Lease carries the handle's Lost channel, so locking.Execute aborts
// its job as soon as the client learns the lock is gone; Renew (the
// server's renew-by-owner) also moves the lease of that handle.
//
// The client's prefix (Options.Prefix, prefix= in the URI) is the
// provider's namespace, as a Redis provider's Namespace: it is put before
// every key, and it is the scope of ReleaseAll, which never touches an
// owner's locks on resources outside it (those of another namespace, or an
// "mlock run" of the same owner), whether the owner is named or anonymous.
// Without a prefix the scope is the whole server. A scoped ReleaseAll needs
// an mlockd that knows releaseallin (an older server refuses it with
// mlock.ErrScopeUnsupported and releases nothing).
//
// Caveats: a lock acquired without Expire (or with a longer one) asks for
// MaxExpire, 24 h, the server's default longest lease: a server started
// with a shorter --max-ttl refuses it (ttl should be integer!), so give such
// a server's users an Expire within it. A lock also ends earlier if the
// process's session ends (its connection stays down past the server's grace
// period).
package mlockd

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"time"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/locking"
	"github.com/mlock-dev/mlock/locking/provider"
)

func init() {
	open := func(_ context.Context, u *url.URL) (locking.Provider, error) { return Open(u.String()) }
	locking.RegisterScheme("mlock", open)
	locking.RegisterScheme("mlocks", open) // TLS
}

// MaxExpire stands for "no expiry", and caps Expire: the server's default
// longest lease (a server with a shorter --max-ttl refuses it).
const MaxExpire = 24 * time.Hour

// Provider implements locking.Provider over an mlock.Client. It is safe for
// concurrent use.
type Provider struct {
	c     *mlock.Client
	owned bool // Close closes c
}

// New returns a provider using c; c's prefix is the provider's namespace
// (see the package documentation). Close does not close c.
func New(c *mlock.Client) *Provider { return &Provider{c: c} }

// Open returns a provider with its own client for an mlock:// URI (see
// mlock.ParseURI); Close closes that client.
func Open(uri string) (*Provider, error) {
	c, err := mlock.New(uri)
	if err != nil {
		return nil, err
	}
	return &Provider{c: c, owned: true}, nil
}

func expireOf(d time.Duration) time.Duration {
	if d <= 0 || d > MaxExpire {
		return MaxExpire
	}
	return max(d.Round(time.Millisecond), time.Millisecond)
}

// Acquire takes every key or none; the same owner asking again for exactly
// the keys it holds renews the lock and gets its original token. See
// locking.Provider.
func (p *Provider) Acquire(ctx context.Context, keys []string, opts locking.AcquireOptions) (locking.Lease, error) {
	keys, err := provider.Keys(keys)
	if err != nil {
		return locking.Lease{}, err
	}
	lo := &mlock.LockOptions{TTL: expireOf(opts.Expire), Timeout: -1, Tolerate: -1, Owner: provider.Owner(opts.OwnerID)}
	var l *mlock.Lock
	var sent time.Time
	if opts.AwaitQueue {
		l, err = p.c.LockAll(ctx, keys, lo)
	} else {
		// The client does not report when it sent the request: the time
		// just before the call is a lower bound, so a lease counted from it
		// ends no later than the server's.
		sent = time.Now()
		l, err = p.c.TryLockAll(ctx, keys, lo)
	}
	if err != nil {
		return locking.Lease{}, mapError(ctx, keys, p.c.Options().Prefix, err)
	}
	return leaseOf(l, sent), nil
}

// leaseOf describes the acquisition of l: its token, its Lost channel (closed
// when the client learns that the lock is gone: an expiry pushed by the
// server, a lost session, or its Deadline passed without word from the
// server), its expiry as the server reported it, its believed end (the
// client's Deadline, which counts its lease from the grant and the end of
// its session) and sent, a lower bound of the send time of the request.
//
// sent is zero for a request that may have waited in a queue: the lease
// then runs from the grant, which only the client sees (the Deadline counts
// from it), and the time before the wait would be so early a bound that the
// lease could end before the job began.
func leaseOf(l *mlock.Lock, sent time.Time) locking.Lease {
	return locking.Lease{Token: l.Token(), Lost: l.Lost(), Why: func() error { return lossCause(l.Err()) }, ExpiresAt: l.ExpiresAt(),
		Deadline: l.Deadline, Sent: sent}
}

// lossCause words the client's loss error err for an operator: what ended
// the lock, and what to do only when the fix is a longer lease. err stays
// in the chain (errors.Is(err, mlock.ErrReleased), ...).
func lossCause(err error) error {
	var me *mlock.Error
	var why string
	switch {
	case err == nil:
		return nil
	case errors.Is(err, mlock.ErrReleased) && errors.As(err, &me) && strings.Contains(me.Msg, "evicted"):
		why = "an administrator evicted it (" + err.Error() + ")."
	case errors.Is(err, mlock.ErrReleased):
		why = "it was released by its owner elsewhere (" + err.Error() + ")."
	case errors.Is(err, mlock.ErrSessionLost) && errors.As(err, &me) && me.Msg == "server shutting down":
		why = "the lock server shut down (" + err.Error() + ")."
	case errors.Is(err, mlock.ErrSessionLost):
		why = "the session was lost: the connection was down past the server's grace period, or the server restarted (" + err.Error() + ")."
	case errors.Is(err, mlock.ErrExpired) && errors.As(err, &me) && strings.Contains(me.Msg, "without word"):
		why = "the lock server could not be reached until the lease ran out (" + err.Error() + ")."
	case errors.Is(err, mlock.ErrExpired):
		why = "the lease ended on the server before it could be renewed (" + err.Error() + "). Increase \"expire\" if the job is expected to run this long."
	default:
		why = err.Error() + "."
	}
	return &locking.Error{Kind: locking.ErrLost, Msg: why, Err: err}
}

// mapError turns client errors into the module's; prefix, the client's,
// is taken off the resource a refusal names.
func mapError(ctx context.Context, keys []string, prefix string, err error) error {
	switch {
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
		return provider.WaitError(ctx)
	case errors.Is(err, mlock.ErrBusy), errors.Is(err, mlock.ErrOwnerConflict):
		key := keys[0]
		if me := (*mlock.Error)(nil); errors.As(err, &me) && me.Resource != "" {
			key = strings.TrimPrefix(me.Resource, prefix)
		}
		return provider.ConflictError(key)
	}
	return err
}

// Renew extends owner's lock on exactly keys, whichever process acquired
// it (the server's renew-by-owner); false if owner no longer holds exactly
// those keys. See locking.Provider.
func (p *Provider) Renew(ctx context.Context, keys []string, owner string, expire time.Duration) (bool, error) {
	keys, err := provider.Keys(keys)
	if err != nil {
		return false, err
	}
	if _, _, err := p.c.Renew(ctx, provider.Owner(owner), keys, expireOf(expire)); err != nil {
		if errors.Is(err, mlock.ErrNotHeld) {
			return false, nil
		}
		return false, err
	}
	return true, nil
}

// Release releases owner's lock on each key. See locking.Provider.
func (p *Provider) Release(ctx context.Context, keys []string, opts locking.ReleaseOptions) (bool, error) {
	keys, err := provider.Keys(keys)
	if err != nil {
		return false, err
	}
	return p.c.Release(ctx, provider.Owner(opts.OwnerID), strings.Join(keys, "|")) // the keys carry the prefix: in scope
}

// ReleaseAll releases every lock of the owner (without owner: the
// anonymous locks) on the resources of the provider's namespace, the
// client's prefix: locks outside it are never touched.
func (p *Provider) ReleaseAll(ctx context.Context, opts locking.ReleaseOptions) error {
	_, err := p.c.ReleaseAllIn(ctx, provider.Owner(opts.OwnerID), "")
	return err
}

// Close closes the client if the provider opened it.
func (p *Provider) Close() error {
	if p.owned {
		return p.c.Close()
	}
	return nil
}
