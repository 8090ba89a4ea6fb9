package faulttest

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/internal/proctest"
	"github.com/mlock-dev/mlock/internal/testenv"

	"go.uber.org/goleak"
)

// programs are the programs under test (see proctest.Programs).
var programs = proctest.NewPrograms("./cmd/mlockd", "./cmd/mlock", "./internal/faulttest/testdata/worker")

// bins are their paths, and redis-server's ("" if not in PATH); set by
// binaries.
var bins struct {
	once                  sync.Once
	mlockd, mlock, worker string
	redis                 string
}

func TestMain(m *testing.M) {
	// The fault kinds of one node (TestFaults) and the four cluster tests
	// wait for faults, elections and leases far more than they compute:
	// all at once, not GOMAXPROCS at a time.
	testenv.WaitBound(8)
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// binaries builds cmd/mlockd, cmd/mlock and the worker (without -race) and
// looks up redis-server; it fails the test if the build fails.
func binaries(t testing.TB) {
	t.Helper()
	b := programs.Paths(t)
	bins.once.Do(func() {
		bins.mlockd, bins.mlock, bins.worker = b[0], b[1], b[2]
		bins.redis, _ = exec.LookPath("redis-server")
	})
}

// proc is a started process in its own process group. done closes when it
// has exited; status is then set.
type proc struct {
	cmd    *exec.Cmd
	wid    string
	done   chan struct{}
	status string // exit status ("0", "125", "signal: killed"); set before done closes
	killed atomic.Bool
	exited int64 // Unix ns when the exit was seen; set before done closes
	stderr *tailBuffer
}

// tailBuffer keeps the last 4 KiB written to it.
type tailBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (w *tailBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b = append(w.b, p...)
	if len(w.b) > 4096 {
		w.b = append(w.b[:0], w.b[len(w.b)-4096:]...)
	}
	return len(p), nil
}

func (w *tailBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.b)
}

// start runs name args in dir, in a new process group. The process is
// killed (the whole group) at the end of the test if still running.
func start(t testing.TB, dir string, stdout *os.File, name string, args ...string) (*proc, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = proctest.CleanEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p := &proc{cmd: cmd, done: make(chan struct{}), stderr: &tailBuffer{}}
	if stdout != nil {
		cmd.Stdout, cmd.Stderr = stdout, stdout
	} else {
		cmd.Stderr = p.stderr
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		err := cmd.Wait()
		p.exited = time.Now().UnixNano()
		p.status = "0"
		if ee, ok := err.(*exec.ExitError); ok {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				p.status = "sig:" + strings.ReplaceAll(ws.Signal().String(), " ", "-")
			} else {
				p.status = strconv.Itoa(ee.ExitCode())
			}
		} else if err != nil {
			p.status = "err"
		}
		close(p.done)
	}()
	t.Cleanup(func() { p.kill() })
	return p, nil
}

// signal sends sig to the process group.
func (p *proc) signal(sig syscall.Signal) {
	select {
	case <-p.done:
	default:
		_ = syscall.Kill(-p.cmd.Process.Pid, sig)
	}
}

// kill SIGKILLs the process group and waits for the exit.
func (p *proc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	p.killed.Store(true)
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// waitDial waits until addr accepts TCP connections (and, for Redis,
// answers PING) or the process exits.
func waitDial(p *proc, addr string, redis bool) error {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			return fmt.Errorf("exited (%s) before listening on %s", p.status, addr)
		default:
		}
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			ok := true
			if redis {
				_ = c.SetDeadline(time.Now().Add(time.Second))
				_, _ = c.Write([]byte("PING\r\n"))
				line, _ := bufio.NewReader(c).ReadString('\n')
				ok = strings.HasPrefix(line, "+PONG")
			}
			c.Close()
			if ok {
				return nil
			}
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
	return fmt.Errorf("%s not listening after 10s", addr)
}

// historyLog is the shared log: workers append to the file themselves; the
// harness's own lines go through this (one write per line).
type historyLog struct {
	path string
	mu   sync.Mutex
	f    *os.File
}

func newHistoryLog(t testing.TB, path string) *historyLog {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return &historyLog{path: path, f: f}
}

func (l *historyLog) printf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = l.f.Write([]byte(fmt.Sprintf(format, args...) + "\n"))
}

func (l *historyLog) read() (*history, error) {
	b, err := os.ReadFile(l.path)
	if err != nil {
		return nil, err
	}
	return parseHistory(bytes.NewReader(b))
}

func now() int64 { return time.Now().UnixNano() }
