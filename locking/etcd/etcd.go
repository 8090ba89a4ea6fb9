// Package etcd is the locking provider backed by etcd 3.x: one
// concurrency.Mutex of the etcd client per key, held under a
// concurrency.Session (an etcd lease kept alive by the session).
//
// Importing the package registers the "etcd" URL scheme with locking.Open:
//
//	p, err := locking.Open(ctx, "etcd://127.0.0.1:2379,127.0.0.2:2379?prefix=mlock/")
//
// # Leases and Expire
//
// etcd sessions renew themselves: a lock lives on an etcd lease that the
// session keeps alive (a keep-alive every third of its TTL) for as long as
// the provider is open, so a lock is held until it is released, whatever
// its Expire. AcquireOptions.Expire is the TTL of that lease, rounded up to
// whole seconds (etcd raises a TTL below its own minimum, 2 s by default;
// Expire 0: 60 s): how long the locks outlive a process that died or lost
// etcd. Renew (and so locking.Execute's watchdog, every Expire/3) refreshes
// the lease once more (LeaseKeepAliveOnce, sent no earlier than the Renew
// call, so the lease runs at least TTL from then) and checks that the owner
// is still the holder of every key. Lease.Lost is the session's Done
// channel: it closes when the lease is lost (expired, revoked).
//
// # Owners
//
// Each owner of a Provider has an etcd session of its own (two owners never
// share a lease: a concurrency.Mutex takes whoever has the lease as its
// holder). The owner's first acquisition picks the session, and so the TTL:
// later acquisitions by the same owner use the same lease while it holds
// anything (their Lease.TTL says so when it is shorter than their Expire,
// and locking.Execute's watchdog keeps to it). A session whose owner holds nothing is kept for the owner's next
// acquisition and given to another owner once 64 such are idle. Anonymous
// acquisitions (no owner: "*", never re-entrant) each get a session of
// their own. Sessions beside the locks, each session records its owner
// under prefix + "owner/" + owner + "|" + lease (attached to the lease), so
// Release, ReleaseAll and Renew work for the owner from any process.
// Re-entry works within one Provider: the same owner acquiring exactly the
// keys it holds renews them and returns the original token; an owner
// acquiring some of the keys it holds conflicts on the first of them. A
// second Provider (another process) with the same owner id cannot re-enter:
// it waits or conflicts like another owner. The acquisitions of one owner
// through one Provider run one at a time.
//
// # Several keys
//
// etcd's mutex has no atomic multi-key acquire. Acquire takes the keys one
// mutex at a time in sorted order, so two callers never deadlock, and on
// failure (a busy key without AwaitQueue, the end of ctx) deletes its keys
// again, so nothing stays held. But a caller waiting for a later key holds
// the earlier ones meanwhile (mlockd grants a set in one step, and so never
// blocks anyone with a set it cannot complete).
//
// # Layout and tokens
//
// The mutex of key k is prefix + "lock/" + k (its entries are
// prefix + "lock/" + k + "/" + lease in hex, the oldest being the holder).
// The fencing token of an acquisition is the etcd revision at which its
// last key was granted: it grows with every acquisition of a key.
//
// The provider is safe for concurrent use. Close revokes its leases, which
// releases every lock it holds.
package etcd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/mlock-dev/mlock/locking"
	"github.com/mlock-dev/mlock/locking/provider"
)

func init() {
	locking.RegisterScheme("etcd", func(ctx context.Context, u *url.URL) (locking.Provider, error) {
		return OpenURL(u.String())
	})
}

// Defaults.
const (
	// DefaultPrefix is put before every etcd key of the provider.
	DefaultPrefix = "mlock/"
	// DefaultEndpoint is the etcd client URL used when none is given.
	DefaultEndpoint = "127.0.0.1:2379"
	// DefaultDialTimeout bounds the connection to etcd.
	DefaultDialTimeout = 5 * time.Second
	// DefaultTTL is the lease TTL of an acquisition without Expire.
	DefaultTTL = 60 * time.Second
	// maxSpare is how many sessions of one TTL whose owner holds nothing
	// are kept bound to their owner before they go to other owners.
	maxSpare = 64
	// cleanupTimeout bounds the clean-up after a failed acquisition and
	// the revocations of Close.
	cleanupTimeout = 5 * time.Second
)

// Options configure a provider. Zero fields take the defaults.
type Options struct {
	// Endpoints are etcd client addresses, host:port or URLs.
	// Default 127.0.0.1:2379.
	Endpoints []string
	// Prefix is put before every key. Default "mlock/".
	Prefix string
	// DialTimeout bounds the connection to etcd, and the steps of an
	// acquisition that do not wait for a lock (its lease grant, its owner
	// record): an etcd that cannot be reached fails the acquisition after
	// it. Default 5 s.
	DialTimeout time.Duration
	// Username and Password authenticate to etcd, if set.
	Username, Password string
}

// Provider implements locking.Provider on etcd. Create it with Open,
// OpenURL or New; it is safe for concurrent use.
type Provider struct {
	cli         *clientv3.Client
	owned       bool
	prefix      string
	dialTimeout time.Duration // bounds the calls that only wait for etcd (see short)

	mu      sync.Mutex
	closed  bool                          // guarded by mu
	owners  map[string]*session           // guarded by mu: named owner -> its session
	free    map[int64][]*session          // guarded by mu: unbound sessions by TTL (s)
	spare   map[int64][]*session          // guarded by mu: bound sessions holding nothing, oldest first
	byLease map[clientv3.LeaseID]*session // guarded by mu: every session
	wg      sync.WaitGroup                // background session closes
}

// session is one etcd lease with the locks of one owner.
type session struct {
	s   *concurrency.Session
	ttl int64
	sem chan struct{} // one acquisition at a time

	owner    string           // guarded by Provider.mu: "" when unbound
	recorded string           // the owner recorded in etcd; only under sem
	held     map[string]int64 // guarded by Provider.mu: held key -> token
	busy     int              // guarded by Provider.mu: acquisitions in flight
}

// Open connects to etcd.
func Open(o Options) (*Provider, error) {
	if len(o.Endpoints) == 0 {
		o.Endpoints = []string{DefaultEndpoint}
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = DefaultDialTimeout
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: o.Endpoints, DialTimeout: o.DialTimeout,
		Username: o.Username, Password: o.Password, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("etcd provider: %w", err)
	}
	p := New(cli, o.Prefix)
	p.owned, p.dialTimeout = true, o.DialTimeout
	return p, nil
}

// OpenURL opens a provider from etcd://host:port[,host:port...]?prefix=...
// (query: prefix, dialTimeout as a duration or milliseconds; user:password@
// for authentication). A host without a port gets 2379 (the last host of a
// list needs its port, for the URL parser); no host: 127.0.0.1:2379.
func OpenURL(raw string) (*Provider, error) {
	o, err := ParseURL(raw)
	if err != nil {
		return nil, err
	}
	return Open(o)
}

// ParseURL reads the options of an etcd:// URL (see OpenURL).
func ParseURL(raw string) (Options, error) {
	var o Options
	u, err := url.Parse(raw)
	if err != nil {
		return o, err
	}
	if u.Scheme != "etcd" {
		return o, fmt.Errorf("etcd provider URL: scheme %q, want etcd", u.Scheme)
	}
	if u.Path != "" && u.Path != "/" {
		return o, fmt.Errorf("etcd provider URL: unexpected path %q (use ?prefix=)", u.Path)
	}
	for _, h := range strings.Split(u.Host, ",") {
		if h == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(h); err != nil {
			h = net.JoinHostPort(strings.Trim(h, "[]"), "2379")
		}
		o.Endpoints = append(o.Endpoints, h)
	}
	if u.User != nil {
		o.Username = u.User.Username()
		o.Password, _ = u.User.Password()
	}
	for k, vs := range u.Query() {
		v := vs[len(vs)-1]
		switch k {
		case "prefix":
			o.Prefix = v
		case "dialTimeout":
			if o.DialTimeout, err = provider.ParseDuration(v); err != nil {
				return o, fmt.Errorf("etcd provider URL: dialTimeout: %w", err)
			}
		default:
			return o, fmt.Errorf("etcd provider URL: unknown option %q (want prefix or dialTimeout)", k)
		}
	}
	return o, nil
}

// Endpoints returns the etcd endpoints of an etcd:// URL (see OpenURL).
func Endpoints(raw string) ([]string, error) {
	o, err := ParseURL(raw)
	if err != nil {
		return nil, err
	}
	if len(o.Endpoints) == 0 {
		return []string{DefaultEndpoint}, nil
	}
	return o.Endpoints, nil
}

// New returns a provider using cli with keys under prefix ("": "mlock/").
// Close does not close cli.
func New(cli *clientv3.Client, prefix string) *Provider {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return &Provider{cli: cli, prefix: prefix, dialTimeout: DefaultDialTimeout, owners: map[string]*session{},
		free: map[int64][]*session{}, spare: map[int64][]*session{}, byLease: map[clientv3.LeaseID]*session{}}
}

// errNoAnswer is the cause of a short call's deadline (see short).
var errNoAnswer = errors.New("no answer")

// short bounds a call that never waits for a lock (a lease grant, an owner
// record) by the dial timeout: the etcd client waits for a connection as
// long as the call's context allows, so an etcd that cannot be reached
// would keep an acquisition without a deadline waiting for ever.
func (p *Provider) short(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(ctx, p.dialTimeout, errNoAnswer)
}

func (p *Provider) lockPrefix(key string) string { return p.prefix + "lock/" + key }

func (p *Provider) mutexKey(key string, l clientv3.LeaseID) string {
	return fmt.Sprintf("%s/%x", p.lockPrefix(key), int64(l))
}

func (p *Provider) ownerPrefix(owner string) string { return p.prefix + "owner/" + owner + "|" }

func (p *Provider) ownerKey(owner string, l clientv3.LeaseID) string {
	return fmt.Sprintf("%s%x", p.ownerPrefix(owner), int64(l))
}

// ttlSeconds is the lease TTL for expire: whole seconds, rounded up.
func ttlSeconds(expire time.Duration) int64 {
	if expire <= 0 {
		expire = DefaultTTL
	}
	return int64((expire + time.Second - 1) / time.Second)
}

func dead(s *session) bool {
	select {
	case <-s.s.Done():
		return true
	default:
		return false
	}
}

func closedError() error {
	return &locking.Error{Kind: locking.ErrClosed, Msg: "etcd provider: closed"}
}

// bind returns the session for one acquisition by owner, counted busy.
func (p *Provider) bind(ctx context.Context, owner string, ttl int64) (*session, error) {
	p.mu.Lock()
	for {
		if p.closed {
			p.mu.Unlock()
			return nil, closedError()
		}
		if owner != locking.AnonymousOwner {
			if s := p.owners[owner]; s != nil {
				if dead(s) {
					p.dropLocked(s)
					continue
				}
				p.unspareLocked(s)
				s.busy++
				p.mu.Unlock()
				return s, nil
			}
		}
		s := p.takeLocked(owner, ttl)
		if s == nil {
			break
		}
		if dead(s) {
			p.dropLocked(s)
			continue
		}
		p.bindLocked(s, owner)
		p.mu.Unlock()
		return s, nil
	}
	p.mu.Unlock()
	// The grant obeys ctx (and the dial timeout); the keep-alive lives as
	// long as the client.
	gctx, cancel := p.short(ctx)
	g, err := p.cli.Grant(gctx, ttl)
	if err != nil {
		err = p.shortError(ctx, gctx, err)
		cancel()
		return nil, err
	}
	cancel()
	cs, err := concurrency.NewSession(p.cli, concurrency.WithLease(g.ID), concurrency.WithTTL(int(ttl)))
	if err != nil {
		return nil, p.callError(ctx, err)
	}
	s := &session{s: cs, ttl: ttl, sem: make(chan struct{}, 1), held: map[string]int64{}}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		p.closeAsync(s)
		return nil, closedError()
	}
	p.byLease[cs.Lease()] = s
	if other := p.owners[owner]; other != nil && owner != locking.AnonymousOwner && !dead(other) {
		// Another acquisition by owner bound a session meanwhile.
		p.free[ttl] = append(p.free[ttl], s)
		p.unspareLocked(other)
		other.busy++
		return other, nil
	}
	p.bindLocked(s, owner)
	return s, nil
}

// takeLocked returns a session for a new binding: an idle one already
// recorded for owner, an unbound one, or the oldest idle one when maxSpare
// are idle; nil if a new one is needed.
func (p *Provider) takeLocked(owner string, ttl int64) *session {
	spare := p.spare[ttl]
	for i := len(spare) - 1; i >= 0; i-- {
		if spare[i].owner == owner { // only the anonymous owner gets here
			s := spare[i]
			p.spare[ttl] = append(spare[:i:i], spare[i+1:]...)
			return s
		}
	}
	if free := p.free[ttl]; len(free) > 0 {
		s := free[len(free)-1]
		p.free[ttl] = free[:len(free)-1]
		return s
	}
	if len(spare) >= maxSpare {
		s := spare[0]
		p.spare[ttl] = spare[1:]
		return s
	}
	return nil
}

func (p *Provider) bindLocked(s *session, owner string) {
	if s.owner != "" && s.owner != locking.AnonymousOwner && p.owners[s.owner] == s {
		delete(p.owners, s.owner)
	}
	s.owner = owner
	if owner != locking.AnonymousOwner {
		p.owners[owner] = s
	}
	s.busy++
}

func (p *Provider) unspareLocked(s *session) {
	list := p.spare[s.ttl]
	for i, x := range list {
		if x == s {
			p.spare[s.ttl] = append(list[:i:i], list[i+1:]...)
			return
		}
	}
}

// idleLocked files s as spare if it holds nothing and nothing is in flight.
func (p *Provider) idleLocked(s *session) {
	if s.busy > 0 || len(s.held) > 0 || p.byLease[s.s.Lease()] != s {
		return
	}
	if dead(s) {
		p.dropLocked(s)
		return
	}
	p.unspareLocked(s)
	p.spare[s.ttl] = append(p.spare[s.ttl], s)
}

// dropLocked forgets s and closes it in the background.
func (p *Provider) dropLocked(s *session) {
	if p.owners[s.owner] == s {
		delete(p.owners, s.owner)
	}
	p.unspareLocked(s)
	for i, x := range p.free[s.ttl] {
		if x == s {
			p.free[s.ttl] = append(p.free[s.ttl][:i:i], p.free[s.ttl][i+1:]...)
			break
		}
	}
	if p.byLease[s.s.Lease()] == s {
		delete(p.byLease, s.s.Lease())
		p.closeAsync(s)
	}
}

// closeAsync stops s's keep-alive and revokes its lease.
func (p *Provider) closeAsync(s *session) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.revoke(s)
	}()
}

func (p *Provider) revoke(s *session) {
	s.s.Orphan()
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	_, _ = p.cli.Revoke(ctx, s.s.Lease())
}

// done ends one acquisition on s: held (key -> token) are now held.
func (p *Provider) done(s *session, held map[string]int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, t := range held {
		s.held[k] = t
	}
	s.busy--
	p.idleLocked(s)
}

// record writes s's owner record if it is not written yet; under s.sem.
func (p *Provider) record(ctx context.Context, s *session) error {
	p.mu.Lock()
	owner := s.owner
	p.mu.Unlock()
	if s.recorded == owner {
		return nil
	}
	ops := []clientv3.Op{clientv3.OpPut(p.ownerKey(owner, s.s.Lease()), owner, clientv3.WithLease(s.s.Lease()))}
	if s.recorded != "" {
		ops = append(ops, clientv3.OpDelete(p.ownerKey(s.recorded, s.s.Lease())))
	}
	if _, err := p.cli.Txn(ctx).Then(ops...).Commit(); err != nil {
		return err
	}
	s.recorded = owner
	return nil
}

// Acquire takes every key for opts.OwnerID, one etcd mutex at a time in
// sorted order (see the package documentation): with AwaitQueue it waits
// in each mutex's queue as long as ctx allows, else a busy key fails at once
// with locking.ErrConflict. On failure the keys taken are deleted again.
// The owner holding exactly keys renews instead, with the original token.
// See locking.Provider.
func (p *Provider) Acquire(ctx context.Context, keys []string, opts locking.AcquireOptions) (locking.Lease, error) {
	keys, err := provider.Keys(keys)
	if err != nil {
		return locking.Lease{}, err
	}
	owner := provider.Owner(opts.OwnerID)
	sent := time.Now()
	s, err := p.bind(ctx, owner, ttlSeconds(opts.Expire))
	if err != nil {
		return locking.Lease{}, err
	}
	var held map[string]int64
	defer func() { p.done(s, held) }()
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return locking.Lease{}, provider.WaitError(ctx)
	}
	defer func() { <-s.sem }()

	p.mu.Lock()
	var token int64
	owned, first := 0, ""
	for _, k := range keys {
		if t, ok := s.held[k]; ok {
			owned++
			token = max(token, t)
			if first == "" {
				first = k
			}
		}
	}
	p.mu.Unlock()
	lease := func(token int64) locking.Lease {
		ttl := time.Duration(s.ttl) * time.Second
		return locking.Lease{Token: uint64(token), Lost: s.s.Done(), Sent: sent, TTL: ttl, ExpiresAt: sent.Add(ttl)}
	}
	if owned == len(keys) {
		ok, err := p.renew(ctx, keys, []clientv3.LeaseID{s.s.Lease()})
		if err != nil {
			return locking.Lease{}, p.callError(ctx, err)
		}
		if ok {
			return lease(token), nil
		}
		// Released by another process meanwhile: take them anew.
		p.mu.Lock()
		for _, k := range keys {
			delete(s.held, k)
		}
		p.mu.Unlock()
	} else if owned > 0 {
		return locking.Lease{}, provider.ConflictError(first)
	}
	rctx, cancel := p.short(ctx)
	err = p.record(rctx, s)
	if err != nil {
		err = p.shortError(ctx, rctx, err)
	}
	cancel()
	if err != nil {
		return locking.Lease{}, err
	}
	for i, k := range keys {
		m := concurrency.NewMutex(s.s, p.lockPrefix(k))
		if opts.AwaitQueue {
			err = m.Lock(ctx)
		} else {
			err = m.TryLock(ctx)
		}
		if err == nil {
			if h := m.Header(); h != nil {
				token = h.Revision
			}
			continue
		}
		p.cleanup(s, keys[:i+1])
		if errors.Is(err, concurrency.ErrLocked) {
			return locking.Lease{}, provider.ConflictError(k)
		}
		if errors.Is(err, concurrency.ErrSessionExpired) {
			return locking.Lease{}, fmt.Errorf("etcd provider: the session's lease was lost while acquiring %q", k)
		}
		return locking.Lease{}, p.callError(ctx, err)
	}
	if dead(s) {
		return locking.Lease{}, fmt.Errorf("etcd provider: the session's lease was lost while acquiring")
	}
	held = make(map[string]int64, len(keys))
	for _, k := range keys {
		held[k] = token
	}
	return lease(token), nil
}

// callError is the error of a failed etcd call: the end of ctx as a wait
// error, else err.
func (p *Provider) callError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return provider.WaitError(ctx)
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		// The deadline passed but ctx's timer has not run yet: etcd, which
		// the client gave the deadline, answered first ("request timed
		// out").
		return provider.TimeoutError(context.DeadlineExceeded)
	}
	if p.isClosed() {
		return closedError()
	}
	return fmt.Errorf("etcd provider: %w", err)
}

// shortError is callError for a call made under sctx (see short): its
// deadline says that etcd did not answer within the dial timeout.
func (p *Provider) shortError(ctx, sctx context.Context, err error) error {
	if ctx.Err() == nil && errors.Is(context.Cause(sctx), errNoAnswer) {
		return fmt.Errorf("etcd provider: no answer from %s within %v (etcd unreachable?): %w",
			strings.Join(p.cli.Endpoints(), ", "), p.dialTimeout, err)
	}
	return p.callError(ctx, err)
}

func (p *Provider) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// cleanup deletes s's mutex entries for keys after a failed acquisition
// (none of them is held by s: see Acquire). If that fails the session is
// revoked, since a stale entry would block the key for as long as it lives.
func (p *Provider) cleanup(s *session, keys []string) {
	ops := make([]clientv3.Op, len(keys))
	for i, k := range keys {
		ops[i] = clientv3.OpDelete(p.mutexKey(k, s.s.Lease()))
	}
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	if _, err := p.cli.Txn(ctx).Then(ops...).Commit(); err != nil {
		p.mu.Lock()
		p.dropLocked(s)
		p.mu.Unlock()
	}
}

// renew refreshes leases and reports whether every key's holder is one of
// them.
func (p *Provider) renew(ctx context.Context, keys []string, leases []clientv3.LeaseID) (bool, error) {
	for _, l := range leases {
		if _, err := p.cli.KeepAliveOnce(ctx, l); err != nil {
			if errors.Is(err, rpctypes.ErrLeaseNotFound) {
				continue
			}
			return false, err
		}
	}
	holders, err := p.holders(ctx, keys)
	if err != nil {
		return false, err
	}
	for _, k := range keys {
		if !containsLease(leases, holders[k]) {
			return false, nil
		}
	}
	return true, nil
}

func containsLease(ls []clientv3.LeaseID, l clientv3.LeaseID) bool {
	for _, x := range ls {
		if x == l && l != clientv3.NoLease {
			return true
		}
	}
	return false
}

// holders returns the lease of the holder of each key (the oldest entry of
// its mutex), in one transaction; keys without holder are missing.
func (p *Provider) holders(ctx context.Context, keys []string) (map[string]clientv3.LeaseID, error) {
	ops := make([]clientv3.Op, len(keys))
	for i, k := range keys {
		ops[i] = clientv3.OpGet(p.lockPrefix(k)+"/", clientv3.WithFirstCreate()...)
	}
	resp, err := p.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, err
	}
	out := make(map[string]clientv3.LeaseID, len(keys))
	for i, r := range resp.Responses {
		if kvs := r.GetResponseRange().GetKvs(); len(kvs) > 0 {
			out[keys[i]] = clientv3.LeaseID(kvs[0].Lease)
		}
	}
	return out, nil
}

// leasesOf returns the leases recorded for owner, with the local session's.
func (p *Provider) leasesOf(ctx context.Context, owner string) ([]clientv3.LeaseID, error) {
	pfx := p.ownerPrefix(owner)
	resp, err := p.cli.Get(ctx, pfx, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, err
	}
	var out []clientv3.LeaseID
	for _, kv := range resp.Kvs {
		rest := strings.TrimPrefix(string(kv.Key), pfx)
		if strings.Contains(rest, "|") {
			continue // an owner whose id starts with owner + "|"
		}
		l, err := strconv.ParseUint(rest, 16, 64)
		if err == nil {
			out = append(out, clientv3.LeaseID(l))
		}
	}
	return out, nil
}

// localLease returns the lease of owner's local session holding every key,
// if there is one.
func (p *Provider) localLease(owner string, keys []string) (*session, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var cands []*session
	if owner != locking.AnonymousOwner {
		if s := p.owners[owner]; s != nil {
			cands = append(cands, s)
		}
	} else {
		for _, s := range p.byLease {
			if s.owner == owner && len(s.held) > 0 {
				cands = append(cands, s)
			}
		}
	}
next:
	for _, s := range cands {
		for _, k := range keys {
			if _, ok := s.held[k]; !ok {
				continue next
			}
		}
		return s, true
	}
	return nil, false
}

// forget drops keys (nil: all) from the local records of owner's sessions.
func (p *Provider) forget(owner string, keys []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.byLease {
		if s.owner != owner {
			continue
		}
		if keys == nil {
			clear(s.held)
		}
		for _, k := range keys {
			delete(s.held, k)
		}
		p.idleLocked(s)
	}
}

// Renew refreshes the lease of owner's lock on keys (LeaseKeepAliveOnce;
// the TTL stays the one of the acquisition) and reports whether owner still
// holds every key. See locking.Provider.
func (p *Provider) Renew(ctx context.Context, keys []string, owner string, expire time.Duration) (bool, error) {
	keys, err := provider.Keys(keys)
	if err != nil {
		return false, err
	}
	owner = provider.Owner(owner)
	if p.isClosed() {
		return false, closedError()
	}
	var leases []clientv3.LeaseID
	if s, ok := p.localLease(owner, keys); ok {
		leases = []clientv3.LeaseID{s.s.Lease()}
	} else if leases, err = p.leasesOf(ctx, owner); err != nil {
		return false, p.callError(ctx, err)
	}
	if len(leases) == 0 {
		return false, nil
	}
	ok, err := p.renew(ctx, keys, leases)
	if err != nil {
		return false, p.callError(ctx, err)
	}
	return ok, nil
}

// Release releases owner's lock on each key, from this process or another;
// true only if every key was held by owner. See locking.Provider.
func (p *Provider) Release(ctx context.Context, keys []string, opts locking.ReleaseOptions) (bool, error) {
	keys, err := provider.Keys(keys)
	if err != nil {
		return false, err
	}
	owner := provider.Owner(opts.OwnerID)
	if p.isClosed() {
		return false, closedError()
	}
	defer p.forget(owner, keys)
	if s, ok := p.localLease(owner, keys); ok {
		// Held here: one transaction, as concurrency.Mutex.Unlock.
		ops := make([]clientv3.Op, len(keys))
		for i, k := range keys {
			ops[i] = clientv3.OpDelete(p.mutexKey(k, s.s.Lease()))
		}
		resp, err := p.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return false, p.callError(ctx, err)
		}
		all := true
		for _, r := range resp.Responses {
			all = all && r.GetResponseDeleteRange().GetDeleted() == 1
		}
		return all, nil
	}
	leases, err := p.leasesOf(ctx, owner)
	if err != nil {
		return false, p.callError(ctx, err)
	}
	holders, err := p.holders(ctx, keys)
	if err != nil {
		return false, p.callError(ctx, err)
	}
	var ops []clientv3.Op
	for _, k := range keys {
		if l := holders[k]; containsLease(leases, l) {
			ops = append(ops, clientv3.OpDelete(p.mutexKey(k, l)))
		}
	}
	if len(ops) == 0 {
		return false, nil
	}
	resp, err := p.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return false, p.callError(ctx, err)
	}
	n := 0
	for _, r := range resp.Responses {
		n += int(r.GetResponseDeleteRange().GetDeleted())
	}
	return n == len(keys), nil
}

// ReleaseAll releases every lock of the owner (without owner: every
// anonymous lock), from this process or another: the mutex entries attached
// to the owner's leases. See locking.Provider.
func (p *Provider) ReleaseAll(ctx context.Context, opts locking.ReleaseOptions) error {
	owner := provider.Owner(opts.OwnerID)
	if p.isClosed() {
		return closedError()
	}
	defer p.forget(owner, nil)
	leases, err := p.leasesOf(ctx, owner)
	if err != nil {
		return p.callError(ctx, err)
	}
	lockPfx := p.prefix + "lock/"
	for _, l := range leases {
		ttl, err := p.cli.TimeToLive(ctx, l, clientv3.WithAttachedKeys())
		if err != nil {
			if errors.Is(err, rpctypes.ErrLeaseNotFound) {
				continue
			}
			return p.callError(ctx, err)
		}
		var ops []clientv3.Op
		for _, k := range ttl.Keys {
			if strings.HasPrefix(string(k), lockPfx) {
				ops = append(ops, clientv3.OpDelete(string(k)))
			}
		}
		for len(ops) > 0 {
			n := min(len(ops), 100) // etcd's default limit of operations per transaction is 128
			if _, err := p.cli.Txn(ctx).Then(ops[:n]...).Commit(); err != nil {
				return p.callError(ctx, err)
			}
			ops = ops[n:]
		}
	}
	return nil
}

// Close revokes the provider's leases (releasing every lock it holds) and
// closes the client if the provider opened it. Calls after Close fail with
// an error of kind locking.ErrClosed.
func (p *Provider) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	all := make([]*session, 0, len(p.byLease))
	for _, s := range p.byLease {
		all = append(all, s)
	}
	clear(p.byLease)
	clear(p.owners)
	clear(p.free)
	clear(p.spare)
	p.mu.Unlock()
	for _, s := range all {
		p.closeAsync(s)
	}
	p.wg.Wait()
	if p.owned {
		return p.cli.Close()
	}
	return nil
}
