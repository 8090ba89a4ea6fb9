package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/mlock-dev/mlock/locking"
	"github.com/mlock-dev/mlock/locking/mlockd"
)

// A locking module whose namespace is medusa_lock: (a Medusa store on the
// same server) releasing everything of owner u1, and the anonymous locks,
// does not stop an mlock run of owner u1 outside that namespace: the run
// keeps its lock and its command finishes with its own status.
func TestRunSurvivesReleaseAllOfAnotherNamespace(t *testing.T) {
	t.Parallel()
	uri := startServer(t)
	admin, _ := holder(t, uri, "unrelated", "")
	// The command holds the lock until the test opens the gate (at most
	// 30 s): a command of a fixed second could end, on a busy machine,
	// before the test saw its lock.
	gate := filepath.Join(t.TempDir(), "gate")
	cmd := mlockCmd("run", "--uri", uri, "--owner", "u1", "--ttl", "10s", "report:nightly", "--", "sh", "-c",
		`i=0; while [ ! -e `+gate+` ] && [ $i -lt 3000 ]; do sleep 0.01; i=$((i+1)); done`)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitHeld(t, admin, "report:nightly")
	shop, err := mlockd.Open(uri + "?prefix=medusa_lock:")
	if err != nil {
		t.Fatal(err)
	}
	defer shop.Close()
	ctx := context.Background()
	if _, err := shop.Acquire(ctx, []string{"cart:1"}, locking.AcquireOptions{OwnerID: "u1"}); err != nil {
		t.Fatal(err)
	}
	for _, owner := range []string{"u1", ""} {
		if err := shop.ReleaseAll(ctx, locking.ReleaseOptions{OwnerID: owner}); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := admin.ReleaseAllIn(ctx, "u1", "medusa_lock:"); err != nil || n != 0 {
		t.Fatalf("the shop's lock was not released by its ReleaseAll: ReleaseAllIn = %d, %v", n, err)
	}
	waitHeld(t, admin, "report:nightly")
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := exitCodeOf(t, cmd.Wait()); code != 0 {
		t.Fatalf("mlock run exited %d, want the command's 0; stderr: %s", code, stderr.String())
	}
}
