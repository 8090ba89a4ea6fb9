package mlock_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/server"
)

// exampleServer runs mlockd in-process for the examples; in production the
// address is that of a running mlockd, usually localhost:12340.
func exampleServer() (addr string, stop func()) {
	// A new server with no earlier run: nothing to wait out, so no quiet
	// period (a restarted production server keeps its default).
	srv, err := server.New(server.Config{QuietPeriod: -1})
	if err != nil {
		panic(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	done := make(chan struct{})
	go func() { srv.Serve(ln); close(done) }()
	return ln.Addr().String(), func() { srv.Shutdown(context.Background()); <-done }
}

// The seed's quick start: lock one resource, work, unlock.
func ExampleClient_Lock() {
	addr, stop := exampleServer()
	defer stop()

	c, err := mlock.New("mlock://" + addr + "?ttl=5000")
	if err != nil {
		panic(err)
	}
	defer c.Close()
	ctx := context.Background()

	l, err := c.Lock(ctx, "resource-1", nil)
	if err != nil {
		panic(err)
	}
	fmt.Println("holding", l.Resources())
	if err := l.Unlock(ctx); err != nil {
		panic(err)
	}
	// Output: holding resource-1
}

// An order service locks every SKU of an order in one step: no oversell,
// no deadlock between orders that share SKUs, first come first served.
func Example_order() {
	addr, stop := exampleServer()
	defer stop()

	c, err := mlock.New("mlock://" + addr + "?prefix=order:&timeout=10000")
	if err != nil {
		panic(err)
	}
	defer c.Close()
	ctx := context.Background()

	err = c.Do(ctx, "product:1001|product:1002|product:1003", &mlock.LockOptions{TTL: 5 * time.Second},
		func(ctx context.Context) error {
			// Deduct inventory and create the order here. ctx is cancelled if
			// the lock is lost; the lease is extended while this runs.
			fmt.Println("order placed")
			return nil
		})
	var me *mlock.Error
	switch {
	case errors.As(err, &me) && me.Type == mlock.TypeTimeout:
		fmt.Println("busy, try again")
	case err != nil:
		panic(err)
	}
	// Output: order placed
}

// A scheduled job runs once across many instances: each instance tries the
// lock when the schedule fires and skips the run if another one holds it.
// (For a job that must also wait out clock skew between instances, keep the
// lock for a minimum time before unlocking.)
func Example_cron() {
	addr, stop := exampleServer()
	defer stop()
	ctx := context.Background()

	tryRun := func(instance string) (*mlock.Client, *mlock.Lock) {
		c, err := mlock.New("mlock://" + addr + "?prefix=task:")
		if err != nil {
			panic(err)
		}
		l, err := c.TryLock(ctx, "daily-report", &mlock.LockOptions{TTL: time.Minute})
		if errors.Is(err, mlock.ErrBusy) {
			fmt.Println(instance, "skips: the report is already running")
			return c, nil
		}
		if err != nil {
			panic(err)
		}
		fmt.Println(instance, "generates the report")
		return c, l
	}
	c1, l := tryRun("instance-1")
	defer c1.Close()
	c2, _ := tryRun("instance-2") // fires while instance-1 is still running
	defer c2.Close()
	l.Unlock(ctx)
	// Output:
	// instance-1 generates the report
	// instance-2 skips: the report is already running
}

// Readers of a catalogue share it; a writer waits for them, and readers
// that come after it wait for the writer (no writer starvation).
func ExampleShared() {
	addr, stop := exampleServer()
	defer stop()
	c, err := mlock.New("mlock://" + addr)
	if err != nil {
		panic(err)
	}
	defer c.Close()
	ctx := context.Background()

	r1, _ := c.Lock(ctx, "catalog", &mlock.LockOptions{Mode: mlock.Shared})
	r2, _ := c.Lock(ctx, "catalog", &mlock.LockOptions{Mode: mlock.Shared})
	_, err = c.TryLock(ctx, "catalog", nil) // exclusive
	fmt.Println("two readers:", r1.Token() < r2.Token(), "writer:", errors.Is(err, mlock.ErrBusy))
	// A batch job writes one table and reads two others, in one atomic step.
	job, err := c.LockAll(ctx, []string{"orders", "catalog", "prices"},
		&mlock.LockOptions{Modes: []mlock.Mode{mlock.Exclusive, mlock.Shared, mlock.Shared}})
	fmt.Println("job:", err == nil)
	for _, l := range []*mlock.Lock{job, r1, r2} {
		l.Unlock(ctx)
	}
	// Output:
	// two readers: true writer: true
	// job: true
}

// A payment provider allows three concurrent calls: a semaphore of 3
// permits.
func ExamplePermits() {
	addr, stop := exampleServer()
	defer stop()
	c, err := mlock.New("mlock://" + addr)
	if err != nil {
		panic(err)
	}
	defer c.Close()
	ctx := context.Background()

	one := &mlock.LockOptions{Mode: mlock.Permits(1, 3)}
	var calls []*mlock.Lock
	for range 3 {
		l, err := c.TryLock(ctx, "psp:calls", one)
		if err != nil {
			panic(err)
		}
		calls = append(calls, l)
	}
	_, err = c.TryLock(ctx, "psp:calls", one)
	fmt.Println("fourth call:", errors.Is(err, mlock.ErrBusy))
	for _, l := range calls {
		l.Unlock(ctx)
	}
	// Output: fourth call: true
}
