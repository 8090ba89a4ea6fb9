// Package deploy tests the packaging of mlockd in the main module's
// deploy/ directory (a Dockerfile, a systemd unit, the container's health
// probe): the Dockerfile parsed and linted with BuildKit's own parser and
// linter (the checks of "docker build --check"), the unit verified with
// systemd-analyze, and the binaries built from the main module and run as
// the image runs them. It lives in the e2e module so that the main module's
// go.mod, which every user of the Go client reads, does not require
// BuildKit.
package deploy

import (
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/linter"
	"github.com/moby/buildkit/frontend/dockerfile/parser"

	"github.com/mlock-dev/mlock/internal/testenv"
)

// The Dockerfile parses and passes BuildKit's linter without a warning;
// it is multi-stage, its last stage runs as a non-root user with a
// HEALTHCHECK on /healthz, and its binaries are built static.
func TestDockerfile(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(deployDir, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := parser.Parse(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range res.Warnings {
		t.Errorf("parser: %s", w.Short)
	}
	var warns []string
	lint := linter.New(&linter.Config{Warn: func(rule, _, _, msg string, loc []parser.Range) {
		warns = append(warns, fmt.Sprintf("%s: %s (line %v)", rule, msg, loc))
	}})
	stages, _, err := instructions.Parse(res.AST, lint)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range warns {
		t.Errorf("lint: %s", w)
	}
	if len(stages) != 2 {
		t.Fatalf("%d stages, want 2 (build, then the image)", len(stages))
	}
	var user, health, entry, env string
	for _, c := range stages[1].Commands {
		switch c := c.(type) {
		case *instructions.UserCommand:
			user = c.User
		case *instructions.HealthCheckCommand:
			health = strings.Join(c.Health.Test, " ")
		case *instructions.EntrypointCommand:
			entry = strings.Join(c.CmdLine, " ")
		case *instructions.EnvCommand:
			for _, kv := range c.Env {
				env += kv.Key + "=" + kv.Value + " "
			}
		}
	}
	if user == "" || user == "root" || strings.HasPrefix(user, "0:") || user == "0" {
		t.Errorf("the image runs as %q: want a non-root user", user)
	}
	if health != "CMD /usr/local/bin/healthcheck" {
		t.Errorf("HEALTHCHECK %q: want the probe without an argument (it probes /healthz at $MLOCK_HTTP)", health)
	}
	if entry != "/usr/local/bin/mlockd" {
		t.Errorf("ENTRYPOINT %q", entry)
	}
	for _, want := range []string{"MLOCK_LISTEN=", "MLOCK_HTTP=", "MLOCK_DATA_DIR=/data"} {
		if !strings.Contains(env, want) {
			t.Errorf("ENV lacks %s: %s", want, env)
		}
	}
	static := false
	for _, c := range stages[0].Commands {
		if e, ok := c.(*instructions.EnvCommand); ok {
			for _, kv := range e.Env {
				static = static || (kv.Key == "CGO_ENABLED" && kv.Value == "0")
			}
		}
	}
	if !static {
		t.Error("the build stage does not set CGO_ENABLED=0: the binaries would not be static")
	}
}

// built caches goBuild's binaries: package → path.
var built sync.Map

// TestMain finds the main module, and removes the binaries built by the
// tests.
func TestMain(m *testing.M) {
	// The main module's directory, as the e2e module's replace directive
	// names it.
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/mlock-dev/mlock").Output()
	if err != nil {
		fmt.Fprintln(os.Stderr, "go list -m github.com/mlock-dev/mlock:", err)
		os.Exit(2)
	}
	mainDir = strings.TrimSpace(string(out))
	deployDir = filepath.Join(mainDir, "deploy")
	dir, err := os.MkdirTemp("", "mlock-deploy-test")
	if err != nil {
		panic(err)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

var (
	// mainDir is the main module's directory; deployDir its deploy/,
	// where the Dockerfile and the unit are.
	mainDir, deployDir string
	// binDir holds the binaries built by goBuild.
	binDir string
)

// goBuild builds pkg as the Dockerfile does (once per test binary): in the
// main module, with its go.mod and go.sum.
func goBuild(t *testing.T, pkg string) string {
	t.Helper()
	if p, ok := built.Load(pkg); ok {
		return p.(string)
	}
	out := filepath.Join(binDir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, pkg)
	cmd.Dir = mainDir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	built.Store(pkg, out)
	return out
}

// freePort returns a loopback address nothing listens on now.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// The binaries are static, and mlockd configured as the image configures
// it (MLOCK_* variables, a data directory) passes the image's health
// probe, which fails once it has stopped.
func TestImageRuntime(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries")
	}
	dir := t.TempDir()
	mlockd := goBuild(t, "github.com/mlock-dev/mlock/cmd/mlockd")
	probe := goBuild(t, "github.com/mlock-dev/mlock/deploy/healthcheck")
	for _, bin := range []string{mlockd, probe} {
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("%s has an ELF interpreter: not static", filepath.Base(bin))
			}
		}
		f.Close()
	}
	httpAddr, listenAddr := freePort(t), freePort(t)
	for range 100 {
		if listenAddr != httpAddr {
			break
		}
		listenAddr = freePort(t) // the kernel may hand out a port just closed again
	}
	cmd := exec.Command(mlockd)
	cmd.Env = append(os.Environ(), "MLOCK_LISTEN="+listenAddr, "MLOCK_HTTP="+httpAddr,
		"MLOCK_DATA_DIR="+filepath.Join(dir, "data"), "MLOCK_LOG_FORMAT=json")
	var logs bytes.Buffer
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	// The probe as the image runs it: no argument, the address from the
	// image's MLOCK_HTTP, whatever it is.
	probeCmd := func(ctx context.Context) *exec.Cmd {
		c := exec.CommandContext(ctx, probe)
		c.Env = append(os.Environ(), "MLOCK_HTTP="+httpAddr)
		return c
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for {
		if err := probeCmd(ctx).Run(); err == nil {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("mlockd exited: %v\n%s", err, logs.String())
		case <-ctx.Done():
			t.Fatalf("the probe never passed\n%s", logs.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("mlockd after SIGINT: %v\n%s", err, logs.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("mlockd did not stop on SIGINT")
	}
	if err := probeCmd(context.Background()).Run(); err == nil {
		t.Error("the probe passes with mlockd stopped")
	}
	if !strings.Contains(logs.String(), `"msg":"mlockd starting"`) || !strings.Contains(logs.String(), `"msg":"mlockd stopped"`) {
		t.Errorf("JSON logs lack the start or the stop:\n%s", logs.String())
	}
}

// The systemd unit passes systemd-analyze verify (with ExecStart pointing
// at a real mlockd). Without systemd-analyze the test skips, except under
// CI=true, where it fails.
func TestSystemdUnit(t *testing.T) {
	sa := testenv.LookPath(t, "the systemd unit's test runs systemd-analyze verify", "systemd-analyze")
	unit, err := os.ReadFile(filepath.Join(deployDir, "mlockd.service"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(unit, []byte("ExecStart=/usr/local/bin/mlockd\n")) {
		t.Fatal("ExecStart does not run /usr/local/bin/mlockd")
	}
	dir := t.TempDir()
	mlockd := goBuild(t, "github.com/mlock-dev/mlock/cmd/mlockd")
	path := filepath.Join(dir, "mlockd.service")
	if err := os.WriteFile(path, bytes.ReplaceAll(unit, []byte("/usr/local/bin/mlockd"), []byte(mlockd)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(sa, "verify", path).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
	// The flags of the variables it sets exist.
	if out, err := exec.Command(mlockd, "--data-dir", filepath.Join(dir, "d"), "--http", "127.0.0.1:0", "--version").CombinedOutput(); err != nil {
		t.Fatalf("mlockd with the unit's flags: %v\n%s", err, out)
	}
}

// The unit's own settings are Environment= defaults, not flags: a flag on
// mlockd's command line wins over its MLOCK_* variable, so a flag in
// ExecStart would silently ignore the same setting in
// /etc/mlockd/mlockd.env, where the unit tells operators to put them
// (systemd lets EnvironmentFile= override Environment=).
func TestSystemdUnitSettingsYieldToTheEnvFile(t *testing.T) {
	unit, err := os.ReadFile(filepath.Join(deployDir, "mlockd.service"))
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]bool{}
	execStart := ""
	for _, line := range strings.Split(string(unit), "\n") {
		if v, ok := strings.CutPrefix(line, "ExecStart="); ok {
			execStart = v
		}
		if v, ok := strings.CutPrefix(line, "Environment="); ok {
			for _, kv := range strings.Fields(v) {
				name, _, _ := strings.Cut(strings.Trim(kv, `"`), "=")
				env[name] = true
			}
		}
	}
	if !strings.Contains(string(unit), "EnvironmentFile=-/etc/mlockd/mlockd.env") {
		t.Fatal("the unit reads no /etc/mlockd/mlockd.env")
	}
	for _, arg := range strings.Fields(execStart) {
		if strings.HasPrefix(arg, "-") {
			t.Errorf("ExecStart passes %s: the same MLOCK_* setting in the env file would be ignored", arg)
		}
	}
	for _, name := range []string{"MLOCK_HTTP", "MLOCK_DATA_DIR"} {
		if !env[name] {
			t.Errorf("the unit sets no default %s", name)
		}
	}
}
