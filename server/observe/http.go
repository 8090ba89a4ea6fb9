package observe

import (
	"embed"
	"encoding/json"
	"io/fs"
	"net/http"
	"net/http/pprof"
	"strconv"
	"sync"
	"time"

	"github.com/mlock-dev/mlock/internal/protocol"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Source is what the HTTP endpoints read from the server. Its methods are
// safe for concurrent use.
type Source interface {
	// Snapshot fills s with the server's counters and sizes now (in one
	// batch of the server's core). It leaves MaxQueue alone.
	Snapshot(s *Snapshot)
	// Status is the status document of `mlock status`, with the detail an
	// administrator sees.
	Status() *protocol.Status
	// Cluster is the node's view of its cluster (at most 100 ms old), nil
	// on a single node.
	Cluster() *protocol.StatusCluster
	// Locks is one page of the locks listing (as `mlock locks` shows it to
	// an administrator): queues in name order from after, with prefix.
	Locks(prefix, after string, limit int) *protocol.Locks
	// Busiest is the n longest queues with prefix, longest first, at most
	// entries entries each, and the number of queues with prefix. It
	// visits every queue with prefix.
	Busiest(prefix string, n, entries int) (queues []protocol.LocksQueue, matched int)
	// Ready reports whether the server can serve locks now, and if not,
	// why.
	Ready() (bool, string)
}

// Options configure a Handler.
type Options struct {
	// Pprof serves net/http/pprof under /debug/pprof/. Default false.
	Pprof bool
	// TopLimit caps the limit parameter of the busiest-queues view.
	// Default 100.
	TopLimit int
	// ListLimit caps the limit parameter of /api/locks. Default 1000.
	ListLimit int
	// History is how long the rates of the page go back. Default 10
	// minutes, sampled every second.
	History time.Duration
	// TopCache is how long a busiest-queues result (a scan of every queue)
	// is reused by the page, the API and the metrics' longest queue.
	// Default 1 s; negative: never reused.
	TopCache time.Duration
	// Authorize, if set, decides who may read the endpoints: a request it
	// refuses is answered 401 with a Basic challenge (a browser then asks
	// for a name and a password) and a Bearer one. /healthz and /readyz are
	// always open (they show nothing but the server's state), and so is
	// /metrics with OpenMetrics. It is called concurrently. Nil: every
	// endpoint is open.
	Authorize func(r *http.Request) bool
	// OpenMetrics serves /metrics without Authorize. Default false.
	OpenMetrics bool
}

// Handler serves the HTTP endpoints of mlockd: /metrics, /healthz,
// /readyz, the page at /, /api/status, /api/locks, /api/view and, with
// Options.Pprof, /debug/pprof/. Create one with New and Close it when done
// (it samples the rates of the page in a goroutine).
type Handler struct {
	src  Source
	opt  Options
	mux  *http.ServeMux
	reg  http.Handler
	stop chan struct{}
	done chan struct{}

	mu      sync.Mutex // guards the fields below
	samples []sample   // ring, oldest first once full
	head    int        // next write in samples
	full    bool
	top     map[topKey]topEntry // recent Busiest results, at most a second old
	snap    Snapshot            // the buffers for the rates' samples
	once    sync.Once
}

// sample is one point of the page's rates.
type sample struct {
	at                                  time.Time
	grants, timeouts, requests, expires uint64
}

type topKey struct {
	prefix string
	n      int
}

type topEntry struct {
	at      time.Time
	queues  []protocol.LocksQueue
	matched int
}

//go:embed page
var pageFS embed.FS

// New returns the Handler of src and starts its sampler.
func New(src Source, opt Options) *Handler {
	if opt.TopLimit <= 0 {
		opt.TopLimit = 100
	}
	if opt.ListLimit <= 0 {
		opt.ListLimit = 1000
	}
	if opt.History <= 0 {
		opt.History = 10 * time.Minute
	}
	if opt.TopCache == 0 {
		opt.TopCache = time.Second
	}
	h := &Handler{src: src, opt: opt, mux: http.NewServeMux(), stop: make(chan struct{}), done: make(chan struct{}),
		samples: make([]sample, int(opt.History/time.Second)+1), top: map[topKey]topEntry{}}
	reg := NewRegistry(h.snapshot)
	h.reg = promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
	h.mux.Handle("GET /metrics", h.reg)
	h.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { plain(w, http.StatusOK, "ok") })
	h.mux.HandleFunc("GET /readyz", h.readyz)
	h.mux.HandleFunc("GET /api/status", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, src.Status()) })
	h.mux.HandleFunc("GET /api/locks", h.locks)
	h.mux.HandleFunc("GET /api/view", h.view)
	static, _ := fs.Sub(pageFS, "page")
	files := http.FileServerFS(static)
	h.mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) { page(w); files.ServeHTTP(w, r) })
	h.mux.HandleFunc("GET /page/", func(w http.ResponseWriter, r *http.Request) {
		page(w)
		http.StripPrefix("/page", files).ServeHTTP(w, r)
	})
	if opt.Pprof {
		h.mux.HandleFunc("/debug/pprof/", pprof.Index)
		h.mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		h.mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		h.mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		h.mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	go h.sampleLoop()
	return h
}

// ServeHTTP serves the endpoints, each to whom Options.Authorize allows.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h.opt.Authorize != nil && !h.open(r.URL.Path) && !h.opt.Authorize(r) {
		w.Header().Add("WWW-Authenticate", `Basic realm="mlockd", charset="UTF-8"`)
		w.Header().Add("WWW-Authenticate", `Bearer realm="mlockd"`)
		plain(w, http.StatusUnauthorized, "401 unauthorized: this endpoint needs an administrator of mlockd's auth file: "+
			"a bearer token <name>:<token>, the name and token as Basic credentials, or a client certificate")
		return
	}
	h.mux.ServeHTTP(w, r)
}

// open reports whether path is served without Authorize.
func (h *Handler) open(path string) bool {
	return path == "/healthz" || path == "/readyz" || (h.opt.OpenMetrics && path == "/metrics")
}

// Close stops the sampler and waits for it. The endpoints still answer.
// It is idempotent.
func (h *Handler) Close() {
	h.once.Do(func() { close(h.stop) })
	<-h.done
}

// page sets the headers of the page's files: nothing from elsewhere, no
// inline script.
func page(w http.ResponseWriter) {
	w.Header().Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Referrer-Policy", "no-referrer")
	w.Header().Set("Cache-Control", "no-cache")
}

func plain(w http.ResponseWriter, code int, text string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(text + "\n"))
}

func writeJSON(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(b)
}

// readyz answers 200 "ready" when the server can serve locks, else 503 and
// why.
func (h *Handler) readyz(w http.ResponseWriter, _ *http.Request) {
	if ok, why := h.src.Ready(); !ok {
		plain(w, http.StatusServiceUnavailable, "not ready: "+why)
		return
	}
	plain(w, http.StatusOK, "ready")
}

// intParam reads a non-negative integer parameter: def when absent, at
// most limit; ok false for anything else.
func intParam(r *http.Request, name string, def, limit int) (int, bool) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return min(def, limit), true
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, false
	}
	if n == 0 {
		n = def
	}
	return min(n, limit), true
}

// locks serves /api/locks?prefix=&limit=&after=&sort=name|depth: one page
// in name order (the locks listing), or the longest queues (sort=depth;
// after is then ignored and matched says how many queues have the prefix).
func (h *Handler) locks(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	prefix := q.Get("prefix")
	switch q.Get("sort") {
	case "", "name":
		limit, ok := intParam(r, "limit", h.opt.ListLimit, h.opt.ListLimit)
		if !ok {
			http.Error(w, "limit: want a non-negative integer", http.StatusBadRequest)
			return
		}
		writeJSON(w, h.src.Locks(prefix, q.Get("after"), limit))
	case "depth":
		limit, ok := intParam(r, "limit", 20, h.opt.TopLimit)
		if !ok {
			http.Error(w, "limit: want a non-negative integer", http.StatusBadRequest)
			return
		}
		queues, matched := h.busiest(prefix, limit)
		writeJSON(w, struct {
			Queues  []protocol.LocksQueue `json:"queues"`
			Matched int                   `json:"matched"`
		}{queues, matched})
	default:
		http.Error(w, "sort: want name or depth", http.StatusBadRequest)
	}
}

// entriesShown is how many entries of each busy queue the page shows.
const entriesShown = 20

// busiest is src.Busiest, reused for a second.
func (h *Handler) busiest(prefix string, n int) ([]protocol.LocksQueue, int) {
	key := topKey{prefix, n}
	now := time.Now()
	h.mu.Lock()
	if e, ok := h.top[key]; ok && now.Sub(e.at) < h.opt.TopCache {
		h.mu.Unlock()
		return e.queues, e.matched
	}
	h.mu.Unlock()
	queues, matched := h.src.Busiest(prefix, n, entriesShown)
	if queues == nil {
		queues = []protocol.LocksQueue{}
	}
	h.mu.Lock()
	for k, e := range h.top {
		if now.Sub(e.at) >= h.opt.TopCache {
			delete(h.top, k)
		}
	}
	if len(h.top) < 64 && h.opt.TopCache > 0 {
		h.top[key] = topEntry{at: now, queues: queues, matched: matched}
	}
	h.mu.Unlock()
	return queues, matched
}

// snapshot is the collector's: the source's snapshot and the longest queue.
func (h *Handler) snapshot(s *Snapshot) {
	h.src.Snapshot(s)
	s.MaxQueue = 0
	if q, _ := h.busiest("", 1); len(q) > 0 {
		s.MaxQueue = q[0].Length
	}
}

// View is the document of /api/view, the page's one request a second.
type View struct {
	Now     int64                   `json:"now"` // Unix ms
	Version string                  `json:"version"`
	StartAt int64                   `json:"startAt"` // Unix ms
	Ready   bool                    `json:"ready"`
	Why     string                  `json:"why,omitempty"` // why not ready
	Quiet   bool                    `json:"quiet"`
	Counts  ViewCounts              `json:"counts"`
	Cluster *protocol.StatusCluster `json:"cluster,omitempty"`
	Prefix  string                  `json:"prefix"`
	Matched int                     `json:"matched"` // queues with the prefix
	Top     []protocol.LocksQueue   `json:"top"`     // the longest of them, longest first
	Rates   ViewRates               `json:"rates"`
}

// ViewCounts are the current sizes and totals shown by the page.
type ViewCounts struct {
	Held         int    `json:"held"`
	Waiting      int    `json:"waiting"`
	Queues       int    `json:"queues"`
	Entries      int    `json:"entries"`
	Online       int    `json:"online"` // sessions connected
	Grace        int    `json:"grace"`  // sessions in their grace period
	Conns        int    `json:"conns"`
	Grants       uint64 `json:"grants"`
	Timeouts     uint64 `json:"timeouts"`
	Expiries     uint64 `json:"expiries"`
	Requests     uint64 `json:"requests"` // lock and trylock commands
	SessionsLost uint64 `json:"sessionsLost"`
	LastToken    uint64 `json:"lastToken"`
}

// ViewRates are per-second rates over the last minutes: At[i] (Unix ms)
// is the end of the interval of Grants[i], Timeouts[i], Requests[i] and
// Expiries[i].
type ViewRates struct {
	At       []int64   `json:"at"`
	Grants   []float64 `json:"grants"`
	Timeouts []float64 `json:"timeouts"`
	Requests []float64 `json:"requests"`
	Expiries []float64 `json:"expiries"`
}

// view serves /api/view?prefix=&limit=.
func (h *Handler) view(w http.ResponseWriter, r *http.Request) {
	limit, ok := intParam(r, "limit", 20, h.opt.TopLimit)
	if !ok {
		http.Error(w, "limit: want a non-negative integer", http.StatusBadRequest)
		return
	}
	prefix := r.URL.Query().Get("prefix")
	var s Snapshot
	h.src.Snapshot(&s)
	ready, why := h.src.Ready()
	v := View{Now: time.Now().UnixMilli(), Version: s.Version, StartAt: s.Start.UnixMilli(), Ready: ready, Why: why,
		Quiet: s.Quiet, Cluster: h.src.Cluster(), Prefix: prefix,
		Counts: ViewCounts{Held: s.Held, Waiting: s.Waiting, Queues: s.Queues, Entries: s.Entries,
			Online: s.Online, Grace: max(s.Sessions-s.Online, 0), Conns: s.Conns, Grants: s.Grants,
			Timeouts: s.Timeouts, Expiries: s.Expiries, Requests: lockRequests(&s), SessionsLost: s.SessionsLost,
			LastToken: s.LastToken}}
	v.Top, v.Matched = h.busiest(prefix, limit)
	v.Rates = h.rates()
	writeJSON(w, v)
}

// lockRequests counts the lock and trylock commands.
func lockRequests(s *Snapshot) uint64 {
	var n uint64
	for v, name := range s.VerbNames {
		if name == "lock" || name == "trylock" {
			n += s.Requests[v][OK] + s.Requests[v][Failed]
		}
	}
	return n
}

// sampleLoop records the counters of the rates every second until Close.
func (h *Handler) sampleLoop() {
	defer close(h.done)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	h.record()
	for {
		select {
		case <-h.stop:
			return
		case <-t.C:
			h.record()
		}
	}
}

func (h *Handler) record() {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := &h.snap
	h.src.Snapshot(s)
	h.samples[h.head] = sample{at: time.Now(), grants: s.Grants, timeouts: s.Timeouts, requests: lockRequests(s), expires: s.Expiries}
	h.head++
	if h.head == len(h.samples) {
		h.head, h.full = 0, true
	}
}

// rates turns the samples into per-second rates, oldest first.
func (h *Handler) rates() ViewRates {
	h.mu.Lock()
	defer h.mu.Unlock()
	var pts []sample
	if h.full {
		pts = append(pts, h.samples[h.head:]...)
	}
	pts = append(pts, h.samples[:h.head]...)
	r := ViewRates{At: []int64{}, Grants: []float64{}, Timeouts: []float64{}, Requests: []float64{}, Expiries: []float64{}}
	for i := 1; i < len(pts); i++ {
		a, b := pts[i-1], pts[i]
		dt := b.at.Sub(a.at).Seconds()
		if dt <= 0 {
			continue
		}
		rate := func(x, y uint64) float64 { return float64(y-min(x, y)) / dt }
		r.At = append(r.At, b.at.UnixMilli())
		r.Grants = append(r.Grants, rate(a.grants, b.grants))
		r.Timeouts = append(r.Timeouts, rate(a.timeouts, b.timeouts))
		r.Requests = append(r.Requests, rate(a.requests, b.requests))
		r.Expiries = append(r.Expiries, rate(a.expires, b.expires))
	}
	return r
}
