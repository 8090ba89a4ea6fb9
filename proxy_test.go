package mlock_test

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// proxy forwards TCP connections to a target and can cut them all, to
// simulate a network failure between a client and a server.
type proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
	drop   atomic.Bool // swallow what clients send
	// dropped counts the client bytes drop swallowed.
	dropped atomic.Int64
	// dropBack swallows what the server sends.
	dropBack atomic.Bool
	// pauseBack, while set, holds what the server sends until it is closed.
	pauseBack atomic.Pointer[chan struct{}]
}

// pause holds what the server sends until the returned function is called.
func (p *proxy) pause() (resume func()) {
	ch := make(chan struct{})
	p.pauseBack.Store(&ch)
	return func() {
		p.pauseBack.Store(nil)
		close(ch)
	}
}

func newProxy(t *testing.T, target string) *proxy {
	ln, err := listenFresh(t)
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target}
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
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Add(2)
		go func() { defer p.wg.Done(); p.forward(s, c); s.Close() }()
		go func() { defer p.wg.Done(); p.copy(c, s); c.Close() }()
	}
}

// forward copies client bytes to the server unless drop is set.
func (p *proxy) forward(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && p.drop.Load() {
			p.dropped.Add(int64(n))
		} else if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// cut closes every forwarded connection.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func (p *proxy) close() {
	p.ln.Close()
	p.cut()
	p.wg.Wait()
}

// copy copies server bytes to the client unless dropBack is set.
func (p *proxy) copy(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if ch := p.pauseBack.Load(); ch != nil && n > 0 {
			<-*ch
		}
		if n > 0 && !p.dropBack.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
