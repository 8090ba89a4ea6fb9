package mlock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/server"
)

func TestModeStrings(t *testing.T) {
	t.Parallel()
	for m, want := range map[mlock.Mode]string{mlock.Exclusive: "x", mlock.Shared: "s", mlock.Permits(2, 5): "2/5",
		mlock.Permits(0, 5): "invalid", mlock.Permits(6, 5): "invalid", mlock.Permits(1, mlock.MaxPermits+1): "invalid"} {
		if m.String() != want {
			t.Errorf("%v: %q, want %q", m, m.String(), want)
		}
	}
}

// TestSharedLocksAndSemaphores: readers share, a writer waits for them and
// blocks later readers, a semaphore admits n permits, a mixed request is
// granted at once, and the refusals of modes come back as typed errors.
func TestSharedLocksAndSemaphores(t *testing.T) {
	t.Parallel()
	addr, stop := startServer(t, server.Config{}, "")
	defer stop()
	ctx := ctxT(t)
	a, b := client(t, addr, mlock.Options{}), client(t, addr, mlock.Options{})
	shared := &mlock.LockOptions{Mode: mlock.Shared}

	r1, err := a.Lock(ctx, "catalog", shared)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := b.Lock(ctx, "catalog", shared)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.TryLock(ctx, "catalog", nil); !errors.Is(err, mlock.ErrBusy) {
		t.Fatalf("exclusive try-lock among readers: %v", err)
	}
	got := make(chan *mlock.Lock, 1)
	go func() {
		w, err := a.Lock(ctx, "catalog", nil)
		if err != nil {
			t.Error(err)
		}
		got <- w
	}()
	// Wait until the writer is queued, then a reader must not pass it.
	deadline := time.Now().Add(5 * time.Second)
	for {
		ls, err := a.Locks(ctx, "catalog")
		if err != nil {
			t.Fatal(err)
		}
		if len(ls.Queues) == 1 && ls.Queues[0].Length == 3 {
			if e := ls.Queues[0].Entries[2]; e.Mode != "x" || e.State != "waiting" {
				t.Fatalf("the writer's entry: %+v", e)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the writer never queued")
		}
		time.Sleep(5 * time.Millisecond) // poll interval
	}
	if _, err := b.TryLock(ctx, "catalog", shared); !errors.Is(err, mlock.ErrBusy) {
		t.Fatalf("a reader passed a waiting writer: %v", err)
	}
	r1.Unlock(ctx)
	r2.Unlock(ctx)
	w := <-got
	if w == nil || w.Token() <= r2.Token() {
		t.Fatalf("writer %v after readers", w)
	}
	w.Unlock(ctx)

	// A semaphore of 2 permits.
	sem := &mlock.LockOptions{Mode: mlock.Permits(1, 2)}
	p1, err1 := a.TryLock(ctx, "pay", sem)
	p2, err2 := b.TryLock(ctx, "pay", sem)
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	if _, err := a.TryLock(ctx, "pay", sem); !errors.Is(err, mlock.ErrBusy) {
		t.Fatalf("third permit of 2: %v", err)
	}
	var me *mlock.Error
	if _, err := a.TryLock(ctx, "pay", &mlock.LockOptions{Mode: mlock.Permits(1, 3)}); !errors.Is(err, mlock.ErrPermitsConflict) ||
		!errors.As(err, &me) || me.Resource != "pay" {
		t.Fatalf("another count: %v", err)
	}
	p1.Unlock(ctx)
	p2.Unlock(ctx)

	// Write one table, read three, in one request, next to another reader.
	rd, err := b.Lock(ctx, "t2", shared)
	if err != nil {
		t.Fatal(err)
	}
	job, err := a.LockAll(ctx, []string{"t1", "t2", "t3", "t4"},
		&mlock.LockOptions{Modes: []mlock.Mode{mlock.Exclusive, mlock.Shared, mlock.Shared, mlock.Shared}})
	if err != nil {
		t.Fatal(err)
	}
	job.Unlock(ctx)
	rd.Unlock(ctx)

	// Owners: re-entry in the same mode renews; an upgrade is refused.
	own := &mlock.LockOptions{Owner: "w1", Mode: mlock.Shared}
	o1, err := a.Lock(ctx, "doc", own)
	if err != nil {
		t.Fatal(err)
	}
	if o2, err := a.Lock(ctx, "doc", own); err != nil || o2.ID() != o1.ID() {
		t.Fatalf("re-entry: %v %v", o2, err)
	}
	if _, err := a.Lock(ctx, "doc", &mlock.LockOptions{Owner: "w1"}); !errors.Is(err, mlock.ErrModeChange) {
		t.Fatalf("upgrade: %v", err)
	}

	// Bad modes never reach the server.
	for _, o := range []*mlock.LockOptions{{Mode: mlock.Permits(3, 2)}, {Modes: []mlock.Mode{mlock.Shared}}} {
		if _, err := a.LockAll(ctx, []string{"x", "y"}, o); !errors.Is(err, mlock.ErrRequest) {
			t.Fatalf("%+v: %v", o, err)
		}
	}
}
