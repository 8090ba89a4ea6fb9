// Package observe is mlockd's window for operators: Prometheus metrics
// (through client_golang), the health and readiness checks, the live page
// of holders and waiters (HTML, CSS and JavaScript embedded in the
// binary), and its JSON API. It reads the server through Source, which
// package server implements (Server.HTTPHandler); docs/observability.md
// lists the endpoints and every metric.
//
// The server counts on its hot path into plain fields guarded by its
// core's lock, and Snapshot copies them in one batch: a scrape costs one
// short batch, a command nothing more than a few additions. Histograms
// (Durations, Depths) are fixed arrays of buckets, exported as constant
// histograms at scrape time.
//
// Label values come from small fixed sets: never a resource name, lock id,
// owner or session. The page and the API show lock ids cut to 8 hex
// digits and sessions as keyed hashes, never a whole lock id or socketId.
// The HTTP endpoints have no authentication.
package observe
