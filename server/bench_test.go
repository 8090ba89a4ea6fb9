package server

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/internal/protocol"
)

// benchConn is a minimal blocking protocol client for benchmarks.
type benchConn struct {
	nc  net.Conn
	r   *bufio.Reader
	out []byte
	n   int
}

func benchDial(b *testing.B, addr, sid string) *benchConn {
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	c := &benchConn{nc: nc, r: bufio.NewReaderSize(nc, 16<<10)}
	c.send("connect " + sid + " 1.0")
	if m := c.recv(); !strings.HasPrefix(m, "connected") {
		b.Fatalf("connect: %q", m)
	}
	return c
}

func (c *benchConn) send(p string) {
	c.out = protocol.Append(c.out[:0], p)
	if _, err := c.nc.Write(c.out); err != nil {
		panic(err)
	}
}

func (c *benchConn) recv() string {
	var h [4]byte
	if _, err := io.ReadFull(c.r, h[:]); err != nil {
		panic(err)
	}
	buf := make([]byte, binary.BigEndian.Uint32(h[:])-4)
	if _, err := io.ReadFull(c.r, buf); err != nil {
		panic(err)
	}
	return string(buf[:len(buf)-1])
}

// lock sends a lock and waits for its grant; it returns the lock id.
func (c *benchConn) lock(res string) string {
	c.n++
	c.send(fmt.Sprintf("lock %d %s 10000 0 0", c.n, res))
	r := c.recv() // result <req> success <id>
	id := r[strings.LastIndexByte(r, ' ')+1:]
	for {
		if m := c.recv(); strings.HasPrefix(m, "locked "+id) {
			return id
		}
	}
}

func (c *benchConn) unlock(id string) {
	c.n++
	c.send(fmt.Sprintf("unlock %d %s", c.n, id))
	if r := c.recv(); !strings.HasSuffix(r, "success done") {
		panic(r)
	}
}

func benchServer(b *testing.B) string {
	srv, err := New(Config{QuietPeriod: -1})
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(ln)
	b.Cleanup(func() { srv.Shutdown(b.Context()) })
	return ln.Addr().String()
}

// BenchmarkServerLockUnlock: W connections, each locking and unlocking its
// own resource over loopback. One op is one lock+unlock cycle; the metric
// cycles/s is the aggregate throughput.
func BenchmarkServerLockUnlock(b *testing.B) {
	for _, w := range []int{1, 16} {
		b.Run(fmt.Sprintf("conns=%d", w), func(b *testing.B) {
			addr := benchServer(b)
			conns := make([]*benchConn, w)
			for i := range conns {
				conns[i] = benchDial(b, addr, fmt.Sprint("bench-", i))
			}
			var next atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			start := time.Now()
			for i, c := range conns {
				wg.Add(1)
				go func() {
					defer wg.Done()
					res := fmt.Sprint("own:", i)
					for next.Add(1) <= int64(b.N) {
						c.unlock(c.lock(res))
					}
				}()
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "cycles/s")
			for _, c := range conns {
				c.nc.Close()
			}
		})
	}
}

// BenchmarkServerHandoff: W connections contend for one hot resource with
// no hold time. Hand-off latency is the time from a holder sending unlock to
// the next holder receiving locked; p50 and p99 are reported in µs.
func BenchmarkServerHandoff(b *testing.B) {
	for _, w := range []int{2, 8} {
		b.Run(fmt.Sprintf("conns=%d", w), func(b *testing.B) {
			addr := benchServer(b)
			conns := make([]*benchConn, w)
			for i := range conns {
				conns[i] = benchDial(b, addr, fmt.Sprint("hot-", i))
			}
			var next atomic.Int64
			var unlockSent atomic.Int64 // ns; set by the holder just before it unlocks
			var mu sync.Mutex
			var lat []time.Duration
			var wg sync.WaitGroup
			b.ResetTimer()
			start := time.Now()
			for _, c := range conns {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var mine []time.Duration
					for next.Add(1) <= int64(b.N) {
						id := c.lock("hot")
						if t0 := unlockSent.Load(); t0 != 0 {
							mine = append(mine, time.Duration(time.Now().UnixNano()-t0))
						}
						unlockSent.Store(time.Now().UnixNano())
						c.unlock(id)
					}
					mu.Lock()
					lat = append(lat, mine...)
					mu.Unlock()
				}()
			}
			wg.Wait()
			elapsed := time.Since(start)
			slices.Sort(lat)
			if len(lat) > 0 {
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
			}
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "grants/s")
			for _, c := range conns {
				c.nc.Close()
			}
		})
	}
}

// BenchmarkPingUnderFlood: one connection floods the server with pipelined
// requests (512 frames per write, its answers drained), while another
// measures ping round trips: one op is one ping. The flooder's kinds are a
// ping and the counters-only status a client without rights gets. p50, p99
// and max are reported in µs: one busy client must not stall the others.
func BenchmarkPingUnderFlood(b *testing.B) {
	for _, kind := range []string{"ping", "status"} {
		b.Run("flood="+kind, func(b *testing.B) {
			addr := benchServer(b)
			flood := benchDial(b, addr, "flood")
			var burst []byte
			for i := range 512 {
				burst = protocol.Append(burst, fmt.Sprintf("%s %d", kind, i+1))
			}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Add(2)
			go func() { // drain the flooder's answers
				defer wg.Done()
				_, _ = io.Copy(io.Discard, flood.nc)
			}()
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					if _, err := flood.nc.Write(burst); err != nil {
						return
					}
				}
			}()
			c := benchDial(b, addr, "pinger")
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := range b.N {
				t0 := time.Now()
				c.send(fmt.Sprintf("ping %d", i+1))
				if r := c.recv(); !strings.HasSuffix(r, "pong") {
					b.Fatalf("ping answered %q", r)
				}
				lat = append(lat, time.Since(t0))
			}
			b.StopTimer()
			close(stop)
			flood.nc.Close()
			wg.Wait()
			c.nc.Close()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
			b.ReportMetric(float64(lat[len(lat)-1].Microseconds()), "max-µs")
		})
	}
}
