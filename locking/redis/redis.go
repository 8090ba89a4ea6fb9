// Package redis is the locking provider backed by Redis, compatible with
// Medusa's locking-redis provider: the same key layout (namespace +
// key, default "medusa_lock:"; value = owner id, "*" for none), the same
// options and defaults, and its backoff with jitter, so Go and Medusa
// processes can share locks on one Redis.
//
// What it does better: a multi-key acquisition is one Lua script that takes
// every key or none (no partial holds, no deadlock whatever the key order);
// a release publishes a message that wakes the waiters at once instead of
// leaving them to their backoff; ReleaseAll is owner-checked key by key in
// Lua; every acquisition gets a fencing token (INCR on a counter key outside
// the namespace).
//
// Importing the package registers the "redis" URL scheme with locking.Open:
//
//	p, err := locking.Open(ctx, "redis://localhost:6379/0?namespace=medusa_lock:")
//
// Caveats: waiters are not served in FIFO order (each retries when woken);
// all keys of one call must be in one hash slot on Redis Cluster (use hash
// tags); a lock acquired without Expire never expires, as in Medusa.
package redis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/mlock-dev/mlock/locking"
)

func init() {
	locking.RegisterScheme("redis", func(ctx context.Context, u *url.URL) (locking.Provider, error) {
		return OpenURL(u.String())
	})
}

// Defaults, as Medusa's locking-redis (2.15.2 and later).
const (
	DefaultNamespace            = "medusa_lock:"
	DefaultWaitLockingTimeout   = 5 * time.Second
	DefaultDefaultRetryInterval = 20 * time.Millisecond
	DefaultMaximumRetryInterval = time.Second
	DefaultBackoffFactor        = 2.0
)

// ErrNoRedisURL is Medusa's error for a provider without a Redis URL.
var ErrNoRedisURL = errors.New(`No "redisUrl" provided in "locking" module, "locking-redis" provider options. It is required for the "locking-redis" Module provider.`)

// Options are Medusa's locking-redis options. Zero fields take the defaults.
type Options struct {
	// RedisURL, e.g. "redis://localhost:6379". Required.
	RedisURL string
	// Namespace is put before every key. Default "medusa_lock:".
	Namespace string
	// WaitLockingTimeout is Execute's default wait. Default 5 s.
	WaitLockingTimeout time.Duration
	// DefaultRetryInterval is the first backoff delay. Default 20 ms.
	DefaultRetryInterval time.Duration
	// MaximumRetryInterval caps the backoff delay. Default 1 s.
	MaximumRetryInterval time.Duration
	// BackoffFactor multiplies the delay after each try. Default 2.
	BackoffFactor float64
	// NoWake turns the release wake-up off: waiters only poll with backoff,
	// as Medusa's do (for comparison).
	NoWake bool
}

// Provider implements locking.Provider on Redis. Create it with New, Open or
// OpenURL; it is safe for concurrent use.
type Provider struct {
	rdb     goredis.UniversalClient
	owned   bool
	opts    Options
	fence   string // counter key for fencing tokens
	channel string // release notifications

	mu      sync.Mutex
	wake    chan struct{} // guarded by mu: closed and replaced on every release message
	sub     *goredis.PubSub
	subDone chan struct{}
	closed  bool
}

// Open connects to o.RedisURL.
func Open(o Options) (*Provider, error) {
	if o.RedisURL == "" {
		return nil, ErrNoRedisURL
	}
	ro, err := goredis.ParseURL(o.RedisURL)
	if err != nil {
		return nil, err
	}
	p, err := New(goredis.NewClient(ro), o)
	if err != nil {
		return nil, err
	}
	p.owned = true
	return p, nil
}

// OpenURL opens a provider from a redis:// URL whose query may also carry
// the options: namespace, waitLockingTimeout, defaultRetryInterval,
// maximumRetryInterval (durations such as 20ms, or milliseconds),
// backoffFactor and wake=false.
func OpenURL(raw string) (*Provider, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	var o Options
	q := u.Query()
	for k, vs := range q {
		v := vs[len(vs)-1]
		var err error
		switch k {
		case "namespace":
			o.Namespace = v
		case "waitLockingTimeout":
			o.WaitLockingTimeout, err = locking.ParseDuration(v)
		case "defaultRetryInterval":
			o.DefaultRetryInterval, err = locking.ParseDuration(v)
		case "maximumRetryInterval":
			o.MaximumRetryInterval, err = locking.ParseDuration(v)
		case "backoffFactor":
			o.BackoffFactor, err = strconv.ParseFloat(v, 64)
		case "wake":
			o.NoWake = v == "false"
		default:
			continue // left for go-redis
		}
		if err != nil {
			return nil, fmt.Errorf("redis provider URL: %s: %w", k, err)
		}
		q.Del(k)
	}
	u.RawQuery = q.Encode()
	o.RedisURL = u.String()
	return Open(o)
}

// New returns a provider using rdb. Close does not close rdb.
func New(rdb goredis.UniversalClient, o Options) (*Provider, error) {
	if o.Namespace == "" {
		o.Namespace = DefaultNamespace
	}
	if o.WaitLockingTimeout <= 0 {
		o.WaitLockingTimeout = DefaultWaitLockingTimeout
	}
	if o.DefaultRetryInterval <= 0 {
		o.DefaultRetryInterval = DefaultDefaultRetryInterval
	}
	if o.MaximumRetryInterval <= 0 {
		o.MaximumRetryInterval = DefaultMaximumRetryInterval
	}
	if o.BackoffFactor <= 0 {
		o.BackoffFactor = DefaultBackoffFactor
	}
	if o.BackoffFactor < 1 {
		return nil, fmt.Errorf("redis provider: BackoffFactor %v is below 1", o.BackoffFactor)
	}
	return &Provider{rdb: rdb, opts: o, fence: "mlock_fence:" + o.Namespace, channel: "mlock_release:" + o.Namespace,
		wake: make(chan struct{})}, nil
}

// Backoff is Medusa's retry delay: each wait is a uniform draw in
// [delay/2, delay), after which delay grows by factor up to max.
type Backoff struct {
	delay, max time.Duration
	factor     float64
}

// NewBackoff starts a backoff at base.
func NewBackoff(base, max time.Duration, factor float64) *Backoff {
	return &Backoff{delay: base, max: max, factor: factor}
}

// Next returns the next wait; r is a uniform draw in [0, 1).
func (b *Backoff) Next(r float64) time.Duration {
	d := time.Duration(float64(b.delay) * (0.5 + r*0.5))
	b.delay = min(time.Duration(float64(b.delay)*b.factor), b.max)
	return d
}

var (
	// acquireScript takes every key or none. KEYS: the keys, then the fence
	// counter. ARGV: owner, ttl in ms (0: none). Reply {1, token} when
	// taken, {2, 0} when the owner already held exactly these keys (the
	// lease is renewed), {0, i} when key i is held by someone else (or by
	// the owner, but not all of them).
	acquireScript = goredis.NewScript(`
local owner = ARGV[1]
local ttl = tonumber(ARGV[2])
local n = #KEYS - 1
local own, first_own = 0, 0
for i = 1, n do
  local v = redis.call('GET', KEYS[i])
  if v then
    if v ~= owner or owner == '*' then
      return {0, i}
    end
    own = own + 1
    if first_own == 0 then first_own = i end
  end
end
if own > 0 and own < n then
  return {0, first_own}
end
for i = 1, n do
  if ttl > 0 then
    redis.call('SET', KEYS[i], owner, 'PX', ttl)
  else
    redis.call('SET', KEYS[i], owner, 'KEEPTTL')
  end
end
if own == n then
  return {2, 0}
end
return {1, redis.call('INCR', KEYS[n + 1])}
`)
	// renewScript resets the lease of keys all held by owner. ARGV: owner,
	// ttl in ms (0: no expiry). Reply 1, or 0 if one is not owner's.
	renewScript = goredis.NewScript(`
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) ~= ARGV[1] then return 0 end
end
local ttl = tonumber(ARGV[2])
for i = 1, #KEYS do
  if ttl > 0 then redis.call('PEXPIRE', KEYS[i], ttl) else redis.call('PERSIST', KEYS[i]) end
end
return 1
`)
	// releaseScript unlinks the keys held by owner and, if it removed any,
	// publishes on the release channel. ARGV: owner, channel. Reply: the
	// number removed.
	releaseScript = goredis.NewScript(`
local n = 0
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then
    redis.call('UNLINK', KEYS[i])
    n = n + 1
  end
end
if n > 0 then redis.call('PUBLISH', ARGV[2], '1') end
return n
`)
)

func (p *Provider) redisKeys(keys []string) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = p.opts.Namespace + k
	}
	return out
}

func ttlMs(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return max(d.Milliseconds(), 1)
}

// wakeChan returns the channel closed by the next release, starting the
// subscription on first use.
func (p *Provider) wakeChan() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.opts.NoWake || p.closed {
		return nil
	}
	if p.sub == nil {
		p.sub = p.rdb.Subscribe(context.Background(), p.channel)
		p.subDone = make(chan struct{})
		ch := p.sub.Channel()
		go func() {
			defer close(p.subDone)
			for range ch {
				p.mu.Lock()
				close(p.wake)
				p.wake = make(chan struct{})
				p.mu.Unlock()
			}
		}()
	}
	return p.wake
}

// Acquire takes every key or none; with AwaitQueue it retries with backoff,
// woken at once by releases. See locking.Provider.
func (p *Provider) Acquire(ctx context.Context, keys []string, opts locking.AcquireOptions) (locking.Lease, error) {
	keys, err := locking.Keys(keys)
	if err != nil {
		return locking.Lease{}, err
	}
	owner := locking.Owner(opts.OwnerID)
	rkeys := append(p.redisKeys(keys), p.fence)
	ttl := ttlMs(opts.Expire)
	b := NewBackoff(p.opts.DefaultRetryInterval, p.opts.MaximumRetryInterval, p.opts.BackoffFactor)
	for {
		var wake <-chan struct{}
		if opts.AwaitQueue {
			wake = p.wakeChan() // before trying: a release after the try wakes us
		}
		res, err := acquireScript.Run(ctx, p.rdb, rkeys, owner, ttl).Int64Slice()
		if err != nil {
			if ctx.Err() != nil {
				return locking.Lease{}, locking.WaitError(ctx)
			}
			return locking.Lease{}, err
		}
		switch res[0] {
		case 1:
			return locking.Lease{Token: uint64(res[1])}, nil
		case 2:
			return locking.Lease{}, nil
		}
		if !opts.AwaitQueue {
			return locking.Lease{}, locking.ConflictError(keys[res[1]-1])
		}
		t := time.NewTimer(b.Next(rand.Float64()))
		select {
		case <-ctx.Done():
			t.Stop()
			return locking.Lease{}, locking.WaitError(ctx)
		case <-t.C:
		case <-wake:
			t.Stop()
		}
	}
}

// Renew resets the lease of owner's lock on keys. See locking.Provider.
func (p *Provider) Renew(ctx context.Context, keys []string, owner string, expire time.Duration) (bool, error) {
	keys, err := locking.Keys(keys)
	if err != nil {
		return false, err
	}
	n, err := renewScript.Run(ctx, p.rdb, p.redisKeys(keys), locking.Owner(owner), ttlMs(expire)).Int64()
	return n == 1, err
}

// Release deletes the keys held by the owner and wakes the waiters; true
// only if every key was the owner's. See locking.Provider.
func (p *Provider) Release(ctx context.Context, keys []string, opts locking.ReleaseOptions) (bool, error) {
	keys, err := locking.Keys(keys)
	if err != nil {
		return false, err
	}
	n, err := releaseScript.Run(ctx, p.rdb, p.redisKeys(keys), locking.Owner(opts.OwnerID), p.channel).Int64()
	return err == nil && n == int64(len(keys)), err
}

// ReleaseAll releases every key of the namespace held by the owner
// (without owner: the anonymous "*" locks): SCAN, then, in one pipeline per
// batch, the release script (owner check and UNLINK in one atomic step) on
// each key.
func (p *Provider) ReleaseAll(ctx context.Context, opts locking.ReleaseOptions) error {
	owner := locking.Owner(opts.OwnerID)
	match := globEscape(p.opts.Namespace) + "*"
	var cursor uint64
	for {
		keys, next, err := p.rdb.Scan(ctx, cursor, match, 100).Result()
		if err != nil {
			return err
		}
		if len(keys) > 0 {
			pipe := p.rdb.Pipeline()
			for _, k := range keys {
				releaseScript.Run(ctx, pipe, []string{k}, owner, p.channel)
			}
			if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, goredis.Nil) {
				return err
			}
		}
		if cursor = next; cursor == 0 {
			return nil
		}
	}
}

func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// Execute runs job under keys, waiting at most WaitLockingTimeout unless
// opts.Timeout says otherwise. See locking.RunExecute.
func (p *Provider) Execute(ctx context.Context, keys []string, job locking.Job, opts locking.ExecuteOptions) error {
	if opts.Timeout == 0 {
		opts.Timeout = p.opts.WaitLockingTimeout
	}
	return locking.RunExecute(ctx, p, keys, job, opts)
}

// Close stops the wake-up subscription and closes the client if the
// provider opened it.
func (p *Provider) Close() error {
	p.mu.Lock()
	p.closed = true
	sub, done := p.sub, p.subDone
	p.mu.Unlock()
	var errs []error
	if sub != nil {
		errs = append(errs, sub.Close())
		<-done
	}
	if p.owned {
		errs = append(errs, p.rdb.Close())
	}
	return errors.Join(errs...)
}
