package faulttest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/internal/proctest"
)

// buildMlockd returns the path of cmd/mlockd, built without -race (see
// programs).
func buildMlockd(t testing.TB) string {
	t.Helper()
	return programs.Paths(t)[0]
}

// token returns a random token and its auth file credential.
func token() (string, string) {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	tok := hex.EncodeToString(b)
	sum := sha256.Sum256([]byte(tok))
	return tok, "sha256:" + hex.EncodeToString(sum[:])
}

// node is one mlockd of the cluster. Its process is replaced on restart;
// its directories stay.
type node struct {
	id     string
	addr   string // client address
	raft   string // Raft address
	dir    string
	args   []string
	logf   *os.File // stdout and stderr of every run, appended
	obs    *mlock.Client
	mu     sync.Mutex
	cmd    *exec.Cmd     // guarded by mu
	done   chan struct{} // closed when cmd has exited; guarded by mu
	paused bool          // guarded by mu
	runs   int           // guarded by mu
}

// cluster is three nodes and the credentials of the clients.
type cluster struct {
	t      testing.TB
	bin    string
	dir    string
	nodes  []*node
	tokens map[string]string // principal -> token
}

// clusterOptions are the servers' settings.
type clusterOptions struct {
	grace   time.Duration // --session-grace
	workers int           // principals w0..w(n-1)
	extra   []string      // more flags of every node
}

// newCluster starts three nodes and waits until they agree on a leader. The
// nodes are stopped (SIGKILL by process id) at the end of the test.
func newCluster(t testing.TB, bin string, o clusterOptions) *cluster {
	dir := t.TempDir()
	c := &cluster{t: t, bin: bin, dir: dir, tokens: map[string]string{}}
	var auth strings.Builder
	names := []string{"obs"}
	for i := range o.workers {
		names = append(names, fmt.Sprintf("w%d", i))
	}
	for _, n := range names {
		tok, cred := token()
		c.tokens[n] = tok
		fmt.Fprintf(&auth, "%s %s prefix=*\n", n, cred)
	}
	// ops: an administrator (cluster membership, rollback).
	tok, cred := token()
	c.tokens["ops"] = tok
	fmt.Fprintf(&auth, "ops %s admin\n", cred)
	authFile := filepath.Join(dir, "auth")
	secretFile := filepath.Join(dir, "secret")
	secret, _ := token()
	if err := os.WriteFile(authFile, []byte(auth.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(secretFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.stopAll)
	// A port handed out free may be taken by another process before the
	// node binds it (the other test binaries of the run dial and listen
	// too): the nodes then start again, on new ports and directories.
	for try := 1; ; try++ {
		err := c.launch(filepath.Join(dir, fmt.Sprintf("try%d", try)), o, authFile, secretFile)
		if err == nil {
			break
		}
		c.stopAll()
		if try == 3 || !strings.Contains(err.Error(), "address already in use") {
			t.Fatal(err)
		}
		t.Logf("starting the cluster again on new ports: %v", err)
	}
	for _, n := range c.nodes {
		obs, err := mlock.NewClient(mlock.Options{Host: "127.0.0.1", Port: port(n.addr), Name: "obs",
			Token: mlock.Secret(c.tokens["obs"]), DialTimeout: 300 * time.Millisecond,
			MaxBackoff: 200 * time.Millisecond, PingInterval: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		n.obs = obs
		t.Cleanup(func() { obs.Close() })
	}
	if _, err := c.waitHealthy(20 * time.Second); err != nil {
		t.Fatalf("the cluster did not come up: %v\n%s", err, c.logTails())
	}
	return c
}

// launch makes c's three nodes, on new free ports and under dir, and
// starts them.
func (c *cluster) launch(dir string, o clusterOptions, authFile, secretFile string) error {
	c.nodes = nil
	var peers []string
	for i := range 3 {
		n := &node{id: fmt.Sprintf("n%d", i+1), addr: proctest.FreeAddr(c.t), raft: proctest.FreeAddr(c.t)}
		n.dir = filepath.Join(dir, n.id)
		if err := os.MkdirAll(n.dir, 0o755); err != nil {
			return err
		}
		peers = append(peers, n.id+"="+n.raft)
		c.nodes = append(c.nodes, n)
	}
	for _, n := range c.nodes {
		n.args = []string{"--listen", n.addr, "--cluster-id", n.id, "--raft-addr", n.raft,
			"--raft-dir", filepath.Join(n.dir, "raft"), "--data-dir", filepath.Join(n.dir, "data"),
			"--cluster-peers", strings.Join(peers, ","), "--cluster-secret-file", secretFile,
			"--auth-file", authFile, "--session-grace", o.grace.String(), "--status-rate", "-1",
			"--log-level", "warn"}
		n.args = append(n.args, o.extra...)
		f, err := os.Create(filepath.Join(n.dir, "mlockd.log"))
		if err != nil {
			return err
		}
		n.logf = f
		c.t.Cleanup(func() { f.Close() })
		if err := c.start(n); err != nil {
			return err
		}
	}
	return nil
}

func port(addr string) int {
	_, p, _ := net.SplitHostPort(addr)
	var n int
	fmt.Sscan(p, &n)
	return n
}

// addrs are the nodes' client addresses, starting with node first.
func (c *cluster) addrs(first int) []string {
	var a []string
	for i := range c.nodes {
		a = append(a, c.nodes[(first+i)%len(c.nodes)].addr)
	}
	return a
}

// byAddr returns the node with client address addr, or nil.
func (c *cluster) byAddr(addr string) *node {
	for _, n := range c.nodes {
		if n.addr == addr {
			return n
		}
	}
	return nil
}

// byID returns the node with id, or nil.
func (c *cluster) byID(id string) *node {
	for _, n := range c.nodes {
		if n.id == id {
			return n
		}
	}
	return nil
}

// start runs n's mlockd in a process group of its own and waits (at most
// 10 s) until its client port accepts connections.
func (c *cluster) start(n *node) error {
	n.mu.Lock()
	if n.cmd != nil {
		select {
		case <-n.done:
		default:
			n.mu.Unlock()
			return fmt.Errorf("%s is running", n.id)
		}
	}
	n.runs++
	fmt.Fprintf(n.logf, "---- start %d at %s\n", n.runs, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(c.bin, n.args...)
	cmd.Dir = n.dir
	cmd.Env = proctest.CleanEnv()
	cmd.Stdout, cmd.Stderr = n.logf, n.logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		n.mu.Unlock()
		return err
	}
	done := make(chan struct{})
	n.cmd, n.done, n.paused = cmd, done, false
	n.mu.Unlock()
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return fmt.Errorf("%s exited before listening on %s; its log:\n%s", n.id, n.addr, n.logTail(15))
		default:
		}
		conn, err := net.DialTimeout("tcp", n.addr, 200*time.Millisecond)
		if err == nil {
			conn.Close()
			return nil
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
	return fmt.Errorf("%s not listening on %s after 10s", n.id, n.addr)
}

// signal sends sig to n's process (by its pid); false if it is not running.
func (n *node) signal(sig syscall.Signal) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return false
	}
	select {
	case <-n.done:
		return false
	default:
	}
	if err := syscall.Kill(n.cmd.Process.Pid, sig); err != nil {
		return false
	}
	switch sig {
	case syscall.SIGSTOP:
		// Its threads stop when next scheduled: on a loaded machine, later.
		// What the caller sends next must find it stopped.
		if !proctest.WaitStopped(n.cmd.Process.Pid, 5*time.Second) {
			return false
		}
		n.paused = true
	case syscall.SIGCONT:
		n.paused = false
	}
	return true
}

// kill sends SIGKILL to n's process and waits (at most 10 s) for its exit.
func (n *node) kill() {
	n.mu.Lock()
	done := n.done
	n.mu.Unlock()
	if !n.signal(syscall.SIGKILL) || done == nil {
		return
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
	}
}

// up reports whether n's process runs and is not paused.
func (n *node) up() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil || n.paused {
		return false
	}
	select {
	case <-n.done:
		return false
	default:
		return true
	}
}

// stopAll kills every node (SIGCONT first for a paused one).
func (c *cluster) stopAll() {
	for _, n := range c.nodes {
		n.signal(syscall.SIGCONT)
		n.kill()
	}
}

// status asks n for its status (at most timeout).
func (n *node) status(timeout time.Duration) (*mlock.Status, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return n.obs.Status(ctx)
}

// statusWait bounds a status asked of a node to find the leader or check
// health: seconds, as a node on a starved machine (load 40 on 2 cores)
// answered none within 500 ms for 15 s and a test found "no leader".
const statusWait = 2 * time.Second

// leader returns the leader the live nodes name, or nil if none answers
// with one.
func (c *cluster) leader() *node {
	for _, n := range c.nodes {
		if !n.up() {
			continue
		}
		st, err := n.status(statusWait)
		if err != nil || st.Cluster == nil || st.Cluster.Leader == "" {
			continue
		}
		if l := c.byID(st.Cluster.Leader); l != nil && l.up() {
			return l
		}
	}
	return nil
}

// waitLeader returns the leader the live nodes name, waiting for one at
// most d (nil if none): a busy machine answers a status slower than
// leader's 500 ms now and then.
func (c *cluster) waitLeader(d time.Duration) *node {
	deadline := time.Now().Add(d)
	for {
		if l := c.leader(); l != nil || !time.Now().Before(deadline) {
			return l
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitHealthy waits (at most d) until every node answers its status and
// all name the same leader, which says it is ready. It returns the leader.
func (c *cluster) waitHealthy(d time.Duration) (*node, error) {
	deadline := time.Now().Add(d)
	var last string
	for time.Now().Before(deadline) {
		leaders := map[string]bool{}
		ok := true
		var ready bool
		for _, n := range c.nodes {
			st, err := n.status(statusWait)
			if err != nil || st.Cluster == nil {
				ok, last = false, fmt.Sprintf("%s: %v", n.id, err)
				break
			}
			leaders[st.Cluster.Leader] = true
			if st.Cluster.Role == "leader" && st.Cluster.Ready {
				ready = true
			}
		}
		if ok && len(leaders) == 1 && !leaders[""] && ready {
			for id := range leaders {
				return c.byID(id), nil
			}
		}
		if ok {
			last = fmt.Sprintf("leaders %v, ready %v", leaders, ready)
		}
		time.Sleep(50 * time.Millisecond) // poll interval (status is rate-limited)
	}
	return nil, fmt.Errorf("not healthy after %v: %s", d, last)
}

// logTails returns the last lines of every node's log.
func (c *cluster) logTails() string {
	var b strings.Builder
	for _, n := range c.nodes {
		fmt.Fprintf(&b, "---- %s (%s)\n%s\n", n.id, n.addr, n.logTail(15))
	}
	return b.String()
}

// logTail returns the last lines of n's log (every run of it).
func (n *node) logTail(lines int) string {
	data, _ := os.ReadFile(filepath.Join(n.dir, "mlockd.log"))
	l := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}
