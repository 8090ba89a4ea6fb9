package cluster

import (
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// A node that applied a lowering of the cluster version (a rollback) dials with raftMagic, as any
// node below version 2; a peer of this build that has not applied the lowering yet (at version 3)
// refuses that, and would never be caught up: the lowered node dials it again with
// raftMagicVersioned, which it accepts. A node at version 1 that did not lower (a new one, or a
// build that says nothing else) is still refused.
func TestLoweredDialerReachesPeerNotYetLowered(t *testing.T) {
	t.Parallel()
	var va, vb atomic.Int64
	var lowered atomic.Bool
	a, b := versionLayer(t, &va), versionLayer(t, &vb)
	a.lowered = lowered.Load
	va.Store(1)
	vb.Store(3)
	dial := func() (accepts []error, err error) {
		done := make(chan []error, 1)
		go func() {
			var errs []error
			for range 2 {
				e := <-accepted(b)
				errs = append(errs, e)
				if e == nil {
					break
				}
			}
			done <- errs
		}()
		c, err := a.Dial(raft.ServerAddress(b.Addr().String()), time.Second)
		if err != nil {
			b.Close() // ends the second accept
			return <-done, err
		}
		defer c.Close()
		if _, err := c.Write([]byte("hello")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 5)
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "world" {
			t.Fatalf("answer %q, %v", buf, err)
		}
		return <-done, nil
	}

	lowered.Store(true)
	accepts, err := dial()
	if err != nil {
		t.Fatalf("lowered dialer at version 1, acceptor at 3: %v", err)
	}
	if len(accepts) != 2 || accepts[0] == nil || accepts[1] != nil {
		t.Fatalf("acceptor's connections: %v; want the raftMagic one refused, then the versioned one served", accepts)
	}

	// Not lowered: refused, and not dialed again.
	lowered.Store(false)
	if _, err := dial(); err == nil || !strings.Contains(err.Error(), "has applied a cluster version this node has not yet") {
		t.Fatalf("dialer at version 1 that did not lower: %v, want refused", err)
	}
}
