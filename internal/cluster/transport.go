package cluster

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"github.com/mlock-dev/mlock/internal/rawio"
)

// newTCPTransport returns raft's network transport over a TCP stream layer that closes every
// connection, accepted or dialed, when the transport closes (raft's own TCP layer leaves accepted
// connections to the peers, which keeps their handler goroutines alive after Close). With a TLS
// configuration every connection speaks TLS (see newStreamLayer); with a secret, every connection is
// authenticated both ways first (see handshake), inside TLS if there is TLS.
// version (nil: always 0) is the cluster version the node has applied: see streamLayer.version;
// lowered (nil: never), whether it applied a lowering: see streamLayer.lowered.
func newTCPTransport(addr string, secret []byte, tlsConf *tls.Config, version func() int, lowered func() bool, logger hclogLogger) (raft.Transport, *streamLayer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	if a, ok := ln.Addr().(*net.TCPAddr); !ok || a.IP.IsUnspecified() {
		ln.Close()
		return nil, nil, errors.New("cluster: RaftAddr must be an address peers can dial, not " + ln.Addr().String())
	}
	s := newStreamLayer(ln, secret, tlsConf)
	s.version, s.lowered, s.logger = version, lowered, logger
	return noPipeline{raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream:  s,
		MaxPool: 4,
		Timeout: 10 * time.Second,
		Logger:  logger,
	})}, s, nil
}

// noPipeline is the network transport without raft's pipelined replication: the leader sends
// each follower one AppendEntries at a time (batched, up to Config.MaxAppendEntries entries),
// as it does with any transport that has no pipeline. The pipeline of hashicorp/raft 1.8 can
// wedge when a follower answers Success=false while the leader has more to send (a follower
// whose log store write failed, which then stops: fail-stop): the leader's replication of that
// follower stops for good, heartbeats go on, and the follower, restarted on its repaired disk,
// never receives another entry (hashicorp/raft issue 612; TestClusterNodeRaftDirReadOnly, the
// follower, did so in 3 runs of 4 with the pipeline). The cost: docs/benchmarks.md, "Replication
// without raft's pipeline".
type noPipeline struct{ *raft.NetworkTransport }

func (noPipeline) AppendEntriesPipeline(raft.ServerID, raft.ServerAddress) (raft.AppendPipeline, error) {
	return nil, raft.ErrPipelineReplicationNotSupported
}

// streamLayer is a raft.StreamLayer on TCP that tracks its connections.
type streamLayer struct {
	ln  net.Listener
	key []byte // nil: no authentication
	// tls serves accepted connections and, cloned with the peer's host as ServerName, verifies the
	// peers of dialed ones; nil: plain TCP.
	tls *tls.Config

	// handshakes holds a token per accepted connection in its handshake: at most maxHandshakes at
	// once, a connection beyond that is closed (a peer's own connections are few, and pooled).
	handshakes chan struct{}

	// version returns the cluster version this node has applied (nil: 0). With a key, a dialer says
	// raftMagicVersioned once it is versionFenced or more, else raftMagic; an acceptor at
	// versionFenced or more refuses a peer that says raftMagic: a build that cannot read the cluster's
	// log (the previous release, which cannot be changed, says raftMagic and refuses
	// raftMagicVersioned), so its vote requests never reach this node, nor this node's RPCs it.
	version func() int
	// lowered reports whether this node applied a lowering of the cluster version (nil: never): a
	// dial whose raftMagic handshake the peer closes unanswered is made again with
	// raftMagicVersioned (see Config.Lowered).
	lowered func() bool
	// logger logs the refusals of old peers (nil: not logged).
	logger hclogLogger

	mu sync.Mutex
	// oldPeers counts the refused connections of old peers, by remote host; guarded by mu.
	oldPeers map[string]*oldPeer
	// refusedBy holds, by peer address, the cluster version at which the peer last closed this
	// node's raftMagicVersioned handshake without answering (a build that does not know it: see
	// PeerRefusesVersion); a dial that succeeds removes it. Guarded by mu.
	refusedBy map[string]int
	// conns are the open connections; guarded by mu.
	conns map[*trackedConn]struct{}
	// closed is set by Close; guarded by mu.
	closed bool
}

type trackedConn struct {
	net.Conn          // raw, or the TLS connection over it
	raw      net.Conn // the TCP connection
	s        *streamLayer
	once     sync.Once
	// An accepted connection is secured (TLS handshake, then authentication) by its first Read or
	// Write, in the goroutine raft gives the connection, so a silent peer never holds up Accept.
	authOnce sync.Once
	authErr  error
	accepted bool
	// rw reads and writes a plain TCP connection with raw system calls (rawio: the runtime's syscall
	// path wakes its monitor thread on every message after an idle moment); nil: through Conn (TLS).
	rw io.ReadWriter
}

func (c *trackedConn) auth() error {
	if !c.accepted || (c.s.key == nil && c.s.tls == nil) {
		return nil
	}
	c.authOnce.Do(func() {
		if c.authErr = c.s.secureAccepted(c); c.authErr != nil {
			c.raw.Close()
		}
	})
	return c.authErr
}

func (c *trackedConn) Read(p []byte) (int, error) {
	if err := c.auth(); err != nil {
		return 0, err
	}
	if c.rw != nil {
		return c.rw.Read(p)
	}
	return c.Conn.Read(p)
}

func (c *trackedConn) Write(p []byte) (int, error) {
	if err := c.auth(); err != nil {
		return 0, err
	}
	if c.rw != nil {
		return c.rw.Write(p)
	}
	return c.Conn.Write(p)
}

// newStreamLayer returns a stream layer on ln; with a secret its connections are authenticated.
// With tlsConf they speak TLS (1.2 at least): an accepted connection is a tls.Server with tlsConf's
// certificate, a dialed one a tls.Client that verifies the peer's certificate against tlsConf.RootCAs
// (nil: the system's roots) for the host of the address dialed.
func newStreamLayer(ln net.Listener, secret []byte, tlsConf *tls.Config) *streamLayer {
	s := &streamLayer{ln: ln, conns: make(map[*trackedConn]struct{}), handshakes: make(chan struct{}, maxHandshakes)}
	if len(secret) > 0 {
		k := sha256.Sum256(append([]byte("mlock cluster raft\x00"), secret...))
		s.key = k[:]
	}
	if tlsConf != nil {
		s.tls = tlsConf.Clone()
		s.tls.MinVersion = max(s.tls.MinVersion, tls.VersionTLS12)
		// Peers are always verified against RootCAs, whatever the caller's configuration says.
		s.tls.InsecureSkipVerify = false
		s.tls.VerifyPeerCertificate = nil
	}
	return s
}

// Close closes the TCP connection. A TLS connection goes without its close_notify: raft's messages
// are framed, so it would say nothing, and tls.Conn.Close may wait up to 5 s to send it to a peer
// that reads nothing, while raft holds its connection pool's lock.
func (c *trackedConn) Close() error {
	err := c.raw.Close()
	c.once.Do(func() {
		c.s.mu.Lock()
		delete(c.s.conns, c)
		c.s.mu.Unlock()
	})
	return err
}

// track registers the connection raw (used as conn: raw or TLS over it).
func (s *streamLayer) track(raw, conn net.Conn, accepted bool) (*trackedConn, error) {
	tc := &trackedConn{Conn: conn, raw: raw, s: s, accepted: accepted}
	if conn == raw {
		if rc, ok := rawio.New(raw); ok {
			tc.rw = rc
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		raw.Close()
		return nil, net.ErrClosed
	}
	s.conns[tc] = struct{}{}
	return tc, nil
}

// Dial connects to a peer; the connection and the TLS handshake, if any, end within timeout (0:
// handshakeTimeout), then the authentication within handshakeTimeout. A node that applied a lowering
// of the cluster version (lowered) whose raftMagic handshake the peer closes unanswered dials again
// with raftMagicVersioned: a peer of this build that has not applied the lowering yet accepts it (and
// is then caught up); a build that cannot read the log refuses it as well.
func (s *streamLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	if timeout <= 0 {
		timeout = handshakeTimeout
	}
	magic := s.dialMagic()
	c, err := s.dial(addr, timeout, magic)
	var pe *peerError
	if err != nil && magic == raftMagic && s.lowered != nil && errors.As(err, &pe) && pe.noAnswer && s.lowered() {
		if c2, err2 := s.dial(addr, timeout, raftMagicVersioned); err2 == nil {
			return c2, nil
		}
	}
	return c, err
}

// dial is Dial with the handshake's magic.
func (s *streamLayer) dial(addr raft.ServerAddress, timeout time.Duration, magic string) (net.Conn, error) {
	deadline := time.Now().Add(timeout)
	var conn *tls.Conn
	var cfg *tls.Config
	if s.tls != nil {
		host, _, err := net.SplitHostPort(string(addr))
		if err != nil {
			return nil, err
		}
		cfg = s.tls.Clone()
		cfg.ServerName = host
	}
	d := net.Dialer{Deadline: deadline}
	raw, err := d.Dial("tcp", string(addr))
	if err != nil {
		return nil, err
	}
	var c net.Conn = raw
	if cfg != nil {
		conn = tls.Client(raw, cfg)
		c = conn
	}
	tc, err := s.track(raw, c, false)
	if err != nil {
		return nil, err
	}
	if conn != nil {
		if err := raw.SetDeadline(deadline); err != nil {
			tc.Close()
			return nil, err
		}
		if err := conn.Handshake(); err != nil {
			tc.Close()
			return nil, fmt.Errorf("cluster: TLS handshake with raft peer %s: %w (does it speak TLS on its raft port, with a certificate the cluster CA verifies for that host?)", addr, err)
		}
	}
	if s.key != nil {
		err := raw.SetDeadline(time.Now().Add(handshakeTimeout))
		if err == nil {
			err = s.handshake(c, true, magic)
		}
		if err != nil {
			tc.Close()
			s.noteRefused(string(addr), magic, err)
			if errors.Is(err, errRaftNoAnswer) && magic == raftMagic && s.version != nil {
				err = &peerError{kind: errRaftAuth, noAnswer: true, msg: fmt.Sprintf("cluster: raft peer %s closed the connection without answering the handshake "+
					"(it has applied a cluster version this node has not yet: it answers once the leader has caught this node up; "+
					"or it speaks TLS on its raft port, and this node not)", addr)}
			} else if errors.Is(err, errRaftNoAnswer) {
				err = &peerError{kind: errRaftOldPeer, msg: fmt.Sprintf("cluster: raft peer %s closed the connection without answering the handshake "+
					"of cluster version %d (a build that cannot read the cluster's log, as the previous release; "+
					"or it speaks TLS on its raft port, and this node not)", addr, s.refusedAt(string(addr)))}
			}
			return nil, err
		}
	}
	if err := raw.SetDeadline(time.Time{}); err != nil {
		tc.Close()
		return nil, err
	}
	s.noteRefused(string(addr), "", nil)
	return tc, nil
}

// secureAccepted runs the TLS handshake (if any), then the authentication (if any), of an accepted
// connection, together within handshakeTimeout.
func (s *streamLayer) secureAccepted(c *trackedConn) error {
	select {
	case s.handshakes <- struct{}{}:
		defer func() { <-s.handshakes }()
	default:
		return fmt.Errorf("cluster: raft connection from %s refused: %d handshakes under way already", c.raw.RemoteAddr(), maxHandshakes)
	}
	if err := c.raw.SetDeadline(time.Now().Add(handshakeTimeout)); err != nil {
		return err
	}
	if conn, ok := c.Conn.(*tls.Conn); ok {
		if err := conn.Handshake(); err != nil {
			return fmt.Errorf("cluster: TLS handshake with raft peer %s: %w (does it speak TLS on its raft port?)", c.raw.RemoteAddr(), err)
		}
	}
	if s.key != nil {
		if err := s.handshake(c.Conn, false, ""); err != nil {
			if errors.Is(err, errRaftPeerTLS) {
				err = &peerError{kind: errRaftPeerTLS, msg: fmt.Sprintf("cluster: raft peer %s speaks TLS on the raft port and this node does not "+
					"(give every node a certificate, or none)", c.raw.RemoteAddr())}
			}
			return err
		}
	}
	return c.raw.SetDeadline(time.Time{})
}

// Accept waits for a peer's connection.
func (s *streamLayer) Accept() (net.Conn, error) {
	raw, err := s.ln.Accept()
	if err != nil {
		return nil, err
	}
	c := raw
	if s.tls != nil {
		c = tls.Server(raw, s.tls)
	}
	return s.track(raw, c, true)
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
		c.raw.Close()
	}
	return err
}

// Addr is the listener's address (advertised to peers).
func (s *streamLayer) Addr() net.Addr { return s.ln.Addr() }

// The handshake of an authenticated raft connection. The dialer sends raftMagic and a random nonce;
// the acceptor answers with its own nonce and the MAC of both under the key ("accept"); the dialer
// checks it and sends its MAC ("dial"). Each side thus proves it knows the cluster secret without
// sending it, before any raft RPC, within handshakeTimeout. It authenticates the peer; TLS, when the
// nodes have certificates, encrypts the stream (the handshake then runs inside it): see
// docs/cluster.md.
const (
	raftMagic = "MLRAFT1\n"
	// raftMagicVersioned starts the handshake of a node of a build that knows the cluster version,
	// once it has applied versionFenced or more (the previous release's acceptor refuses it).
	raftMagicVersioned = "MLRAFT3\n"
	// versionFenced is the lowest cluster version whose log the previous release cannot read (it
	// skips what it cannot decode and would serve a diverged state).
	versionFenced    = 2
	nonceLen         = 32
	handshakeTimeout = 5 * time.Second
	// maxHandshakes bounds the accepted connections in their handshake at once (TLS costs the
	// acceptor a signature before the secret is checked).
	maxHandshakes = 64
)

var (
	// errRaftAuth: the peer did not prove it knows the cluster secret.
	errRaftAuth = errors.New("cluster: raft peer failed authentication (a different cluster secret?)")
	// errRaftPeerTLS: a node without TLS received a TLS ClientHello instead of the handshake.
	errRaftPeerTLS = errors.New("cluster: the raft peer speaks TLS and this node does not")
	// errRaftNoAnswer: the dialer's peer closed the connection without answering (Dial explains).
	errRaftNoAnswer = errors.New("cluster: the raft peer did not answer the handshake")
	// errRaftOldPeer: the acceptor is at a cluster version the peer's build cannot read (it said
	// raftMagic).
	errRaftOldPeer = errors.New("cluster: a raft peer of a build that cannot read the cluster's log")
)

// peerError is a failed handshake with a peer, explained: its message, and the error it matches
// (errors.Is).
type peerError struct {
	msg  string
	kind error
	// noAnswer: the peer closed a raftMagic handshake unanswered (it is at a cluster version of 2 or
	// more).
	noAnswer bool
}

func (e *peerError) Error() string { return e.msg }
func (e *peerError) Unwrap() error { return e.kind }

func (s *streamLayer) mac(role string, dialNonce, acceptNonce, binding []byte) []byte {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(role))
	m.Write(dialNonce)
	m.Write(acceptNonce)
	m.Write(binding)
	return m.Sum(nil)
}

// bindingLabel labels the keying material a TLS connection exports for the handshake (RFC 5705).
const bindingLabel = "EXPORTER-mlock-raft-auth"

// binding returns what ties the handshake to c's TLS session: keying material both ends of that one
// TLS session derive, and nobody else (nil on a plain connection). A relay that holds a certificate
// the cluster CA accepts ends two TLS sessions with different material, so the MACs it forwards do
// not verify.
func binding(c net.Conn) ([]byte, error) {
	tc, ok := c.(*tls.Conn)
	if !ok {
		return nil, nil
	}
	st := tc.ConnectionState()
	return st.ExportKeyingMaterial(bindingLabel, nil, 32)
}

// handshake authenticates c (as the dialer, which starts with magic, or the acceptor); the caller
// bounds it with a deadline.
// On a TLS connection the MACs also cover the session's exported keying material (see binding).
func (s *streamLayer) handshake(c net.Conn, dialer bool, magic string) error {
	bind, err := binding(c)
	if err != nil {
		return fmt.Errorf("cluster: raft handshake: %w", err)
	}
	var dn, an [nonceLen]byte
	if dialer {
		rand.Read(dn[:])
		if _, err := c.Write(append([]byte(magic), dn[:]...)); err != nil {
			return err
		}
		var in [nonceLen + sha256.Size]byte
		if n, err := io.ReadFull(c, in[:]); err != nil {
			if n == 0 && !isTimeout(err) {
				return errRaftNoAnswer
			}
			return errRaftAuth
		}
		copy(an[:], in[:nonceLen])
		if !hmac.Equal(in[nonceLen:], s.mac("accept", dn[:], an[:], bind)) {
			return errRaftAuth
		}
		if _, err := c.Write(s.mac("dial", dn[:], an[:], bind)); err != nil {
			return err
		}
		return nil
	}
	var in [len(raftMagic) + nonceLen]byte
	n, err := io.ReadFull(c, in[:])
	magic = string(in[:len(raftMagic)])
	if err != nil || (magic != raftMagic && magic != raftMagicVersioned) {
		if n >= 2 && in[0] == 0x16 && in[1] == 0x03 { // a TLS handshake record
			return errRaftPeerTLS
		}
		return errRaftAuth
	}
	if v := s.versionNow(); magic == raftMagic && v >= versionFenced {
		// Refused before the MACs: an old peer is refused whatever it knows, and says nothing more.
		return s.refuseOld(c.RemoteAddr(), v)
	}
	copy(dn[:], in[len(raftMagic):])
	rand.Read(an[:])
	if _, err := c.Write(append(an[:], s.mac("accept", dn[:], an[:], bind)...)); err != nil {
		return err
	}
	var m [sha256.Size]byte
	if _, err := io.ReadFull(c, m[:]); err != nil || !hmac.Equal(m[:], s.mac("dial", dn[:], an[:], bind)) {
		return errRaftAuth
	}
	return nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// versionNow is the cluster version this node has applied (0 without a version func).
func (s *streamLayer) versionNow() int {
	if s.version == nil {
		return 0
	}
	return s.version()
}

// dialMagic is what this node's handshake starts with: raftMagicVersioned once it has applied
// versionFenced, else raftMagic (a node that has not applied it yet, restarted or new, is accepted
// only by peers that have not either, and by any once a leader has caught it up).
func (s *streamLayer) dialMagic() string {
	if s.versionNow() >= versionFenced {
		return raftMagicVersioned
	}
	return raftMagic
}

// oldPeer counts the refused connections of one remote host.
type oldPeer struct {
	n      uint64
	logged time.Time // when the last refusal was logged
}

// oldPeerLogEvery is how often the refusals of one host are logged again (with their count).
const oldPeerLogEvery = time.Minute

// refuseOld records the refusal of an old peer's connection from addr at cluster version v, logs the
// first of each host and then one a minute with the count, and returns the error that closes it.
func (s *streamLayer) refuseOld(addr net.Addr, v int) error {
	host := addr.String()
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	now := time.Now()
	s.mu.Lock()
	if s.oldPeers == nil {
		s.oldPeers = map[string]*oldPeer{}
	}
	p := s.oldPeers[host]
	if p == nil {
		if len(s.oldPeers) >= maxOldPeers {
			clear(s.oldPeers)
		}
		p = &oldPeer{}
		s.oldPeers[host] = p
	}
	p.n++
	n, log := p.n, p.logged.IsZero() || now.Sub(p.logged) >= oldPeerLogEvery
	if log {
		p.logged = now
	}
	s.mu.Unlock()
	if log && s.logger != nil {
		s.logger.Warn("cluster: a raft peer of a build that cannot read the cluster's log: its connection is refused",
			"peer", addr.String(), "cluster-version", v, "refused", n)
	}
	return &peerError{kind: errRaftOldPeer, msg: fmt.Sprintf("cluster: raft connection from %s refused: a raft peer of a build "+
		"that cannot read the cluster's log (version %d), or of this build before it has applied it", addr, v)}
}

// maxOldPeers bounds the hosts whose refusals are counted (the counts start again beyond it).
const maxOldPeers = 1024

// noteRefused records the end of a dial to addr that started with magic: err nil (it succeeded)
// forgets addr; errRaftNoAnswer to raftMagicVersioned records the version dialed at.
func (s *streamLayer) noteRefused(addr, magic string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil {
		delete(s.refusedBy, addr)
		return
	}
	if magic != raftMagicVersioned || !errors.Is(err, errRaftNoAnswer) {
		return
	}
	if s.refusedBy == nil {
		s.refusedBy = map[string]int{}
	}
	if len(s.refusedBy) >= maxOldPeers {
		clear(s.refusedBy)
	}
	s.refusedBy[addr] = max(s.versionNow(), versionFenced)
}

// refusedAt returns the cluster version at which the peer at addr last refused this node's handshake
// (0: it did not, or a dial succeeded since).
func (s *streamLayer) refusedAt(addr string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refusedBy[addr]
}
