package server

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/internal/testenv"
)

// TestNodeClientCompat runs a Node.js client that speaks the protocol exactly
// as the original mlock client does. Without node it skips, except under
// CI=true, where node is required.
func TestNodeClientCompat(t *testing.T) {
	t.Parallel()
	node := testenv.LookPath(t, "the Node.js compatibility test runs the original client's protocol in node", "node")
	srv := start(t, Config{SessionGrace: 5 * time.Second})
	// Minutes: node and the race-detected server on a busy machine took
	// over 30 s; the bound only ends a hung run.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, node, "testdata/node/compat.js", srv.Addr().String()).CombinedOutput()
	if err != nil {
		t.Fatalf("node client: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}
