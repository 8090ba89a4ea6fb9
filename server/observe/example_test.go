package observe_test

import (
	"fmt"
	"io"
	"net/http/httptest"
	"strings"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/server/observe"
)

// fixed is a Source with fixed numbers: one held lock, one waiter.
type fixed struct{}

func (fixed) Snapshot(s *observe.Snapshot) {
	s.Version, s.Held, s.Waiting, s.Grants = "example", 1, 1, 1
	s.Wait.Observe(0)
}
func (fixed) Status() *mlock.Status         { return &mlock.Status{} }
func (fixed) Cluster() *mlock.StatusCluster { return nil }
func (fixed) Locks(prefix, after string, limit int) *mlock.Locks {
	return &mlock.Locks{Queues: []mlock.LocksQueue{}}
}
func (fixed) Busiest(prefix string, n, entries int) ([]mlock.LocksQueue, int) {
	return []mlock.LocksQueue{{Resource: "order:1", Length: 2}}, 1
}
func (fixed) Ready() (bool, string) { return false, "not listening yet" }

// A Handler serves a Source's metrics, health and page; package server's
// Server.HTTPHandler is the real one.
func Example() {
	h := observe.New(fixed{}, observe.Options{})
	defer h.Close()
	for _, path := range []string{"/readyz", "/metrics"} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", path, nil))
		body, _ := io.ReadAll(w.Body)
		for _, line := range strings.Split(string(body), "\n") {
			if (path == "/readyz" && line != "") || strings.HasPrefix(line, "mlock_locks_") || strings.HasPrefix(line, "mlock_queue_depth_max") {
				fmt.Println(w.Code, line)
			}
		}
	}
	// Output:
	// 503 not ready: not listening yet
	// 200 mlock_locks_held 1
	// 200 mlock_locks_waiting 1
	// 200 mlock_queue_depth_max 2
}
