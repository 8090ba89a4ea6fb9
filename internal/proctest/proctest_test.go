package proctest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
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

// Where the kernel names its ephemeral range, the ports are drawn below
// it, where no outgoing connection takes them.
func TestFreeAddrBelowTheEphemeralRange(t *testing.T) {
	low := ephemeralLow()
	if low < minPort+1000 {
		t.Skipf("no ephemeral range to stay below (first port %d)", low)
	}
	for range 20 {
		_, p, _ := net.SplitHostPort(FreeAddr(t))
		if n, err := strconv.Atoi(p); err != nil || n < minPort || n >= low {
			t.Fatalf("port %s, want one in [%d, %d)", p, minPort, low)
		}
	}
}

// A port claimed by another live process is refused; the claim of a
// process that has exited, or an old one, is taken over.
func TestClaimPort(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	dir := portClaims()
	claimant := func(port string) string {
		b, err := os.ReadFile(filepath.Join(dir, port))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	me := strconv.Itoa(os.Getpid())
	if !claimPort("70001") || claimant("70001") != me {
		t.Fatalf("a free port was not claimed (claim %q)", claimant("70001"))
	}
	if claimPort("70001") {
		t.Fatal("a port this process claimed was claimed again")
	}

	other := exec.Command("sleep", "30")
	if err := other.Start(); err != nil {
		t.Skipf("no sleep program: %v", err)
	}
	pid := strconv.Itoa(other.Process.Pid)
	write := func(port, content string, age time.Duration) {
		name := filepath.Join(dir, port)
		if err := os.WriteFile(name, []byte(content), 0o666); err != nil {
			t.Fatal(err)
		}
		at := time.Now().Add(-age)
		if err := os.Chtimes(name, at, at); err != nil {
			t.Fatal(err)
		}
	}
	write("70002", pid, 0)
	write("70003", pid, claimMaxAge+time.Minute)
	write("70004", "", 0)
	write("70005", "", 2*time.Minute)
	if claimPort("70002") || claimant("70002") != pid {
		t.Fatal("a port another live process claimed was taken")
	}
	if !claimPort("70003") || claimant("70003") != me {
		t.Fatal("a claim older than claimMaxAge was not taken over")
	}
	if claimPort("70004") {
		t.Fatal("a claim being written was taken")
	}
	if !claimPort("70005") {
		t.Fatal("an unreadable claim of two minutes ago was not taken over")
	}
	_ = other.Process.Kill()
	_ = other.Wait()
	if !claimPort("70002") || claimant("70002") != me {
		t.Fatal("the claim of an exited process was not taken over")
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

// Programs builds into the checkout's shared directory: a second Programs
// of the same package (another test binary of the run) finds the program
// up to date and does not write it again; builds from two at once both
// succeed; a package that does not exist fails.
func TestPrograms(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: no go build")
	}
	bins := NewPrograms("./internal/proctest/testdata/hello").Paths(t)
	out, err := execOutput(bins[0])
	if err != nil || out != "hello\n" {
		t.Fatalf("the built program: %q, %v", out, err)
	}
	if want := filepath.Join(ModuleRoot(t), ".testbin", "hello"); bins[0] != want {
		t.Fatalf("built at %s, want %s", bins[0], want)
	}
	before, err := os.Stat(bins[0])
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = NewPrograms("./internal/proctest/testdata/hello").Build()
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	after, err := os.Stat(bins[0])
	if err != nil {
		t.Fatal(err)
	}
	// go build touches an up-to-date program's time; written again, it
	// would be a new file.
	if !os.SameFile(before, after) {
		t.Error("the program was written again: it was up to date")
	}
	if _, err := NewPrograms("./no/such/package").Build(); err == nil {
		t.Fatal("building a package that does not exist succeeded")
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

// Writers at once, and a reader among them: String holds every write whole.
func TestBufferConcurrent(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for range 100 {
				fmt.Fprintf(&b, "w%d;", i)
				_ = b.String()
			}
		})
	}
	wg.Wait()
	got := b.String()
	for i := range 8 {
		if n := strings.Count(got, fmt.Sprintf("w%d;", i)); n != 100 {
			t.Errorf("writer %d: %d writes in the buffer, want 100", i, n)
		}
	}
	if len(got) != 8*100*3 {
		t.Errorf("buffer holds %d bytes, want %d", len(got), 8*100*3)
	}
}

// fatalTB records a Fatalf and ends its goroutine, as testing.T does.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (f *fatalTB) Fatal(args ...any) {
	f.msg = fmt.Sprint(args...)
	runtime.Goexit()
}

// GrantAgain returns the first token granted; a token not above the last
// one, and a refusal past the timeout, fail the test.
func TestGrantAgain(t *testing.T) {
	calls := 0
	cycle := func(tok uint64, refusals int) func() (uint64, string) {
		return func() (uint64, string) {
			calls++
			if calls <= refusals {
				return 0, "no tokens"
			}
			return tok, ""
		}
	}
	if got := GrantAgain(t, 10*time.Second, time.Millisecond, "the repair", 5, cycle(7, 3)); got != 7 || calls != 4 {
		t.Fatalf("GrantAgain = %d after %d calls, want 7 after 4", got, calls)
	}
	for _, c := range []struct {
		tok      uint64
		refusals int
		want     string
	}{
		{5, 0, "token 5 after 5"},
		{9, 1 << 30, `still refused 0 s after the repair: "no tokens"`},
	} {
		calls = 0
		f := &fatalTB{TB: t}
		done := make(chan struct{})
		go func() {
			defer close(done)
			GrantAgain(f, 0, time.Millisecond, "the repair", 5, cycle(c.tok, c.refusals))
			t.Errorf("GrantAgain returned for %+v", c)
		}()
		<-done
		if f.msg != c.want {
			t.Errorf("GrantAgain's failure: %q, want %q", f.msg, c.want)
		}
	}
}

// TokenMark reads the number in token-mark; a missing file or one without
// a number fails the test.
func TestTokenMark(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "token-mark"), []byte("4096\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := TokenMark(t, dir); got != 4096 {
		t.Fatalf("TokenMark = %d, want 4096", got)
	}
	for _, c := range []struct{ content, want string }{{"", "no such file"}, {"x\n", "invalid syntax"}} {
		d := t.TempDir()
		if c.content != "" {
			if err := os.WriteFile(filepath.Join(d, "token-mark"), []byte(c.content), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		f := &fatalTB{TB: t}
		done := make(chan struct{})
		go func() {
			defer close(done)
			TokenMark(f, d)
			t.Errorf("TokenMark returned for %q", c.content)
		}()
		<-done
		if !strings.Contains(f.msg, c.want) {
			t.Errorf("TokenMark's failure for %q: %q, want %q in it", c.content, f.msg, c.want)
		}
	}
}

// GrantUntilRefused stops at the first refusal, or after max grants, and
// calls each with every token granted; a token not above the one before
// fails the test.
func TestGrantUntilRefused(t *testing.T) {
	seq := func(toks ...uint64) func() (uint64, string) {
		return func() (uint64, string) {
			if len(toks) == 0 {
				return 0, "no tokens"
			}
			tok := toks[0]
			toks = toks[1:]
			return tok, ""
		}
	}
	var seen []uint64
	last, why := GrantUntilRefused(t, 10, 2, seq(3, 5, 8), func(tok uint64) { seen = append(seen, tok) })
	if last != 8 || why != "no tokens" || !slices.Equal(seen, []uint64{3, 5, 8}) {
		t.Fatalf("GrantUntilRefused = %d, %q, each saw %v; want 8, \"no tokens\", [3 5 8]", last, why, seen)
	}
	if last, why := GrantUntilRefused(t, 2, 0, seq(1, 2, 3), nil); last != 2 || why != "" {
		t.Fatalf("GrantUntilRefused past max = %d, %q; want 2, \"\"", last, why)
	}
	if last, why := GrantUntilRefused(t, 2, 7, seq(), nil); last != 7 || why != "no tokens" {
		t.Fatalf("GrantUntilRefused refused at once = %d, %q; want 7, \"no tokens\"", last, why)
	}
	f := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		GrantUntilRefused(f, 10, 0, seq(4, 4), nil)
		t.Error("GrantUntilRefused returned after a token repeated")
	}()
	<-done
	if f.msg != "token 4 after 4" {
		t.Errorf("GrantUntilRefused's failure: %q, want \"token 4 after 4\"", f.msg)
	}
}
