//go:build linux

package attacktest

import (
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/internal/proctest"
	"github.com/mlock-dev/mlock/internal/protocol"
)

// Bursts of legitimate clients against a real mlockd with the default
// limits: every client of a burst opens its own connection at the same
// instant, sends its connect at once, then a ping. Nobody may be refused or
// evicted while the pre-handshake pool (--max-unauthenticated, 1000) has
// room: 200 clients of one host (a deploy, a cron fleet at :00, a
// reconnect after a restart), and 1000 over four addresses; and a client
// of an address that holds 200 idle connections before their connect.
func TestBurstOfClientsIsAdmitted(t *testing.T) {
	// Not parallel: it runs before the attack tests, whose healthy client
	// (in this process) its thousand clients would slow down.
	raiseNoFile(t)
	bin := mlockdBin(t)
	dir := t.TempDir()
	// The default limits but the auth timeout: the burst's clients are
	// goroutines of this (race-instrumented) test process, and on a busy
	// machine one was scheduled to write its connect more than 5 s after
	// its dial (error auth timeout!). What a burst must not meet is a
	// refusal or an eviction of the pre-handshake pool, which stay
	// asserted; a minute still bounds a client that never sends.
	p := startMlockd(t, bin, dir, proctest.FreeAddr(t), "--data-dir", "none", "--quiet-period", "0", "--auth-timeout", "1m")
	for _, tc := range []struct {
		name    string
		clients int
		ips     []string
	}{
		{"200 from one address", 200, []string{"127.0.0.1"}},
		{"1000 from four addresses", 1000, []string{"127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			watch := watcher(t, p.addr)
			before := watch.limits(t, 0)
			errs := burst(p.addr, tc.name, tc.clients, tc.ips)
			for i, e := range errs {
				if i == 10 {
					t.Errorf("... and %d more", len(errs)-10)
					break
				}
				t.Error(e)
			}
			after := watch.limits(t, 0)
			refused := after.RejectedPerIP - before.RejectedPerIP
			evicted := after.Evicted - before.Evicted
			full := after.rejected - before.rejected
			t.Logf("%d clients from %d address(es): %d failed; refused per address %d, evicted %d, refused at max-conns %d",
				tc.clients, len(tc.ips), len(errs), refused, evicted, full)
			if refused != 0 || evicted != 0 || full != 0 {
				t.Errorf("refused per address %d, evicted %d, refused at max-conns %d; want none", refused, evicted, full)
			}
		})
	}
	// 200 idle connections of one address, before their connect, do not
	// keep that address's next client out.
	t.Run("a client after 200 idle from its address", func(t *testing.T) {
		watch := watcher(t, p.addr)
		before := watch.limits(t, 0)
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.5")}, Timeout: 10 * time.Second}
		for range 200 {
			nc, err := d.Dial("tcp", p.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
		}
		for deadline := time.Now().Add(10 * time.Second); ; {
			if l := watch.limits(t, 1000); l.Unauthenticated == 200 {
				break
			} else if time.Now().After(deadline) {
				t.Fatalf("%d connections before their handshake, want the 200 idle ones", l.Unauthenticated)
			}
			time.Sleep(20 * time.Millisecond) // poll interval
		}
		if err := connectAndPing(p.addr, "127.0.0.5", "after-idle"); err != nil {
			t.Fatalf("a client from the idle connections' address: %v", err)
		}
		after := watch.limits(t, 1000)
		if after.RejectedPerIP != before.RejectedPerIP || after.Evicted != before.Evicted || after.rejected != before.rejected {
			t.Errorf("refused per address %d, evicted %d, refused at max-conns %d; want none",
				after.RejectedPerIP-before.RejectedPerIP, after.Evicted-before.Evicted, after.rejected-before.rejected)
		}
	})
}

// burst opens n connections to addr at once, spread over ips, each sending
// its connect as soon as it is open and then a ping, and returns what went
// wrong (nothing when every one connected and was answered its ping).
func burst(addr, name string, n int, ips []string) []string {
	var (
		mu   sync.Mutex
		errs []string
		wg   sync.WaitGroup
	)
	gate := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ip := ips[i%len(ips)]
			<-gate
			if err := connectAndPing(addr, ip, "burst-"+strings.ReplaceAll(name, " ", "-")+"-"+strconv.Itoa(i)); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Sprintf("client %d from %s: %v", i, ip, err))
				mu.Unlock()
			}
		}()
	}
	close(gate)
	wg.Wait()
	return errs
}

// connectAndPing opens a connection from ip, sends connect and then a ping,
// and checks both answers (each within seconds: the user's patience, not a
// speed goal).
func connectAndPing(addr, ip, sid string) error {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 10 * time.Second}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer nc.Close()
	r := &frameReader{nc: nc}
	if _, err := nc.Write(protocol.Append(nil, "connect "+sid+" 1.0")); err != nil {
		return err
	}
	if p, err := r.next(time.Now().Add(15 * time.Second)); err != nil || !strings.HasPrefix(p, "connected ") {
		return fmt.Errorf("connect: %q %v", p, err)
	}
	if _, err := nc.Write(protocol.Append(nil, "ping p")); err != nil {
		return err
	}
	if p, err := r.next(time.Now().Add(15 * time.Second)); err != nil || p != "result p success pong" {
		return fmt.Errorf("ping: %q %v", p, err)
	}
	return nil
}

// statusWatcher is a connected client that reads the server's counters.
type statusWatcher struct {
	nc net.Conn
	r  *frameReader
	n  int
}

// limitCounts are the admission counters of a status.
type limitCounts struct {
	protocol.StatusLimits
	rejected uint64 // refused at max-conns
}

func watcher(t *testing.T, addr string) *statusWatcher {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	w := &statusWatcher{nc: nc, r: &frameReader{nc: nc}}
	if _, err := nc.Write(protocol.Append(nil, "connect watcher-"+strconv.FormatInt(time.Now().UnixNano(), 36)+" 1.0")); err != nil {
		t.Fatal(err)
	}
	if p, err := w.r.next(time.Now().Add(5 * time.Second)); err != nil || !strings.HasPrefix(p, "connected ") {
		t.Fatalf("watcher's connect: %q %v", p, err)
	}
	return w
}

// limits returns the server's limit counters once it has at most unauthed
// connections before their handshake (waiting up to 10 s for the others to
// end).
func (w *statusWatcher) limits(t *testing.T, unauthed int) limitCounts {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		w.n++
		req := "s" + strconv.Itoa(w.n)
		if _, err := w.nc.Write(protocol.Append(nil, "status "+req)); err != nil {
			t.Fatal(err)
		}
		p, err := w.r.next(time.Now().Add(5 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		body, ok := strings.CutPrefix(p, "result "+req+" success ")
		if !ok {
			t.Fatalf("status: %q", p)
		}
		var st protocol.Status
		if err := json.Unmarshal([]byte(body), &st); err != nil || st.Limits == nil {
			t.Fatalf("status %q: %v", body, err)
		}
		if st.Limits.Unauthenticated <= unauthed || time.Now().After(deadline) {
			return limitCounts{StatusLimits: *st.Limits, rejected: st.RejectedConnections}
		}
		time.Sleep(20 * time.Millisecond) // poll interval
	}
}
