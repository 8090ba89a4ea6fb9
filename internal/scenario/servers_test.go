//go:build unix

package scenario

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/internal/proctest"
)

// binaries are the programs the scenarios run, built (without -race) from
// this repository (see proctest.Programs).
type binaries struct {
	mlockd, mlock, order string
}

// build returns mlockd, mlock and the Go worker, built once for the
// package's tests, in one go build.
func build(t testing.TB) binaries {
	t.Helper()
	b := programs.Paths(t)
	return binaries{mlockd: b[0], mlock: b[1], order: b[2]}
}

var programs = proctest.NewPrograms("./cmd/mlockd", "./cmd/mlock", "./internal/scenario/testdata/order")

// daemon is one mlockd process.
type daemon struct {
	name string
	addr string
	log  string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
}

// startDaemon starts mlockd with args, its output in dir/name.log, and
// waits (at most 15 s) until addr accepts connections. It is killed by its
// PID at the end of the test.
func startDaemon(t testing.TB, bin, dir, name, addr string, args ...string) *daemon {
	t.Helper()
	d := &daemon{name: name, addr: addr, log: filepath.Join(dir, name+".log"), done: make(chan struct{})}
	f, err := os.Create(d.log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	level := "warn"
	if l := os.Getenv("MLOCK_SCENARIO_LOG_LEVEL"); l != "" {
		level = l // debug: every command applied, with its session
	}
	d.cmd = exec.Command(bin, append([]string{"--listen", addr, "--log-level", level}, args...)...)
	d.cmd.Dir = dir
	d.cmd.Env = proctest.CleanEnv()
	d.cmd.Stdout, d.cmd.Stderr = f, f
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = d.cmd.Wait()
		close(d.done)
	}()
	t.Cleanup(d.stop)
	deadline := time.Now().Add(15 * time.Second)
	for {
		select {
		case <-d.done:
			t.Fatalf("%s exited before listening:\n%s", name, tail(d.log, 20))
		default:
		}
		conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			conn.Close()
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not listening on %s after 15s:\n%s", name, addr, tail(d.log, 20))
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
}

// stop kills the process by its PID and waits for it (at most 10 s).
func (d *daemon) stop() {
	select {
	case <-d.done:
		return
	default:
	}
	_ = syscall.Kill(d.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-d.done:
	case <-time.After(10 * time.Second):
	}
}

// target is what the scenarios run against: one mlockd or a cluster.
type target struct {
	name    string
	daemons []*daemon
}

// uri is the URI of worker i: every node's address, starting with node
// i mod n, so that the workers of a cluster reach every node first.
func (tg *target) uri(i int, query string) string {
	var a []string
	for k := range tg.daemons {
		a = append(a, tg.daemons[(i+k)%len(tg.daemons)].addr)
	}
	u := "mlock://" + strings.Join(a, ",")
	if query != "" {
		u += "?" + query
	}
	return u
}

// logTails returns the last lines of every server's log.
func (tg *target) logTails() string {
	var b strings.Builder
	for _, d := range tg.daemons {
		fmt.Fprintf(&b, "---- %s (%s)\n%s\n", d.name, d.addr, tail(d.log, 15))
	}
	return b.String()
}

// startSingle starts one mlockd with its defaults.
func startSingle(t testing.TB, bin string) *target {
	dir := t.TempDir()
	return &target{name: "single", daemons: []*daemon{startDaemon(t, bin, dir, "mlockd", proctest.FreeAddr(t))}}
}

// startCluster starts three mlockd nodes on loopback as docs/cluster.md
// shows (no credentials, the default settings, then args on every node)
// and waits until they agree on a ready leader.
func startCluster(t testing.TB, bin string, args ...string) *target {
	dir := t.TempDir()
	secret := make([]byte, 24)
	_, _ = rand.Read(secret)
	secretFile := filepath.Join(dir, "secret")
	if err := os.WriteFile(secretFile, []byte(hex.EncodeToString(secret)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ids := []string{"a", "b", "c"}
	var addrs, rafts, peers []string
	for _, id := range ids {
		addrs, rafts = append(addrs, proctest.FreeAddr(t)), append(rafts, proctest.FreeAddr(t))
		peers = append(peers, id+"="+rafts[len(rafts)-1])
	}
	tg := &target{name: "cluster"}
	for i, id := range ids {
		argv := []string{"--cluster-id", id, "--raft-addr", rafts[i], "--raft-dir", filepath.Join(dir, id+".raft"),
			"--data-dir", filepath.Join(dir, id+".data"), "--cluster-peers", strings.Join(peers, ","),
			"--cluster-secret-file", secretFile}
		tg.daemons = append(tg.daemons, startDaemon(t, bin, dir, "node-"+id, addrs[i], append(argv, args...)...))
	}
	if err := waitLeader(tg, 30*time.Second); err != nil {
		t.Fatalf("the cluster did not come up: %v\n%s", err, tg.logTails())
	}
	return tg
}

// waitLeader waits (at most d) until every node answers its status naming
// the same leader, which says it is ready.
func waitLeader(tg *target, d time.Duration) error {
	var clients []*mlock.Client
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	for _, n := range tg.daemons {
		c, err := mlock.New("mlock://" + n.addr + "?stay-on-node=1")
		if err != nil {
			return err
		}
		clients = append(clients, c)
	}
	deadline := time.Now().Add(d)
	last := "no answer"
	for time.Now().Before(deadline) {
		leaders := map[string]bool{}
		ready, ok := false, true
		for i, c := range clients {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			st, err := c.Status(ctx)
			cancel()
			if err != nil || st.Cluster == nil {
				ok, last = false, fmt.Sprintf("%s: %v", tg.daemons[i].name, err)
				break
			}
			leaders[st.Cluster.Leader] = true
			ready = ready || (st.Cluster.Role == "leader" && st.Cluster.Ready)
		}
		if ok && len(leaders) == 1 && !leaders[""] && ready {
			return nil
		}
		if ok {
			last = fmt.Sprintf("leaders %v, ready %v", leaders, ready)
		}
		time.Sleep(100 * time.Millisecond) // status is rate-limited (20/s by default)
	}
	return fmt.Errorf("no ready leader after %v: %s", d, last)
}

// tail returns the last n lines of the file at path.
func tail(path string, n int) string {
	data, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
