package server

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/mlock-dev/mlock/internal/proctest"
	"github.com/mlock-dev/mlock/internal/protocol"
	"github.com/mlock-dev/mlock/server/observe"
)

// startHTTP serves srv's HTTP endpoints on a loopback port until the test
// ends, and returns their base URL.
func startHTTP(t testing.TB, srv *Server) string {
	t.Helper()
	h := srv.HTTPHandler(observe.Options{})
	ts := httptest.NewServer(h)
	t.Cleanup(func() { ts.Close(); h.Close() })
	return ts.URL
}

// get fetches url and returns its status and body.
func get(t testing.TB, url string) (int, string) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, string(b)
}

// scrape fetches /metrics and parses it with Prometheus's text parser.
func scrape(t testing.TB, base string) map[string]*dto.MetricFamily {
	t.Helper()
	code, body := get(t, base+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parsing /metrics: %v\n%s", err, body)
	}
	return fams
}

// value returns the value of the sample of family name whose labels are
// labels ("k=v" each), or fails.
func value(t testing.TB, fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	t.Helper()
	f := fams[name]
	if f == nil {
		t.Fatalf("no metric %s", name)
	}
next:
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for _, kv := range labels {
			k, v, _ := strings.Cut(kv, "=")
			if have[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue()
		case m.Gauge != nil:
			return m.GetGauge().GetValue()
		}
		t.Fatalf("%s%v is neither a counter nor a gauge", name, labels)
	}
	t.Fatalf("no sample %s%v", name, labels)
	return 0
}

// histogram returns the count and the cumulative buckets (upper bound →
// count) of histogram name.
func histogram(t testing.TB, fams map[string]*dto.MetricFamily, name string) (uint64, float64, map[float64]uint64) {
	t.Helper()
	f := fams[name]
	if f == nil || len(f.GetMetric()) != 1 || f.GetMetric()[0].Histogram == nil {
		t.Fatalf("no histogram %s", name)
	}
	h := f.GetMetric()[0].GetHistogram()
	b := map[float64]uint64{}
	for _, bk := range h.GetBucket() {
		b[bk.GetUpperBound()] = bk.GetCumulativeCount()
	}
	return h.GetSampleCount(), h.GetSampleSum(), b
}

// counting is a raw client that counts the frames and bytes it sends and
// the frames it reads.
type counting struct {
	*raw
	framesIn, bytesIn, framesOut *int
}

func (c counting) send(payload string) {
	c.t.Helper()
	b := protocol.Append(nil, payload)
	*c.framesIn++
	*c.bytesIn += len(b)
	c.write(b)
}

func (c counting) expect(want string) []string {
	c.t.Helper()
	*c.framesOut++
	return c.raw.expect(want)
}

// syncBuffer is a log sink safe for the server's goroutines.
type syncBuffer = proctest.Buffer

// After a scripted workload every counter of /metrics has the value the
// workload implies, and each histogram the count.
func TestMetricsAfterWorkload(t *testing.T) {
	t.Parallel()
	logs := &syncBuffer{}
	srv := start(t, Config{SessionGrace: 50 * time.Millisecond, LogLongQueue: 2,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	base := startHTTP(t, srv)
	var fin, bin, fout int
	dial := func(sid string) counting {
		c := counting{dialRaw(t, srv), &fin, &bin, &fout}
		c.send("connect " + sid + " 1.0")
		c.expect("connected 1.0 new *")
		return c
	}
	a, b, c := dial("sid-a"), dial("sid-b"), dial("sid-c")

	a.send("lock r1 x 60000 0 0") // granted at once: ahead 0
	id1 := a.expect("result r1 success *")[3]
	a.expect("locked " + id1 + " * *")
	b.send("lock r2 x 60000 0 0") // waits: ahead 1
	id2 := b.expect("result r2 success *")[3]
	c.send("lock r3 x 60000 0 1") // tolerate 1, queue of 2: refused
	c.expect("result r3 failed can not tolerate!")
	c.send("trylock r4 x 60000") // busy
	c.expect("result r4 failed resource is locked! x")
	c.send("lock r5 x 60000 30 0") // waits behind 2 (logged as a long queue), times out after 30 ms
	id5 := c.expect("result r5 success *")[3]
	c.expect("timeout " + id5)
	// a has held x for at least r5's 30 ms wait.
	a.send("unlock r6 " + id1) // b is granted: a hold ends, a wait ends
	a.expect("result r6 success done")
	b.expect("locked " + id2 + " * *")
	b.send("unlock r7 0123456789abcdef0123456789abcdef")
	b.expect("result r7 failed lock not exist!")
	b.send("ping r8")
	b.expect("result r8 success pong")
	b.send("extend r9 " + id2 + " 60000")
	b.expect("result r9 success *")
	c.send("lock r10 z 20 0 0") // expires after 20 ms
	id10 := c.expect("result r10 success *")[3]
	c.expect("locked " + id10 + " * *")
	c.expect("expired " + id10)
	b.send("unlock r11 " + id2)
	b.expect("result r11 success done")

	// A session lost with one lock: dropped after the 50 ms grace.
	d := dial("sid-d")
	d.send("lock r12 w 60000 0 0")
	id12 := d.expect("result r12 success *")[3]
	d.expect("locked " + id12 + " * *")
	d.nc.Close()
	var fams map[string]*dto.MetricFamily
	for deadline := time.Now().Add(10 * time.Second); ; {
		fams = scrape(t, base)
		if value(t, fams, "mlock_sessions_lost_total") == 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}

	counters := []struct {
		name   string
		labels []string
		want   float64
	}{
		{"mlock_requests_total", []string{"command=connect", "outcome=ok"}, 4},
		{"mlock_requests_total", []string{"command=connect", "outcome=failed"}, 0},
		{"mlock_requests_total", []string{"command=lock", "outcome=ok"}, 5},
		{"mlock_requests_total", []string{"command=lock", "outcome=failed"}, 1},
		{"mlock_requests_total", []string{"command=trylock", "outcome=failed"}, 1},
		{"mlock_requests_total", []string{"command=unlock", "outcome=ok"}, 2},
		{"mlock_requests_total", []string{"command=unlock", "outcome=failed"}, 1},
		{"mlock_requests_total", []string{"command=ping", "outcome=ok"}, 1},
		{"mlock_requests_total", []string{"command=extend", "outcome=ok"}, 1},
		{"mlock_grants_total", nil, 4},
		{"mlock_timeouts_total", nil, 1},
		{"mlock_expiries_total", nil, 1},
		{"mlock_unlocks_total", nil, 2},
		{"mlock_refusals_total", []string{"reason=tolerate"}, 1},
		{"mlock_refusals_total", []string{"reason=busy"}, 1},
		{"mlock_extends_total", []string{"outcome=ok"}, 1},
		{"mlock_sessions_lost_total", nil, 1},
		{"mlock_session_lost_requests_total", nil, 1},
		{"mlock_locks_held", nil, 0},
		{"mlock_locks_waiting", nil, 0},
		{"mlock_queues", nil, 0},
		{"mlock_sessions", []string{"state=online"}, 3},
		{"mlock_sessions", []string{"state=grace"}, 0},
		{"mlock_connections", nil, 3},
		{"mlock_connections_accepted_total", nil, 4},
		{"mlock_frames_total", []string{"direction=in"}, float64(fin)},
		{"mlock_bytes_total", []string{"direction=in"}, float64(bin)},
		{"mlock_frames_total", []string{"direction=out"}, float64(fout)},
		{"mlock_quiet", nil, 0},
		{"mlock_build_info", []string{"version=" + srv.statusVersion()}, 1},
	}
	for _, c := range counters {
		if got := value(t, fams, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	// Every grant ends a wait: three at once (0), one after a hand-off.
	n, _, bk := histogram(t, fams, "mlock_wait_seconds")
	if n != 4 || bk[0.0001] < 3 {
		t.Errorf("wait: %d observations, %d at most 100µs; want 4 and at least 3", n, bk[0.0001])
	}
	// Holds ended: unlock id1 (≥ 5 ms), expiry of z (≥ 20 ms), unlock id2, the lost session's lock (≥ 50 ms).
	n, sum, bk := histogram(t, fams, "mlock_hold_seconds")
	if n != 4 || bk[0.0025] > 1 || sum < 0.075 {
		t.Errorf("hold: %d observations (want 4), %d at most 2.5ms (want ≤ 1), sum %v (want ≥ 0.075)", n, bk[0.0025], sum)
	}
	// Accepted requests: x (0 ahead), x (1), x (2), z (0), w (0).
	n, sum, bk = histogram(t, fams, "mlock_queue_depth_at_enqueue")
	if n != 5 || sum != 3 || bk[0] != 3 || bk[1] != 4 || bk[2] != 5 {
		t.Errorf("depth: %d observations, sum %v, buckets %v; want 5, 3, 0:3 1:4 2:5", n, sum, bk)
	}
	if last := value(t, fams, "mlock_fencing_token_last"); last == 0 {
		t.Error("fencing token high-water mark 0")
	}
	for _, f := range []string{"go_goroutines", "process_cpu_seconds_total"} {
		if fams[f] == nil {
			t.Errorf("no %s: the Go and process collectors are missing", f)
		}
	}

	// The story at info level; every command at debug level; never a
	// lock id or socketId.
	out := logs.String()
	for _, want := range []string{"session lost", "locks-freed=1", "long queue", "ahead=2", "cmd=lock", "cmd=unlock", "resources=x"} {
		if !strings.Contains(out, want) {
			t.Errorf("logs lack %q:\n%s", want, out)
		}
	}
	for _, secret := range []string{id1, id2, id5, id10, id12, "sid-a", "sid-b", "sid-c", "sid-d"} {
		if strings.Contains(out, secret) {
			t.Errorf("logs show the secret %q", secret)
		}
	}
}

// statusVersion is the version the server reports.
func (s *Server) statusVersion() string {
	var snap observe.Snapshot
	obsSource{s}.Snapshot(&snap)
	return snap.Version
}

// A slow hand-off is logged (rate-limited), with the resource.
func TestSlowHandoffLogged(t *testing.T) {
	t.Parallel()
	logs := &syncBuffer{}
	srv := start(t, Config{LogSlowWait: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	a, b := connected(t, srv, "a"), connected(t, srv, "b")
	id := a.lock("1", "slow:1 60000 0 0")
	a.locked(id)
	idb := b.lock("2", "slow:1 60000 0 0")
	time.Sleep(40 * time.Millisecond) // fixed: b waits at least 40 ms (the wait the histogram must record)
	a.send("unlock 3 " + id)
	a.expect("result 3 success done")
	b.locked(idb)
	if out := logs.String(); !strings.Contains(out, "slow hand-off") || !strings.Contains(out, "resources=slow:1") {
		t.Fatalf("no slow hand-off logged:\n%s", out)
	}
}

// /readyz is 503 before the lock listener listens, 200 while it serves,
// and 503 from the start of a shutdown (while it waits for holders).
func TestReadyz(t *testing.T) {
	t.Parallel()
	srv, err := New(Config{DataDir: t.TempDir(), ShutdownWait: 10 * time.Second}) // a new directory: no quiet start
	if err != nil {
		t.Fatal(err)
	}
	h := srv.HTTPHandler(observe.Options{})
	ts := httptest.NewServer(h)
	defer func() { ts.Close(); h.Close() }()
	if code, body := get(t, ts.URL+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "not listening") {
		t.Fatalf("before listening: %d %q", code, body)
	}
	if code, body := get(t, ts.URL+"/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Fatalf("healthz: %d %q", code, body)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	for deadline := time.Now().Add(5 * time.Second); ; {
		code, _ := get(t, ts.URL+"/readyz")
		if code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready after Serve: %d", code)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// A holder keeps Shutdown waiting for its bye.
	c := connected(t, srv, "holder")
	id := c.lock("1", "r 60000 0 0")
	c.locked(id)
	stopped := make(chan error, 1)
	go func() { stopped <- srv.Shutdown(context.Background()) }()
	c.expect("expired " + id + " shutdown")
	if code, body := get(t, ts.URL+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "shutting down") {
		t.Fatalf("during shutdown: %d %q", code, body)
	}
	select {
	case err := <-stopped:
		t.Fatalf("shutdown ended before the holder confirmed: %v", err)
	default:
	}
	c.send("bye 2")
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != ErrServerClosed {
		t.Fatalf("Serve: %v", err)
	}
	if code, _ := get(t, ts.URL+"/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("after shutdown: %d", code)
	}
}

// Neither the page nor the JSON API nor the metrics ever show a whole
// lock id or socketId; the API shows the listing an administrator sees.
func TestHTTPNeverShowsSecrets(t *testing.T) {
	t.Parallel()
	srv := start(t, Config{})
	base := startHTTP(t, srv)
	const sidA, sidB = "socket-secret-aaaaaaaaaaaaaaaa", "socket-secret-bbbbbbbbbbbbbbbb"
	a, b := connected(t, srv, sidA), connected(t, srv, sidB)
	held := a.lock("1", "order:1 60000 0 0 alice")
	a.locked(held)
	waiting := b.lock("2", "order:1 60000 0 0 bob")
	var docs []string
	for _, path := range []string{"/", "/page/app.js", "/page/style.css", "/api/status", "/api/locks", "/api/locks?prefix=order:&sort=depth",
		"/api/view", "/api/view?prefix=order", "/metrics"} {
		code, body := get(t, base+path)
		if code != http.StatusOK {
			t.Fatalf("%s: %d %s", path, code, body)
		}
		docs = append(docs, body)
		for _, secret := range []string{held, waiting, sidA, sidB, strings.ToUpper(held)} {
			if strings.Contains(body, secret) {
				t.Errorf("%s shows the secret %q", path, secret)
			}
		}
	}
	var view observe.View
	if err := json.Unmarshal([]byte(docs[6]), &view); err != nil {
		t.Fatal(err)
	}
	if view.Matched != 1 || len(view.Top) != 1 || view.Top[0].Resource != "order:1" || view.Top[0].Length != 2 {
		t.Fatalf("view: %+v", view)
	}
	e := view.Top[0].Entries
	if len(e) != 2 || e[0].State != "held" || e[0].Owner != "alice" || e[0].Lock != held[8:16] || e[0].HeldMs == nil ||
		e[1].State != "waiting" || e[1].Owner != "bob" || e[1].Lock != waiting[8:16] || e[1].Position != 1 {
		t.Fatalf("entries: %+v", e)
	}
	if view.Counts.Held != 1 || view.Counts.Waiting != 1 || view.Counts.Online != 2 || !view.Ready {
		t.Fatalf("counts: %+v ready %v", view.Counts, view.Ready)
	}
	// A prefix that matches nothing.
	_, body := get(t, base+"/api/view?prefix=nothing:")
	if err := json.Unmarshal([]byte(body), &view); err != nil || view.Matched != 0 || len(view.Top) != 0 {
		t.Fatalf("prefix nothing: %s", body)
	}
	// Bad parameters are a clear 400.
	for _, path := range []string{"/api/locks?limit=-1", "/api/locks?limit=x", "/api/locks?sort=size", "/api/view?limit=no"} {
		if code, body := get(t, base+path); code != http.StatusBadRequest || body == "" {
			t.Errorf("%s: %d %q", path, code, body)
		}
	}
	// pprof is off by default.
	if code, _ := get(t, base+"/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("/debug/pprof/ without Pprof: %d", code)
	}
}

// A session that ends its grace holding and waiting for nothing lost
// nothing: every client that exits without a shutdown (mlock status, ping,
// a finished mlock run) ends that way. It is not counted in
// mlock_sessions_lost_total nor logged as "session lost" at info level, so
// that the counter and the log tell of clients that died with locks.
func TestEmptySessionEndIsNotALoss(t *testing.T) {
	t.Parallel()
	logs := &syncBuffer{}
	srv := start(t, Config{SessionGrace: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	base := startHTTP(t, srv)
	idle := connected(t, srv, "sid-idle")
	idle.send("ping r1")
	idle.expect("result r1 success pong")
	done := connected(t, srv, "sid-done")
	id := done.lock("r2", "x 60000 0 0")
	done.locked(id)
	done.send("unlock r3 " + id)
	done.expect("result r3 success done")
	idle.nc.Close()
	done.nc.Close()
	holder := connected(t, srv, "sid-holder")
	hid := holder.lock("r4", "y 60000 0 0")
	holder.locked(hid)
	holder.nc.Close()
	var fams map[string]*dto.MetricFamily
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		fams = scrape(t, base)
		if value(t, fams, "mlock_sessions", "state=grace") == 0 && value(t, fams, "mlock_sessions", "state=online") == 0 &&
			value(t, fams, "mlock_locks_held") == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the sessions never ended")
		}
	}
	if got := value(t, fams, "mlock_sessions_lost_total"); got != 1 {
		t.Errorf("mlock_sessions_lost_total = %v, want 1 (the holder's session only)", got)
	}
	if got := value(t, fams, "mlock_session_lost_requests_total"); got != 1 {
		t.Errorf("mlock_session_lost_requests_total = %v, want 1", got)
	}
	if n := strings.Count(logs.String(), "session lost"); n != 1 {
		t.Errorf("%d \"session lost\" lines, want 1 (the holder's):\n%s", n, logs.String())
	}
}

// Refusals by a principal's quota are counted in mlock_refusals_total
// (reason quota), as status's limits.quotaRefused counts them.
func TestQuotaRefusalsInMetrics(t *testing.T) {
	t.Parallel()
	srv, tk, _ := quotaServer(t, Config{}, "max-locks=1")
	h := srv.HTTPHandler(observe.Options{OpenMetrics: true})
	ts := httptest.NewServer(h)
	t.Cleanup(func() { ts.Close(); h.Close() })
	a := connectAs(t, srv, "a1", "A", tk.a)
	a.locked(a.lock("1", "a:x 60000 0 0"))
	a.send("lock 2 a:y 60000 0 0")
	a.expect("result 2 failed too many locks for this principal!")
	a.send("trylock 3 a:z 60000")
	a.expect("result 3 failed too many locks for this principal!")
	if got := value(t, scrape(t, ts.URL), "mlock_refusals_total", "reason=quota"); got != 2 {
		t.Fatalf("mlock_refusals_total{reason=quota} = %v, want 2", got)
	}
}
