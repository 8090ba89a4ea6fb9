package main

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestClusterNodeRaftDiskFull: node c of three runs with its --raft-dir on a
// small tmpfs that fills up while clients lock through the other two (large
// requests: the log's segment fills, and the next cannot be created). c
// stops (fail-stop: it exits and says why), the others serve; the lock
// acknowledged before is still held, tokens only grow, and c, started again
// on the same directory once there is room, catches up and serves.
func TestClusterNodeRaftDiskFull(t *testing.T) {
	t.Parallel()
	mnt := mountTmpfs(t, "64m") // unmounted after the processes are stopped (cleanups run last first)
	e := newOpsEnv(t)
	e.node("a", "b", "c")
	e.vars["C_DIR"] = filepath.Join(mnt, "raft")
	bootstrap(e, "a", "b", "c")
	e.leader("a", "b", "c")
	c := e.client("a", "b")
	held := e.lock(c, "held", 10*time.Second)
	filler := fill(t, mnt)

	name := strings.Repeat("x", 480)
	p := e.proc("c")
	var last uint64
	stopped := false
	for i := 0; i < 5000 && !stopped; i++ {
		var res []string
		for j := range 64 {
			res = append(res, name+strconv.Itoa(i*64+j))
		}
		l := e.lock(c, strings.Join(res, "|"), 20*time.Second)
		last = max(last, l.Token())
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := l.Unlock(ctx); err != nil {
			t.Fatalf("unlock: %v", err)
		}
		cancel()
		select {
		case <-p.done:
			stopped = true
		default:
		}
	}
	if !stopped {
		t.Fatal("c wrote 5000 large entries on a full disk and did not stop")
	}
	if code := p.cmd.ProcessState.ExitCode(); code == 0 {
		t.Fatalf("c exited 0 after its disk filled up")
	}
	if log := e.logOf("c"); !strings.Contains(log, "cannot be written") {
		t.Fatalf("c's log does not say why it stopped:\n%s", tail(log))
	}
	e.leader("a", "b")
	e.held(held, held.Token())
	after := e.lock(c, "after", 15*time.Second)
	if after.Token() <= last || after.Token() <= held.Token() {
		t.Fatalf("token %d after %d", after.Token(), last)
	}
	// Room again: c starts on its directory and catches up.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	x := "$C"
	e.run("mlockd --listen " + x + "_ADDR --cluster-id c --raft-addr " + x + "_RAFT --raft-dir " + x +
		"_DIR --cluster-peers a=$A_RAFT,b=$B_RAFT,c=$C_RAFT --cluster-secret-file $SECRET &")
	deadline := time.Now().Add(min(30*time.Second, e.left()))
	for {
		st, err := e.status("c")
		if err == nil && st.LastToken >= after.Token() && st.Cluster != nil && st.Cluster.Leader != "" {
			break
		}
		if time.Now().After(deadline) {
			var cs any
			if st != nil {
				cs = st.Cluster
			}
			t.Fatalf("c did not catch up within 30 s: %+v %+v, %v (want token %d)", st, cs, err, after.Token())
		}
		time.Sleep(100 * time.Millisecond)
	}
	onC := e.client("c")
	l := e.lock(onC, "on-c", 15*time.Second)
	if l.Token() <= after.Token() {
		t.Fatalf("token %d on c after %d", l.Token(), after.Token())
	}
}

func tail(s string) string {
	if len(s) > 4000 {
		return s[len(s)-4000:]
	}
	return s
}
