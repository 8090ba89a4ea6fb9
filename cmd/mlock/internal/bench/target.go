package bench

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/locking"
	"github.com/mlock-dev/mlock/locking/etcd"     // etcd:// for locking.Open
	_ "github.com/mlock-dev/mlock/locking/mlockd" // mlock:// for locking.Open
	_ "github.com/mlock-dev/mlock/locking/redis"  // redis:// for locking.Open
)

// Open returns a target for a provider URL, opened with locking.Open
// (memory:, mlock://host:port, redis://host:port/db, and its
// ?mode=medusa, etcd://host:port[,host:port]). Unless allowRemote, every
// host must be a loopback address. The server's CPU is read from mlockd's
// status, Redis's INFO cpu or etcd's process_cpu_seconds_total (its
// /metrics on each client URL, summed); the in-process memory provider has
// none. The returned close function releases
// the target.
func Open(ctx context.Context, rawURL string, allowRemote bool) (Target, func(), error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return Target{}, nil, err
	}
	hosts := []string{u.Hostname()}
	var nodes []string // mlock(s)://, etcd://: every node of the list
	if u.Scheme == "etcd" {
		if nodes, err = etcd.Endpoints(rawURL); err != nil {
			return Target{}, nil, err
		}
		hosts = hosts[:0]
		for _, n := range nodes {
			h, _, _ := net.SplitHostPort(n)
			hosts = append(hosts, h)
		}
	}
	if u.Scheme == "mlock" || u.Scheme == "mlocks" {
		o, err := mlock.ParseURI(rawURL)
		if err != nil {
			return Target{}, nil, err
		}
		nodes = o.Addrs
		if len(nodes) == 0 {
			nodes = []string{net.JoinHostPort(cmp.Or(o.Host, mlock.DefaultHost), strconv.Itoa(cmp.Or(o.Port, mlock.DefaultPort)))}
		}
		hosts = hosts[:0]
		for _, n := range nodes {
			h, _, _ := net.SplitHostPort(n)
			hosts = append(hosts, h)
		}
	}
	if u.Scheme != "memory" && !allowRemote {
		for _, h := range hosts {
			if err := checkLoopback(h); err != nil {
				return Target{}, nil, err
			}
		}
	}
	cpu, closeCPU, err := serverCPU(ctx, u, rawURL, nodes)
	if err != nil {
		return Target{}, nil, err
	}
	p, err := locking.Open(ctx, rawURL)
	if err != nil {
		closeCPU()
		return Target{}, nil, err
	}
	return Target{Name: rawURL, Provider: p, ServerCPU: cpu}, func() { p.Close(); closeCPU() }, nil
}

// serverCPU returns a probe of the total CPU time of the server behind u,
// checked once, and the function that closes it; a nil probe for a target
// without a server.
//
// For mlock(s):// the probe is the sum over the nodes of the URI (a
// cluster's CPU is every node's), each asked through a client of its own.
func serverCPU(ctx context.Context, u *url.URL, rawURL string, nodes []string) (func(context.Context) (time.Duration, bool), func(), error) {
	var cpu func(context.Context) (time.Duration, bool)
	var closeCPU func() error
	switch u.Scheme {
	case "mlock", "mlocks":
		o, err := mlock.ParseURI(rawURL)
		if err != nil {
			return nil, nil, err
		}
		var clients []*mlock.Client
		closeCPU = func() error {
			var errs []error
			for _, c := range clients {
				errs = append(errs, c.Close())
			}
			return errors.Join(errs...)
		}
		for _, n := range nodes {
			one := o
			one.Addrs, one.SocketID = []string{n}, ""
			one.Host, one.Port = "", 0
			c, err := mlock.NewClient(one)
			if err != nil {
				return nil, nil, errors.Join(err, closeCPU())
			}
			clients = append(clients, c)
		}
		cpu = func(ctx context.Context) (time.Duration, bool) {
			var total time.Duration
			for _, c := range clients {
				st, err := c.Status(ctx)
				if err != nil {
					return 0, false
				}
				total += time.Duration(st.CPUTimeMs * float64(time.Millisecond))
			}
			return total, true
		}
	case "redis":
		bare := *u
		bare.RawQuery = "" // the provider's options
		ro, err := goredis.ParseURL(bare.String())
		if err != nil {
			return nil, nil, err
		}
		rdb := goredis.NewClient(ro)
		closeCPU = rdb.Close
		if ro.Network == "tcp" {
			nodes = []string{ro.Addr}
		}
		cpu = func(ctx context.Context) (time.Duration, bool) { return redisCPU(ctx, rdb) }
	case "etcd":
		hc := &http.Client{Timeout: 5 * time.Second}
		closeCPU = func() error { hc.CloseIdleConnections(); return nil }
		cpu = func(ctx context.Context) (time.Duration, bool) {
			var total time.Duration
			for _, n := range nodes {
				d, ok := etcdCPU(ctx, hc, "http://"+n+"/metrics")
				if !ok {
					return 0, false
				}
				total += d
			}
			return total, true
		}
	default:
		return nil, func() {}, nil
	}
	if _, ok := cpu(ctx); !ok {
		err := fmt.Errorf("bench: %s does not report its CPU time", u.Redacted())
		if derr := reach(ctx, nodes); derr != nil {
			err = fmt.Errorf("bench: %s: server unreachable: %w", u.Redacted(), derr)
		}
		return nil, nil, errors.Join(err, closeCPU())
	}
	return cpu, func() { _ = closeCPU() }, nil
}

// reach dials every address once (the connection closed at once) and
// returns the first failure: why a server did not answer its CPU probe.
func reach(ctx context.Context, addrs []string) error {
	d := net.Dialer{Timeout: 3 * time.Second}
	for _, a := range addrs {
		nc, err := d.DialContext(ctx, "tcp", a)
		if err != nil {
			return err
		}
		nc.Close()
	}
	return nil
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

// etcdCPU reads process_cpu_seconds_total (user + system, 10 ms steps)
// from an etcd /metrics page.
func etcdCPU(ctx context.Context, hc *http.Client, metricsURL string) (time.Duration, bool) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, metricsURL, nil)
	if err != nil {
		return 0, false
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, false
	}
	return parseProcessCPU(io.LimitReader(resp.Body, 8<<20))
}

// parseProcessCPU finds process_cpu_seconds_total in a Prometheus text page.
func parseProcessCPU(r io.Reader) (time.Duration, bool) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), " ")
		if !ok || name != "process_cpu_seconds_total" {
			continue
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || f < 0 {
			return 0, false
		}
		return time.Duration(f * float64(time.Second)), true
	}
	return 0, false
}

// ErrNotLoopback is in the chain of Open's error for a target that is not
// on loopback, when remote targets are not allowed.
var ErrNotLoopback = errors.New("not a loopback address")

// checkLoopback refuses hosts that are not loopback addresses
// (ErrNotLoopback).
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
			return fmt.Errorf("bench: %s is %w; pass --allow-remote to load it", host, ErrNotLoopback)
		}
	}
	return nil
}
