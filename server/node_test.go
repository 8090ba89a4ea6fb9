package server

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"
)

// TestNodeClientCompat runs a Node.js client that speaks the protocol exactly
// as the original mlock client does. Without node it skips, except under
// CI, where node is required.
func TestNodeClientCompat(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("node is required under CI")
		}
		t.Skip("node not found: skipping the Node.js compatibility test")
	}
	srv := start(t, Config{SessionGrace: 5 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, node, "testdata/node/compat.js", srv.Addr().String()).CombinedOutput()
	if err != nil {
		t.Fatalf("node client: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}
