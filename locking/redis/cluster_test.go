package redis_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/mlock-dev/mlock/internal/proctest"
	"github.com/mlock-dev/mlock/locking"
	"github.com/mlock-dev/mlock/locking/redis"
)

// startClusterNode starts redis-server bin in cluster mode on a free port
// and returns its address once it answers. A server that exits first (its
// port, or its cluster bus port 10000 above, taken meanwhile by another
// process of the run) is started again on another port, at most 3 times.
func startClusterNode(t *testing.T, bin string) string {
	t.Helper()
retry:
	for try := 1; ; try++ {
		port := proctest.FreePort(t)
		dir := t.TempDir()
		cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(dir, "nodes.conf"), "--dir", dir)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() {
			_ = cmd.Wait()
			close(exited)
		}()
		t.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			<-exited
		})
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		node := goredis.NewClient(&goredis.Options{Addr: addr, MaxRetries: -1})
		up := false
		for deadline := time.Now().Add(10 * time.Second); !up; {
			select {
			case <-exited:
				node.Close()
				if try == 3 {
					t.Fatalf("redis-server exited before answering:\n%s", out.String())
				}
				t.Logf("redis-server on port %d exited before answering; again on another port:\n%s", port, out.String())
				continue retry
			default:
			}
			up = node.Ping(context.Background()).Err() == nil
			if !up && time.Now().After(deadline) {
				t.Fatal("redis-server did not start")
			}
			if !up {
				time.Sleep(20 * time.Millisecond) // poll interval
			}
		}
		node.Close()
		return addr
	}
}

// startCluster starts a one-node Redis Cluster (every slot on one node: it
// still refuses a script whose keys are in different slots) and returns a
// cluster client of it; skipped without redis-server.
func startCluster(t *testing.T) *goredis.ClusterClient {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server not found: skipping the Redis Cluster test")
	}
	addr := startClusterNode(t, bin)
	node := goredis.NewClient(&goredis.Options{Addr: addr})
	defer node.Close()
	ctx := context.Background()
	if err := node.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		if info, _ := node.ClusterInfo(ctx).Result(); strings.Contains(info, "cluster_state:ok") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the cluster never became ready")
		}
		time.Sleep(20 * time.Millisecond) // poll interval
	}
	c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: []string{addr}})
	t.Cleanup(func() { c.Close() })
	return c
}

// On Redis Cluster the keys of one call share a hash slot through their
// hash tag; the provider's own keys (token keys, fencing counter) must go
// with them, or every script is refused (CROSSSLOT). Tokens grow per hash
// tag; a key without a hash tag is refused with a clear error.
func TestRedisCluster(t *testing.T) {
	t.Parallel() // on a cluster of its own
	rdb := startCluster(t)
	p, err := redis.New(rdb, redis.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	keys := []string{"{cart:1}:a", "{cart:1}:b"}
	l1, err := p.Acquire(ctx, keys, locking.AcquireOptions{OwnerID: "o1", Expire: time.Minute})
	if err != nil {
		t.Fatalf("acquire on Redis Cluster: %v", err)
	}
	_, err = p.Acquire(ctx, keys[:1], locking.AcquireOptions{OwnerID: "o2"})
	if !errors.Is(err, locking.ErrConflict) {
		t.Fatalf("another owner: %v, want a conflict", err)
	}
	renewed, err := p.Acquire(ctx, keys, locking.AcquireOptions{OwnerID: "o1", Expire: time.Minute})
	if err != nil || renewed.Token != l1.Token {
		t.Fatalf("renewal: token %d, %v; want %d", renewed.Token, err, l1.Token)
	}
	if ok, err := p.Renew(ctx, keys, "o1", time.Minute); !ok || err != nil {
		t.Fatalf("renew: %v, %v", ok, err)
	}
	if ok, err := p.Release(ctx, keys, locking.ReleaseOptions{OwnerID: "o1"}); !ok || err != nil {
		t.Fatalf("release: %v, %v", ok, err)
	}
	l2, err := p.Acquire(ctx, keys, locking.AcquireOptions{OwnerID: "o2", Expire: time.Minute})
	if err != nil || l2.Token <= l1.Token {
		t.Fatalf("next acquisition: token %d, %v; want above %d", l2.Token, err, l1.Token)
	}
	if err := p.ReleaseAll(ctx, locking.ReleaseOptions{OwnerID: "o2"}); err != nil {
		t.Fatal(err)
	}
	ran := false
	if err := locking.Execute(ctx, p, keys, func(context.Context) error { ran = true; return nil }, locking.ExecuteOptions{}); err != nil || !ran {
		t.Fatalf("Execute after ReleaseAll: ran %v, %v", ran, err)
	}
	_, err = p.Acquire(ctx, []string{"untagged"}, locking.AcquireOptions{})
	if err == nil || !strings.Contains(err.Error(), "hash tag") {
		t.Fatalf("a key without hash tag: %v, want an error that asks for one", err)
	}
}
