package cluster

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// The leader's tick timer is set for the next deadline; an entry that brings an earlier one sets it
// again (the FSM pokes the leader only then), and one that brings a later one leaves it.
func TestTickForAnEarlierDeadline(t *testing.T) {
	t.Parallel()
	sm := newLockedSM(false)
	n, err := Open(Config{ID: "a", RaftAddr: "127.0.0.1:0", Bootstrap: true, SM: sm, NextDeadline: sm.nextDeadline})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := n.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	far := time.Now().Add(time.Hour).UnixNano()
	if _, err := n.Propose(ctx, fmt.Appendf(nil, "deadline:%d", far)); err != nil {
		t.Fatal(err)
	}
	waitArmed := func(want int64) {
		t.Helper()
		for n.fsm.armed.Load() != want {
			select {
			case <-ctx.Done():
				t.Fatalf("the tick timer is armed for %d, want the deadline %d", n.fsm.armed.Load(), want)
			case <-time.After(time.Millisecond):
			}
		}
	}
	waitArmed(far)
	later := far + int64(time.Hour)
	if _, err := n.Propose(ctx, fmt.Appendf(nil, "deadline:%d", later)); err != nil {
		t.Fatal(err)
	}
	soon := time.Now().Add(30 * time.Millisecond).UnixNano()
	if _, err := n.Propose(ctx, fmt.Appendf(nil, "deadline:%d", soon)); err != nil {
		t.Fatal(err)
	}
	for {
		var left []int64
		sm.read(func(s *toySM) { left = append(left, s.Deadlines...) })
		if len(left) == 2 {
			if left[0] != far || left[1] != later {
				t.Fatalf("deadlines left %v, want [%d %d]", left, far, later)
			}
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no tick for the earlier deadline (deadlines left %v)", left)
		case <-time.After(5 * time.Millisecond):
		}
	}
	sm.read(func(s *toySM) {
		last := s.Log[len(s.Log)-1]
		var at, dl int64
		if _, err := fmt.Sscanf(last, "%d deadline %d", &at, &dl); err != nil || dl != soon || at < soon {
			t.Fatalf("last log line %q: want a tick at >= %d", last, soon)
		}
	})
	waitArmed(far) // the next deadline again
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
}
