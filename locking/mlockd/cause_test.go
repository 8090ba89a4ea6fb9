package mlockd_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/locking"
	"github.com/mlock-dev/mlock/server"
	"github.com/mlock-dev/mlock/server/servertest"
)

// runUntilLost runs Execute on key, calls stop once the job holds the lock,
// and returns Execute's error once the job's context is cancelled.
func runUntilLost(t *testing.T, p locking.Provider, key string, stop func()) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return locking.Execute(ctx, p, []string{key}, func(jctx context.Context) error {
		stop()
		<-jctx.Done()
		return context.Cause(jctx)
	}, locking.ExecuteOptions{Expire: 10 * time.Second})
}

// The error of a lost Execute names the real cause, keeps the client's
// error in its chain, and advises a longer "expire" only when the lease ran
// out.
func TestLossNamesTheCause(t *testing.T) {
	t.Run("released by its owner", func(t *testing.T) {
		addr, _ := servertest.Start(t, server.Config{}, "")
		p, err := locking.Open(context.Background(), "mlock://"+addr)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		other, err := mlock.New("mlock://" + addr)
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		err = locking.Execute(context.Background(), p, []string{"k"}, func(jctx context.Context) error {
			// Execute's owner is its own: free the key the way an operator would.
			l, err := other.Locks(jctx, "k")
			if err != nil || len(l.Queues) != 1 || len(l.Queues[0].Entries) != 1 {
				t.Errorf("locks: %v %+v", err, l)
				return err
			}
			if _, err := other.Release(jctx, l.Queues[0].Entries[0].Owner, "k"); err != nil {
				t.Error(err)
			}
			<-jctx.Done()
			return context.Cause(jctx)
		}, locking.ExecuteOptions{Expire: 10 * time.Second})
		t.Log(err)
		if !errors.Is(err, locking.ErrLost) || !errors.Is(err, mlock.ErrReleased) ||
			!strings.Contains(err.Error(), "it was released by its owner elsewhere") || strings.Contains(err.Error(), "Increase") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("evicted", func(t *testing.T) {
		addr, _ := servertest.Start(t, server.Config{}, "")
		p, err := locking.Open(context.Background(), "mlock://"+addr)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		admin, err := mlock.New("mlock://" + addr)
		if err != nil {
			t.Fatal(err)
		}
		defer admin.Close()
		err = runUntilLost(t, p, "k", func() {
			if n, err := admin.Evict(context.Background(), "k"); n != 1 || err != nil {
				t.Errorf("Evict = %d, %v", n, err)
			}
		})
		t.Log(err)
		if !errors.Is(err, locking.ErrLost) || !errors.Is(err, mlock.ErrReleased) ||
			!strings.Contains(err.Error(), "an administrator evicted it") || strings.Contains(err.Error(), "Increase") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("server shutdown", func(t *testing.T) {
		addr, stop := servertest.Start(t, server.Config{}, "")
		p, err := locking.Open(context.Background(), "mlock://"+addr)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		err = runUntilLost(t, p, "k", func() { go stop() })
		t.Log(err)
		if !errors.Is(err, locking.ErrLost) || !errors.Is(err, mlock.ErrSessionLost) ||
			!strings.Contains(err.Error(), "the lock server shut down") || strings.Contains(err.Error(), "Increase") {
			t.Fatalf("err = %v", err)
		}
	})
}
