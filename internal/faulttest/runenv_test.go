package faulttest

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/internal/proctest"
)

// TestIssue7RunEnv checks that "mlock run" gives the command its fencing
// token, resources and lease end (MLOCK_TOKEN, MLOCK_RESOURCES,
// MLOCK_EXPIRES_AT), never the lock id, and that tokens grow from run to
// run.
func TestIssue7RunEnv(t *testing.T) {
	binaries(t)
	dir := t.TempDir()
	addr := fmt.Sprintf("127.0.0.1:%d", proctest.FreePort(t))
	o, err := os.Create(filepath.Join(dir, "server.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	srv, err := start(t, dir, o, bins.mlockd, "--listen", addr, "--data-dir", filepath.Join(dir, "data"), "--log-level", "warn")
	if err != nil {
		t.Fatal(err)
	}
	if err := waitDial(srv, addr, false); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "history.log")
	var tokens []uint64
	for i := range 2 {
		wid := fmt.Sprintf("e%d", i)
		p, err := start(t, dir, nil, bins.mlock, "run", "--uri", "mlock://"+addr, "--ttl", "5s", "--timeout", "5s",
			"--kill-after", "100ms", "r1|r2", "--", bins.worker, "-mode", "env", "-log", logPath, "-id", wid)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
			p.kill()
			t.Fatal("mlock run did not finish in 20s")
		}
		if p.status != "0" {
			t.Fatalf("mlock run exited %s: %s", p.status, p.stderr)
		}
		data, _ := os.ReadFile(logPath)
		env := map[string]string{}
		for _, line := range strings.Split(string(data), "\n") {
			f := strings.SplitN(line, " ", 3)
			if len(f) == 3 && f[0] == "env" && f[1] == wid {
				k, v, _ := strings.Cut(f[2], "=")
				env[k] = v
			}
		}
		tok := env["MLOCK_TOKEN"]
		n, err := strconv.ParseUint(tok, 10, 64)
		if err != nil || n == 0 {
			t.Errorf("MLOCK_TOKEN = %q, want a positive integer", tok)
		}
		tokens = append(tokens, n)
		if got := env["MLOCK_RESOURCES"]; got != "r1|r2" {
			t.Errorf("MLOCK_RESOURCES = %q, want r1|r2", got)
		}
		if v, ok := env["MLOCK_EXPIRES_AT"]; !ok || v == "" {
			t.Errorf("MLOCK_EXPIRES_AT missing")
		}
		for k := range env {
			if strings.Contains(k, "ID") {
				t.Errorf("the command's environment has %s: the lock id is a secret", k)
			}
		}
	}
	if len(tokens) == 2 && tokens[1] <= tokens[0] {
		t.Errorf("tokens %v do not increase from run to run", tokens)
	}
}
