package faulttest

import (
	"net"
	"sync"
	"testing"
	"time"
)

// proxy forwards TCP connections from 127.0.0.1 to a target address and
// injects network faults: cut (close every connection), refuse (close new
// connections at once), blackhole (stop forwarding, connections stay open;
// what was held back is delivered when it ends, as TCP retransmission
// would) and delay (each chunk is forwarded this long after it was read).
//
// Every goroutine belongs to the proxy and ends in close. Lock order: mu only.
type proxy struct {
	ln     net.Listener
	target string

	mu        sync.Mutex
	cond      *sync.Cond // signalled when blackhole or closed change; guarded by mu
	conns     map[net.Conn]struct{}
	refuse    bool          // guarded by mu
	blackhole bool          // guarded by mu
	delay     time.Duration // guarded by mu
	closed    bool          // guarded by mu
	wg        sync.WaitGroup
}

// newProxy listens on a free loopback port and forwards to target until the
// test ends.
func newProxy(t testing.TB, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.refuse || p.closed {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns[c] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(1)
		go p.serve(c)
	}
}

// serve connects c to the target and forwards both ways until either side
// closes or the proxy cuts.
func (p *proxy) serve(c net.Conn) {
	defer p.wg.Done()
	u, err := net.DialTimeout("tcp", p.target, time.Second)
	if err != nil {
		p.drop(c)
		return
	}
	p.mu.Lock()
	if _, ok := p.conns[c]; !ok { // cut while dialling
		p.mu.Unlock()
		c.Close()
		u.Close()
		return
	}
	p.conns[u] = struct{}{}
	p.mu.Unlock()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pipe(u, c) }()
	go func() { defer wg.Done(); p.pipe(c, u) }()
	wg.Wait()
	p.drop(c)
	p.drop(u)
}

func (p *proxy) drop(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

type chunk struct {
	b  []byte
	at time.Time
}

// pipe copies src to dst through a queue, so that reading goes on (and the
// connection stays open) while forwarding is held back. Closing either
// connection ends both directions.
func (p *proxy) pipe(dst, src net.Conn) {
	q := make(chan chunk, 256)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ch := range q {
			p.mu.Lock()
			for p.blackhole && !p.closed {
				p.cond.Wait()
			}
			d := p.delay
			p.mu.Unlock()
			if wait := time.Until(ch.at.Add(d)); wait > 0 {
				time.Sleep(wait) // fixed: the delay the fault injects
			}
			if _, err := dst.Write(ch.b); err != nil {
				src.Close()
				for range q {
				}
				return
			}
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			q <- chunk{b: append([]byte(nil), buf[:n]...), at: time.Now()}
		}
		if err != nil {
			break
		}
	}
	close(q)
	<-done
	dst.Close()
}

// cut closes every open connection (both sides).
func (p *proxy) cut() {
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
	p.mu.Unlock()
}

// setRefuse makes the proxy close new connections at once (on) or accept
// them again (off).
func (p *proxy) setRefuse(on bool) {
	p.mu.Lock()
	p.refuse = on
	p.mu.Unlock()
}

// setBlackhole stops (on) or resumes (off) forwarding on every connection.
func (p *proxy) setBlackhole(on bool) {
	p.mu.Lock()
	p.blackhole = on
	p.cond.Broadcast()
	p.mu.Unlock()
}

// setDelay sets the one-way delay of every chunk forwarded from now on.
func (p *proxy) setDelay(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

func (p *proxy) close() {
	p.mu.Lock()
	p.closed = true
	p.blackhole = false
	p.cond.Broadcast()
	p.mu.Unlock()
	p.ln.Close()
	p.cut()
	p.wg.Wait()
}

// TestProxy checks the proxy's faults against an echo server.
func TestProxy(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var ewg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); ewg.Wait() })
	ewg.Add(1)
	go func() {
		defer ewg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			ewg.Add(1)
			go func() {
				defer ewg.Done()
				defer c.Close()
				b := make([]byte, 1024)
				for {
					n, err := c.Read(b)
					if err != nil {
						return
					}
					if _, err := c.Write(b[:n]); err != nil {
						return
					}
				}
			}()
		}
	}()
	p := newProxy(t, ln.Addr().String())
	dial := func() net.Conn {
		c, err := net.Dial("tcp", p.addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	echo := func(c net.Conn, within time.Duration) (time.Duration, error) {
		start := time.Now()
		_ = c.SetDeadline(start.Add(within))
		if _, err := c.Write([]byte("x")); err != nil {
			return 0, err
		}
		b := make([]byte, 1)
		_, err := c.Read(b)
		return time.Since(start), err
	}
	c := dial()
	if _, err := echo(c, time.Second); err != nil {
		t.Fatalf("plain echo: %v", err)
	}
	p.setDelay(100 * time.Millisecond)
	if d, err := echo(c, 2*time.Second); err != nil || d < 200*time.Millisecond {
		t.Fatalf("delayed echo took %v (%v), want >= 200ms", d, err)
	}
	p.setDelay(0)
	p.setBlackhole(true)
	if _, err := echo(c, 200*time.Millisecond); err == nil {
		t.Fatal("echo went through a blackhole")
	}
	p.setBlackhole(false)
	_ = c.SetDeadline(time.Now().Add(time.Second))
	b := make([]byte, 1)
	if _, err := c.Read(b); err != nil {
		t.Fatalf("held-back byte not delivered after the blackhole: %v", err)
	}
	p.cut()
	if _, err := echo(c, time.Second); err == nil {
		t.Fatal("echo on a cut connection")
	}
	p.setRefuse(true)
	if _, err := echo(dial(), 500*time.Millisecond); err == nil {
		t.Fatal("echo through a refusing proxy")
	}
	p.setRefuse(false)
	if _, err := echo(dial(), time.Second); err != nil {
		t.Fatalf("echo after refuse ended: %v", err)
	}
}
