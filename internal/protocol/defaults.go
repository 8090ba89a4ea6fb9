package protocol

import "time"

// The protocol's defaults: the one place each is written. The server, the
// engine and the Go client take them from here; the Node.js client's copy
// is checked against them by a test (js/test/fixtures/rules.json).
const (
	// DefaultTTL is the lease of a request that names none: the original
	// server's, the server's default for its --default-ttl, and the
	// clients' default ttl.
	DefaultTTL = 60 * time.Second
	// DefaultMaxTTL is the longest lease (and the longest wait) the server
	// grants by default: its --max-ttl and --max-timeout.
	DefaultMaxTTL = 24 * time.Hour
	// DefaultPort is the server's port: the original server's.
	DefaultPort = 12340
)
