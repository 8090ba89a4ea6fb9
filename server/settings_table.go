package server

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mlock-dev/mlock/internal/cluster"
	"github.com/mlock-dev/mlock/internal/datadir"
	"github.com/mlock-dev/mlock/internal/protocol"
)

// A Setting is one setting of a Server: a field of Config, with mlockd's
// flag and environment variable for it, its default, its range, whether a
// cluster replicates it, and its doc line. Settings lists them all; from
// that one table come Config's defaults (New), Config.Validate, the
// settings a cluster's leader puts in force on every node, mlockd's flags
// and the flag table of docs/configuration.md.
type Setting struct {
	// Name is the setting's name: mlockd's flag without its dashes
	// ("max-queue-len"), and its name in the replicated settings.
	Name string
	// Field is the field of Config it is: "MaxQueueLen", or
	// "Cluster.DedupWindow" for a field of ClusterConfig.
	Field string
	// Default is the value a zero field takes, and mlockd's default: an
	// int, a time.Duration, a string or a bool. Nil where it is computed
	// (DefaultText says how).
	Default any
	// DefaultText is the default in words where Default does not say it
	// all; empty otherwise.
	DefaultText string
	// Zero is what a zero or negative field means in Config.
	Zero Zero
	// FlagZero is what 0 means to mlockd's flag.
	FlagZero FlagZero
	// NonNegative: Config.Validate refuses a negative value.
	NonNegative bool
	// Max, if not 0, is the largest value Config.Validate accepts.
	Max int64
	// Replicated: in a cluster, the leader's value is in force on every
	// node, whatever the node's own (see docs/cluster.md).
	Replicated bool
	// NoFlag: mlockd has no flag for it (set in ClusterConfig).
	NoFlag bool
	// Doc is the setting's doc line, mlockd's usage text. A word in
	// backquotes names the flag's argument (see flag.UnquoteUsage).
	Doc string

	engine bool // a field of core.EngineConfig too, of the same name
}

// Zero says what a zero or negative value of a Config field means.
type Zero uint8

const (
	// ZeroAsIs: the value is used as it is (what 0 and negative values
	// mean is in the doc line).
	ZeroAsIs Zero = iota
	// ZeroIsDefault: 0 takes the default; a negative value means what the
	// doc line says.
	ZeroIsDefault
	// NonPositiveIsDefault: 0 and negative values take the default.
	NonPositiveIsDefault
	// ZeroIsDefaultNegativeNoLimit: an integer limit; 0 takes the default,
	// a negative value means no limit.
	ZeroIsDefaultNegativeNoLimit
	// EngineLimit is ZeroIsDefaultNegativeNoLimit applied by the engine:
	// Config keeps the value as given (it is replicated so).
	EngineLimit
)

// FlagZero says what 0 means to mlockd's flag of a setting.
type FlagZero uint8

const (
	// FlagZeroAsConfig: 0 means what it means in Config.
	FlagZeroAsConfig FlagZero = iota
	// FlagZeroIsOff: 0 turns the setting off (a negative value in
	// Config); a negative value is refused.
	FlagZeroIsOff
	// FlagNonPositiveIsOff: 0 or a negative value turns it off.
	FlagNonPositiveIsOff
)

// settingsTable is the table, in Config's order.
var settingsTable = []Setting{
	{Name: "listen", Field: "Addr", Default: DefaultAddr, Zero: ZeroIsDefault,
		Doc: "TCP address to listen on; beyond loopback it needs credentials (--auth-file or --tls-client-ca) or --insecure"},
	{Name: "auth-file", Field: "AuthFile", Default: "",
		Doc: "auth file: principals, hashed tokens and rights (see docs/security.md); reloaded on SIGHUP. Without it: protected mode, loopback clients only"},
	{Name: "insecure", Field: "Insecure", Default: false,
		Doc: "without credentials, accept clients from any address anyway (anyone who reaches the server can take, release and list every lock)"},
	{Name: "tls-cert", Field: "TLSCertFile", Default: "",
		Doc: "TLS certificate file (PEM): every connection speaks TLS 1.2+, a cluster node's Raft port included; reloaded on SIGHUP"},
	{Name: "tls-key", Field: "TLSKeyFile", Default: "", Doc: "TLS private key file (PEM), with --tls-cert"},
	{Name: "tls-client-ca", Field: "TLSClientCAFile", Default: "",
		Doc: "CA file (PEM) verifying client certificates (mTLS); a verified certificate's name is the client's principal. Without --auth-file, a client without a certificate is refused, on loopback too"},
	{Name: "session-grace", Field: "SessionGrace", Default: DefaultSessionGrace, Zero: ZeroIsDefault, Replicated: true, engine: true,
		Doc: "how long a disconnected session keeps its locks; announced to clients, which believe a lock for at most this long after their last answer (negative: dropped at once and announced as 0, so a client that follows the safety rule cannot hold a lock across any silence; use a positive grace)"},
	{Name: "default-ttl", Field: "DefaultTTL", Default: DefaultTTL, Zero: ZeroIsDefault, NonNegative: true, Replicated: true,
		Doc: "lease of a lock sent without a ttl"},
	{Name: "auth-timeout", Field: "AuthTimeout", Default: DefaultAuthTimeout, Zero: ZeroIsDefault, NonNegative: true,
		Doc: "time a new connection has to send connect"},
	{Name: "idle-timeout", Field: "IdleTimeout", Default: DefaultIdleTimeout, Zero: ZeroIsDefault, FlagZero: FlagZeroIsOff,
		Doc: "close a connection that sent nothing for this `duration` after its handshake (0: never)"},
	{Name: "max-frame", Field: "MaxFrame", Default: DefaultMaxFrame, Zero: NonPositiveIsDefault, Max: protocol.MaxFrameLimit,
		Doc: "largest frame payload in bytes (at most 16 MiB)"},
	{Name: "max-conns", Field: "MaxConns", Default: DefaultMaxConns, Zero: ZeroIsDefaultNegativeNoLimit,
		Doc: "most simultaneous connections"},
	{Name: "max-conns-per-ip", Field: "MaxConnsPerIP", Default: DefaultMaxConnsPerIP, Zero: ZeroIsDefaultNegativeNoLimit,
		Doc: "most simultaneous connections from one IP address (an IPv6 /64 counts as one; loopback is not limited)"},
	{Name: "max-unauthenticated", Field: "MaxUnauthenticated", Default: DefaultMaxUnauthenticated, Zero: ZeroIsDefaultNegativeNoLimit,
		Doc: "most connections that have not completed connect (TLS handshake included); nobody is refused below it, and a newcomer past it evicts the oldest of the address holding the most of them (-1: no limit)"},
	{Name: "max-unauthenticated-per-ip", Field: "MaxUnauthenticatedPerIP", Default: 0, DefaultText: "--max-unauthenticated",
		Doc: "most connections from one address that have not completed connect (loopback addresses too, each on its own; an IPv6 /64 counts as one); a newcomer past it evicts that address's oldest, and nobody is refused for it (0: --max-unauthenticated; negative: no limit)"},
	{Name: "principal-max-locks", Field: "PrincipalMaxLocks", Default: 0,
		Doc: "default quota of live lock requests of a principal whose auth-file line has no max-locks= (0: half of --max-locks; -1: none)"},
	{Name: "principal-max-sessions", Field: "PrincipalMaxSessions", Default: 0,
		Doc: "default quota of sessions of a principal whose auth-file line has no max-sessions= (0: half of --max-sessions; -1: none)"},
	{Name: "principal-max-conns", Field: "PrincipalMaxConns", Default: 0,
		Doc: "default quota of connections of a principal whose auth-file line has no max-conns= (0: half of --max-conns; -1: none)"},
	{Name: "max-sessions", Field: "MaxSessions", Default: DefaultMaxSessions, Zero: ZeroIsDefaultNegativeNoLimit, Replicated: true,
		Doc: "most sessions, connected or in their grace period"},
	{Name: "max-pending-output", Field: "MaxPendingOutput", Default: DefaultMaxPendingOutput, Zero: ZeroIsDefaultNegativeNoLimit,
		Doc: "bytes queued for a client that does not read before it is disconnected"},
	{Name: "write-timeout", Field: "WriteTimeout", Default: DefaultWriteTimeout, Zero: NonPositiveIsDefault,
		Doc: "a client that does not read what it is sent for this long is disconnected"},
	{Name: "max-offline-bytes", Field: "MaxOfflineBytes", Default: DefaultMaxOfflineBytes, Zero: ZeroIsDefaultNegativeNoLimit, Replicated: true,
		Doc: "bytes of pushes kept for a disconnected session"},
	{Name: "max-resources", Field: "MaxResources", Default: DefaultMaxResources, Zero: EngineLimit, Replicated: true, engine: true,
		Doc: "most resources in one request"},
	{Name: "max-name-len", Field: "MaxNameLen", Default: DefaultMaxNameLen, Zero: EngineLimit, Replicated: true, engine: true,
		Doc: "longest resource or owner name in bytes"},
	{Name: "max-socket-id-len", Field: "MaxSocketIDLen", Default: DefaultMaxSocketIDLen, Zero: ZeroIsDefaultNegativeNoLimit,
		Doc: "longest socketId in bytes"},
	{Name: "max-locks-per-session", Field: "MaxLocksPerSession", Default: DefaultMaxLocksPerSession, Zero: ZeroIsDefaultNegativeNoLimit, Replicated: true, engine: true,
		Doc: "most live requests of one session (-1: no limit)"},
	{Name: "max-queue-len", Field: "MaxQueueLen", Default: DefaultMaxQueueLen, Zero: EngineLimit, Replicated: true, engine: true,
		Doc: "most entries in one resource's queue, holder included (-1: no limit)"},
	{Name: "max-session-bytes", Field: "MaxSessionBytes", Default: DefaultMaxSessionBytes, Zero: ZeroIsDefaultNegativeNoLimit, Replicated: true, engine: true,
		Doc: "most bytes of resource and owner names held by one session (-1: no limit)"},
	{Name: "max-locks", Field: "MaxLocks", Default: DefaultMaxLocks, Zero: ZeroIsDefaultNegativeNoLimit, Replicated: true, engine: true,
		Doc: "most live requests (held and waiting) in the whole server (-1: no limit)"},
	{Name: "max-entries", Field: "MaxEntries", Default: DefaultMaxEntries, Zero: ZeroIsDefaultNegativeNoLimit, Replicated: true, engine: true,
		Doc: "most queue entries in the whole server; a request on k resources is k entries (-1: no limit)"},
	{Name: "max-name-bytes", Field: "MaxNameBytes", Default: DefaultMaxNameBytes, Zero: ZeroIsDefaultNegativeNoLimit, Replicated: true, engine: true,
		Doc: "most bytes of resource and owner names held by the whole server (-1: no limit)"},
	{Name: "max-ttl", Field: "MaxTTL", Default: DefaultMaxTTL, Zero: ZeroIsDefault, NonNegative: true, Replicated: true, engine: true,
		Doc: "longest lease"},
	{Name: "max-timeout", Field: "MaxTimeout", Default: DefaultMaxTimeout, Zero: ZeroIsDefault, NonNegative: true, Replicated: true, engine: true,
		Doc: "longest wait timeout"},
	{Name: "status-limit", Field: "StatusLimit", Default: DefaultStatusLimit, Zero: ZeroIsDefaultNegativeNoLimit,
		Doc: "most locks, queues and sockets listed by status and locks"},
	{Name: "status-rate", Field: "StatusRate", Default: DefaultStatusRate, Zero: ZeroIsDefaultNegativeNoLimit,
		Doc: "detailed status and locks listings per second and principal (-1: no limit)"},
	{Name: "data-dir", Field: "DataDir", Default: datadir.DefaultDir,
		Doc: "data directory: fencing-token high-water mark and how the last run ended, locked while in use (empty: the default; \"none\": none, then every start is quiet)"},
	{Name: "token-block", Field: "TokenBlock", Default: datadir.TokenBlock, Zero: ZeroIsDefault, NonNegative: true,
		Doc: "fencing tokens one write of the data directory's token high-water mark reserves: a failing disk is noticed within half as many grants, and at most half as many are then given until a write succeeds"},
	{Name: "quiet-period", Field: "QuietPeriod", DefaultText: "session grace + 1% + 5ms", FlagZero: FlagZeroIsOff,
		Doc: "after a start that may follow a crash, grant nothing for this `duration`, or for the crashed run's, if longer (shorter than the default is unsafe and logged; 0: never quiet, unsafe, for tests)"},
	{Name: "shutdown-wait", Field: "ShutdownWait", Default: DefaultShutdownWait, Zero: ZeroIsDefault, FlagZero: FlagZeroIsOff,
		Doc: "on shutdown, the `duration` to wait for clients holding locks to confirm (bye) after they are told (0: no wait, then the next start is quiet if any lock was held)"},
	{Name: "log-slow-wait", Field: "LogSlowWait", Default: DefaultLogSlowWait, Zero: ZeroIsDefault, FlagZero: FlagNonPositiveIsOff,
		Doc: "log a waiter granted after waiting longer than this `duration` (rate-limited; 0 or negative: never)"},
	{Name: "log-long-queue", Field: "LogLongQueue", Default: DefaultLogLongQueue, Zero: ZeroIsDefault, FlagZero: FlagNonPositiveIsOff,
		Doc: "log a lock request queued behind at least this `number` of entries (rate-limited; 0 or negative: never)"},
	{Name: "dedup-window", Field: "Cluster.DedupWindow", Default: cluster.DefaultDedupWindow, Zero: NonPositiveIsDefault,
		Max: 1 << 30, Replicated: true, NoFlag: true,
		Doc: "cluster: how many recent answers are kept to answer a retried command without applying it twice"},
}

// Settings returns the settings of a Server, one per field of Config that
// is a value (every field but Logger and Cluster) and one per replicated
// field of ClusterConfig, in Config's order.
func Settings() []Setting { return slices.Clone(settingsTable) }

// replicatedSettings are the replicated settings in name order: the
// order of their text form.
var replicatedSettings = func() []*Setting {
	var r []*Setting
	for i := range settingsTable {
		if settingsTable[i].Replicated {
			r = append(r, &settingsTable[i])
		}
	}
	slices.SortFunc(r, func(a, b *Setting) int { return strings.Compare(a.Name, b.Name) })
	return r
}()

// settingByField returns the setting of a Config field.
func settingByField(field string) *Setting {
	for i := range settingsTable {
		if settingsTable[i].Field == field {
			return &settingsTable[i]
		}
	}
	panic("server: no setting for Config." + field)
}

// Env is the setting's environment variable for mlockd: MLOCK_ and its
// name in upper case with '-' as '_'; empty without a flag.
func (s *Setting) Env() string {
	if s.NoFlag {
		return ""
	}
	return "MLOCK_" + strings.ToUpper(strings.ReplaceAll(s.Name, "-", "_"))
}

// Ptr returns a pointer to the setting's field of c: an *int, a
// *time.Duration, a *string or a *bool. For a field of ClusterConfig, it
// is nil if c.Cluster is.
func (s *Setting) Ptr(c *Config) any {
	v := s.value(reflect.ValueOf(c).Elem())
	if !v.IsValid() {
		return nil
	}
	return v.Addr().Interface()
}

// value is the setting's field in cfg, a Config; invalid for a field of a
// nil ClusterConfig.
func (s *Setting) value(cfg reflect.Value) reflect.Value {
	v := cfg
	for name := range strings.SplitSeq(s.Field, ".") {
		if v.Kind() == reflect.Pointer {
			if v.IsNil() {
				return reflect.Value{}
			}
			v = v.Elem()
		}
		v = v.FieldByName(name)
	}
	return v
}

// goName is the setting's name in Go: its field's, without "Cluster.".
func (s *Setting) goName() string {
	_, name, _ := strings.Cut(s.Field, ".")
	if name == "" {
		return s.Field
	}
	return name
}

// DefaultString is the default as mlockd's help and docs say it: the
// value (as a flag takes it), else DefaultText.
func (s *Setting) DefaultString() string {
	if s.DefaultText != "" || s.Default == nil {
		return s.DefaultText
	}
	return fmt.Sprint(s.Default)
}

// Range says, for mlockd's flag, the values the setting takes beyond
// positive ones: what 0 and negative values mean, and its bounds.
func (s *Setting) Range() string {
	var r []string
	switch {
	case s.FlagZero == FlagZeroIsOff:
		r = append(r, "0: off")
	case s.FlagZero == FlagNonPositiveIsOff:
		r = append(r, "0 or negative: off")
	case s.Zero == ZeroIsDefault:
		if _, ok := s.Default.(string); ok {
			r = append(r, "empty: the default")
		} else {
			r = append(r, "0: the default")
		}
	case s.Zero == NonPositiveIsDefault:
		r = append(r, "0 or negative: the default")
	case s.Zero == ZeroIsDefaultNegativeNoLimit || s.Zero == EngineLimit:
		r = append(r, "0: the default", "negative: no limit")
	}
	if s.NonNegative || s.FlagZero == FlagZeroIsOff {
		r = append(r, "negative: refused")
	}
	if s.Max != 0 {
		r = append(r, "at most "+strconv.FormatInt(s.Max, 10))
	}
	return strings.Join(r, "; ")
}

// applyDefault sets v, the setting's field, to its default if the field's
// Zero rule says so.
func (s *Setting) applyDefault(v reflect.Value) {
	switch s.Zero {
	case ZeroIsDefault:
		if v.IsZero() {
			v.Set(reflect.ValueOf(s.Default).Convert(v.Type()))
		}
	case NonPositiveIsDefault:
		if v.Int() <= 0 {
			v.SetInt(toInt64(s.Default))
		}
	case ZeroIsDefaultNegativeNoLimit:
		switch n := v.Int(); {
		case n == 0:
			v.SetInt(toInt64(s.Default))
		case n < 0:
			v.SetInt(int64(noLimit))
		}
	}
}

// noLimit is an integer limit's value for "no limit".
const noLimit = int(^uint(0) >> 1)

// toInt64 is an int or time.Duration default as an int64.
func toInt64(v any) int64 {
	switch v := v.(type) {
	case int:
		return int64(v)
	case time.Duration:
		return int64(v)
	}
	panic(fmt.Sprintf("server: %T is not an integer setting", v))
}

// check reports the setting's value v (a field of a Config as given) out
// of its range: negative where it must not be, or above its maximum.
func (s *Setting) check(v reflect.Value) error {
	if !v.IsValid() || (v.Kind() != reflect.Int && v.Kind() != reflect.Int64) {
		return nil
	}
	n := v.Int()
	switch {
	case s.NonNegative && n < 0:
		return newConfigError(s, " "+fmt.Sprint(v.Interface())+" is negative")
	case s.Max != 0 && n > s.Max:
		return newConfigError(s, " "+fmt.Sprint(v.Interface())+" is above "+strconv.FormatInt(s.Max, 10))
	}
	return nil
}

// checkInForce reports the setting's value n in force (a field of
// settings, its default applied) out of range: every replicated setting
// is one that a Config with its defaults always has positive, but for
// the session grace (not 0) and the engine's limits (any).
func (s *Setting) checkInForce(n int64) error {
	switch {
	case s.Zero == EngineLimit:
	case s.Zero == ZeroIsDefault && !s.NonNegative:
		if n == 0 {
			return fmt.Errorf("%s is 0", s.Name)
		}
	case n <= 0:
		return fmt.Errorf("%s %s must be positive", s.Name, s.format(n))
	}
	if s.Max != 0 && n > s.Max {
		return fmt.Errorf("%s %s is out of range", s.Name, s.format(n))
	}
	return nil
}

// format is a replicated setting's value in the text form: an integer,
// or a duration in Go's form ("1m0s").
func (s *Setting) format(n int64) string {
	if _, ok := s.Default.(time.Duration); ok {
		return time.Duration(n).String()
	}
	return strconv.FormatInt(n, 10)
}

// parse reads a replicated setting's value in the text form.
func (s *Setting) parse(v string) (int64, error) {
	if _, ok := s.Default.(time.Duration); ok {
		d, err := time.ParseDuration(v)
		return int64(d), err
	}
	n, err := strconv.Atoi(v)
	return int64(n), err
}

// A ConfigError is a Config that Validate refuses: one or more settings
// and what is wrong with them.
type ConfigError struct {
	// Settings are the settings the error names, the one out of range
	// first.
	Settings []*Setting
	// parts are the message: strings, and *Setting where a setting is
	// named.
	parts []any
}

// newConfigError is an error of the settings named in parts (strings and
// *Setting), in order.
func newConfigError(parts ...any) *ConfigError {
	e := &ConfigError{parts: parts}
	for _, p := range parts {
		if s, ok := p.(*Setting); ok {
			e.Settings = append(e.Settings, s)
		}
	}
	return e
}

// Error names the settings by their Config fields: "server:
// Config.DefaultTTL 2h0m0s is above MaxTTL 1h0m0s".
func (e *ConfigError) Error() string {
	first := true
	return "server: " + e.Message(func(s *Setting) string {
		if first {
			first = false
			return "Config." + s.Field
		}
		return s.Field
	})
}

// Message is the error with each setting named by name: mlockd names them
// by their flag or variable ("--default-ttl 2h0m0s is above --max-ttl
// 1h0m0s").
func (e *ConfigError) Message(name func(*Setting) string) string {
	var b strings.Builder
	for _, p := range e.parts {
		switch p := p.(type) {
		case string:
			b.WriteString(p)
		case *Setting:
			b.WriteString(name(p))
		}
	}
	return b.String()
}
