package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/internal/testenv"
)

// The sections of README.md whose example commands TestReadmeCommands runs.
var readmeSections = []string{"## The command line", "### mlock for cron"}

// readmeCommand is one example command of README.md.
type readmeCommand struct {
	section string
	line    string            // as written
	args    []string          // its words, the schedule of a crontab line left out
	comment string            // the text after " # ", if any
	env     map[string]string // crontab: the assignments above it (else nil)
	crontab bool
}

// TestReadmeCommands runs every example command of README.md's "The command
// line" and "mlock for cron" sections, read from the README's fenced blocks,
// against a real mlockd (built by the README's own go install) and, for
// bench's --vs, a real Redis, and checks the exit status and output the
// README states. A command of a kind the test has no check for fails it, so
// the README and the commands cannot drift apart.
//
// What the test changes, and only that: the server's address (a free port
// on loopback, given to the commands as $MLOCK_URI or written over the
// README's host:port), the job of mlock run (a small script in a temporary
// directory standing for ./nightly-report.sh and /opt/report/nightly.sh),
// Redis's URL ($REDIS_URL; without it, and without CI, bench runs without
// --vs) and bench's length (--duration 1s). go install writes into a
// temporary GOBIN.
func TestReadmeCommands(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	cmds, err := readmeCommands(string(readme), readmeSections)
	if err != nil {
		t.Fatal(err)
	}
	r := &readmeRun{t: t, root: root, dir: t.TempDir()}
	r.bin = filepath.Join(r.dir, "bin")
	for _, c := range cmds {
		t.Logf("%s: %s", c.section, c.line)
		switch {
		case len(c.args) >= 2 && c.args[0] == "go" && c.args[1] == "install":
			r.goInstall(c)
		case len(c.args) >= 2 && c.args[0] == "mlock":
			r.startServer()
			switch c.args[1] {
			case "run":
				r.run(c)
			case "status":
				r.status(c)
			case "locks":
				r.locks(c)
			case "bench":
				r.bench(c)
			default:
				t.Fatalf("README.md: no check for %q: add one to TestReadmeCommands", c.line)
			}
		default:
			t.Fatalf("README.md: no check for %q: add one to TestReadmeCommands", c.line)
		}
	}
	if r.checked == 0 {
		t.Fatal("README.md: no command of mlock found in its sections")
	}
}

// readmeCommands returns the commands of the fenced blocks of the named
// sections of a README (a section ends at the next heading): the lines of
// sh blocks that are not comments, and the command lines of crontab blocks
// (their variables go with them). It refuses what it cannot run without a
// shell: quotes, pipes, redirections, variables.
func readmeCommands(readme string, sections []string) ([]readmeCommand, error) {
	lines := strings.Split(readme, "\n")
	var cmds []readmeCommand
	for _, sec := range sections {
		start := -1
		for i, l := range lines {
			if strings.TrimSpace(l) == sec {
				start = i + 1
				break
			}
		}
		if start < 0 {
			return nil, fmt.Errorf("README.md has no section %q", sec)
		}
		fence, blocks := "", 0
		env := map[string]string{}
		for _, l := range lines[start:] {
			if fence == "" && strings.HasPrefix(l, "#") {
				break // the next heading
			}
			if strings.HasPrefix(l, "```") {
				if fence == "" {
					fence = strings.TrimPrefix(l, "```")
					if fence != "sh" && fence != "crontab" {
						return nil, fmt.Errorf("%s: a fenced block of %q: the test runs sh and crontab blocks only", sec, fence)
					}
					blocks++
				} else {
					fence = ""
				}
				continue
			}
			text := strings.TrimSpace(l)
			if fence == "" || text == "" || strings.HasPrefix(text, "#") {
				continue
			}
			c := readmeCommand{section: sec, line: text}
			if i := strings.Index(text, " #"); i >= 0 {
				c.comment = strings.TrimSpace(text[i+2:])
				text = strings.TrimSpace(text[:i])
			}
			if strings.ContainsAny(text, "'\"`$|;&<>\\") {
				return nil, fmt.Errorf("%s: %q needs a shell; the test runs commands without one", sec, c.line)
			}
			words := strings.Fields(text)
			if fence == "crontab" {
				if k, v, ok := strings.Cut(text, "="); ok && len(words) == 1 && regexp.MustCompile(`^[A-Z_][A-Z0-9_]*$`).MatchString(k) {
					env[k] = v
					continue
				}
				if len(words) < 6 {
					return nil, fmt.Errorf("%s: %q is not a crontab line", sec, c.line)
				}
				for _, f := range words[:5] {
					if !regexp.MustCompile(`^[0-9*/,-]+$`).MatchString(f) {
						return nil, fmt.Errorf("%s: %q: %q is not a schedule field", sec, c.line, f)
					}
				}
				words = words[5:]
				c.crontab, c.env = true, maps.Clone(env)
			}
			c.args = words
			cmds = append(cmds, c)
		}
		if blocks == 0 {
			return nil, fmt.Errorf("README.md's section %q has no fenced block", sec)
		}
	}
	return cmds, nil
}

// readmeRun is the state of one run of the README's commands.
type readmeRun struct {
	t       *testing.T
	root    string // the repository
	dir     string // scratch directory
	bin     string // where go install put mlock and mlockd
	addr    string // mlockd's address, once started
	checked int    // commands of mlock checked
	job     int    // jobs written
}

// goInstall runs go install as written, into a temporary GOBIN, and checks
// that it built the commands it names.
func (r *readmeRun) goInstall(c readmeCommand) {
	t := r.t
	// go test runs with its go command on PATH, as the other tests that
	// build binaries assume. -trimpath, as proctest builds the programs the
	// other tests start: the same compiled packages, from go's cache.
	// GOFLAGS from go env, not from the environment only: a GOFLAGS set
	// with go env -w (such as -buildvcs=false) is what proctest's builds
	// get, and the variable set here would hide it.
	goflags, err := exec.Command("go", "env", "GOFLAGS").Output()
	if err != nil {
		t.Fatalf("go env GOFLAGS: %v", err)
	}
	cmd := exec.Command("go", c.args[1:]...)
	cmd.Dir = r.root
	cmd.Env = append(os.Environ(), "GOBIN="+r.bin, "GOFLAGS="+strings.TrimSpace(strings.TrimSpace(string(goflags))+" -trimpath"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", c.line, err, out)
	}
	for _, pkg := range c.args[2:] {
		if _, err := os.Stat(filepath.Join(r.bin, filepath.Base(pkg))); err != nil {
			t.Fatalf("%s did not install %s: %v", c.line, filepath.Base(pkg), err)
		}
	}
}

// startServer starts the installed mlockd once, on a free loopback port, in
// a directory of its own (its data directory is the default, mlockd.data,
// there); the test's cleanup stops it with SIGTERM and expects exit 0.
func (r *readmeRun) startServer() {
	t := r.t
	if r.addr != "" {
		return
	}
	bin := filepath.Join(r.bin, "mlockd")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("no mlockd: the README's go install must come before its mlock commands (%v)", err)
	}
	wd := filepath.Join(r.dir, "server")
	if err := os.Mkdir(wd, 0o700); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--listen", "127.0.0.1:0")
	cmd.Dir = wd
	cmd.Env = cleanEnv(nil)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var log syncBuffer
	drained := make(chan struct{})
	addrCh := make(chan string, 1)
	go func() {
		defer close(drained)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			log.Write([]byte(line + "\n"))
			if m := regexp.MustCompile(`msg="mlockd listening" addr=(\S+)`).FindStringSubmatch(line); m != nil {
				addrCh <- m[1]
			}
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		waited := make(chan error, 1)
		go func() { <-drained; waited <- cmd.Wait() }()
		select {
		case err := <-waited:
			if err != nil {
				t.Errorf("mlockd after SIGTERM: %v (the README: exit 0 after a clean shutdown)\n%s", err, log.String())
			}
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("mlockd did not stop within 20s of SIGTERM\n%s", log.String())
		}
	})
	select {
	case r.addr = <-addrCh:
	case <-drained:
		t.Fatalf("mlockd ended before listening\n%s", log.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("mlockd did not listen within 30s\n%s", log.String())
	}
}

// cleanEnv is this process's environment without the MLOCK_ variables,
// plus extra.
func cleanEnv(extra map[string]string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MLOCK_") {
			env = append(env, kv)
		}
	}
	for k, v := range extra {
		env = append(env, k+"="+v)
	}
	return env
}

// cronEnv is the environment cron gives a job: little more than the
// crontab's variables.
func (r *readmeRun) cronEnv(c readmeCommand) []string {
	env := []string{"PATH=" + r.bin + ":/usr/bin:/bin", "SHELL=/bin/sh", "HOME=" + r.dir, "LOGNAME=cron"}
	for k, v := range c.env {
		env = append(env, k+"="+r.rewrite(v))
	}
	return env
}

// rewrite points a README URI at the test's servers: any mlock:// host and
// port at mlockd, redis:// at $REDIS_URL.
func (r *readmeRun) rewrite(w string) string {
	if rest, ok := strings.CutPrefix(w, "mlock://"); ok {
		hostport, tail, _ := strings.Cut(rest, "?")
		if strings.ContainsAny(hostport, "@/,") {
			r.t.Fatalf("README URI %q: the test rewrites plain mlock://host:port only", w)
		}
		if tail != "" {
			tail = "?" + tail
		}
		return "mlock://" + r.addr + tail
	}
	if strings.HasPrefix(w, "redis://") {
		return os.Getenv("REDIS_URL")
	}
	return w
}

// exec runs the installed mlock with args (the README's, rewritten) in env,
// stdin closed, as cron and scripts run it; it returns the outputs and the
// exit status.
func (r *readmeRun) exec(env []string, args ...string) (stdout, stderr string, code int) {
	r.t.Helper()
	cmd := exec.Command(filepath.Join(r.bin, "mlock"), args...)
	cmd.Env = env
	cmd.Dir = r.dir
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	code = exitCodeOf(r.t, cmd.Run())
	return out.String(), errb.String(), code
}

// env is the environment of a command of c: cron's for a crontab line,
// else this process's with $MLOCK_URI naming the test's mlockd (the
// README's commands use the default server) and the installed commands
// first on PATH.
func (r *readmeRun) env(c readmeCommand, extra map[string]string) []string {
	var env []string
	if c.crontab {
		env = r.cronEnv(c)
	} else {
		env = cleanEnv(map[string]string{"MLOCK_URI": "mlock://" + r.addr, "PATH": r.bin + ":" + os.Getenv("PATH")})
	}
	for k, v := range extra {
		env = append(env, k+"="+v)
	}
	return env
}

// client connects to the test's mlockd.
func (r *readmeRun) client() *mlock.Client {
	r.t.Helper()
	c, err := mlock.New("mlock://" + r.addr)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { c.Close() })
	return c
}

// runArgs is what the checks of mlock run read from its command line.
type runArgs struct {
	skip, quiet bool
	ttl         time.Duration
	resources   string
	job         int // index of the job's first word in args
}

func parseRunArgs(t *testing.T, c readmeCommand) runArgs {
	var a runArgs
	args := c.args[2:]
	for i := 0; i < len(args); i++ {
		switch w := args[i]; {
		case w == "--":
			a.job = 2 + i + 1
			if a.resources == "" || a.job >= len(c.args) {
				t.Fatalf("%s: want resources and a job", c.line)
			}
			return a
		case w == "--skip-if-locked":
			a.skip = true
		case w == "--quiet":
			a.quiet = true
		case w == "--ttl":
			i++
			d, err := time.ParseDuration(args[i])
			if err != nil {
				t.Fatalf("%s: --ttl %q: %v", c.line, args[i], err)
			}
			a.ttl = d
		case strings.HasPrefix(w, "-"):
			t.Fatalf("%s: no check for %s: add one to TestReadmeCommands", c.line, w)
		default:
			a.resources = w
		}
	}
	t.Fatalf("%s: no -- before the job", c.line)
	return a
}

// writeJob writes the script that stands for the README's job: it records
// its environment, prints one line and exits with status.
func (r *readmeRun) writeJob(status int) (script, envFile, marker string) {
	r.t.Helper()
	r.job++
	n := strconv.Itoa(r.job)
	script = filepath.Join(r.dir, "job"+n+".sh")
	envFile = filepath.Join(r.dir, "job"+n+".env")
	marker = filepath.Join(r.dir, "job"+n+".ran")
	body := "#!/bin/sh\nenv > " + envFile + "\ntouch " + marker + "\necho report written\nexit " + strconv.Itoa(status) + "\n"
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		r.t.Fatal(err)
	}
	return script, envFile, marker
}

// withJob returns c's arguments with the job replaced by script.
func withJob(c readmeCommand, a runArgs, script string) []string {
	args := append([]string(nil), c.args[1:]...)
	args[a.job-1] = script
	return args
}

// run checks an mlock run line: the job runs under the lock with the
// README's environment and mlock run exits with its status; a job that
// cannot be run or found, or an unreachable server, gives the README's
// statuses; with --skip-if-locked a held lock skips the job (status 0,
// nothing printed with --quiet).
func (r *readmeRun) run(c readmeCommand) {
	t := r.t
	t.Helper()
	a := parseRunArgs(t, c)
	if a.ttl <= 0 {
		t.Fatalf("%s: the test wants --ttl", c.line)
	}
	stale := map[string]string{"MLOCK_TOKEN": "1", "MLOCK_RESOURCES": "stale", "MLOCK_EXPIRES_AT": "1"}
	var lastToken uint64
	for _, status := range []int{0, 3} {
		script, envFile, _ := r.writeJob(status)
		before := time.Now()
		stdout, stderr, code := r.exec(r.env(c, stale), withJob(c, a, script)...)
		after := time.Now()
		if code != status || stdout != "report written\n" || stderr != "" {
			t.Fatalf("%s (job exits %d): exit %d, stdout %q, stderr %q; want the job's status and output only",
				c.line, status, code, stdout, stderr)
		}
		env := readEnv(t, envFile)
		if env["MLOCK_RESOURCES"] != a.resources {
			t.Fatalf("%s: MLOCK_RESOURCES=%q, want %q", c.line, env["MLOCK_RESOURCES"], a.resources)
		}
		token, err := strconv.ParseUint(env["MLOCK_TOKEN"], 10, 64)
		if err != nil || token <= lastToken || token == 1 {
			t.Fatalf("%s: MLOCK_TOKEN=%q after %d: want a new, larger fencing token", c.line, env["MLOCK_TOKEN"], lastToken)
		}
		lastToken = token
		exp, err := strconv.ParseInt(env["MLOCK_EXPIRES_AT"], 10, 64)
		if lo, hi := before.Add(a.ttl).Add(-time.Second).UnixMilli(), after.Add(a.ttl).Add(time.Second).UnixMilli(); err != nil || exp < lo || exp > hi {
			t.Fatalf("%s: MLOCK_EXPIRES_AT=%q, want the start + --ttl %v (Unix ms in [%d, %d])", c.line, env["MLOCK_EXPIRES_AT"], a.ttl, lo, hi)
		}
		for k, v := range env {
			if regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(v) {
				t.Fatalf("%s: the job's %s=%s looks like a lock id, which is never passed", c.line, k, v)
			}
		}
	}
	// A job that is not executable, one that does not exist, a server
	// that cannot be reached.
	notExec := filepath.Join(r.dir, "not-executable.sh")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\nexit 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	job, _, marker := r.writeJob(0)
	for _, tc := range []struct {
		what, job string
		env       map[string]string
		want      int
	}{
		{"a job that is not executable", notExec, nil, 126},
		{"a job that does not exist", filepath.Join(r.dir, "no-such-job.sh"), nil, 127},
		// Set last, $MLOCK_URI wins over the crontab's (exec keeps the last value).
		{"a server that cannot be reached", job, map[string]string{"MLOCK_URI": "mlock://" + refusedAddr(t)}, 125},
	} {
		if _, stderr, code := r.exec(r.env(c, tc.env), withJob(c, a, tc.job)...); code != tc.want || stderr == "" {
			t.Fatalf("%s with %s: exit %d, stderr %q; want %d and the error", c.line, tc.what, code, stderr, tc.want)
		}
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatalf("%s ran the job without the lock", c.line)
	}
	if !a.skip {
		r.checked++
		return
	}
	// Another host holds the lock: the job is skipped.
	cl := r.client()
	l, err := cl.Lock(context.Background(), a.resources, &mlock.LockOptions{Owner: "other-host:1"})
	if err != nil {
		t.Fatal(err)
	}
	script, _, marker := r.writeJob(0)
	stdout, stderr, code := r.exec(r.env(c, nil), withJob(c, a, script)...)
	if _, err := os.Stat(marker); err == nil {
		t.Fatalf("%s ran the job although another host holds %s", c.line, a.resources)
	}
	switch {
	case code != 0:
		t.Fatalf("%s, skipped: exit %d, want 0 (--skip-exit's default)", c.line, code)
	case a.quiet && (stdout != "" || stderr != ""):
		t.Fatalf("%s, skipped: stdout %q, stderr %q; --quiet prints nothing", c.line, stdout, stderr)
	case !a.quiet && stderr == "":
		t.Fatalf("%s, skipped: it says nothing without --quiet", c.line)
	}
	if err := l.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.checked++
}

func readEnv(t *testing.T, file string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("the job did not run: %v", err)
	}
	env := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			env[k] = v
		}
	}
	return env
}

// statusShows maps what the README's comment on mlock status names to the
// lines of its output that show it.
var statusShows = map[string][]string{
	"counters": {"requests ", "ended ", "extends "},
	"sessions": {"(sessions "},
	"CPU time": {"cpu time "},
}

// status checks mlock status: exit 0, and every item its README comment
// names.
func (r *readmeRun) status(c readmeCommand) {
	t := r.t
	if len(c.args) != 2 {
		t.Fatalf("%s: no check for its arguments: add one to TestReadmeCommands", c.line)
	}
	stdout, stderr, code := r.exec(r.env(c, nil), c.args[1:]...)
	if code != 0 || stderr != "" {
		t.Fatalf("%s: exit %d, stderr %q", c.line, code, stderr)
	}
	if c.comment == "" {
		t.Fatalf("%s: the README says nothing of its output", c.line)
	}
	for _, item := range strings.Split(c.comment, ",") {
		item = strings.TrimSpace(item)
		shows, ok := statusShows[item]
		if !ok {
			t.Fatalf("%s: the README says it shows %q: add what that is to statusShows", c.line, item)
		}
		for _, s := range shows {
			if !strings.Contains(stdout, s) {
				t.Fatalf("%s: the README says it shows %s, but %q is not in\n%s", c.line, item, s, stdout)
			}
		}
	}
	r.checked++
}

// locks checks mlock locks PREFIX: the holder and the waiter of a resource
// starting with PREFIX are listed, a resource that does not start with it
// is not.
func (r *readmeRun) locks(c readmeCommand) {
	t := r.t
	if len(c.args) != 3 || strings.HasPrefix(c.args[2], "-") {
		t.Fatalf("%s: no check for its arguments: add one to TestReadmeCommands", c.line)
	}
	prefix := c.args[2]
	in, out := prefix+"1001", "zz-not-"+strings.TrimSuffix(prefix, ":")+":1"
	holder, waiter := r.client(), r.client()
	ctx := context.Background()
	h, err := holder.Lock(ctx, in+"|"+out, &mlock.LockOptions{Owner: "holder-1"})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	waited := make(chan error, 1)
	go func() {
		_, err := waiter.Lock(wctx, in, &mlock.LockOptions{Owner: "waiter-1"})
		waited <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ls, err := holder.Locks(ctx, in)
		if err == nil && len(ls.Queues) == 1 && len(ls.Queues[0].Entries) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the waiter never queued on %s: %+v %v", in, ls, err)
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
	stdout, stderr, code := r.exec(r.env(c, nil), c.args[1:]...)
	if code != 0 || stderr != "" {
		t.Fatalf("%s: exit %d, stderr %q", c.line, code, stderr)
	}
	held := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(in) + `\s+0\s+held\s+exclusive\s+holder-1\s`)
	waiting := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(in) + `\s+1\s+waiting\s+exclusive\s+waiter-1\s`)
	if !held.MatchString(stdout) || !waiting.MatchString(stdout) || strings.Contains(stdout, out) {
		t.Fatalf("%s: want the holder and the waiter of %s and nothing of %s:\n%s", c.line, in, out, stdout)
	}
	cancel()
	<-waited
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	r.checked++
}

// bench checks mlock bench: exit 0, the scenario named, a row with
// operations for every target and, with --vs, the ratios. It runs for 1s
// per target. Without $REDIS_URL the --vs redis:// part is left out, unless
// under CI, where it is required.
func (r *readmeRun) bench(c readmeCommand) {
	t := r.t
	args := []string{"bench", "--duration", "1s"}
	var targets []string
	scenario := ""
	for i := 2; i < len(c.args); i++ {
		w := c.args[i]
		switch {
		case w == "--scenario" && i+1 < len(c.args):
			scenario = c.args[i+1]
			args = append(args, w, scenario)
			i++
		case w == "--vs" && i+1 < len(c.args):
			u := r.rewrite(c.args[i+1])
			i++
			if u == "" {
				if testenv.Strict() {
					t.Fatalf("%s: REDIS_URL is not set (required under CI)", c.line)
				}
				t.Logf("%s: REDIS_URL is not set: run without --vs %s", c.line, c.args[i])
				continue
			}
			args = append(args, w, u)
			targets = append(targets, u)
		case strings.HasPrefix(w, "-"):
			t.Fatalf("%s: no check for %s: add one to TestReadmeCommands", c.line, w)
		default:
			u := r.rewrite(w)
			args = append(args, u)
			targets = append([]string{u}, targets...)
		}
	}
	if scenario == "" || len(targets) == 0 {
		t.Fatalf("%s: the test wants --scenario and a target", c.line)
	}
	stdout, stderr, code := r.exec(r.env(c, nil), args...)
	if code != 0 {
		t.Fatalf("%s: exit %d, stderr %q", c.line, code, stderr)
	}
	if !strings.HasPrefix(stdout, "scenario "+scenario+",") {
		t.Fatalf("%s: the scenario is not named:\n%s", c.line, stdout)
	}
	for _, u := range targets {
		m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(u) + `\s+(\d+)\s`).FindStringSubmatch(stdout)
		if m == nil || m[1] == "0" {
			t.Fatalf("%s: no operations of %s:\n%s", c.line, u, stdout)
		}
	}
	if len(targets) > 1 && !strings.Contains(stdout, "ratios (first / "+targets[1]+")") {
		t.Fatalf("%s: no ratios against %s:\n%s", c.line, targets[1], stdout)
	}
	r.checked++
}

// FuzzReadmeCommands: the README parser never panics, and what it accepts
// can be run without a shell: words without quotes or shell syntax, a
// crontab line's schedule left out.
func FuzzReadmeCommands(f *testing.F) {
	f.Add("## A\n```sh\nmlock status  # x, y\n```\n")
	f.Add("## A\n```crontab\nMLOCK_URI=mlock://h:1\n0 2 * * *  mlock run r -- /j.sh\n```\n## B\n")
	f.Add("## A\n```sh\nmlock 'x'\n```\n")
	f.Add("## A\n```crontab\n0 2 * *\n```\n")
	f.Add("## A\n```go\nx\n```\n")
	f.Add("## A\ntext\n")
	f.Fuzz(func(t *testing.T, readme string) {
		cmds, err := readmeCommands(readme, []string{"## A"})
		if err != nil {
			return
		}
		for _, c := range cmds {
			if len(c.args) == 0 {
				t.Fatalf("a command without words: %+v", c)
			}
			for _, w := range c.args {
				if w == "" || strings.ContainsAny(w, "'\"`$|;&<>\\ \t\n") {
					t.Fatalf("a word %q a shell would read otherwise: %+v", w, c)
				}
			}
			if c.crontab != (c.env != nil) {
				t.Fatalf("crontab %v with env %v", c.crontab, c.env)
			}
		}
	})
}
