package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/mlock-dev/mlock/internal/proctest"
)

// versionLayer is newLayer at the cluster version held by v.
func versionLayer(t *testing.T, v *atomic.Int64) *streamLayer {
	s := newLayer(t, "the-cluster-secret")
	s.version = func() int { return int(v.Load()) }
	return s
}

// A node that has applied cluster version 2 or more dials with raftMagicVersioned and refuses a peer
// that dials with raftMagic (the previous release's, or this build's before it applied the version);
// below 2 it accepts both. The refusals are counted by host.
func TestRaftConnectionOldPeerRefused(t *testing.T) {
	t.Parallel()
	var va, vb atomic.Int64
	a, b := versionLayer(t, &va), versionLayer(t, &vb)
	dial := func() error {
		got := accepted(b)
		c, err := a.Dial(raft.ServerAddress(b.Addr().String()), time.Second)
		if err != nil {
			if aerr := <-got; aerr == nil {
				t.Fatal("the acceptor read from a refused dialer")
			} else if !errors.Is(aerr, errRaftOldPeer) {
				t.Fatalf("acceptor: %v, want errRaftOldPeer", aerr)
			}
			return err
		}
		defer c.Close()
		helloWorld(t, c)
		if err := <-got; err != nil {
			t.Fatalf("acceptor: %v", err)
		}
		return nil
	}
	for _, tc := range []struct {
		dialer, acceptor int64
		ok               bool
	}{
		{0, 0, true}, {1, 1, true}, {1, 3, false}, {0, 2, false}, {2, 1, true}, {3, 3, true}, {3, 2, true}, {3, 0, true},
	} {
		va.Store(tc.dialer)
		vb.Store(tc.acceptor)
		if err := dial(); (err == nil) != tc.ok {
			t.Fatalf("dialer at version %d, acceptor at %d: Dial: %v, want success %v", tc.dialer, tc.acceptor, err, tc.ok)
		} else if err != nil && !strings.Contains(err.Error(), "has applied a cluster version this node has not yet") {
			t.Fatalf("dialer's error does not say why: %v", err)
		}
	}
	b.mu.Lock()
	n := b.oldPeers["127.0.0.1"].n
	b.mu.Unlock()
	if n != 2 {
		t.Fatalf("refusals counted for 127.0.0.1: %d, want 2", n)
	}
}

// A node that dials with the previous release's handshake is never elected by a cluster at version 2
// or more, even as the only node with the longest log: its vote requests never reach the voter it
// needs. Three nodes at version 1 elect a leader L; the others, O (the old one: it never says a
// version, as v0.1.0) and B. L and B apply version 3. B stops, L commits an entry with O alone, L
// stops, B starts again: O has the longest log, so B cannot win O's vote, and O's vote requests are
// refused by B at the handshake: nobody leads. Once O dials as a node at version 3, B votes for it
// and it leads (the check above could fail).
func TestOldPeerNeverElected(t *testing.T) {
	t.Parallel()
	addrs := freeAddrs(t, 3)
	base := t.TempDir()
	var peers []Peer
	for i, a := range addrs {
		peers = append(peers, Peer{ID: fmt.Sprintf("n%d", i), Addr: a})
	}
	versions := make([]atomic.Int64, 3)
	logs := make([]*proctest.Buffer, 3)
	open := func(i int) *Node {
		t.Helper()
		logs[i] = &proctest.Buffer{}
		cfg := Config{ID: peers[i].ID, RaftAddr: addrs[i], Dir: filepath.Join(base, peers[i].ID), Bootstrap: true, Peers: peers,
			SM: newLockedSM(true), Secret: []byte("tcp-cluster-test-secret"),
			ClusterVersion: func() int { return int(versions[i].Load()) },
			Logger:         slog.New(slog.NewTextHandler(logs[i], nil))}
		fastConfig(&cfg)
		var n *Node
		var err error
		for try := 0; ; try++ { // the port may linger briefly after a close
			if n, err = Open(cfg); err == nil || try == 50 {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	var nodes []*Node
	for i := range versions {
		versions[i].Store(1)
		nodes = append(nodes, open(i))
	}
	defer func() {
		for _, n := range nodes {
			if n != nil {
				n.Close()
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	L := -1
	for end := time.Now().Add(15 * time.Second); L < 0; time.Sleep(10 * time.Millisecond) {
		for i, n := range nodes {
			if n.IsLeader() {
				L = i
			}
		}
		if L < 0 && time.Now().After(end) {
			t.Fatal("no leader within 15 s")
		}
	}
	O, B := (L+1)%3, (L+2)%3
	propose := func(cmd string) uint64 {
		t.Helper()
		if _, err := nodes[L].Propose(ctx, DedupCommand("c", uint64(len(cmd)), []byte(cmd))); err != nil {
			t.Fatal(err)
		}
		return nodes[L].AppliedIndex()
	}
	waitApplied := func(n *Node, idx uint64) {
		t.Helper()
		if err := n.WaitApplied(ctx, idx); err != nil {
			t.Fatal(err)
		}
	}
	idx := propose("one")
	waitApplied(nodes[O], idx)
	waitApplied(nodes[B], idx)

	versions[L].Store(3)
	versions[B].Store(3)
	nodes[B].Close()
	waitApplied(nodes[O], propose("three"))
	nodes[L].Close()
	nodes[L] = nil
	nodes[B] = open(B)
	if o, b := nodes[O].Status().LastIndex, nodes[B].Status().LastIndex; o <= b {
		t.Fatalf("O's log (last index %d) is not longer than B's (%d)", o, b)
	}

	// O campaigns every few hundred ms (a pre-vote first: its term may stay); B never answers it.
	campaigned := false
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if nodes[O].IsLeader() || nodes[B].IsLeader() {
			t.Fatalf("a leader was elected with the old node the only one that can win (the old node leads: %v)", nodes[O].IsLeader())
		}
		campaigned = campaigned || nodes[O].Status().Role == Candidate
	}
	if !campaigned {
		t.Fatal("the old node did not campaign: the test proves nothing")
	}
	if !strings.Contains(logs[B].String(), "a raft peer of a build that cannot read the cluster") {
		t.Fatalf("B did not log the refusal:\n%s", logs[B].String())
	}

	versions[O].Store(3)
	for end := time.Now().Add(15 * time.Second); !nodes[O].IsLeader(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("O, dialing at version 3, was not elected within 15 s")
		}
	}
}

// A peer whose acceptor knows only raftMagic (the previous release: it closes the connection on any
// other magic, unanswered) refuses a node at version 2 or more; the node records it, and a dial that
// succeeds later forgets it.
func TestRaftOldAcceptorRecorded(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	oldAnswer := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var in [len(raftMagic) + nonceLen]byte
		io.ReadFull(c, in[:])
		oldAnswer <- string(in[:len(raftMagic)]) // not raftMagic: the previous release closes
	}()
	var va, vb atomic.Int64
	va.Store(3)
	a, b := versionLayer(t, &va), versionLayer(t, &vb)
	addr := raft.ServerAddress(ln.Addr().String())
	if _, err := a.Dial(addr, time.Second); !errors.Is(err, errRaftOldPeer) || !strings.Contains(err.Error(), "of cluster version 3 (a build that cannot read") {
		t.Fatalf("Dial to an old acceptor: %v, want errRaftOldPeer", err)
	}
	if m := <-oldAnswer; m != raftMagicVersioned {
		t.Fatalf("the dialer at version 3 said %q", m)
	}
	if v := a.refusedAt(string(addr)); v != 3 {
		t.Fatalf("refusedAt = %d, want 3", v)
	}
	n := &Node{stream: a}
	if why := n.PeerRefusesVersion(string(addr)); !strings.Contains(why, "cluster version 3") {
		t.Fatalf("PeerRefusesVersion = %q", why)
	}
	// b answers; an old acceptor's refusal at b's address is forgotten by the dial that succeeds.
	baddr := b.Addr().String()
	a.noteRefused(baddr, raftMagicVersioned, errRaftNoAnswer)
	got := accepted(b)
	c, err := a.Dial(raft.ServerAddress(baddr), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("hello"))
	io.ReadFull(c, make([]byte, 5))
	c.Close()
	<-got
	if v := a.refusedAt(baddr); v != 0 {
		t.Fatalf("refusedAt after a dial that succeeded = %d, want 0", v)
	}
}
