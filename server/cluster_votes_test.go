package server

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A node keeps the highest cluster version it applied in its raft
// directory, and its raft handshake carries it from its next start on,
// before it has applied the log again: restarted, it still refuses the raft
// connections of a build that cannot read the log.
func TestClusterVersionKeptForTheHandshake(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3, true)
	tc.leader()
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		done := true
		for _, s := range tc.nodes {
			done = done && s.cl.versionNow.Load() == logFormat
		}
		if done {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("cluster version %d not on every node within 30 s", logFormat)
		}
	}
	b, err := os.ReadFile(filepath.Join(tc.dirs[1], versionFile))
	if err != nil || strings.TrimSpace(string(b)) != strconv.Itoa(logFormat) {
		t.Fatalf("version file of n1: %q, %v (this build reads format %d)", b, err, logFormat)
	}
	tc.stop(1)
	tc.start(1)
	cl := tc.nodes[1].cl
	if v := cl.versionFloor.Load(); v != logFormat {
		t.Fatalf("version kept across the restart: %d, want %d", v, logFormat)
	}
	if v := cl.raftVersion(); v != logFormat {
		t.Fatalf("the handshake's version after the restart: %d, want %d", v, logFormat)
	}

	// A version file that does not hold a version stops the start, saying so.
	tc.stop(2)
	if err := os.WriteFile(filepath.Join(tc.dirs[2], versionFile), []byte("three\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readVersionFile(tc.dirs[2]); err == nil || !strings.Contains(err.Error(), "is not a version") {
		t.Fatalf("a bad version file: %v", err)
	}
	if v, err := readVersionFile(t.TempDir()); v != 0 || err != nil {
		t.Fatalf("no version file: %d, %v", v, err)
	}
}
