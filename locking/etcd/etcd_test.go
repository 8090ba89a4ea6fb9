package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/mlock-dev/mlock/internal/testenv"
	"github.com/mlock-dev/mlock/locking"
	"github.com/mlock-dev/mlock/locking/etcd"
	"github.com/mlock-dev/mlock/locking/lockingtest"
)

func TestMain(m *testing.M) {
	testenv.WaitBound(8) // the conformance subtests wait for leases and queues
	goleak.VerifyTestMain(m)
}

// endpoints returns ETCD_ENDPOINTS (comma-separated host:port). Without it
// the test is skipped, except under CI=true, where a missing etcd is a
// failure.
func endpoints(t testing.TB) []string {
	t.Helper()
	e := testenv.Getenv(t, "ETCD_ENDPOINTS", "the etcd provider tests need an etcd (start etcd and set ETCD_ENDPOINTS)")
	return strings.Split(e, ",")
}

func prefix() string { return fmt.Sprintf("mlocktest/%x/", rand.Uint32()) }

func open(t testing.TB, pfx string) *etcd.Provider {
	t.Helper()
	p, err := etcd.Open(etcd.Options{Endpoints: endpoints(t), Prefix: pfx})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func raw(t testing.TB) *clientv3.Client {
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints(t), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestConformance(t *testing.T) {
	t.Parallel()
	pfx := prefix()
	lockingtest.Run(t, lockingtest.Harness{
		New:    func(t *testing.T) locking.Provider { return open(t, pfx) },
		Tokens: true,
		Namespaced: func(t *testing.T, _ locking.Provider, ns string) locking.Provider {
			return open(t, "mlocktest/"+ns)
		},
	})
}

func TestParseURL(t *testing.T) {
	tests := []struct {
		in      string
		want    etcd.Options
		wantErr string
	}{
		{in: "etcd://", want: etcd.Options{}},
		{in: "etcd://127.0.0.1:2379", want: etcd.Options{Endpoints: []string{"127.0.0.1:2379"}}},
		{in: "etcd://a,b:2?prefix=x/&dialTimeout=250ms", want: etcd.Options{Endpoints: []string{"a:2379", "b:2"}, Prefix: "x/", DialTimeout: 250 * time.Millisecond}},
		{in: "etcd://u:pw@[::1]:2379?dialTimeout=100", want: etcd.Options{Endpoints: []string{"[::1]:2379"}, Username: "u", Password: "pw", DialTimeout: 100 * time.Millisecond}},
		{in: "etcd://h/path", wantErr: "unexpected path"},
		{in: "etcd://h?bogus=1", wantErr: `unknown option "bogus"`},
		{in: "etcd://h?dialTimeout=soon", wantErr: "dialTimeout"},
		{in: "redis://h", wantErr: "want etcd"},
	}
	for _, tc := range tests {
		got, err := etcd.ParseURL(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseURL(%q) = %v, want an error with %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !slices.Equal(got.Endpoints, tc.want.Endpoints) || got.Prefix != tc.want.Prefix ||
			got.DialTimeout != tc.want.DialTimeout || got.Username != tc.want.Username || got.Password != tc.want.Password {
			t.Errorf("ParseURL(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
	if e, _ := etcd.Endpoints("etcd://"); !slices.Equal(e, []string{etcd.DefaultEndpoint}) {
		t.Errorf("Endpoints(etcd://) = %v", e)
	}
}

func FuzzParseURL(f *testing.F) {
	for _, s := range []string{"etcd://", "etcd://a:1,b?prefix=x/", "etcd://u:p@h?dialTimeout=5"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		o, err := etcd.ParseURL(s)
		if err != nil {
			return
		}
		for _, e := range o.Endpoints {
			if e == "" || strings.Contains(e, ",") {
				t.Fatalf("ParseURL(%q): endpoint %q", s, e)
			}
		}
	})
}

// The layout: the mutex entry under prefix/lock/<key>/<lease>, the owner
// record under prefix/owner/<owner>|<lease>, both on the session's lease
// with the TTL of Expire; opened through locking.Open.
func TestLayoutThroughOpen(t *testing.T) {
	pfx := prefix()
	p, err := locking.Open(ctx(t), "etcd://"+strings.Join(endpoints(t), ",")+"?prefix="+pfx)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, cli := ctx(t), raw(t)
	l, err := p.Acquire(c, []string{"cart_1"}, locking.AcquireOptions{OwnerID: "user_1", Expire: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(c, pfx, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	var lockKey, ownerKey string
	var lease int64
	for _, kv := range resp.Kvs {
		k := string(kv.Key)
		switch {
		case strings.HasPrefix(k, pfx+"lock/cart_1/"):
			lockKey, lease = k, kv.Lease
			if int64(l.Token) != kv.CreateRevision {
				t.Errorf("token %d, want the entry's revision %d", l.Token, kv.CreateRevision)
			}
		case strings.HasPrefix(k, pfx+"owner/user_1|"):
			ownerKey = k
		}
	}
	if lockKey == "" || ownerKey == "" || lease == 0 {
		t.Fatalf("keys %q", resp.Kvs)
	}
	if want := fmt.Sprintf("%s/%x", pfx+"lock/cart_1", lease); lockKey != want {
		t.Errorf("lock key %q, want %q", lockKey, want)
	}
	ttl, err := cli.TimeToLive(c, clientv3.LeaseID(lease))
	if err != nil || ttl.GrantedTTL != 30 {
		t.Fatalf("lease TTL = %+v, %v; want 30 s", ttl, err)
	}
	if ok, err := p.Release(c, []string{"cart_1"}, locking.ReleaseOptions{OwnerID: "user_1"}); !ok || err != nil {
		t.Fatalf("release = %v, %v", ok, err)
	}
	if resp, _ := cli.Get(c, pfx+"lock/", clientv3.WithPrefix(), clientv3.WithCountOnly()); resp.Count != 0 {
		t.Fatalf("%d lock entries left", resp.Count)
	}
}

// Another process of the same owner can renew, release and release all;
// it cannot re-enter (it conflicts like another owner).
func TestOwnerAcrossProviders(t *testing.T) {
	pfx := prefix()
	a, b := open(t, pfx), open(t, pfx)
	defer a.Close()
	defer b.Close()
	c := ctx(t)
	if _, err := a.Acquire(c, []string{"k1", "k2"}, locking.AcquireOptions{OwnerID: "o", Expire: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Acquire(c, []string{"k3"}, locking.AcquireOptions{OwnerID: "o", Expire: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(c, []string{"k1"}, locking.AcquireOptions{OwnerID: "o"}); !errors.Is(err, locking.ErrConflict) {
		t.Fatalf("re-entry from another provider = %v, want a conflict", err)
	}
	if ok, err := b.Renew(c, []string{"k1", "k2"}, "o", time.Minute); !ok || err != nil {
		t.Fatalf("renewal from another provider = %v, %v", ok, err)
	}
	if ok, err := b.Renew(c, []string{"k1"}, "other", time.Minute); ok || err != nil {
		t.Fatalf("another owner's renewal = %v, %v", ok, err)
	}
	if ok, err := b.Release(c, []string{"k1"}, locking.ReleaseOptions{OwnerID: "other"}); ok || err != nil {
		t.Fatalf("another owner's release = %v, %v", ok, err)
	}
	if ok, err := b.Release(c, []string{"k1"}, locking.ReleaseOptions{OwnerID: "o"}); !ok || err != nil {
		t.Fatalf("release from another provider = %v, %v", ok, err)
	}
	if ok, _ := a.Renew(c, []string{"k1", "k2"}, "o", time.Minute); ok {
		t.Fatal("renewal after another provider released a key")
	}
	if _, err := b.Acquire(c, []string{"k1"}, locking.AcquireOptions{OwnerID: "x"}); err != nil {
		t.Fatalf("the released key: %v", err)
	}
	if err := b.ReleaseAll(c, locking.ReleaseOptions{OwnerID: "o"}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"k2", "k3"} {
		if _, err := b.Acquire(c, []string{k}, locking.AcquireOptions{OwnerID: "y"}); err != nil {
			t.Fatalf("%s after ReleaseAll from another provider: %v", k, err)
		}
	}
	// x's lock survived o's ReleaseAll.
	if _, err := a.Acquire(c, []string{"k1"}, locking.AcquireOptions{OwnerID: "o"}); !errors.Is(err, locking.ErrConflict) {
		t.Fatalf("k1 after o's ReleaseAll = %v, want x's conflict", err)
	}
	// And the owner can take its keys again in the first provider.
	b.ReleaseAll(c, locking.ReleaseOptions{OwnerID: "y"})
	if _, err := a.Acquire(c, []string{"k2", "k3"}, locking.AcquireOptions{OwnerID: "o"}); err != nil {
		t.Fatalf("the owner re-acquiring after a remote ReleaseAll: %v", err)
	}
}

// Close revokes the leases: the locks are free at once, and the provider
// refuses further calls.
func TestCloseReleases(t *testing.T) {
	pfx := prefix()
	a, b := open(t, pfx), open(t, pfx)
	defer b.Close()
	c := ctx(t)
	if _, err := a.Acquire(c, []string{"held"}, locking.AcquireOptions{OwnerID: "a", Expire: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(c, []string{"held"}, locking.AcquireOptions{OwnerID: "b"}); err != nil {
		t.Fatalf("after the holder closed: %v", err)
	}
	if _, err := a.Acquire(c, []string{"x"}, locking.AcquireOptions{}); !errors.Is(err, locking.ErrClosed) {
		t.Fatalf("Acquire after Close = %v", err)
	}
}

// A lease revoked behind the provider's back closes Lease.Lost and makes
// Renew false.
func TestLostOnRevoke(t *testing.T) {
	t.Parallel()
	pfx := prefix()
	p := open(t, pfx)
	defer p.Close()
	c, cli := ctx(t), raw(t)
	l, err := p.Acquire(c, []string{"r"}, locking.AcquireOptions{OwnerID: "o", Expire: 10 * time.Second})
	if err != nil || l.Lost == nil {
		t.Fatalf("Acquire = %+v, %v", l, err)
	}
	// The lease of this test's one mutex entry (prefix/lock/r/<lease>).
	resp, err := cli.Get(c, pfx+"lock/r/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || resp.Kvs[0].Lease == 0 {
		t.Fatalf("the mutex entries of r: %v, want one on a lease", resp.Kvs)
	}
	if _, err := cli.Revoke(c, clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Lost:
	case <-time.After(15 * time.Second):
		t.Fatal("Lease.Lost did not close after the lease was revoked")
	}
	if ok, _ := p.Renew(c, []string{"r"}, "o", 10*time.Second); ok {
		t.Fatal("Renew after the lease was revoked")
	}
	// The owner gets a new session for its next acquisition.
	if _, err := p.Acquire(c, []string{"r"}, locking.AcquireOptions{OwnerID: "o"}); err != nil {
		t.Fatalf("acquiring again after the loss: %v", err)
	}
}

// Many workers, overlapping key sets in random orders, AwaitQueue: nobody
// deadlocks and no key has two holders at once.
func TestOverlappingSetsStress(t *testing.T) {
	t.Parallel()
	pfx := prefix()
	a, b := open(t, pfx), open(t, pfx)
	defer a.Close()
	defer b.Close()
	c := ctx(t)
	var mu sync.Mutex
	holders := map[string]string{}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 8 {
		p := a
		if w%2 == 1 {
			p = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			owner := fmt.Sprintf("w%d", w)
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for range 15 {
				keys := []string{fmt.Sprint("s", r.IntN(4)), fmt.Sprint("s", r.IntN(4)), fmt.Sprint("s", r.IntN(4))}
				if _, err := p.Acquire(c, keys, locking.AcquireOptions{OwnerID: owner, AwaitQueue: true, Expire: 10 * time.Second}); err != nil {
					errs <- err
					return
				}
				mu.Lock()
				for _, k := range keys {
					if h, ok := holders[k]; ok && h != owner {
						errs <- fmt.Errorf("%s held by %s and %s", k, h, owner)
					}
					holders[k] = owner
				}
				mu.Unlock()
				time.Sleep(time.Millisecond) // fixed: the critical section, where an overlap would show
				mu.Lock()
				for _, k := range keys {
					delete(holders, k)
				}
				mu.Unlock()
				if ok, err := p.Release(c, keys, locking.ReleaseOptions{OwnerID: owner}); !ok || err != nil {
					errs <- fmt.Errorf("release %v: %v, %v", keys, ok, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// An etcd that cannot be reached fails an acquisition within the dial
// timeout, with an error that says so, instead of keeping the caller
// waiting for the connection as long as its context allows (a cron job
// without a deadline would wait for ever).
func TestUnreachableFailsWithinDialTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now: every dial is refused
	p, err := etcd.Open(etcd.Options{Endpoints: []string{addr}, DialTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, await := range []bool{false, true} {
		_, err := p.Acquire(ctx(t), []string{"k"}, locking.AcquireOptions{AwaitQueue: await})
		if err == nil || errors.Is(err, locking.ErrTimeout) || !strings.Contains(err.Error(), addr) {
			t.Fatalf("AwaitQueue=%v: Acquire against an unreachable etcd: %v, want an error naming %s before the context's deadline",
				await, err, addr)
		}
	}
}

// An owner's later acquisition shares the lease of its first, and so its
// TTL: its Lease says so when that is shorter than the Expire asked for
// (locking.Execute's watchdog keeps to it), and nothing when it is not.
func TestOwnerLeaseInForce(t *testing.T) {
	p := open(t, prefix())
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	first, err := p.Acquire(ctx, []string{"a"}, locking.AcquireOptions{OwnerID: "o", Expire: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if first.TTL != 2*time.Second {
		t.Fatalf("first acquisition: TTL %v, want 2s", first.TTL)
	}
	later, err := p.Acquire(ctx, []string{"b"}, locking.AcquireOptions{OwnerID: "o", Expire: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if later.TTL != 2*time.Second {
		t.Fatalf("a later acquisition of the owner asking 30s: TTL %v, want the 2s of the owner's lease", later.TTL)
	}
	if err := p.ReleaseAll(ctx, locking.ReleaseOptions{OwnerID: "o"}); err != nil {
		t.Fatal(err)
	}
}

// lateCtx is a context whose deadline has passed while its timer has not
// run yet (on a busy machine, for a moment): Err is still nil.
type lateCtx struct{ context.Context }

func (lateCtx) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// A call whose deadline passed before its context's timer ran (etcd, given
// the deadline, answers "request timed out" first) is a timeout, as the
// end of the context is, not a failure of etcd.
func TestDeadlinePassedIsATimeout(t *testing.T) {
	t.Parallel()
	p := open(t, prefix())
	defer p.Close()
	_, err := p.Acquire(lateCtx{context.Background()}, []string{"late"}, locking.AcquireOptions{Expire: 2 * time.Second})
	if !errors.Is(err, locking.ErrTimeout) {
		t.Fatalf("Acquire past its deadline: %v, want a timeout", err)
	}
}
