package cluster

import (
	"errors"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// newTCPTransport returns raft's network transport over a TCP stream layer that closes every
// connection, accepted or dialed, when the transport closes (raft's own TCP layer leaves accepted
// connections to the peers, which keeps their handler goroutines alive after Close).
func newTCPTransport(addr string, logger hclogLogger) (raft.Transport, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	if a, ok := ln.Addr().(*net.TCPAddr); !ok || a.IP.IsUnspecified() {
		ln.Close()
		return nil, errors.New("cluster: RaftAddr must be an address peers can dial, not " + ln.Addr().String())
	}
	s := &streamLayer{ln: ln, conns: make(map[*trackedConn]struct{})}
	return raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream:  s,
		MaxPool: 4,
		Timeout: 10 * time.Second,
		Logger:  logger,
	}), nil
}

// streamLayer is a raft.StreamLayer on TCP that tracks its connections.
type streamLayer struct {
	ln net.Listener

	mu sync.Mutex
	// conns are the open connections; guarded by mu.
	conns map[*trackedConn]struct{}
	// closed is set by Close; guarded by mu.
	closed bool
}

type trackedConn struct {
	net.Conn
	s    *streamLayer
	once sync.Once
}

func (c *trackedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.s.mu.Lock()
		delete(c.s.conns, c)
		c.s.mu.Unlock()
	})
	return err
}

func (s *streamLayer) track(c net.Conn) (net.Conn, error) {
	tc := &trackedConn{Conn: c, s: s}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		c.Close()
		return nil, net.ErrClosed
	}
	s.conns[tc] = struct{}{}
	return tc, nil
}

// Dial connects to a peer.
func (s *streamLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	c, err := d.Dial("tcp", string(addr))
	if err != nil {
		return nil, err
	}
	return s.track(c)
}

// Accept waits for a peer's connection.
func (s *streamLayer) Accept() (net.Conn, error) {
	c, err := s.ln.Accept()
	if err != nil {
		return nil, err
	}
	return s.track(c)
}

// Close closes the listener and every open connection.
func (s *streamLayer) Close() error {
	err := s.ln.Close()
	s.mu.Lock()
	s.closed = true
	conns := s.conns
	s.conns = nil
	s.mu.Unlock()
	for c := range conns {
		c.Conn.Close()
	}
	return err
}

// Addr is the listener's address (advertised to peers).
func (s *streamLayer) Addr() net.Addr { return s.ln.Addr() }
