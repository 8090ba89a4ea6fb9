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
// the namespace), kept beside each key so that a renewal returns the lock's
// original token.
//
// Safety when Redis loses its data: the fencing counter never goes
// backwards. Before each INCR the acquire script raises the counter to
// Redis's own clock (TIME) in microseconds if it is below it, as mlockd
// floors its tokens with its start time, so a Redis that restarted without
// persistence (or a replica promoted without the latest writes) still gives
// tokens above every earlier one, as long as its clock does not go back and
// fewer than a million locks per second were taken on average. And the
// provider notices a restart or a failover: it remembers the run_id of the
// server (INFO server) under which each lock was taken, checks it after
// every renewal and, while it holds locks, at least every second; once it
// changes every lock taken before is reported lost at once (its Lease.Lost
// closes, its Renew returns false), since the new server may have granted
// it to someone else. The check needs a single Redis server or a sentinel
// failover client; on Redis Cluster (or a Ring) it is off.
//
// The Medusa mode (Options.Medusa, URL query mode=medusa) runs Medusa's own
// scripts instead, as Medusa ships them, for interoperability tests and as a
// benchmark baseline: see Options.Medusa.
//
// Importing the package registers the "redis" URL scheme with locking.Open:
//
//	p, err := locking.Open(ctx, "redis://localhost:6379/0?namespace=medusa_lock:")
//
// Caveats: waiters are not served in FIFO order (each retries when woken);
// tokens are large numbers (the microseconds of Redis's clock, then one more
// per lock); on Redis Cluster (a goredis.ClusterClient given to New) every
// key needs a hash tag, the same for the keys of one call ({cart:1}:a and
// {cart:1}:b), and tokens grow per hash tag (a counter in each tag's slot);
// a lock acquired without Expire never expires, as in Medusa.
package redis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/mlock-dev/mlock/locking"
	"github.com/mlock-dev/mlock/locking/provider"
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
//
//lint:ignore ST1005 Medusa's text, kept byte for byte
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
	// Medusa runs Medusa's own scripts, as Medusa ships them, one key per
	// script call: acquire is SET NX (EX in whole seconds, rounded up) in
	// Lua, with Medusa's re-entry for the same owner only without
	// AwaitQueue; release is GET + DEL in Lua; Renew is Medusa's
	// extendLock (GET + EXPIRE). No wake-up PUBLISH, no fencing INCR:
	// tokens are 0 (so no floor), no restart detection (Lease.Lost is
	// nil). Waiters poll with Medusa's backoff, one delay shared
	// by the keys of a call; the keys of a call are tried together, each
	// try one pipeline, and a failed multi-key acquisition keeps the keys
	// it took (until their TTL), as Medusa's acquire does. Use it to
	// measure Medusa's Redis load or to test interop; it does not pass
	// the conformance suite (no atomic multi-key acquire). ReleaseAll runs
	// the owner-checked release per key in both modes.
	Medusa bool
}

// Provider implements locking.Provider on Redis. Create it with New, Open or
// OpenURL; it is safe for concurrent use.
type Provider struct {
	rdb     goredis.UniversalClient
	owned   bool
	opts    Options
	fence   string // counter key for fencing tokens (on Redis Cluster: one per hash tag, see fenceKey)
	channel string // release notifications
	cluster bool   // rdb is a Redis Cluster client: every call's keys need one hash tag

	mu      sync.Mutex
	wake    chan struct{} // guarded by mu: closed and replaced on every release message
	sub     *goredis.PubSub
	subDone chan struct{}
	closed  bool

	// The restart detector (see the package documentation); nil when off.
	watch *runWatch
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
// backoffFactor, wake=false (NoWake) and mode=medusa (Medusa).
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
			o.WaitLockingTimeout, err = provider.ParseDuration(v)
		case "defaultRetryInterval":
			o.DefaultRetryInterval, err = provider.ParseDuration(v)
		case "maximumRetryInterval":
			o.MaximumRetryInterval, err = provider.ParseDuration(v)
		case "backoffFactor":
			o.BackoffFactor, err = strconv.ParseFloat(v, 64)
		case "wake":
			o.NoWake = v == "false"
		case "mode":
			switch v {
			case "medusa":
				o.Medusa = true
			case "":
			default:
				err = fmt.Errorf("unknown mode %q (want medusa)", v)
			}
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
	p := &Provider{rdb: rdb, opts: o, fence: "mlock_fence:" + o.Namespace, channel: "mlock_release:" + o.Namespace,
		wake: make(chan struct{})}
	if c, single := rdb.(*goredis.Client); single && !o.Medusa {
		p.watch = newRunWatch(func(ctx context.Context) (string, error) { return runID(ctx, c) })
	}
	_, p.cluster = rdb.(*goredis.ClusterClient)
	return p, nil
}

// hashTag returns what Redis Cluster hashes of key k: the text between its
// first '{' and the first '}' after it, if not empty; "" if k has none.
func hashTag(k string) string {
	if i := strings.IndexByte(k, '{'); i >= 0 {
		if j := strings.IndexByte(k[i+1:], '}'); j > 0 {
			return k[i+1 : i+1+j]
		}
	}
	return ""
}

// clusterTag returns, on Redis Cluster, the one hash tag of the Redis keys
// of keys, which every script of a call needs (its token keys and fencing
// counter go in that slot with them); an error if a key has none or the
// keys have several. "" when not on Redis Cluster.
func (p *Provider) clusterTag(keys []string) (string, error) {
	if !p.cluster {
		return "", nil
	}
	tag := hashTag(p.opts.Namespace + keys[0])
	for _, k := range keys {
		if t := hashTag(p.opts.Namespace + k); t == "" || t != tag {
			return "", fmt.Errorf("redis provider: on Redis Cluster the keys of one call need one hash tag, "+
				"such as {cart:1}:a and {cart:1}:b: %q", k)
		}
	}
	return tag, nil
}

// fenceKey is the fencing counter of the keys whose hash tag is tag: the
// provider's one counter, or on Redis Cluster one per hash tag, in the
// keys' slot (tokens then grow per hash tag, which is all that fencing a
// key needs).
func (p *Provider) fenceKey(tag string) string {
	if tag == "" {
		return p.fence
	}
	return "{" + tag + "}" + p.fence
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

// tokenPrefix names the key beside each lock key that keeps the fencing
// token of the lock: tokenPrefix + namespace + key. Medusa never reads it.
const tokenPrefix = "mlock_fence_tok:"

var (
	// acquireScript takes every key or none. KEYS: the n lock keys, their
	// n token keys, then the fence counter. ARGV: owner, ttl in ms (0:
	// none). Reply {1, token} when taken; {2, token} when the owner
	// already held exactly these keys (a renewal: the lease is renewed and
	// token is the lock's original one, or a new one if the keys did not
	// share one token); {0, i} when key i is held by someone else; {3, i}
	// when the owner holds key i but not all of the keys (refused at once,
	// also with AwaitQueue: waiting would wait behind itself, as on the
	// other providers). A token key mirrors its lock key's
	// TTL. A new token is the counter raised to Redis's TIME in
	// microseconds if below it, plus one: it never goes backwards, even
	// after Redis lost the counter (TIME before writes is allowed: scripts
	// replicate their effects since Redis 5, and only so since 7).
	acquireScript = goredis.NewScript(`
local owner = ARGV[1]
local ttl = tonumber(ARGV[2])
local n = (#KEYS - 1) / 2
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
  return {3, first_own}
end
local token, kind = false, 1
if own == n then
  kind = 2
  token = redis.call('GET', KEYS[n + 1])
  for i = 2, n do
    if redis.call('GET', KEYS[n + i]) ~= token then token = false end
  end
end
if not token then
  local fence = KEYS[2 * n + 1]
  local t = redis.call('TIME')
  local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  if (tonumber(redis.call('GET', fence)) or 0) < now_us then
    redis.call('SET', fence, string.format('%d', now_us))
  end
  token = redis.call('INCR', fence)
end
for i = 1, n do
  if ttl > 0 then
    redis.call('SET', KEYS[i], owner, 'PX', ttl)
  else
    redis.call('SET', KEYS[i], owner, 'KEEPTTL')
  end
  local pttl = redis.call('PTTL', KEYS[i])
  if pttl > 0 then
    redis.call('SET', KEYS[n + i], token, 'PX', pttl)
  else
    redis.call('SET', KEYS[n + i], token)
  end
end
return {kind, tonumber(token)}
`)
	// renewScript resets the lease of keys all held by owner. KEYS: the n
	// lock keys, then their n token keys. ARGV: owner, ttl in ms (0: no
	// expiry). Reply 1, or 0 if one is not owner's.
	renewScript = goredis.NewScript(`
local n = #KEYS / 2
for i = 1, n do
  if redis.call('GET', KEYS[i]) ~= ARGV[1] then return 0 end
end
local ttl = tonumber(ARGV[2])
for i = 1, #KEYS do
  if ttl > 0 then redis.call('PEXPIRE', KEYS[i], ttl) else redis.call('PERSIST', KEYS[i]) end
end
return 1
`)
	// releaseScript unlinks the keys held by owner, with their token keys,
	// and, if it removed any, publishes on the release channel. KEYS: the n
	// lock keys, then their n token keys. ARGV: owner, channel. Reply: the
	// number removed.
	releaseScript = goredis.NewScript(`
local n, removed = #KEYS / 2, 0
for i = 1, n do
  if redis.call('GET', KEYS[i]) == ARGV[1] then
    redis.call('UNLINK', KEYS[i], KEYS[n + i])
    removed = removed + 1
  end
end
if removed > 0 then redis.call('PUBLISH', ARGV[2], '1') end
return removed
`)
)

// Medusa's scripts, as its locking-redis provider ships them (one key each).
var (
	// medusaAcquire: KEYS[1]; ARGV: owner, ttl in seconds (0: none),
	// awaitQueue ("true"/"false"). Reply 1 (taken or re-entered) or 0.
	medusaAcquire = goredis.NewScript(`
local ok
if tonumber(ARGV[2]) > 0 then
  ok = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2])
else
  ok = redis.call('SET', KEYS[1], ARGV[1], 'NX')
end
if ok then return 1 end
if ARGV[3] == 'false' then
  local cur = redis.call('GET', KEYS[1])
  if cur == '*' then return 0 end
  if cur == ARGV[1] then
    if tonumber(ARGV[2]) > 0 then
      redis.call('SET', KEYS[1], ARGV[1], 'XX', 'EX', ARGV[2])
    else
      redis.call('SET', KEYS[1], ARGV[1], 'XX')
    end
    return 1
  end
end
return 0
`)
	// medusaRelease: KEYS[1]; ARGV: owner. Reply 1 if deleted, else 0.
	medusaRelease = goredis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)
	// medusaExtend: KEYS[1]; ARGV: owner, ttl in seconds. Reply 1 if
	// extended, else 0.
	medusaExtend = goredis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('EXPIRE', KEYS[1], ARGV[2])
end
return 0
`)
)

// lockKeys returns the Redis keys of keys: the n lock keys, then their n
// token keys, with room for extra more.
func (p *Provider) lockKeys(keys []string, extra int) []string {
	n := len(keys)
	out := make([]string, 2*n, 2*n+extra)
	for i, k := range keys {
		out[i] = p.opts.Namespace + k
		out[n+i] = tokenPrefix + out[i]
	}
	return out
}

func ttlMs(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return max(d.Milliseconds(), 1)
}

// medusaSeconds is Medusa's ttl argument: whole seconds, at least 1; 0 for
// no expiry.
func medusaSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// runEach runs s once per group of KEYS with args, in one pipeline for
// several groups, and returns the integer replies.
func (p *Provider) runEach(ctx context.Context, s *goredis.Script, groups [][]string, args ...any) ([]int64, error) {
	if len(groups) == 1 {
		n, err := s.Run(ctx, p.rdb, groups[0], args...).Int64()
		return []int64{n}, err
	}
	for try := 0; ; try++ {
		cmds := make([]*goredis.Cmd, len(groups))
		_, err := p.rdb.Pipelined(ctx, func(pipe goredis.Pipeliner) error {
			for i, g := range groups {
				cmds[i] = s.EvalSha(ctx, pipe, g, args...)
			}
			return nil
		})
		if try == 0 && goredis.HasErrorPrefix(err, "NOSCRIPT") {
			if err := s.Load(ctx, p.rdb).Err(); err != nil {
				return nil, err
			}
			continue // the script cache was empty: load it and try again
		}
		if err != nil {
			return nil, err
		}
		out := make([]int64, len(groups))
		for i, c := range cmds {
			if out[i], err = c.Int64(); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
}

// singles returns one group per Redis key of keys (Medusa's scripts take
// one key each).
func (p *Provider) singles(keys []string) [][]string {
	out := make([][]string, len(keys))
	for i, k := range keys {
		out[i] = []string{p.opts.Namespace + k}
	}
	return out
}

// wakeChan returns the channel closed by the next release, starting the
// subscription on first use.
func (p *Provider) wakeChan() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.opts.NoWake || p.opts.Medusa || p.closed {
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

// sleep waits for the backoff's next delay, a wake-up or the end of ctx.
func sleep(ctx context.Context, b *Backoff, wake <-chan struct{}) error {
	t := time.NewTimer(b.Next(rand.Float64()))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return provider.WaitError(ctx)
	case <-t.C:
	case <-wake:
	}
	return nil
}

// Acquire takes every key or none; with AwaitQueue it retries with backoff,
// woken at once by releases. A renewal (the owner holding exactly keys)
// returns the lock's original token. In the Medusa mode, see
// Options.Medusa. See locking.Provider.
func (p *Provider) Acquire(ctx context.Context, keys []string, opts locking.AcquireOptions) (locking.Lease, error) {
	keys, err := provider.Keys(keys)
	if err != nil {
		return locking.Lease{}, err
	}
	owner := provider.Owner(opts.OwnerID)
	b := NewBackoff(p.opts.DefaultRetryInterval, p.opts.MaximumRetryInterval, p.opts.BackoffFactor)
	if p.opts.Medusa {
		return locking.Lease{}, p.acquireMedusa(ctx, keys, owner, opts, b)
	}
	tag, err := p.clusterTag(keys)
	if err != nil {
		return locking.Lease{}, err
	}
	rkeys := append(p.lockKeys(keys, 1), p.fenceKey(tag))
	ttl := ttlMs(opts.Expire)
	for {
		var wake <-chan struct{}
		if opts.AwaitQueue {
			wake = p.wakeChan() // before trying: a release after the try wakes us
		}
		sent := time.Now()
		var rid string
		if p.watch != nil {
			rid, err = p.watch.current(ctx) // read before the script: see runWatch.current
		}
		var res []int64
		if err == nil {
			res, err = acquireScript.Run(ctx, p.rdb, rkeys, owner, ttl).Int64Slice()
		}
		if err != nil {
			if ctx.Err() != nil {
				return locking.Lease{}, provider.WaitError(ctx)
			}
			return locking.Lease{}, err
		}
		if res[0] == 3 {
			return locking.Lease{}, provider.ConflictError(keys[res[1]-1])
		}
		if res[0] != 0 {
			l := locking.Lease{Token: uint64(res[1]), Sent: sent}
			if ttl > 0 {
				l.ExpiresAt = sent.Add(time.Duration(ttl) * time.Millisecond)
			}
			if p.watch != nil {
				l.Lost = p.watch.track(owner, keys, rid, opts.Expire, sent)
			}
			return l, nil
		}
		if !opts.AwaitQueue {
			return locking.Lease{}, provider.ConflictError(keys[res[1]-1])
		}
		if err := sleep(ctx, b, wake); err != nil {
			return locking.Lease{}, err
		}
	}
}

// acquireMedusa is Acquire in the Medusa mode.
func (p *Provider) acquireMedusa(ctx context.Context, keys []string, owner string, opts locking.AcquireOptions, b *Backoff) error {
	pending, names := p.singles(keys), keys
	secs, await := medusaSeconds(opts.Expire), strconv.FormatBool(opts.AwaitQueue)
	for {
		res, err := p.runEach(ctx, medusaAcquire, pending, owner, secs, await)
		if err != nil {
			if ctx.Err() != nil {
				return provider.WaitError(ctx)
			}
			return err
		}
		var left [][]string
		var leftNames []string
		for i, n := range res {
			if n != 1 {
				left, leftNames = append(left, pending[i]), append(leftNames, names[i])
			}
		}
		if len(left) == 0 {
			return nil
		}
		if !opts.AwaitQueue {
			return provider.ConflictError(leftNames[0])
		}
		pending, names = left, leftNames
		if err := sleep(ctx, b, nil); err != nil {
			return err
		}
	}
}

// Renew resets the lease of owner's lock on keys; false if owner does not
// hold every key, or if the lock was taken by this provider before Redis
// restarted or failed over (its run_id, read after the renewal, changed
// since the acquisition). See locking.Provider.
func (p *Provider) Renew(ctx context.Context, keys []string, owner string, expire time.Duration) (bool, error) {
	keys, err := provider.Keys(keys)
	if err != nil {
		return false, err
	}
	owner = provider.Owner(owner)
	if p.opts.Medusa {
		if expire <= 0 {
			// EXPIRE cannot mean "no expiry": only check the owner.
			vals, err := p.rdb.MGet(ctx, p.lockKeys(keys, 0)[:len(keys)]...).Result()
			if err != nil {
				return false, err
			}
			for _, v := range vals {
				if v != owner {
					return false, nil
				}
			}
			return true, nil
		}
		res, err := p.runEach(ctx, medusaExtend, p.singles(keys), owner, medusaSeconds(expire))
		if err != nil {
			return false, err
		}
		return !slices.Contains(res, 0), nil
	}
	if _, err := p.clusterTag(keys); err != nil {
		return false, err
	}
	sent := time.Now()
	n, err := renewScript.Run(ctx, p.rdb, p.lockKeys(keys, 0), owner, ttlMs(expire)).Int64()
	if err != nil || p.watch == nil {
		return n == 1, err
	}
	// The run_id after the renewal: unchanged since the acquisition means
	// the renewal ran on the server that granted the lock.
	if err := p.watch.check(ctx); err != nil {
		return false, err
	}
	return p.watch.renewed(owner, keys, expire, sent) && n == 1, nil
}

// Release deletes the keys held by the owner and wakes the waiters; true
// only if every key was the owner's. See locking.Provider.
func (p *Provider) Release(ctx context.Context, keys []string, opts locking.ReleaseOptions) (bool, error) {
	keys, err := provider.Keys(keys)
	if err != nil {
		return false, err
	}
	owner := provider.Owner(opts.OwnerID)
	if p.opts.Medusa {
		res, err := p.runEach(ctx, medusaRelease, p.singles(keys), owner)
		if err != nil {
			return false, err
		}
		return !slices.Contains(res, 0), nil
	}
	if _, err := p.clusterTag(keys); err != nil {
		return false, err
	}
	n, err := releaseScript.Run(ctx, p.rdb, p.lockKeys(keys, 0), owner, p.channel).Int64()
	if p.watch != nil {
		p.watch.forget(owner, keys)
	}
	return err == nil && n == int64(len(keys)), err
}

// ReleaseAll releases every key of the namespace held by the owner
// (without owner: the anonymous "*" locks): SCAN (on every master of a
// Redis Cluster), then, in one pipeline per batch, the release script
// (owner check and UNLINK in one atomic step) on each key.
func (p *Provider) ReleaseAll(ctx context.Context, opts locking.ReleaseOptions) error {
	owner := provider.Owner(opts.OwnerID)
	if p.watch != nil {
		p.watch.forget(owner, nil)
	}
	if c, ok := p.rdb.(*goredis.ClusterClient); ok {
		return c.ForEachMaster(ctx, func(ctx context.Context, node *goredis.Client) error {
			return p.releaseAllOn(ctx, node, owner)
		})
	}
	return p.releaseAllOn(ctx, p.rdb, owner)
}

// releaseAllOn is ReleaseAll over the keys that node's SCAN finds.
func (p *Provider) releaseAllOn(ctx context.Context, node goredis.Cmdable, owner string) error {
	match := globEscape(p.opts.Namespace) + "*"
	var cursor uint64
	for {
		keys, next, err := node.Scan(ctx, cursor, match, 100).Result()
		if err != nil {
			return err
		}
		var groups [][]string
		for _, k := range keys {
			switch {
			case strings.HasPrefix(k, tokenPrefix) || k == p.fence || strings.HasSuffix(k, "}"+p.fence):
			case p.opts.Medusa:
				groups = append(groups, []string{k})
			default:
				groups = append(groups, []string{k, tokenPrefix + k})
			}
		}
		if len(groups) > 0 {
			script, args := releaseScript, []any{owner, p.channel}
			if p.opts.Medusa {
				script, args = medusaRelease, []any{owner}
			}
			if _, err := p.runEach(ctx, script, groups, args...); err != nil {
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

// DefaultTimeout is Execute's default wait: Options.WaitLockingTimeout. See
// locking.TimeoutDefaulter.
func (p *Provider) DefaultTimeout() time.Duration { return p.opts.WaitLockingTimeout }

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
	if p.watch != nil {
		p.watch.close()
	}
	if p.owned {
		errs = append(errs, p.rdb.Close())
	}
	return errors.Join(errs...)
}
