package cluster

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// newTCPTransport returns raft's network transport over a TCP stream layer that closes every
// connection, accepted or dialed, when the transport closes (raft's own TCP layer leaves accepted
// connections to the peers, which keeps their handler goroutines alive after Close). With a secret,
// every connection is authenticated both ways first (see handshake).
func newTCPTransport(addr string, secret []byte, logger hclogLogger) (raft.Transport, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	if a, ok := ln.Addr().(*net.TCPAddr); !ok || a.IP.IsUnspecified() {
		ln.Close()
		return nil, errors.New("cluster: RaftAddr must be an address peers can dial, not " + ln.Addr().String())
	}
	s := newStreamLayer(ln, secret)
	return raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream:  s,
		MaxPool: 4,
		Timeout: 10 * time.Second,
		Logger:  logger,
	}), nil
}

// streamLayer is a raft.StreamLayer on TCP that tracks its connections.
type streamLayer struct {
	ln  net.Listener
	key []byte // nil: no authentication

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
	// An accepted connection is authenticated by its first Read or Write (in the goroutine raft
	// gives the connection, so a silent peer never holds up Accept).
	authOnce sync.Once
	authErr  error
	accepted bool
}

func (c *trackedConn) auth() error {
	if !c.accepted || c.s.key == nil {
		return nil
	}
	c.authOnce.Do(func() {
		if c.authErr = c.s.handshake(c.Conn, false); c.authErr != nil {
			c.Conn.Close()
		}
	})
	return c.authErr
}

func (c *trackedConn) Read(p []byte) (int, error) {
	if err := c.auth(); err != nil {
		return 0, err
	}
	return c.Conn.Read(p)
}

func (c *trackedConn) Write(p []byte) (int, error) {
	if err := c.auth(); err != nil {
		return 0, err
	}
	return c.Conn.Write(p)
}

// newStreamLayer returns a stream layer on ln; with a secret its connections are authenticated.
func newStreamLayer(ln net.Listener, secret []byte) *streamLayer {
	s := &streamLayer{ln: ln, conns: make(map[*trackedConn]struct{})}
	if len(secret) > 0 {
		k := sha256.Sum256(append([]byte("mlock cluster raft\x00"), secret...))
		s.key = k[:]
	}
	return s
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

func (s *streamLayer) track(c net.Conn, accepted bool) (*trackedConn, error) {
	tc := &trackedConn{Conn: c, s: s, accepted: accepted}
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
	tc, err := s.track(c, false)
	if err != nil {
		return nil, err
	}
	if s.key != nil {
		if err := s.handshake(c, true); err != nil {
			tc.Close()
			return nil, err
		}
	}
	return tc, nil
}

// Accept waits for a peer's connection.
func (s *streamLayer) Accept() (net.Conn, error) {
	c, err := s.ln.Accept()
	if err != nil {
		return nil, err
	}
	return s.track(c, true)
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

// The handshake of an authenticated raft connection. The dialer sends raftMagic and a random nonce;
// the acceptor answers with its own nonce and the MAC of both under the key ("accept"); the dialer
// checks it and sends its MAC ("dial"). Each side thus proves it knows the cluster secret without
// sending it, before any raft RPC, within handshakeTimeout. (It authenticates the peer; it does not
// encrypt the stream: see docs/cluster.md.)
const (
	raftMagic        = "MLRAFT1\n"
	nonceLen         = 32
	handshakeTimeout = 5 * time.Second
)

// errRaftAuth: the peer did not prove it knows the cluster secret.
var errRaftAuth = errors.New("cluster: raft peer failed authentication (a different cluster secret?)")

func (s *streamLayer) mac(role string, dialNonce, acceptNonce []byte) []byte {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(role))
	m.Write(dialNonce)
	m.Write(acceptNonce)
	return m.Sum(nil)
}

func (s *streamLayer) handshake(c net.Conn, dialer bool) error {
	if err := c.SetDeadline(time.Now().Add(handshakeTimeout)); err != nil {
		return err
	}
	var dn, an [nonceLen]byte
	if dialer {
		rand.Read(dn[:])
		if _, err := c.Write(append([]byte(raftMagic), dn[:]...)); err != nil {
			return err
		}
		var in [nonceLen + sha256.Size]byte
		if _, err := io.ReadFull(c, in[:]); err != nil {
			return errRaftAuth
		}
		copy(an[:], in[:nonceLen])
		if !hmac.Equal(in[nonceLen:], s.mac("accept", dn[:], an[:])) {
			return errRaftAuth
		}
		if _, err := c.Write(s.mac("dial", dn[:], an[:])); err != nil {
			return err
		}
	} else {
		var in [len(raftMagic) + nonceLen]byte
		if _, err := io.ReadFull(c, in[:]); err != nil || string(in[:len(raftMagic)]) != raftMagic {
			return errRaftAuth
		}
		copy(dn[:], in[len(raftMagic):])
		rand.Read(an[:])
		if _, err := c.Write(append(an[:], s.mac("accept", dn[:], an[:])...)); err != nil {
			return err
		}
		var m [sha256.Size]byte
		if _, err := io.ReadFull(c, m[:]); err != nil || !hmac.Equal(m[:], s.mac("dial", dn[:], an[:])) {
			return errRaftAuth
		}
	}
	return c.SetDeadline(time.Time{})
}
