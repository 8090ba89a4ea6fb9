package server

import (
	"log/slog"
	"reflect"
	"strings"
	"time"

	"github.com/mlock-dev/mlock/internal/core"
	"github.com/mlock-dev/mlock/internal/datadir"
	"github.com/mlock-dev/mlock/internal/protocol"
)

// Defaults for the zero fields of Config. These are the server's limits;
// the settings table (Settings) applies them, and cmd/mlockd shows them as
// its flags' defaults.
const (
	DefaultAddr               = "127.0.0.1:12340"
	DefaultTTL                = protocol.DefaultTTL
	DefaultAuthTimeout        = 5 * time.Second
	DefaultMaxFrame           = 64 << 10
	DefaultMaxConns           = 10_000
	DefaultMaxPendingOutput   = 8 << 20
	DefaultMaxOfflineBytes    = 1 << 20
	DefaultStatusLimit        = 1000
	DefaultMaxSocketIDLen     = 256
	DefaultWriteTimeout       = 10 * time.Second
	DefaultShutdownWait       = 2 * time.Second
	DefaultMaxConnsPerIP      = 1000
	DefaultMaxUnauthenticated = 1000
	DefaultIdleTimeout        = 60 * time.Second
	DefaultMaxSessions        = 20_000
	DefaultStatusRate         = 20 // detailed status and locks listings per second and principal
	// MaxHandshakeFrame caps a frame received before the handshake (connect)
	// succeeded, whatever MaxFrame is.
	MaxHandshakeFrame = 4 << 10

	DefaultSessionGrace       = core.DefaultSessionGrace       // 15 s
	DefaultMaxResources       = core.DefaultMaxResources       // 64
	DefaultMaxNameLen         = core.DefaultMaxNameLen         // 512 bytes
	DefaultMaxLocksPerSession = core.DefaultMaxLocksPerSession // 100 000
	DefaultMaxQueueLen        = core.DefaultMaxQueueLen        // 100 000
	DefaultMaxTTL             = core.DefaultMaxTTL             // 24 h
	DefaultMaxTimeout         = core.DefaultMaxTimeout         // 24 h
	DefaultMaxLocks           = core.DefaultMaxLocks           // 1 000 000
	DefaultMaxEntries         = core.DefaultMaxEntries         // 4 000 000
	DefaultMaxNameBytes       = core.DefaultMaxNameBytes       // 256 MiB
	DefaultMaxSessionBytes    = core.DefaultMaxSessionBytes    // 8 MiB
)

// Config configures a Server. The zero value is valid: every zero field takes
// its default. For the integer limits a negative value means "no limit".
type Config struct {
	// Addr is the TCP address ListenAndServe listens on. Default
	// "127.0.0.1:12340": listening on other interfaces is an explicit choice.
	// Without credentials (AuthFile or TLSClientCAFile) ListenAndServe
	// refuses an address that is not loopback unless Insecure is set.
	Addr string
	// AuthFile is the auth file: the principals, their tokens (hashed) and
	// rights (see docs/security.md). Empty: no authentication, and
	// protected mode: only clients on loopback are accepted, unless
	// Insecure. New loads it (an error for a bad file); Reload reads it
	// again.
	AuthFile string
	// Insecure accepts clients from any address without credentials (and
	// lets ListenAndServe listen beyond loopback without them). Default
	// false: protected mode.
	Insecure bool
	// TLSCertFile and TLSKeyFile, both or neither, make every listener
	// speak TLS (1.2 at least, Go's default cipher suites) with this
	// certificate, and so does a cluster node's Raft port (see
	// ClusterConfig.CAFile). Reload reads them again; connections keep
	// their session.
	TLSCertFile, TLSKeyFile string
	// TLSClientCAFile verifies client certificates against these CAs
	// (PEM). A client may present one (it must then verify); its name
	// (CommonName, else first DNS name) is its principal: with an AuthFile,
	// the entry of that name marked "cert"; without, a principal that may
	// lock any resource and does not administer. Without an AuthFile, a
	// client without a certificate is refused (authentication required!),
	// on loopback too. Needs TLSCertFile. Reload reads it again.
	TLSClientCAFile string
	// Logger receives the server's logs. Default: discard.
	Logger *slog.Logger

	// SessionGrace is how long the locks of a disconnected session are kept
	// for it to reconnect (and its pushes buffered). The handshake announces
	// it: a client believes it holds a lock for at most this long after the
	// send time of its last answered request. Default 15 s. A negative value
	// drops them at once and is announced as 0: a client that follows the
	// safety rule then cannot hold a lock across any silence (it treats
	// every lock as lost almost as soon as it is granted, unless answers
	// keep coming); use a positive grace. New logs a warning for it.
	SessionGrace time.Duration
	// DefaultTTL is the lease of a lock or extend sent without a ttl (the
	// 0.1.10 client sends "undefined"). Default 60 s.
	DefaultTTL time.Duration
	// AuthTimeout is how long a connection may take to send connect (TLS
	// handshake included). Default 5 s.
	AuthTimeout time.Duration
	// IdleTimeout closes a connection on which nothing was received for
	// this long after the handshake (its session keeps its grace period).
	// Default 60 s: the 1.0 client pings every 20 s, the Go client every
	// 20 s at most. Negative: none.
	IdleTimeout time.Duration

	// MaxFrame is the largest frame payload in bytes. Default 64 KiB, at
	// most 16 MiB.
	MaxFrame int
	// MaxConns caps simultaneous connections. A newcomer at the cap evicts
	// a connection that has not connected yet (see MaxUnauthenticated) if
	// there is one; else it is let in and its connect is refused ("too many
	// connections!"), unless it is a cluster node's forwarding link, which
	// does not count: the server holds at most MaxConns +
	// MaxUnauthenticated sockets of clients. Default 10 000.
	MaxConns int
	// MaxConnsPerIP caps simultaneous connections from one IP address (an
	// IPv6 address counts with its /64): the connect of one past it is
	// refused ("too many connections from this address!"); a cluster
	// node's forwarding link neither counts nor is refused. Loopback is not
	// limited: local processes share 127.0.0.1, and protected mode would
	// otherwise cap the whole server at this. Default 1000.
	MaxConnsPerIP int
	// MaxUnauthenticated caps the connections that have not completed their
	// connect yet (TLS handshake included), so that clients that cannot
	// authenticate never fill MaxConns: authenticated clients keep their
	// room. Below it nobody is refused, whatever its address; a newcomer
	// when they are all taken evicts the oldest of the address that holds
	// the most of them (it is told "too many unauthenticated connections!"
	// and closed) rather than being refused. Default 1000; negative: no
	// limit.
	MaxUnauthenticated int
	// MaxUnauthenticatedPerIP caps the connections of one address that
	// have not completed their connect yet; loopback addresses count too,
	// each on its own (127.0.0.2 apart from 127.0.0.1), and an IPv6 address
	// with its /64. A newcomer from an address at the cap is not refused:
	// it evicts that address's oldest. Default (0): MaxUnauthenticated;
	// negative: no limit.
	MaxUnauthenticatedPerIP int
	// PrincipalMaxLocks, PrincipalMaxSessions and PrincipalMaxConns are the
	// quotas of a principal whose auth-file line sets none (max-locks=,
	// max-sessions=, max-conns=): its live lock requests, its sessions
	// (connected or in their grace period) and its connections. Default (0):
	// half of MaxLocks, MaxSessions and MaxConns, so that no principal can
	// fill the server alone; negative: no quota. The anonymous principal of
	// a server without credentials has none.
	PrincipalMaxLocks, PrincipalMaxSessions, PrincipalMaxConns int
	// MaxSessions caps the sessions, connected or in their grace period; a
	// connect that would create one more is refused. Default 20 000.
	MaxSessions int
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
	// MaxSessionBytes caps the bytes of names one session's live requests
	// hold (each resource name per queue entry, plus the owner). Default
	// 8 MiB.
	MaxSessionBytes int
	// MaxLocks caps the live requests (held and waiting) of the whole
	// server. Default 1 000 000.
	MaxLocks int
	// MaxEntries caps the queue entries of the whole server (a request on
	// k resources is k entries). Default 4 000 000.
	MaxEntries int
	// MaxNameBytes caps the bytes of names held by the whole server,
	// counted as for MaxSessionBytes. Default 256 MiB.
	MaxNameBytes int
	// MaxTTL caps lease times. Default 24 h.
	MaxTTL time.Duration
	// MaxTimeout caps wait timeouts. Default 24 h.
	MaxTimeout time.Duration
	// StatusLimit caps the locks, queues and sockets listed by status, and
	// the queues and the entries in all listed by one locks page.
	// Default 1000.
	StatusLimit int
	// StatusRate caps the detailed status and locks listings of each
	// principal, per second (a burst of as many is allowed); past it they are
	// refused with "too many requests, retry later!". Default 20; negative:
	// no limit.
	StatusRate int

	// DataDir is the data directory (internal/datadir): the fencing-token
	// high-water mark, so tokens never repeat across restarts even if the
	// clock goes back, and how the previous run ended, so that a start that
	// may follow a crash is quiet (QuietPeriod). New opens and locks it
	// (created if missing, mode 0700); a second server on the same
	// directory fails with an error wrapping datadir.ErrInUse. Empty: no
	// directory; the first token is the start time in microseconds, and
	// since the history is unknown every start is quiet unless QuietPeriod
	// is negative. (mlockd's default is datadir.DefaultDir, "mlockd.data".)
	DataDir string
	// TokenBlock is how many fencing tokens one write of the token
	// high-water mark in DataDir reserves: the mark is kept at least
	// TokenBlock/2 above the last token given, and moved TokenBlock above
	// it. A failing disk is noticed within TokenBlock/2 grants, and at most
	// that many are then left to give until a write succeeds (see
	// docs/operations.md). Default 1 048 576 (datadir.TokenBlock); below 2
	// counts as 2.
	TokenBlock int
	// QuietPeriod is how long a start that may follow a crash grants
	// nothing: requests queue and are granted when it ends, try-locks are
	// refused as busy. A client of the previous run may believe it holds a
	// lock until its last answer plus the session grace, so the default is
	// datadir.QuietPeriod(SessionGrace): the grace plus 1 % plus 5 ms; New
	// logs a warning for a positive value below it. A start is quiet after a
	// crash, after a shutdown that could not confirm every holder learned of
	// it, and always without DataDir. The period is recorded in DataDir, and
	// a start after a crash is quiet for the longer of the crashed run's
	// period and this one: restarting with a shorter SessionGrace or
	// QuietPeriod does not shorten what the crashed run's clients may
	// believe. Negative: never quiet, unsafe (a restarted server may grant a
	// lock a client still believes it holds), for tests that restart
	// servers on purpose.
	QuietPeriod time.Duration
	// ShutdownWait is how long Shutdown waits, after telling every holder
	// that its locks are gone, for those clients to confirm with "bye"
	// (never past Shutdown's context). A holder that does not confirm in
	// time, or whose connection closes without bye, makes the next start
	// quiet. Only with a DataDir and a
	// quiet period: otherwise there is nothing to record and Shutdown does
	// not wait. Default 2 s; negative: no wait.
	ShutdownWait time.Duration

	// LogSlowWait: a waiter granted after waiting longer than this is
	// logged at info level as a slow hand-off (at most one such log every
	// 10 s, with how many were not logged). Default 1 s; negative: never.
	LogSlowWait time.Duration
	// LogLongQueue: a lock request queued behind at least this many
	// entries is logged at info level as a long queue (rate-limited like
	// LogSlowWait). Default 100; negative: never.
	LogLongQueue int

	// Cluster, if set, makes the server one node of a cluster (see
	// ClusterConfig and docs/cluster.md); DataDir, QuietPeriod and
	// ShutdownWait are then not used. Nil: a single node.
	Cluster *ClusterConfig
}

// Validate reports the first field of c that is out of range: a
// *ConfigError naming its setting (see Settings).
func (c *Config) Validate() error {
	cfg := reflect.ValueOf(c).Elem()
	for i := range settingsTable {
		s := &settingsTable[i]
		if err := s.check(s.value(cfg)); err != nil {
			return err
		}
	}
	if err := checkDefaultTTL(c.DefaultTTL, c.MaxTTL); err != nil {
		return err
	}
	cert, key, ca := settingByField("TLSCertFile"), settingByField("TLSKeyFile"), settingByField("TLSClientCAFile")
	switch {
	case (c.TLSCertFile == "") != (c.TLSKeyFile == ""):
		return newConfigError(cert, " and ", key, " go together")
	case c.TLSClientCAFile != "" && c.TLSCertFile == "":
		return newConfigError(ca, " needs ", cert, " and ", key)
	}
	return nil
}

// checkDefaultTTL reports a default lease above the longest (both given:
// 0 is the default).
func checkDefaultTTL(def, maxTTL time.Duration) error {
	if def != 0 && maxTTL != 0 && def > maxTTL {
		return newConfigError(settingByField("DefaultTTL"), " "+def.String()+" is above ",
			settingByField("MaxTTL"), " "+maxTTL.String())
	}
	return nil
}

// engineConfig returns the engine's part of c: its limits and the session
// grace.
func (c *Config) engineConfig() core.EngineConfig {
	st := settingsOf(c)
	return st.engineConfig()
}

// withDefaults returns c with every zero field set, as its setting says
// (see Settings).
func (c Config) withDefaults() Config {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	cfg := reflect.ValueOf(&c).Elem()
	for i := range settingsTable {
		s := &settingsTable[i]
		if v := s.value(cfg); v.IsValid() && !strings.HasPrefix(s.Field, "Cluster.") {
			s.applyDefault(v)
		}
	}
	if c.QuietPeriod == 0 {
		c.QuietPeriod = datadir.QuietPeriod(max(c.SessionGrace, 0))
	}
	return c
}
