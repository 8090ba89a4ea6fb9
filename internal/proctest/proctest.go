// Package proctest is what the test suites that run the module's programs
// as processes share (internal/scenario, internal/faulttest,
// internal/attacktest, cmd/mlock, cmd/mlockd): the module's root, one go build
// of the programs, an environment without the caller's MLOCK_ settings,
// free loopback addresses, and waiting for a condition with a deadline.
// It is for tests only.
package proctest

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// ModuleRoot returns the directory of the module's go.mod.
func ModuleRoot(t testing.TB) string {
	t.Helper()
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil || strings.TrimSpace(string(out)) == "" {
		return "", fmt.Errorf("finding the module root: %v", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out))), nil
}

// Programs are programs of the module that a test binary starts as
// processes (packages given relative to the module root, such as
// "./cmd/mlockd"), built without -race on first use.
//
// They go to the checkout's .testbin directory (git ignores it), which the
// test binaries of a go test run share: go build links a program again only
// when what it is built from has changed, so a run links each program once,
// however many packages start it (linking mlockd takes about 2 s of CPU).
// A lock file keeps two test binaries from building at the same time. The
// programs are built with -trimpath: the compiled packages do not depend on
// the checkout's directory, so another clone of the same commit finds them
// in go's cache.
type Programs struct {
	pkgs []string
	once sync.Once
	bins []string
	err  error
}

// NewPrograms returns the Programs of pkgs; nothing is built yet.
func NewPrograms(pkgs ...string) *Programs { return &Programs{pkgs: pkgs} }

// Paths builds the programs on its first call and returns their paths in
// the order of the packages. A failed build fails t, at every call.
func (p *Programs) Paths(t testing.TB) []string {
	t.Helper()
	bins, err := p.Build()
	if err != nil {
		t.Fatal(err)
	}
	return bins
}

// Build is Paths for a caller without a test at hand (a goroutine): the
// paths, or why the build failed.
func (p *Programs) Build() ([]string, error) {
	p.once.Do(func() { p.bins, p.err = buildShared(p.pkgs) })
	return p.bins, p.err
}

// buildShared builds pkgs into the checkout's .testbin directory, holding
// its lock.
func buildShared(pkgs []string) ([]string, error) {
	root, err := moduleRoot()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(root, ".testbin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	unlock, err := lockFile(filepath.Join(dir, ".lock"))
	if err != nil {
		return nil, fmt.Errorf("locking %s: %v", dir, err)
	}
	defer unlock()
	cmd := exec.Command("go", append([]string{"build", "-trimpath", "-o", dir + string(filepath.Separator)}, pkgs...)...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build %s: %v\n%s", strings.Join(pkgs, " "), err, out)
	}
	bins := make([]string, len(pkgs))
	for i, p := range pkgs {
		bins[i] = filepath.Join(dir, path.Base(p))
	}
	return bins, nil
}

// CleanEnv returns this process's environment without the MLOCK_
// variables, so that the caller's settings reach neither the servers nor
// the workers the tests start.
func CleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MLOCK_") {
			env = append(env, kv)
		}
	}
	return env
}

// handedOut holds the addresses FreeAddr returned: the kernel may hand out
// a port just closed again, and two servers given one port fail to start.
var handedOut = struct {
	sync.Mutex
	m map[string]bool
}{m: map[string]bool{}}

// FreeAddr returns a loopback host:port that was free a moment ago and was
// not returned before in this test binary, nor claimed by another test
// process still running (see claimPort). Where the kernel says which
// ports it gives outgoing connections (Linux: ip_local_port_range), the
// port is drawn below that range: the connections the other processes of a
// run open meanwhile never take it before the server it is meant for binds
// it (a port the kernel handed out for a listener on port 0 could be).
func FreeAddr(t testing.TB) string {
	t.Helper()
	a, err := NewFreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// NewFreeAddr is FreeAddr for a caller without a test (a TestMain).
func NewFreeAddr() (string, error) {
	handedOut.Lock()
	defer handedOut.Unlock()
	low := ephemeralLow()
	for range 100 {
		try := "127.0.0.1:0"
		if low >= minPort+1000 {
			try = "127.0.0.1:" + strconv.Itoa(minPort+rand.IntN(low-minPort))
		}
		ln, err := net.Listen("tcp", try)
		if err != nil {
			if try != "127.0.0.1:0" {
				continue // in use
			}
			return "", err
		}
		a := ln.Addr().String()
		ln.Close()
		if handedOut.m[a] {
			continue
		}
		if _, port, _ := net.SplitHostPort(a); !claimPort(port) {
			continue // another test process holds it
		}
		handedOut.m[a] = true
		return a, nil
	}
	return "", errors.New("no new free port in 100 tries")
}

// minPort is the lowest port FreeAddr draws.
const minPort = 10000

// ephemeralLow returns the first port of the range the kernel gives
// outgoing connections, or 0 if it does not say (not Linux).
var ephemeralLow = sync.OnceValue(func() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	n, _ := strconv.Atoi(f[0])
	return n
})

// FreePort is FreeAddr's port.
func FreePort(t testing.TB) int {
	t.Helper()
	_, port, _ := net.SplitHostPort(FreeAddr(t))
	n := 0
	for _, c := range port {
		n = n*10 + int(c-'0')
	}
	return n
}

// WaitFor polls cond until it holds, and fails the test with what (what
// was waited for) if it does not within timeout. For states that announce
// themselves by no event (another process's files, a server's counters):
// where there is a channel or a log line to wait on, wait on that.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for pause := time.Millisecond; !cond(); pause = min(2*pause, 50*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, timeout)
		}
		time.Sleep(pause) // the poll's interval: cond has no event to wait on
	}
}

// WaitStopped waits until every thread of process pid is stopped (state T
// in /proc, after a SIGSTOP), at most d, and reports whether it is. A
// stopped process answers nothing, but the stop takes effect when each of
// its threads is next scheduled: on a loaded machine a test that pauses a
// server and at once sends it work must wait for this first. Linux only:
// elsewhere it reports true at once.
func WaitStopped(pid int, d time.Duration) bool {
	if runtime.GOOS != "linux" {
		return true
	}
	deadline := time.Now().Add(d)
	for {
		if allStopped(pid) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond) // poll interval: no event says a process stopped
	}
}

// allStopped reports whether every thread of pid is in state T or t.
func allStopped(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		if err != nil {
			return false
		}
		// pid (comm) state ...: comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) || (b[i+2] != 'T' && b[i+2] != 't') {
			return false
		}
	}
	return true
}
