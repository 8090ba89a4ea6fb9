package bench

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/locking"
	"github.com/mlock-dev/mlock/locking/mlockd"
	lredis "github.com/mlock-dev/mlock/locking/redis"
)

// Open returns a target for a provider URL (memory:, mlock://, redis://).
// Unless allowRemote, the host must be a loopback address. The returned
// close function releases the target.
func Open(ctx context.Context, rawURL string, allowRemote bool) (Target, func(), error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return Target{}, nil, err
	}
	if u.Scheme != "memory" && !allowRemote {
		if err := checkLoopback(u.Hostname()); err != nil {
			return Target{}, nil, err
		}
	}
	switch u.Scheme {
	case "memory":
		p := locking.NewMemory()
		return Target{Name: rawURL, Provider: p}, func() { p.Close() }, nil
	case "mlock":
		p, err := mlockd.Open(rawURL)
		if err != nil {
			return Target{}, nil, err
		}
		c, err := mlock.New(rawURL)
		if err != nil {
			p.Close()
			return Target{}, nil, err
		}
		cpu := func(ctx context.Context) (time.Duration, bool) {
			st, err := c.Status(ctx)
			if err != nil {
				return 0, false
			}
			return time.Duration(st.CPUTimeMs * float64(time.Millisecond)), true
		}
		if _, ok := cpu(ctx); !ok {
			c.Close()
			p.Close()
			return Target{}, nil, fmt.Errorf("bench: %s does not answer status", rawURL)
		}
		return Target{Name: rawURL, Provider: p, ServerCPU: cpu}, func() { p.Close(); c.Close() }, nil
	case "redis":
		p, err := lredis.OpenURL(rawURL)
		if err != nil {
			return Target{}, nil, err
		}
		ro, err := goredis.ParseURL(stripQuery(rawURL))
		if err != nil {
			p.Close()
			return Target{}, nil, err
		}
		rdb := goredis.NewClient(ro)
		cpu := func(ctx context.Context) (time.Duration, bool) { return redisCPU(ctx, rdb) }
		if _, ok := cpu(ctx); !ok {
			rdb.Close()
			p.Close()
			return Target{}, nil, fmt.Errorf("bench: %s does not answer INFO", rawURL)
		}
		return Target{Name: rawURL, Provider: p, ServerCPU: cpu}, func() { p.Close(); rdb.Close() }, nil
	}
	return Target{}, nil, fmt.Errorf("bench: unknown URL scheme %q (want memory:, mlock:// or redis://)", u.Scheme)
}

func stripQuery(raw string) string {
	if i := strings.IndexByte(raw, '?'); i >= 0 {
		return raw[:i]
	}
	return raw
}

// redisCPU reads used_cpu_sys + used_cpu_user from INFO cpu.
func redisCPU(ctx context.Context, rdb *goredis.Client) (time.Duration, bool) {
	info, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, false
	}
	var total float64
	found := 0
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, false
			}
			total += f
			found++
		}
	}
	return time.Duration(total * float64(time.Second)), found == 2
}

// checkLoopback refuses hosts that are not loopback addresses.
func checkLoopback(host string) error {
	if host == "" || host == "localhost" {
		return nil
	}
	ips, err := net.LookupIP(host)
	if err != nil {
		return err
	}
	for _, ip := range ips {
		if !ip.IsLoopback() {
			return fmt.Errorf("bench: %s is not a loopback address; pass --allow-remote to load it", host)
		}
	}
	return nil
}
