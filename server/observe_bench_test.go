package server

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/internal/core"
	"github.com/mlock-dev/mlock/server/observe"
)

// The cost of the HTTP endpoints with 100 000 held locks (one resource
// each, in two sessions), without the network: one /metrics scrape, one
// page of /api/locks, one /api/view (the busiest queues: a scan of every
// queue). Results are not reused between iterations (TopCache -1), as for
// scrapes 15 s apart.
func BenchmarkHTTP100kLocks(b *testing.B) {
	srv := start(b, Config{MaxLocksPerSession: -1})
	connected(b, srv, "bench-a")
	ids := []string{scope(anyone, "bench-a")}
	srv.batch(func(tx *core.Tx) {
		for i := range 100_000 {
			r := tx.Apply(&core.Command{Op: core.OpLock, Request: core.Request{Session: ids[0],
				Resources: []string{"order:" + strconv.Itoa(i)}, TTL: time.Hour}})
			if r.Err != nil || !r.Grant.Granted {
				b.Fatalf("lock %d: %+v", i, r)
			}
		}
	})
	h := srv.HTTPHandler(observe.Options{TopCache: -1})
	defer h.Close()
	for _, path := range []string{"/metrics", "/api/locks?limit=100", "/api/view?limit=20", "/api/view?limit=20&prefix=order:"} {
		b.Run(path, func(b *testing.B) {
			b.ReportAllocs()
			req := httptest.NewRequest(http.MethodGet, path, nil)
			for b.Loop() {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req)
				if w.Code != http.StatusOK {
					b.Fatalf("%s: %d", path, w.Code)
				}
			}
		})
	}
}
