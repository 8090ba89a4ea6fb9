package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// openPty returns the two ends of a new pseudo-terminal.
func openPty(t *testing.T) (ptm, pts *os.File) {
	t.Helper()
	ptm, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	t.Cleanup(func() { ptm.Close() })
	if err := unix.IoctlSetPointerInt(int(ptm.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetUint32(int(ptm.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	pts, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pts.Close() })
	return ptm, pts
}

// On a terminal the command shares mlock run's process group, so a ^C
// reaches it from the terminal: mlock run must not send it a second one
// (a program that takes a second interrupt as "stop at once", as many do,
// would not stop cleanly). A signal sent to mlock run alone is still
// forwarded.
func TestRunTerminalInterruptOnce(t *testing.T) {
	t.Parallel()
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("needs python3 for a command that counts its signals")
	}
	uri := startServer(t)
	ptm, pts := openPty(t)
	dir := t.TempDir()
	log, ready := filepath.Join(dir, "log"), filepath.Join(dir, "ready")
	prog := `import signal, sys, time
def note(s, f):
    with open(sys.argv[1], "a") as f:
        f.write(signal.Signals(s).name + "\n")
    if s == signal.SIGTERM:
        sys.exit(0)
signal.signal(signal.SIGINT, note)
signal.signal(signal.SIGTERM, note)
open(sys.argv[2], "w").close()
while True:
    time.sleep(0.05)
`
	cmd := mlockCmd("run", "--uri", uri, "--quiet", "tty-int", "--", python, "-c", prog, log, ready)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = pts, pts, pts
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go io.Copy(io.Discard, ptm)
	waitFile := func(path, want string) string {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; {
			if b, err := os.ReadFile(path); err == nil && strings.Contains(string(b), want) {
				return string(b)
			}
			if time.Now().After(deadline) {
				cmd.Process.Kill()
				b, _ := os.ReadFile(path)
				t.Fatalf("%s never held %q (it holds %q)", path, want, b)
			}
			time.Sleep(10 * time.Millisecond) // poll interval
		}
	}
	waitFile(ready, "")
	if _, err := ptm.Write([]byte{3}); err != nil { // ^C
		t.Fatal(err)
	}
	waitFile(log, "SIGINT\n")
	cmd.Process.Signal(syscall.SIGTERM) // to mlock run alone: forwarded, after any forwarded ^C
	got := waitFile(log, "SIGTERM\n")
	if code := exitCodeOf(t, cmd.Wait()); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if got != "SIGINT\nSIGTERM\n" {
		t.Fatalf("the command got %q, want one SIGINT (from the terminal), then the forwarded SIGTERM", got)
	}
}
