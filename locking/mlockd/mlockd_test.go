package mlockd_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/internal/testenv"
	"github.com/mlock-dev/mlock/locking"
	"github.com/mlock-dev/mlock/locking/lockingtest"
	_ "github.com/mlock-dev/mlock/locking/mlockd"
	"github.com/mlock-dev/mlock/server"
	"github.com/mlock-dev/mlock/server/servertest"
)

func TestMain(m *testing.M) {
	testenv.WaitBound(8) // the conformance subtests wait for leases and queues
	goleak.VerifyTestMain(m)
}

func TestConformance(t *testing.T) {
	// No rate on listings: the suite polls the queues.
	addr, _ := servertest.Start(t, server.Config{StatusRate: -1}, "")
	uri := "mlock://" + addr
	admin, err := mlock.New(uri)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() }) // after the parallel subtests
	lockingtest.Run(t, lockingtest.Harness{
		New: func(t *testing.T) locking.Provider {
			p, err := locking.Open(context.Background(), uri)
			if err != nil {
				t.Fatal(err)
			}
			return p
		},
		Tokens: true,
		Namespaced: func(t *testing.T, _ locking.Provider, ns string) locking.Provider {
			p, err := locking.Open(context.Background(), uri+"?prefix="+ns)
			if err != nil {
				t.Fatal(err)
			}
			return p
		},
		QueueLen: func(_ locking.Provider, key string) int {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			l, err := admin.Locks(ctx, key)
			if err != nil {
				return -1
			}
			for _, q := range l.Queues {
				if q.Resource == key {
					return q.Length
				}
			}
			return 0
		},
	})
}

// A lease carries the client's Deadline and, for a try (no wait), a lower
// bound of the request's send time; a request that may wait has none (its
// lease runs from the grant, which the Deadline counts from).
func TestLeaseTimes(t *testing.T) {
	addr, _ := servertest.Start(t, server.Config{}, "")
	p, err := locking.Open(context.Background(), "mlock://"+addr)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	before := time.Now()
	l, err := p.Acquire(ctx, []string{"a"}, locking.AcquireOptions{OwnerID: "o1", Expire: 10 * time.Second})
	after := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	if l.Sent.Before(before) || l.Sent.After(after) {
		t.Fatalf("Sent %v not within [%v, %v]", l.Sent, before, after)
	}
	if l.Deadline == nil {
		t.Fatal("no Deadline")
	}
	if d := l.Deadline(); d.Before(after) || d.After(l.Sent.Add(10*time.Second)) {
		t.Fatalf("Deadline %v: want after %v and at most Sent + 10s", d, after)
	}
	l, err = p.Acquire(ctx, []string{"b"}, locking.AcquireOptions{OwnerID: "o1", Expire: 10 * time.Second, AwaitQueue: true})
	if err != nil {
		t.Fatal(err)
	}
	if !l.Sent.IsZero() || l.Deadline == nil || l.Deadline().IsZero() {
		t.Fatalf("queued acquisition: Sent %v, Deadline set %v", l.Sent, l.Deadline != nil)
	}
	if err := p.ReleaseAll(ctx, locking.ReleaseOptions{OwnerID: "o1"}); err != nil {
		t.Fatal(err)
	}
}
