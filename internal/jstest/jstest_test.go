//go:build unix

package jstest

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/internal/testenv"
)

// TestNodePackages runs npm test in js/ against an mlockd built from this
// repository (MLOCKD_BIN): the client against real servers (single node,
// restarts, a cut connection, a 3-node cluster) and the Medusa provider in
// the real @medusajs/locking module, with @medusajs/locking-redis alongside
// when REDIS_URL is set (the differential suite: the same scenarios through
// both, side by side). Without node, npm or js/node_modules (npm ci in js/)
// it skips, except under CI=true, where they, and a missing REDIS_URL, fail
// it.
func TestNodePackages(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the Node.js packages' tests")
	}
	js, err := filepath.Abs(filepath.Join("..", "..", "js"))
	if err != nil {
		t.Fatal(err)
	}
	const why = "the Node.js packages' tests need it"
	testenv.LookPath(t, why, "node")
	testenv.LookPath(t, why, "npm")
	if _, err := os.Stat(filepath.Join(js, "node_modules")); err != nil {
		testenv.Missing(t, "js/node_modules missing (run npm ci in js/)", why)
	}

	// The differential suite runs @medusajs/locking-redis on a real Redis:
	// required in CI, like Node itself.
	if os.Getenv("REDIS_URL") == "" && testenv.Strict() {
		t.Fatal("REDIS_URL is not set: the differential suite (locking-redis against locking-mlock) is required in CI")
	}

	dir := t.TempDir()
	bin, cli := filepath.Join(dir, "mlockd"), filepath.Join(dir, "mlock")
	for _, b := range [][2]string{{bin, "github.com/mlock-dev/mlock/cmd/mlockd"}, {cli, "github.com/mlock-dev/mlock/cmd/mlock"}} {
		build := exec.Command("go", "build", "-o", b[0], b[1])
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", b[1], err, out)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npm", "test")
	cmd.Dir = js
	cmd.Env = append(os.Environ(), "MLOCKD_BIN="+bin, "MLOCK_CLI="+cli, "NO_COLOR=1")
	// npm, node and the servers the tests start share a process group: a
	// timeout ends them all, by the group of the PID started here.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err = cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("npm test did not finish within the time allowed\n%s", out.Bytes())
	}
	if err != nil {
		t.Fatalf("npm test: %v\n%s", err, out.Bytes())
	}
	t.Logf("%s", out.Bytes())
}
