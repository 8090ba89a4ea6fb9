package redis_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/mlock-dev/mlock/internal/proctest"
	"github.com/mlock-dev/mlock/internal/testenv"
	"github.com/mlock-dev/mlock/locking"
	"github.com/mlock-dev/mlock/locking/redis"
)

// ownRedis is a redis-server of the test's own (no persistence), on a free
// loopback port, that the test may restart.
type ownRedis struct {
	t       *testing.T
	port    int
	pidfile string
}

func startOwnRedis(t *testing.T) *ownRedis {
	t.Helper()
	testenv.LookPath(t, "the Redis restart test starts and restarts its own redis-server", "redis-server")
	port := proctest.FreePort(t) // restarted on it: outside the ephemeral ports
	r := &ownRedis{t: t, port: port, pidfile: filepath.Join(t.TempDir(), "redis.pid")}
	r.start()
	t.Cleanup(r.stop)
	return r
}

func (r *ownRedis) url() string { return fmt.Sprintf("redis://127.0.0.1:%d/0", r.port) }

func (r *ownRedis) start() {
	r.t.Helper()
	out, err := exec.Command("redis-server", "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--daemonize", "yes", "--pidfile", r.pidfile).CombinedOutput()
	if err != nil {
		r.t.Fatalf("redis-server: %v: %s", err, out)
	}
	c := goredis.NewClient(&goredis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", r.port)})
	defer c.Close()
	ctx := context.Background()
	for i := 0; ; i++ {
		if pid, ok := r.pid(); ok && c.Ping(ctx).Err() == nil {
			// The one this test started, not another that took the port
			// (the tests beside this one pick free ports too).
			if info, _ := c.Info(ctx, "server").Result(); !strings.Contains(info, "process_id:"+strconv.Itoa(pid)+"\r\n") {
				r.t.Fatalf("port %d answers for another redis-server than this test's (pid %d)", r.port, pid)
			}
			return
		}
		if i == 100 {
			r.t.Fatal("the test's redis-server did not start")
		}
		time.Sleep(20 * time.Millisecond) // poll interval
	}
}

// pid returns the process id the server wrote in its pid file.
func (r *ownRedis) pid() (int, bool) {
	b, err := os.ReadFile(r.pidfile)
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid, err == nil && pid > 0
}

// stop kills the server by its pid and waits until it is gone.
func (r *ownRedis) stop() {
	pid, ok := r.pid()
	if !ok {
		return
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	for range 200 {
		if syscall.Kill(pid, 0) != nil {
			break
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
	os.Remove(r.pidfile)
}

// Issue 10, item 6: Redis loses its data (FLUSHALL, then a restart without
// persistence). Tokens never repeat: every token after is above every token
// before. The restart is detected (the run_id changed): a running job is
// aborted with ErrLost within about a second, the earlier leases' Lost
// channels close and their renewals say the lock is gone, even though a
// newcomer took the key on the new server meanwhile.
func TestRedisLosesItsData(t *testing.T) {
	t.Parallel() // on a Redis of its own
	r := startOwnRedis(t)
	p, err := redis.Open(redis.Options{RedisURL: r.url()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	var before []locking.Lease
	take := func(key, owner string) locking.Lease {
		t.Helper()
		l, err := p.Acquire(ctx, []string{key}, locking.AcquireOptions{OwnerID: owner, Expire: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range before {
			if l.Token <= b.Token {
				t.Fatalf("token %d for %s after token %d: tokens went backwards", l.Token, key, b.Token)
			}
		}
		before = append(before, l)
		return l
	}
	for i := range 4 {
		take(fmt.Sprintf("k%d", i), "o")
	}
	raw := goredis.NewClient(&goredis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", r.port)})
	if err := raw.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	raw.Close()
	take("k0", "o2") // the counter was wiped: floored with TIME
	held := take("k1", "o")

	// A job under the lock, with the default ttl (first renewal at 20 s).
	started, jobErr := make(chan struct{}), make(chan error, 1)
	go func() {
		jobErr <- locking.Execute(ctx, p, []string{"job"}, func(ctx context.Context) error {
			close(started)
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-time.After(15 * time.Second):
				return errors.New("the job ran on through the restart")
			}
		}, locking.ExecuteOptions{OwnerID: "worker"})
	}()
	<-started
	r.stop()
	r.start()
	restarted := time.Now()
	select { // learned by the background check, at most a second apart
	case err := <-jobErr:
		if !errors.Is(err, locking.ErrLost) {
			t.Fatalf("Execute = %v, want ErrLost", err)
		}
		t.Logf("the job learned of the restart %v after it", time.Since(restarted))
		if d := time.Since(restarted); d > 3*time.Second {
			t.Fatalf("the job learned of the restart %v after it", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the job was not aborted after the restart")
	}
	newcomer := take("job", "newcomer") // the new server has no lock on "job"
	select {
	case <-held.Lost:
	case <-time.After(time.Second):
		t.Fatal("a lease taken before the restart is not reported lost")
	}
	// A lease taken after the restart is not lost by it.
	select {
	case <-newcomer.Lost:
		t.Fatal("the newcomer's lease is reported lost")
	default:
	}
	// Renewals of the earlier locks say they are gone, even where a new
	// holder of the same owner and key exists on the new server.
	take("k2", "other")
	if _, err := raw2(r).Set(ctx, "medusa_lock:k3", "o", time.Minute).Result(); err != nil {
		t.Fatal(err)
	}
	if ok, err := p.Renew(ctx, []string{"k3"}, "o", time.Minute); ok || err != nil {
		t.Fatalf("Renew after the restart = %v, %v; want false", ok, err)
	}
	if ok, err := p.Renew(ctx, []string{"job"}, "newcomer", time.Minute); !ok || err != nil {
		t.Fatalf("Renew of the newcomer = %v, %v", ok, err)
	}
}

func raw2(r *ownRedis) *goredis.Client {
	c := goredis.NewClient(&goredis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", r.port)})
	r.t.Cleanup(func() { c.Close() })
	return c
}
