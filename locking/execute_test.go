package locking_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/locking"
	"github.com/mlock-dev/mlock/locking/provider"
)

// scripted is a provider whose answers the test sets, recording the calls.
type scripted struct {
	mu       sync.Mutex
	acquire  func(ctx context.Context) error
	renew    func() (bool, error)
	timeout  time.Duration // DefaultTimeout
	lease    locking.Lease // returned by Acquire (Token 1 if zero)
	owners   []string      // of Acquire
	released []string      // owners of Release
	gone     bool          // Release answers false: the keys were no longer the owner's
}

func (s *scripted) Acquire(ctx context.Context, keys []string, o locking.AcquireOptions) (locking.Lease, error) {
	s.mu.Lock()
	s.owners = append(s.owners, o.OwnerID)
	s.mu.Unlock()
	if s.acquire != nil {
		return locking.Lease{}, s.acquire(ctx)
	}
	if s.lease.Token == 0 {
		s.lease.Token = 1
	}
	return s.lease, nil
}

func (s *scripted) Renew(context.Context, []string, string, time.Duration) (bool, error) {
	if s.renew != nil {
		return s.renew()
	}
	return true, nil
}

func (s *scripted) Release(_ context.Context, _ []string, o locking.ReleaseOptions) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.released = append(s.released, o.OwnerID)
	return !s.gone, nil
}

func (s *scripted) ReleaseAll(context.Context, locking.ReleaseOptions) error { return nil }
func (s *scripted) Close() error                                             { return nil }
func (s *scripted) DefaultTimeout() time.Duration                            { return s.timeout }

func TestExecuteOwnersAndRelease(t *testing.T) {
	s := &scripted{}
	ctx := context.Background()
	for range 2 {
		if err := locking.Execute(ctx, s, []string{"k"}, func(context.Context) error { return nil }, locking.ExecuteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	boom := errors.New("boom")
	err := locking.Execute(ctx, s, []string{"k"}, func(context.Context) error { return boom }, locking.ExecuteOptions{OwnerID: "me"})
	if err != boom {
		t.Fatalf("Execute = %v, want the job's error", err)
	}
	if len(s.owners) != 3 || s.owners[0] == s.owners[1] || !strings.HasPrefix(s.owners[0], "execute:") || s.owners[2] != "me" {
		t.Fatalf("owners %q: want a new random owner per call, or the given one", s.owners)
	}
	if strings.Join(s.released, ",") != strings.Join(s.owners, ",") {
		t.Fatalf("released under %q, acquired under %q", s.released, s.owners)
	}
	if err := locking.Execute(ctx, s, []string{"a b"}, nil, locking.ExecuteOptions{}); !errors.Is(err, locking.ErrInvalidKey) {
		t.Fatalf("bad key: %v", err)
	}
}

// A provider that gives up on its own terms when the wait's deadline passes
// still yields ErrTimeout; the provider's default wait applies; whatever the
// failed acquisition may have taken is released.
func TestExecuteTimeout(t *testing.T) {
	s := &scripted{timeout: 50 * time.Millisecond, acquire: func(ctx context.Context) error {
		<-ctx.Done()
		return errors.New("provider: connection closed")
	}}
	start := time.Now()
	err := locking.Execute(context.Background(), s, []string{"k"}, nil, locking.ExecuteOptions{})
	if !errors.Is(err, locking.ErrTimeout) || err.Error() != "Timed-out acquiring lock." {
		t.Fatalf("Execute = %v", err)
	}
	if d := time.Since(start); d < 50*time.Millisecond || d > 2*time.Second {
		t.Fatalf("waited %v, want the provider's 50ms", d)
	}
	if len(s.released) != 1 || s.released[0] != s.owners[0] {
		t.Fatalf("released %q after a failed acquisition by %q", s.released, s.owners)
	}
	// A cancellation is not a timeout.
	cctx, cancel := context.WithCancel(context.Background())
	s.acquire = func(ctx context.Context) error { cancel(); <-ctx.Done(); return provider.WaitError(ctx) }
	if err := locking.Execute(cctx, s, []string{"k"}, nil, locking.ExecuteOptions{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}

func TestExecuteLost(t *testing.T) {
	s := &scripted{renew: func() (bool, error) { return false, nil }}
	jobErr := errors.New("job gave up")
	var cause error
	err := locking.Execute(context.Background(), s, []string{"b", "a"}, func(ctx context.Context) error {
		<-ctx.Done()
		cause = context.Cause(ctx)
		return jobErr
	}, locking.ExecuteOptions{Expire: 30 * time.Millisecond})
	if !errors.Is(err, locking.ErrLost) || !errors.Is(err, jobErr) || !errors.Is(cause, locking.ErrLost) {
		t.Fatalf("Execute = %v (cause %v); want the loss joined with the job's error", err, cause)
	}
	want := `Lost the lock for key(s) "a", "b" while the job was still running`
	if !strings.HasPrefix(cause.Error(), want) {
		t.Fatalf("message %q", cause.Error())
	}
	var le *locking.Error
	if !errors.As(cause, &le) || strings.Join(le.Keys, ",") != "a,b" {
		t.Fatalf("the loss names its keys: %#v", cause)
	}
	if len(s.released) != 1 {
		t.Fatal("a lost lock is still released")
	}
}

func TestErrorMessages(t *testing.T) {
	for _, tc := range []struct {
		err  error
		kind error
		want string
	}{
		{provider.ConflictError("k"), locking.ErrConflict, `Failed to acquire lock for key "k"`},
		{provider.TimeoutError(context.DeadlineExceeded), locking.ErrTimeout, "Timed-out acquiring lock."},
		{&locking.Error{Kind: locking.ErrClosed}, locking.ErrClosed, "locking: provider closed"},
		{&locking.Error{Kind: locking.ErrConflict, Msg: "custom"}, locking.ErrConflict, "custom"},
	} {
		if tc.err.Error() != tc.want || !errors.Is(tc.err, tc.kind) {
			t.Errorf("%#v: %q", tc.err, tc.err.Error())
		}
	}
	_, err := provider.Keys([]string{"ok", "a|b"})
	var le *locking.Error
	if !errors.As(err, &le) || le.Kind != locking.ErrInvalidKey || !strings.Contains(err.Error(), `"a|b"`) {
		t.Fatalf("invalid key: %v", err)
	}
	if keys, err := provider.Keys([]string{"b", "a", "b"}); err != nil || strings.Join(keys, ",") != "a,b" {
		t.Fatalf("Keys = %q, %v", keys, err)
	}
	if _, err := provider.Keys(nil); !errors.Is(err, locking.ErrInvalidKey) {
		t.Fatalf("no keys: %v", err)
	}
	if provider.Owner("") != locking.AnonymousOwner || provider.Owner("o") != "o" {
		t.Fatal("Owner")
	}
	for in, want := range map[string]time.Duration{"20ms": 20 * time.Millisecond, "1.5s": 1500 * time.Millisecond, "250": 250 * time.Millisecond} {
		if d, err := provider.ParseDuration(in); d != want || err != nil {
			t.Errorf("ParseDuration(%q) = %v, %v", in, d, err)
		}
	}
	for _, in := range []string{"20abc", "-5", ""} {
		if _, err := provider.ParseDuration(in); err == nil {
			t.Errorf("ParseDuration(%q) accepted", in)
		}
	}
}

// A provider that learns of the loss (Lease.Lost) aborts the job at once.
func TestExecuteLeaseLost(t *testing.T) {
	lost := make(chan struct{})
	s := &scripted{lease: locking.Lease{Token: 7, Lost: lost}}
	start := time.Now()
	err := locking.ExecuteLease(context.Background(), s, []string{"k"}, func(ctx context.Context, l locking.Lease) error {
		if l.Token != 7 {
			return errors.New("the job got another lease")
		}
		close(lost)
		<-ctx.Done()
		return context.Cause(ctx)
	}, locking.ExecuteOptions{Expire: time.Minute})
	if !errors.Is(err, locking.ErrLost) || time.Since(start) > time.Second {
		t.Fatalf("Execute = %v after %v; want ErrLost at once", err, time.Since(start))
	}
	if len(s.released) != 1 {
		t.Fatalf("released %v", s.released)
	}
}

// A job that ends normally but whose release finds the keys no longer the
// owner's (a Redis that lost its data between two checks) did not run under
// the lock to its end: Execute reports the loss, not a success.
func TestExecuteReleaseFindsTheLockGone(t *testing.T) {
	s := &scripted{gone: true}
	err := locking.Execute(context.Background(), s, []string{"k"}, func(context.Context) error { return nil },
		locking.ExecuteOptions{Expire: time.Minute})
	if !errors.Is(err, locking.ErrLost) {
		t.Fatalf("Execute = %v, want ErrLost", err)
	}
	s.gone = false
	if err := locking.Execute(context.Background(), s, []string{"k"}, func(context.Context) error { return nil },
		locking.ExecuteOptions{Expire: time.Minute}); err != nil {
		t.Fatalf("Execute = %v, want nil", err)
	}
}

// The provider's own Deadline, less Lead, ends the job; Lease.Sent moves the
// base of the first lease back to the acquisition.
func TestExecuteDeadlineSentAndLead(t *testing.T) {
	for _, c := range []struct {
		name string
		l    func(start time.Time) locking.Lease
		lead time.Duration
		want time.Duration // after the start
	}{
		// Times of seconds: without its Deadline or Sent the job would end
		// at 8.9 s (the lease of 10 s less its margin, 105 ms, and Lead),
		// told apart from the time wanted by a bound of seconds, which a
		// busy machine keeps (milliseconds it did not).
		{"deadline", func(start time.Time) locking.Lease {
			return locking.Lease{Deadline: func() time.Time { return start.Add(2500 * time.Millisecond) }}
		}, time.Second, 1500 * time.Millisecond},
		{"sent", func(start time.Time) locking.Lease { return locking.Lease{Sent: start.Add(-7 * time.Second)} },
			time.Second, 10*time.Second - 105*time.Millisecond - time.Second - 7*time.Second},
	} {
		start := time.Now()
		l := c.l(start)
		s := &scripted{lease: l, renew: func() (bool, error) { return false, errors.New("unreachable") }}
		var took time.Duration
		err := locking.Execute(context.Background(), s, []string{"k"}, func(ctx context.Context) error {
			<-ctx.Done()
			took = time.Since(start)
			return nil
		}, locking.ExecuteOptions{Expire: 10 * time.Second, Lead: c.lead})
		if !errors.Is(err, locking.ErrLost) || took < c.want-5*time.Millisecond || took > c.want+3*time.Second {
			t.Errorf("%s: Execute = %v after %v, want ErrLost after about %v", c.name, err, took, c.want)
		}
	}
}

// A job that panics (the panic recovered further up, as a server does per
// request) releases its keys as a job that returns does, as Medusa's execute
// releases in its finally; the watchdog stops with it (see internal/lease),
// or it would renew the lock for as long as ctx lives.
func TestExecutePanicReleases(t *testing.T) {
	m := locking.NewMemory()
	defer m.Close()
	func() {
		defer func() {
			if r := recover(); r != "job panicked" {
				t.Fatalf("recovered %v, want the job's panic", r)
			}
		}()
		locking.Execute(context.Background(), m, []string{"panic-key"}, func(context.Context) error {
			panic("job panicked")
		}, locking.ExecuteOptions{})
	}()
	if _, err := m.Acquire(context.Background(), []string{"panic-key"}, locking.AcquireOptions{OwnerID: "next"}); err != nil {
		t.Fatalf("the keys of a job that panicked are still held: %v", err)
	}
}

// A provider whose lease in force is shorter than the Expire asked for
// (etcd: an owner's later acquisitions share the lease of its first) says
// so in Lease.TTL: the watchdog counts the lock's end from that lease, not
// from Expire, and a Lead not below its half is dropped. Here the renewals
// fail: the job is ended at the end of the 300 ms lease, not of the minute
// asked for.
func TestExecuteKeepsToTheLeaseInForce(t *testing.T) {
	for _, lead := range []time.Duration{0, 20 * time.Second} {
		s := &scripted{lease: locking.Lease{TTL: 300 * time.Millisecond},
			renew: func() (bool, error) { return false, errors.New("unreachable") }}
		start := time.Now()
		var took time.Duration
		err := locking.Execute(context.Background(), s, []string{"k"}, func(ctx context.Context) error {
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Second):
			}
			took = time.Since(start)
			return nil
		}, locking.ExecuteOptions{Expire: time.Minute, Lead: lead})
		if !errors.Is(err, locking.ErrLost) || took > 5*time.Second {
			t.Fatalf("lead %v: Execute = %v after %v, want ErrLost by the end of the 300 ms lease", lead, err, took)
		}
		if took < 200*time.Millisecond {
			t.Fatalf("lead %v: the job ended after %v, well before its 300 ms lease", lead, took)
		}
	}
}

func TestModuleExecuteLeaseGivesTheToken(t *testing.T) {
	m := locking.NewModule()
	defer m.Close()
	ctx := context.Background()
	var tokens []uint64
	for range 2 {
		err := m.ExecuteLease(ctx, []string{"sku:1"}, func(ctx context.Context, l locking.Lease) error {
			tokens = append(tokens, l.Token)
			return nil
		}, locking.ExecuteOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	if tokens[0] == 0 || tokens[1] <= tokens[0] {
		t.Fatalf("tokens %v: want two growing tokens", tokens)
	}
	if err := m.ExecuteLease(ctx, []string{"k"}, func(context.Context, locking.Lease) error { return nil },
		locking.ExecuteOptions{Provider: "nope"}); !errors.Is(err, locking.ErrNoProvider) {
		t.Fatalf("unknown provider: %v", err)
	}
}
