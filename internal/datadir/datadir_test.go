package datadir

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

var (
	t0     = time.Unix(1_700_000_000, 0)
	period = QuietPeriod(15 * time.Second)
)

func open(t *testing.T, dir string) *Dir {
	t.Helper()
	d, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func start(t *testing.T, d *Dir, now time.Time) time.Time {
	t.Helper()
	q, err := d.Start(now, period)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func TestQuietPeriod(t *testing.T) {
	if got := QuietPeriod(15 * time.Second); got != 15*time.Second+150*time.Millisecond+5*time.Millisecond {
		t.Fatalf("QuietPeriod(15s) = %v", got)
	}
}

func TestFirstStartIsNotQuiet(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "data")
	d := open(t, dir)
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("directory: %v %v", fi, err)
	}
	if p := d.Previous(); p.Ending != EndingNone || !p.QuietUntil.IsZero() {
		t.Fatalf("previous on a new directory: %+v", p)
	}
	if q := start(t, d, t0); !q.IsZero() {
		t.Fatalf("first start quiet until %v", q)
	}
	// The start is recorded as running.
	b, err := os.ReadFile(filepath.Join(dir, "state"))
	if err != nil || string(b) != "mlockd-state 1\nstatus running\nquiet-until 0\nquiet-period 15155000000\n" {
		t.Fatalf("state file %q %v", b, err)
	}
	if _, err := d.Start(t0, period); err == nil {
		t.Fatal("a second Start succeeded")
	}
}

func TestCrashIsQuiet(t *testing.T) {
	dir := t.TempDir()
	d := open(t, dir)
	start(t, d, t0)
	d.Close() // a crash: no CleanShutdown

	d = open(t, dir)
	if p := d.Previous(); p.Ending != EndingUnclean {
		t.Fatalf("previous after a crash: %+v", p)
	}
	now := t0.Add(time.Minute)
	q := start(t, d, now)
	if !q.Equal(now.Add(period)) {
		t.Fatalf("after a crash quiet until %v, want %v", q, now.Add(period))
	}
	// A crash during the quiet period keeps it: the holders of the first
	// run may still believe until then.
	d.Close()
	d = open(t, dir)
	if p := d.Previous(); p.Ending != EndingUnclean || !p.QuietUntil.Equal(q) {
		t.Fatalf("previous after a crash in the quiet period: %+v", p)
	}
	if q2 := start(t, d, now.Add(time.Second)); !q2.Equal(now.Add(time.Second).Add(period)) {
		t.Fatalf("second crash quiet until %v", q2)
	}
	d.Close()
	d = open(t, dir)
	if q3, _ := d.Start(now.Add(2*time.Second), 0); !q3.Equal(now.Add(2 * time.Second).Add(period)) {
		t.Fatalf("with period 0 the recorded period still counts: %v", q3)
	}
	// That start recorded period 0 and a quiet-until: the time still counts.
	d.Close()
	d = open(t, dir)
	if q4, _ := d.Start(now.Add(3*time.Second), 0); !q4.Equal(now.Add(2 * time.Second).Add(period)) {
		t.Fatalf("with period 0 the recorded time still counts: %v", q4)
	}
}

// The start after a crash is quiet for the longer of the crashed run's
// quiet period and its own: a restart with a shorter session grace (or
// quiet period) must not shorten what the clients of the crashed run may
// believe.
func TestCrashKeepsTheLongerRecordedPeriod(t *testing.T) {
	long, short := QuietPeriod(60*time.Second), QuietPeriod(5*time.Second)
	dir := t.TempDir()
	d := open(t, dir)
	if _, err := d.Start(t0, long); err != nil {
		t.Fatal(err)
	}
	d.Close() // a crash
	d = open(t, dir)
	if p := d.Previous(); p.Ending != EndingUnclean || p.QuietPeriod != long {
		t.Fatalf("previous: %+v, want the period %v recorded", p, long)
	}
	now := t0.Add(time.Minute)
	q, err := d.Start(now, short)
	if err != nil || !q.Equal(now.Add(long)) {
		t.Fatalf("restart with a shorter period quiet until %v (%v), want %v", q, err, now.Add(long))
	}
	// This run recorded its own, shorter period: a crash of it is quiet for
	// the longer of that and the next start's, and for the carried time.
	d.Close()
	d = open(t, dir)
	if p := d.Previous(); p.QuietPeriod != short || !p.QuietUntil.Equal(now.Add(long)) {
		t.Fatalf("previous: %+v", p)
	}
	later := now.Add(2 * time.Minute)
	if q, _ := d.Start(later, time.Second); !q.Equal(later.Add(short)) {
		t.Fatalf("quiet until %v, want %v", q, later.Add(short))
	}
	// A longer period of the new run wins, of course.
	d.Close()
	d = open(t, dir)
	if q, _ := d.Start(later, long); !q.Equal(later.Add(long)) {
		t.Fatalf("quiet until %v, want %v", q, later.Add(long))
	}
	// A clean shutdown records the period too, but its ending is decided by
	// the time recorded: no holder left, no quiet start.
	if st, err := d.CleanShutdown(later, time.Time{}); err != nil || st.Ending != EndingUnconfirmed {
		t.Fatalf("CleanShutdown within the start's quiet period: %+v, %v", st, err)
	}
	d.Close()
	d = open(t, dir)
	if p := d.Previous(); p.Ending != EndingUnconfirmed || p.QuietPeriod != long {
		t.Fatalf("previous after a clean shutdown: %+v", p)
	}
	if q, _ := d.Start(later.Add(2*long), short); !q.IsZero() {
		t.Fatalf("quiet until %v after a shutdown whose time passed", q)
	}
	// A recorded period beyond MaxRecordedQuiet counts as MaxRecordedQuiet.
	d.Close()
	writeState(t, dir, "mlockd-state 1\nstatus running\nquiet-until 0\nquiet-period 999999999999999999\n")
	d = open(t, dir)
	if q, _ := d.Start(t0, short); !q.Equal(t0.Add(MaxRecordedQuiet)) {
		t.Fatalf("quiet until %v, want %v", q, t0.Add(MaxRecordedQuiet))
	}
}

// A state file of an earlier version has no quiet-period line: it parses,
// with no period recorded.
func TestStateWithoutPeriod(t *testing.T) {
	dir := t.TempDir()
	writeState(t, dir, "mlockd-state 1\nstatus running\nquiet-until 0\n")
	d := open(t, dir)
	if p := d.Previous(); p.Ending != EndingUnclean || p.QuietPeriod != 0 || p.Err != nil {
		t.Fatalf("previous: %+v", p)
	}
	if q := start(t, d, t0); !q.Equal(t0.Add(period)) {
		t.Fatalf("quiet until %v, want the start's own period", q)
	}
}

func writeState(t *testing.T, dir, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "state"), []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestCleanShutdown(t *testing.T) {
	dir := t.TempDir()
	d := open(t, dir)
	start(t, d, t0)
	if st, err := d.CleanShutdown(t0, time.Time{}); err != nil || st.Ending != EndingClean || !st.QuietUntil.IsZero() {
		t.Fatalf("CleanShutdown: %+v, %v", st, err)
	}
	d.Close()
	if _, err := d.CleanShutdown(t0, time.Time{}); !errors.Is(err, ErrClosed) {
		t.Fatalf("CleanShutdown after Close: %v", err)
	}
	stateIs(t, dir, "clean", time.Time{})

	d = open(t, dir)
	if p := d.Previous(); p.Ending != EndingClean || !p.QuietUntil.IsZero() {
		t.Fatalf("previous after a clean shutdown: %+v", p)
	}
	if q := start(t, d, t0.Add(time.Second)); !q.IsZero() {
		t.Fatalf("quiet after a clean shutdown without holders: %v", q)
	}
	// Holders did not confirm: they may believe until qu. The file says
	// so in one word, never "clean" with a time.
	qu := t0.Add(20 * time.Second)
	if st, err := d.CleanShutdown(t0.Add(time.Second), qu); err != nil || st.Ending != EndingUnconfirmed || !st.QuietUntil.Equal(qu) {
		t.Fatalf("CleanShutdown with holders: %+v, %v", st, err)
	}
	d.Close()
	stateIs(t, dir, "unconfirmed", qu)
	d = open(t, dir)
	if p := d.Previous(); p.Ending != EndingUnconfirmed || !p.QuietUntil.Equal(qu) {
		t.Fatalf("previous: %+v", p)
	}
	if q := start(t, d, t0.Add(2*time.Second)); !q.Equal(qu) {
		t.Fatalf("quiet until %v, want the recorded %v", q, qu)
	}
	// That run shuts down with no holders of its own during its quiet
	// period: the earlier holders still count, and it is not clean.
	if st, err := d.CleanShutdown(t0.Add(2*time.Second), time.Time{}); err != nil || st.Ending != EndingUnconfirmed || !st.QuietUntil.Equal(qu) {
		t.Fatalf("CleanShutdown during the quiet period: %+v, %v", st, err)
	}
	d.Close()
	stateIs(t, dir, "unconfirmed", qu)
	d = open(t, dir)
	if q := start(t, d, t0.Add(3*time.Second)); !q.Equal(qu) {
		t.Fatalf("quiet until %v, want the carried %v", q, qu)
	}
	// Past the carried time, a shutdown without holders is clean.
	if st, _ := d.CleanShutdown(qu, time.Time{}); st.Ending != EndingClean {
		t.Fatalf("CleanShutdown at the end of the quiet period: %+v", st)
	}
	d.Close()
	stateIs(t, dir, "clean", time.Time{})
	d = open(t, dir)
	if q := start(t, d, qu); !q.IsZero() {
		t.Fatalf("quiet after a clean shutdown: %v", q)
	}
	d.Close()
	// Once the recorded time has passed, an unconfirmed start grants at once.
	writeState(t, dir, string(formatState(State{Ending: EndingUnconfirmed, QuietUntil: qu})))
	d = open(t, dir)
	if q := start(t, d, qu); !q.IsZero() {
		t.Fatalf("quiet after the recorded time passed: %v", q)
	}
}

// stateIs checks the state file's status word and quiet-until.
func stateIs(t *testing.T, dir, word string, qu time.Time) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "state"))
	if err != nil {
		t.Fatal(err)
	}
	q := "0"
	if !qu.IsZero() {
		q = strconv.FormatInt(qu.UnixNano(), 10)
	}
	if want := "mlockd-state 1\nstatus " + word + "\nquiet-until " + q + "\n"; !strings.HasPrefix(string(b), want) {
		t.Fatalf("state file %q, want it to begin %q", b, want)
	}
}

func TestSecondOpenFails(t *testing.T) {
	dir := t.TempDir()
	d := open(t, dir)
	_, err := Open(dir)
	if !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), dir) ||
		!strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())) {
		t.Fatalf("second Open: %v", err)
	}
	d.Close()
	d2, err := Open(dir)
	if err != nil {
		t.Fatalf("Open after Close: %v", err)
	}
	d2.Close()
}

// TestSecondOpenFailsAcrossProcesses runs Open in a child process while
// this one holds the directory.
func TestSecondOpenFailsAcrossProcesses(t *testing.T) {
	if dir := os.Getenv("DATADIR_TEST_CHILD"); dir != "" {
		_, err := Open(dir)
		if errors.Is(err, ErrInUse) {
			os.Exit(3)
		}
		os.Exit(4)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	open(t, dir)
	cmd := exec.Command(exe, "-test.run=^TestSecondOpenFailsAcrossProcesses$")
	cmd.Env = append(os.Environ(), "DATADIR_TEST_CHILD="+dir)
	err = cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("child Open: %v (want exit 3: ErrInUse)", err)
	}
}

func TestCorruptStateIsQuiet(t *testing.T) {
	for _, content := range []string{
		"",
		"garbage",
		"mlockd-state 1\nstatus clean\n",
		"mlockd-state 1\nstatus clean\nquiet-until x\n",
		"mlockd-state 2\nstatus clean\nquiet-until 0\n",
		"mlockd-state 1\nstatus stopped\nquiet-until 0\n",
		"mlockd-state 1\nstatus clean\nquiet-until 0\nmore\n",
		"mlockd-state 1\nstatus clean\nquiet-until 0\nquiet-period 0\n",
		"mlockd-state 1\nstatus clean\nquiet-until 0\nquiet-period -5\n",
		"mlockd-state 1\nstatus clean\nquiet-until 0\nquiet-period 5\nmore\n",
		"mlockd-state 1\nstatus running\nquiet-period 5\nquiet-until 0\n",
	} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "state"), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		d := open(t, dir)
		if p := d.Previous(); p.Ending != EndingUnknown || p.Err == nil {
			t.Fatalf("%q: previous %+v", content, p)
		}
		if q := start(t, d, t0); !q.Equal(t0.Add(period)) {
			t.Fatalf("%q: quiet until %v", content, q)
		}
		d.Close()
	}
}

// A recorded time too far ahead is not believed.
func TestRecordedQuietTooFarAhead(t *testing.T) {
	dir := t.TempDir()
	d := open(t, dir)
	d.CleanShutdown(t0, t0.Add(MaxRecordedQuiet+time.Hour))
	d.Close()
	d = open(t, dir)
	if q := start(t, d, t0); !q.Equal(t0.Add(period)) {
		t.Fatalf("quiet until %v, want the start's own period", q)
	}
}

// A token mark without a state file was written by an older mlockd, whose
// end is unknown: quiet.
func TestOlderDirectoryIsQuiet(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "token-mark"), []byte("5000000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := open(t, dir)
	if p := d.Previous(); p.Ending != EndingUnknown {
		t.Fatalf("previous: %+v", p)
	}
	if q := start(t, d, t0); !q.Equal(t0.Add(period)) {
		t.Fatalf("quiet until %v", q)
	}
}

func TestNilDir(t *testing.T) {
	var d *Dir
	if q, err := d.Start(t0, period); err != nil || !q.Equal(t0.Add(period)) {
		t.Fatalf("nil Start = %v, %v: no history means quiet", q, err)
	}
	if f, err := d.FirstToken(42); err != nil || f != 42 {
		t.Fatalf("nil FirstToken = %d %v", f, err)
	}
	if f, _ := d.FirstToken(0); f != 1 {
		t.Fatalf("nil FirstToken(0) = %d", f)
	}
	if st, err := d.CleanShutdown(t0, t0); err != nil || st.Ending != EndingUnknown {
		t.Fatalf("nil CleanShutdown = %+v, %v", st, err)
	}
	if d.ReserveTokens(1<<40) != nil || d.Close() != nil ||
		d.TokenMark() != 0 || d.Path() != "" || d.Previous().Ending != EndingUnknown {
		t.Fatal("nil Dir methods")
	}
}

func TestEmptyPath(t *testing.T) {
	if _, err := Open(""); err == nil {
		t.Fatal("Open(\"\") succeeded")
	}
}

func TestEndingString(t *testing.T) {
	if EndingUnclean.String() != "unclean" || EndingUnconfirmed.String() != "unconfirmed" || Ending(9).String() != "Ending(9)" {
		t.Fatal(EndingUnclean.String(), EndingUnconfirmed.String(), Ending(9).String())
	}
}

func TestNoTemporaryFilesLeft(t *testing.T) {
	dir := t.TempDir()
	d := open(t, dir)
	start(t, d, t0)
	if _, err := d.FirstToken(1); err != nil {
		t.Fatal(err)
	}
	d.CleanShutdown(t0, time.Time{})
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != "lock state token-mark" {
		t.Fatalf("files: %v", names)
	}
}
