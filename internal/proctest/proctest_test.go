package proctest

import (
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestFreeAddrNeverTwice(t *testing.T) {
	seen := map[string]bool{}
	for range 50 {
		a := FreeAddr(t)
		if seen[a] {
			t.Fatalf("%s handed out twice", a)
		}
		seen[a] = true
		ln, err := net.Listen("tcp", a)
		if err != nil {
			t.Fatalf("%s is not free: %v", a, err)
		}
		ln.Close()
	}
	if p := FreePort(t); p <= 0 || p > 65535 {
		t.Fatalf("FreePort = %d", p)
	}
}

func TestCleanEnv(t *testing.T) {
	t.Setenv("MLOCK_URI", "mlock://example:1")
	t.Setenv("PROCTEST_KEPT", "1")
	env := strings.Join(CleanEnv(), "\n")
	if strings.Contains(env, "MLOCK_URI") || !strings.Contains(env, "PROCTEST_KEPT=1") {
		t.Fatalf("CleanEnv: %s", env)
	}
}

func TestWaitForReturnsWhenTheConditionHolds(t *testing.T) {
	var n atomic.Int32
	go func() {
		for range 3 {
			n.Add(1)
		}
	}()
	WaitFor(t, 10*time.Second, "three increments", func() bool { return n.Load() == 3 })
}

func TestBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: no go build")
	}
	bins := Build(t, t.TempDir(), "./internal/proctest/testdata/hello")
	out, err := execOutput(bins[0])
	if err != nil || out != "hello\n" {
		t.Fatalf("the built program: %q, %v", out, err)
	}
	if _, err := BuildErr(t.TempDir(), "./no/such/package"); err == nil {
		t.Fatal("building a package that does not exist succeeded")
	}
	if _, err := os.Stat(ModuleRoot(t) + "/go.mod"); err != nil {
		t.Fatal(err)
	}
}

func execOutput(bin string) (string, error) {
	out, err := exec.Command(bin).Output()
	return string(out), err
}

// WaitStopped sees a SIGSTOP take effect, and a SIGCONT undo it.
func TestWaitStopped(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("SKIPPED: /proc is Linux's")
	}
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	if allStopped(cmd.Process.Pid) {
		t.Fatal("a running process reads as stopped")
	}
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if !WaitStopped(cmd.Process.Pid, 5*time.Second) {
		t.Fatal("not stopped 5 s after SIGSTOP")
	}
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if WaitStopped(cmd.Process.Pid, 100*time.Millisecond) {
		t.Fatal("still stopped after SIGCONT")
	}
}
