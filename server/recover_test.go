package server

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/internal/cluster"
	"github.com/mlock-dev/mlock/internal/core"
	"github.com/mlock-dev/mlock/internal/datadir"
)

// TestRecoverClusterKeepsLocksAndRaisesTokens: a follower is cut off, the
// two others grant a lock it never hears of, and every node stops. The
// recovered follower leads alone: its session resumes with its lock (same
// id and token), the lock it never heard of is not there, and its next
// token is above the one the old majority gave.
func TestRecoverClusterKeepsLocksAndRaisesTokens(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, true)
	l := tc.leader()
	s := (l + 1) % 3
	a := tc.dial(s, "keeper")
	a.expect("connected 1.0 new * **")
	id := a.lock("1", "kept 600000 0 0")
	tok := a.locked(id)
	w := tc.dial(s, "waiter")
	w.expect("connected 1.0 new * **")
	w.send("lock 1 kept 600000 600000 0")
	w.expect("result 1 success *")

	// Cut s off; the majority grants what s never receives.
	for j := range 3 {
		if j != s {
			tc.trans[j].Disconnect(tc.trans[s].LocalAddr())
			tc.trans[s].Disconnect(tc.trans[j].LocalAddr())
		}
	}
	m := tc.dial(l, "majority")
	m.expect("connected 1.0 new *")
	idM := m.lock("1", "missed 600000 0 0")
	tokM := mustUint(m.locked(idM))
	if tokM <= mustUint(tok) {
		t.Fatalf("the majority's token %d is not above %s", tokM, tok)
	}
	if _, err := RecoverCluster(RecoverConfig{Dir: tc.dirs[s], ID: "n" + strconv.Itoa(s)}); !errors.Is(err, datadir.ErrInUse) {
		t.Fatalf("recovery of a running node's directory: %v", err)
	}
	a.nc.Close()
	w.nc.Close()
	for _, j := range []int{l, (l + 2) % 3, s} {
		tc.stop(j)
	}

	if _, err := RecoverCluster(RecoverConfig{Dir: tc.dirs[s], ID: "nobody"}); !errors.Is(err, cluster.ErrNotMember) {
		t.Fatalf("recovery under another id: %v", err)
	}
	at := time.Now().Add(5 * time.Second)
	rep, err := RecoverCluster(RecoverConfig{Dir: tc.dirs[s], ID: "n" + strconv.Itoa(s), Now: func() time.Time { return at }})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", rep)
	if !rep.Genesis || rep.Held != 1 || rep.Waiting != 1 || rep.Sessions < 2 || len(rep.Previous) != 3 {
		t.Fatalf("report: %+v", rep)
	}
	if rep.LastToken != mustUint(tok) {
		t.Fatalf("last token %d, the survivor's was %s", rep.LastToken, tok)
	}
	if want := tokenFloor(rep.LastToken, 1, rep.Gap); rep.NextToken != want || rep.NextToken <= tokM {
		t.Fatalf("next token %d, want %d and above %d", rep.NextToken, want, tokM)
	}
	if rep.Gap < 5*time.Second || rep.Gap > time.Minute {
		t.Fatalf("gap %v", rep.Gap)
	}

	// A higher floor given wins (a dry run: the recovered state again).
	high := rep.NextToken + 1e9
	dry, err := RecoverCluster(RecoverConfig{Dir: tc.dirs[s], ID: "n" + strconv.Itoa(s), TokenFloor: high, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if dry.NextToken != high || dry.LastToken != rep.NextToken-1 || dry.Replayed != 0 || len(dry.Previous) != 1 {
		t.Fatalf("dry run after the recovery, floor %d: %+v", high, dry)
	}

	tc.start(s)
	if got := tc.leader(); got != s {
		t.Fatalf("leader n%d", got)
	}
	b := tc.dial(s, "keeper")
	if got := b.readWithin(30 * time.Second); !match(got, "connected 1.0 resumed * **") {
		t.Fatalf("after the recovery: %q", got)
	}
	if f := strings.Fields(b.read()); len(f) != 4 || f[0] != "locked" || f[1] != id || f[3] != tok {
		t.Fatalf("lock after the recovery: %q, want %s with token %s", f, id, tok)
	}
	b.send("lock 2 missed 1000 0 0")
	idN := b.expect("result 2 success *")[3]
	if got := mustUint(b.locked(idN)); got < rep.NextToken {
		t.Fatalf("first token after the recovery %d, floor %d", got, rep.NextToken)
	}
}

func TestTokenFloor(t *testing.T) {
	slack := uint64(RecoverClockSlack / time.Microsecond * RecoverTokenRate)
	for _, c := range []struct {
		last    uint64
		waiting int
		gap     time.Duration
		want    uint64
	}{
		{100, 0, 0, 101 + slack},
		{100, 3, time.Second, 104 + slack + 1e6*RecoverTokenRate},
		{100, 0, -time.Hour, 101 + slack},
		{math.MaxUint64 - 5, 0, 0, math.MaxUint64},
		{1 << 63, math.MaxInt, math.MaxInt64, math.MaxUint64},
	} {
		if got := tokenFloor(c.last, c.waiting, c.gap); got != c.want {
			t.Errorf("tokenFloor(%d, %d, %v) = %d, want %d", c.last, c.waiting, c.gap, got, c.want)
		}
	}
}

// TestWithTokenCounter raises the counter of a real core snapshot, which
// then restores with every lock as it was.
func TestWithTokenCounter(t *testing.T) {
	s := replayServer(t, "x", nil)
	c := s.core()
	c.BatchAt(1e18, func(tx *core.Tx) {
		tx.Apply(&core.Command{Op: core.OpAttach, Session: "s"})
		if g := tx.Apply(&core.Command{Op: core.OpLock, Request: core.Request{Session: "s", Resources: []string{"r"}, TTL: time.Minute}}); !g.Grant.Granted {
			t.Fatalf("lock: %+v", g)
		}
	})
	snap, err := c.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var last uint64
	c.Batch(func(tx *core.Tx) { last = tx.LastToken() })
	raised, err := withTokenCounter(snap, last+1000)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := s.newCore(s.set, raised, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	c2.Batch(func(tx *core.Tx) {
		if got := tx.LastToken(); got != last+999 {
			t.Errorf("last token %d, want %d", got, last+999)
		}
		if st := tx.Stats(); st.Held != 1 {
			t.Errorf("held %d", st.Held)
		}
	})
	if same, err := withTokenCounter(snap, last); err != nil || !bytes.Equal(same, snap) {
		t.Fatalf("lowering: %v", err)
	}
	for _, bad := range [][]byte{nil, []byte("mlkc"), []byte("xxxx\x01\x00mlkt\x02\x00\x05"), append([]byte("mlkc\x09\x00"), snap[6:]...)} {
		if _, err := withTokenCounter(bad, 5); !errors.Is(err, errTokenCounter) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

// FuzzWithTokenCounter: any input gives an error or a snapshot whose
// counter reads back as the larger of the two, never a panic.
func FuzzWithTokenCounter(f *testing.F) {
	f.Add([]byte("mlkc\x01\x02mlkt\x02\x04\x07rest"), uint64(9))
	f.Add([]byte("mlkc\x01\x02mlkt\x02\x04\x80"), uint64(1))
	f.Fuzz(func(t *testing.T, b []byte, next uint64) {
		out, err := withTokenCounter(b, next)
		if err != nil {
			return
		}
		again, err := withTokenCounter(out, 0)
		if err != nil || !bytes.Equal(again, out) {
			t.Fatalf("the result does not read back: %v", err)
		}
		// The counter is the uvarint after the two headers.
		i := bytes.Index(out, []byte("mlkt"))
		p := out[i+4:]
		for range 2 {
			if p[0]&0x80 != 0 {
				_, n := binary.Uvarint(p)
				p = p[n:]
			} else {
				p = p[1:]
			}
		}
		got, _ := binary.Uvarint(p)
		if got < next {
			t.Fatalf("counter %d after raising to %d", got, next)
		}
	})
}
