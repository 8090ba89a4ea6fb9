package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/mlock-dev/mlock"
)

// RWLock takes key shared (a read lock) or exclusive and returns the
// function that releases it. It is what the readheavy scenario runs.
type RWLock func(ctx context.Context, key string, shared bool) (unlock func(context.Context) error, err error)

// ExclusivePrefix, before a target's URL, runs the readheavy scenario on it
// with every lock exclusive: the baseline a read/write lock is measured
// against.
const ExclusivePrefix = "x:"

// OpenRW returns a target for the readheavy scenario: mlock:// (shared
// locks for the reads; with ExclusivePrefix, exclusive ones),
// redis://host:port/db (a read/write lock in Lua with Redisson's layout),
// or memory: (a sync.RWMutex per key, in-process). Hosts must be on
// loopback unless allowRemote.
func OpenRW(ctx context.Context, rawURL string, allowRemote bool) (Target, func(), error) {
	spec, exclusive := strings.CutPrefix(rawURL, ExclusivePrefix)
	u, err := url.Parse(spec)
	if err != nil {
		return Target{}, nil, err
	}
	switch u.Scheme {
	case "memory":
		return Target{Name: rawURL, RW: memoryRW(exclusive)}, func() {}, nil
	case "mlock", "mlocks":
		o, err := mlock.ParseURI(spec)
		if err != nil {
			return Target{}, nil, err
		}
		nodes := o.Addrs
		if len(nodes) == 0 {
			nodes = []string{hostPort(o)}
		}
		if !allowRemote {
			if err := checkNodes(nodes); err != nil {
				return Target{}, nil, err
			}
		}
		cpu, closeCPU, err := serverCPU(ctx, u, spec, nodes)
		if err != nil {
			return Target{}, nil, err
		}
		c, err := mlock.NewClient(o)
		if err != nil {
			closeCPU()
			return Target{}, nil, err
		}
		mode := mlock.Shared
		if exclusive {
			mode = mlock.Exclusive
		}
		rw := func(ctx context.Context, key string, shared bool) (func(context.Context) error, error) {
			lo := &mlock.LockOptions{TTL: time.Minute}
			if shared {
				lo.Mode = mode
			}
			l, err := c.Lock(ctx, key, lo)
			if err != nil {
				return nil, err
			}
			return l.Unlock, nil
		}
		return Target{Name: rawURL, RW: rw, ServerCPU: cpu}, func() { c.Close(); closeCPU() }, nil
	case "redis":
		if exclusive {
			return Target{}, nil, errors.New("bench: " + ExclusivePrefix + " is for mlock:// and memory: targets")
		}
		if !allowRemote {
			if err := checkLoopback(u.Hostname()); err != nil {
				return Target{}, nil, err
			}
		}
		cpu, closeCPU, err := serverCPU(ctx, u, spec, nil)
		if err != nil {
			return Target{}, nil, err
		}
		rw, closeRW, err := redisRW(ctx, spec)
		if err != nil {
			closeCPU()
			return Target{}, nil, err
		}
		return Target{Name: rawURL, RW: rw, ServerCPU: cpu}, func() { closeRW(); closeCPU() }, nil
	}
	return Target{}, nil, fmt.Errorf("bench: the readheavy scenario runs on mlock://, redis:// or memory:, not %s", u.Scheme)
}

func hostPort(o mlock.Options) string {
	h := o.Host
	if h == "" {
		h = mlock.DefaultHost
	}
	p := o.Port
	if p == 0 {
		p = mlock.DefaultPort
	}
	return h + ":" + strconv.Itoa(p)
}

func checkNodes(nodes []string) error {
	for _, n := range nodes {
		h := n
		if i := strings.LastIndexByte(n, ':'); i >= 0 {
			h = strings.Trim(n[:i], "[]")
		}
		if err := checkLoopback(h); err != nil {
			return err
		}
	}
	return nil
}

// memoryRW is an in-process read/write lock per key (sync.RWMutex, which
// blocks new readers while a writer waits).
func memoryRW(exclusive bool) RWLock {
	var mu sync.Mutex
	locks := map[string]*sync.RWMutex{}
	return func(ctx context.Context, key string, shared bool) (func(context.Context) error, error) {
		mu.Lock()
		l := locks[key]
		if l == nil {
			l = new(sync.RWMutex)
			locks[key] = l
		}
		mu.Unlock()
		if shared && !exclusive {
			l.RLock()
			return func(context.Context) error { l.RUnlock(); return nil }, nil
		}
		l.Lock()
		return func(context.Context) error { l.Unlock(); return nil }, nil
	}
}

// The read/write lock in Redis, laid out as Redisson's RReadWriteLock: a
// hash per lock whose field "mode" is "read" or "write" and whose other
// fields are the holders (a hold count each), with one expiry for the
// hash, and a message on a channel when the last holder leaves. A reader
// joins whenever the mode is read, even while a writer waits (Redisson's
// lock is not fair). Unlike Redisson, readers do not keep timeouts of
// their own: the hash lives as long as its longest lease.
var (
	rwAcquire = goredis.NewScript(`
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  redis.call('hset', KEYS[1], 'mode', ARGV[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[3])
  return nil
end
if ARGV[1] == 'read' and mode == 'read' then
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  local ttl = redis.call('pttl', KEYS[1])
  redis.call('pexpire', KEYS[1], math.max(ttl, tonumber(ARGV[3])))
  return nil
end
return redis.call('pttl', KEYS[1])`)
	rwRelease = goredis.NewScript(`
if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
  return 0
end
if redis.call('hincrby', KEYS[1], ARGV[1], -1) <= 0 then
  redis.call('hdel', KEYS[1], ARGV[1])
end
if redis.call('hlen', KEYS[1]) <= 1 then
  redis.call('del', KEYS[1])
  redis.call('publish', KEYS[2], 0)
end
return 1`)
)

// redisRW returns the Redis read/write lock on rawURL's database. A waiter
// tries, and on failure waits for the release message of its key (or its
// lock's remaining time, at most 100 ms) and tries again, as Redisson's
// lock does.
func redisRW(ctx context.Context, rawURL string) (RWLock, func(), error) {
	u, _ := url.Parse(rawURL)
	u.RawQuery = ""
	ro, err := goredis.ParseURL(u.String())
	if err != nil {
		return nil, nil, err
	}
	ro.PoolSize = max(ro.PoolSize, 64)
	rdb := goredis.NewClient(ro)
	prefix := fmt.Sprintf("mlockbench:rw:%x:", rand.Uint32())
	ps := rdb.PSubscribe(ctx, prefix+"*:ch")
	if _, err := ps.Receive(ctx); err != nil {
		rdb.Close()
		return nil, nil, err
	}
	var mu sync.Mutex
	wake := map[string]chan struct{}{} // per channel, closed by its next message
	wakeOf := func(ch string) chan struct{} {
		mu.Lock()
		defer mu.Unlock()
		w := wake[ch]
		if w == nil {
			w = make(chan struct{})
			wake[ch] = w
		}
		return w
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range ps.Channel() {
			mu.Lock()
			if w := wake[m.Channel]; w != nil {
				close(w)
				delete(wake, m.Channel)
			}
			mu.Unlock()
		}
	}()
	var ids atomic.Int64
	rw := func(ctx context.Context, key string, shared bool) (func(context.Context) error, error) {
		k, ch := prefix+key, prefix+key+":ch"
		mode := "write"
		if shared {
			mode = "read"
		}
		id := strconv.FormatInt(ids.Add(1), 10)
		for {
			w := wakeOf(ch)
			ttl, err := rwAcquire.Run(ctx, rdb, []string{k}, mode, id, 60_000).Int64()
			if errors.Is(err, goredis.Nil) {
				return func(ctx context.Context) error {
					n, err := rwRelease.Run(ctx, rdb, []string{k, ch}, id).Int64()
					if err == nil && n != 1 {
						err = errors.New("bench: redis read/write lock not held at release")
					}
					return err
				}, nil
			}
			if err != nil {
				return nil, err
			}
			t := time.NewTimer(time.Duration(min(max(ttl, 1), 100)) * time.Millisecond)
			select {
			case <-w:
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil, ctx.Err()
			}
			t.Stop()
		}
	}
	return rw, func() { ps.Close(); <-done; rdb.Close() }, nil
}
