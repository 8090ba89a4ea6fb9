package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRunSharedAndPermits: a run with --shared holds its resource while a
// second --shared run of the same resource runs and ends; mlock locks
// shows the mode; --permits takes permits; bad flags are usage errors.
func TestRunSharedAndPermits(t *testing.T) {
	t.Parallel()
	uri := startServer(t)
	admin, _ := holder(t, uri, "unrelated", "")
	dir := t.TempDir()
	gate := filepath.Join(dir, "gate")
	long := mlockCmd("run", "--uri", uri, "--shared", "cat", "--", "sh", "-c",
		`i=0; while [ ! -e `+gate+` ] && [ $i -lt 6000 ]; do sleep 0.01; i=$((i+1)); done`)
	if err := long.Start(); err != nil {
		t.Fatal(err)
	}
	defer long.Process.Kill()
	waitHeld(t, admin, "cat")

	var out, errb bytes.Buffer
	if code := cli(withBusyTimeout([]string{"locks", "--uri", uri, "cat"}), &out, &errb); code != 0 || !strings.Contains(out.String(), "MODE") ||
		!strings.Contains(out.String(), "shared") {
		t.Fatalf("locks: %d %s %s", code, out.String(), errb.String())
	}
	// A second reader runs at once, next to the first (--skip-if-locked
	// would skip it if it had to wait).
	out.Reset()
	if code := cli([]string{"run", "--uri", uri, "--shared", "--skip-if-locked", "--skip-exit", "3", "cat", "--", "true"},
		&out, &errb); code != 0 {
		t.Fatalf("second reader: exit %d: %s", code, errb.String())
	}
	// A writer is skipped while the reader holds.
	if code := cli([]string{"run", "--uri", uri, "--skip-if-locked", "--skip-exit", "3", "--quiet", "cat", "--", "true"},
		&out, &errb); code != 3 {
		t.Fatalf("writer among readers: exit %d: %s", code, errb.String())
	}
	os.WriteFile(gate, nil, 0o600)
	if code := exitCodeOf(t, long.Wait()); code != 0 {
		t.Fatalf("first reader: exit %d", code)
	}

	// Two permits of 2 at once, a third is skipped.
	gate2 := filepath.Join(dir, "gate2")
	for range 2 {
		c := mlockCmd("run", "--uri", uri, "--permits", "1/2", "psp", "--", "sh", "-c",
			`i=0; while [ ! -e `+gate2+` ] && [ $i -lt 6000 ]; do sleep 0.01; i=$((i+1)); done`)
		var e bytes.Buffer
		c.Stderr = &e
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() {
			os.WriteFile(gate2, nil, 0o600)
			if code := exitCodeOf(t, c.Wait()); code != 0 {
				t.Errorf("permit holder: exit %d: %s", code, e.String())
			}
		}()
	}
	// Each holder is this test binary started as mlock: on a busy machine
	// it takes seconds to start.
	deadline := time.Now().Add(30 * time.Second)
	for {
		ls, err := admin.Locks(t.Context(), "psp")
		if err == nil && len(ls.Queues) == 1 && ls.Queues[0].Length == 2 &&
			ls.Queues[0].Entries[1].State == "held" && ls.Queues[0].Entries[1].Mode == "1/2" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("two permit holders never held: %+v %v", ls, err)
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
	if code := cli([]string{"run", "--uri", uri, "--permits", "1/2", "--skip-if-locked", "--skip-exit", "3", "--quiet", "psp",
		"--", "true"}, &out, &errb); code != 3 {
		t.Fatalf("third permit of 2: exit %d: %s", code, errb.String())
	}

	for _, args := range [][]string{
		{"--shared", "--permits", "1/2"}, {"--permits", "3/2"}, {"--permits", "2"}, {"--permits", "0/2"},
		{"--uri", "memory:", "--shared"},
	} {
		errb.Reset()
		a := append([]string{"run", "--uri", uri}, args...)
		if code := cli(append(a, "r", "--", "true"), &out, &errb); code != exitUsage {
			t.Fatalf("%v: exit %d, want a usage error: %s", args, code, errb.String())
		}
	}
}
