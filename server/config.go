package server

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/mlock-dev/mlock/internal/core"
	"github.com/mlock-dev/mlock/internal/protocol"
)

// Defaults for the zero fields of Config. These are the server's limits;
// cmd/mlockd shows them as its flags' defaults.
const (
	DefaultAddr             = "127.0.0.1:12340"
	DefaultTTL              = 60 * time.Second
	DefaultAuthTimeout      = 10 * time.Second
	DefaultMaxFrame         = 64 << 10
	DefaultMaxConns         = 10_000
	DefaultMaxPendingOutput = 8 << 20
	DefaultMaxOfflineBytes  = 1 << 20
	DefaultStatusLimit      = 1000
	DefaultMaxSocketIDLen   = 256
	DefaultWriteTimeout     = 10 * time.Second

	DefaultSessionGrace       = core.DefaultSessionGrace       // 15 s
	DefaultMaxResources       = core.DefaultMaxResources       // 64
	DefaultMaxNameLen         = core.DefaultMaxNameLen         // 512 bytes
	DefaultMaxLocksPerSession = core.DefaultMaxLocksPerSession // 100 000
	DefaultMaxQueueLen        = core.DefaultMaxQueueLen        // 100 000
	DefaultMaxTTL             = core.DefaultMaxTTL             // 24 h
	DefaultMaxTimeout         = core.DefaultMaxTimeout         // 24 h
)

// Config configures a Server. The zero value is valid: every zero field takes
// its default. For the integer limits a negative value means "no limit".
type Config struct {
	// Addr is the TCP address ListenAndServe listens on. Default
	// "127.0.0.1:12340": listening on other interfaces is an explicit choice.
	Addr string
	// Logger receives the server's logs. Default: discard.
	Logger *slog.Logger

	// SessionGrace is how long the locks of a disconnected session are kept
	// for it to reconnect (and its pushes buffered). Default 15 s. A
	// negative value releases them at once.
	SessionGrace time.Duration
	// DefaultTTL is the lease of a lock or extend sent without a ttl (the
	// 0.1.10 client sends "undefined"). Default 60 s.
	DefaultTTL time.Duration
	// AuthTimeout is how long a connection may take to send connect.
	// Default 10 s.
	AuthTimeout time.Duration

	// MaxFrame is the largest frame payload in bytes. Default 64 KiB, at
	// most 16 MiB.
	MaxFrame int
	// MaxConns caps simultaneous connections. Default 10 000.
	MaxConns int
	// MaxPendingOutput caps the bytes waiting to be written to one
	// connection; a client that stops reading past it is disconnected (its
	// session keeps its grace period). Default 8 MiB.
	MaxPendingOutput int
	// WriteTimeout bounds one write to a client: a client that does not read
	// what it is sent for this long is disconnected. Default 10 s.
	WriteTimeout time.Duration
	// MaxOfflineBytes caps the pushes kept for one disconnected session.
	// Default 1 MiB; past it the oldest are dropped.
	MaxOfflineBytes int
	// MaxResources caps the resources in one request. Default 64.
	MaxResources int
	// MaxNameLen caps resource and owner names, in bytes. Default 512.
	MaxNameLen int
	// MaxSocketIDLen caps the length of a socketId. Default 256.
	MaxSocketIDLen int
	// MaxLocksPerSession caps the live requests of one session.
	// Default 100 000.
	MaxLocksPerSession int
	// MaxQueueLen caps the entries of one resource's queue. Default 100 000.
	MaxQueueLen int
	// MaxTTL caps lease times. Default 24 h.
	MaxTTL time.Duration
	// MaxTimeout caps wait timeouts. Default 24 h.
	MaxTimeout time.Duration
	// StatusLimit caps the locks, queues and sockets listed by status and
	// locks. Default 1000.
	StatusLimit int

	// DataDir, if set, is a directory where the server keeps the fencing
	// token high-water mark, so tokens never repeat across restarts even if
	// the clock goes back. Without it the first token is the start time in
	// microseconds, which never repeats on a sane clock.
	DataDir string
}

// Validate reports the first field of c that is out of range.
func (c *Config) Validate() error {
	switch {
	case c.MaxFrame > protocol.MaxFrameLimit:
		return fmt.Errorf("server: Config.MaxFrame %d is above %d", c.MaxFrame, protocol.MaxFrameLimit)
	case c.DefaultTTL < 0:
		return fmt.Errorf("server: Config.DefaultTTL %v is negative", c.DefaultTTL)
	case c.AuthTimeout < 0:
		return fmt.Errorf("server: Config.AuthTimeout %v is negative", c.AuthTimeout)
	case c.MaxTTL < 0:
		return fmt.Errorf("server: Config.MaxTTL %v is negative", c.MaxTTL)
	case c.MaxTimeout < 0:
		return fmt.Errorf("server: Config.MaxTimeout %v is negative", c.MaxTimeout)
	case c.DefaultTTL != 0 && c.MaxTTL != 0 && c.DefaultTTL > c.MaxTTL:
		return fmt.Errorf("server: Config.DefaultTTL %v is above MaxTTL %v", c.DefaultTTL, c.MaxTTL)
	}
	return nil
}

// withDefaults returns c with every zero field set.
func (c Config) withDefaults() Config {
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.DefaultTTL == 0 {
		c.DefaultTTL = DefaultTTL
	}
	if c.AuthTimeout == 0 {
		c.AuthTimeout = DefaultAuthTimeout
	}
	if c.MaxFrame <= 0 {
		c.MaxFrame = DefaultMaxFrame
	}
	if c.MaxTTL == 0 {
		c.MaxTTL = DefaultMaxTTL
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.MaxTimeout == 0 {
		c.MaxTimeout = DefaultMaxTimeout
	}
	c.MaxConns = core.Limit(c.MaxConns, DefaultMaxConns)
	c.MaxPendingOutput = core.Limit(c.MaxPendingOutput, DefaultMaxPendingOutput)
	c.MaxOfflineBytes = core.Limit(c.MaxOfflineBytes, DefaultMaxOfflineBytes)
	c.StatusLimit = core.Limit(c.StatusLimit, DefaultStatusLimit)
	c.MaxSocketIDLen = core.Limit(c.MaxSocketIDLen, DefaultMaxSocketIDLen)
	return c
}
