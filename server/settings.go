package server

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/mlock-dev/mlock/internal/cluster"
	"github.com/mlock-dev/mlock/internal/core"
)

// settings are the settings that commands are applied with: the limits of
// the command handlers, the engine's limits and session grace, and (in a
// cluster) the de-duplication window. A single node applies its own
// (Config's). In a cluster they are replicated state: the genesis entry
// and every opParams entry put the proposing leader's in force on every
// node, so that the same log gives the same state whatever each node's
// flags (see docs/cluster.md).
type settings struct {
	DedupWindow        int
	DefaultTTL         time.Duration
	MaxEntries         int
	MaxLocks           int
	MaxLocksPerSession int
	MaxNameBytes       int
	MaxNameLen         int
	MaxOfflineBytes    int
	MaxQueueLen        int
	MaxResources       int
	MaxSessionBytes    int
	MaxSessions        int
	MaxTimeout         time.Duration
	MaxTTL             time.Duration
	SessionGrace       time.Duration
}

// settingsOf returns the settings of c, a Config with its defaults.
func settingsOf(c *Config) settings {
	st := settings{
		DedupWindow: cluster.DefaultDedupWindow,
		DefaultTTL:  c.DefaultTTL, MaxEntries: c.MaxEntries, MaxLocks: c.MaxLocks,
		MaxLocksPerSession: c.MaxLocksPerSession, MaxNameBytes: c.MaxNameBytes, MaxNameLen: c.MaxNameLen,
		MaxOfflineBytes: c.MaxOfflineBytes, MaxQueueLen: c.MaxQueueLen, MaxResources: c.MaxResources,
		MaxSessionBytes: c.MaxSessionBytes, MaxSessions: c.MaxSessions, MaxTimeout: c.MaxTimeout,
		MaxTTL: c.MaxTTL, SessionGrace: c.SessionGrace,
	}
	if c.Cluster != nil && c.Cluster.DedupWindow > 0 {
		st.DedupWindow = c.Cluster.DedupWindow
	}
	return st
}

// engineConfig returns the engine's part: its limits and session grace.
func (st *settings) engineConfig() core.EngineConfig {
	return core.EngineConfig{
		MaxResources: st.MaxResources, MaxNameLen: st.MaxNameLen, MaxLocksPerSession: st.MaxLocksPerSession,
		MaxQueueLen: st.MaxQueueLen, SessionGrace: st.SessionGrace, MaxTTL: st.MaxTTL, MaxTimeout: st.MaxTimeout,
		MaxLocks: st.MaxLocks, MaxEntries: st.MaxEntries, MaxNameBytes: st.MaxNameBytes,
		MaxSessionBytes: st.MaxSessionBytes,
	}
}

// graceMs is the session grace announced in the handshake.
func (st *settings) graceMs() int64 { return max(st.SessionGrace, 0).Milliseconds() }

// fields are the settings' names in the text form, in its order, with
// their values.
func (st *settings) fields() []settingField {
	return []settingField{
		{"dedup-window", &st.DedupWindow, nil},
		{"default-ttl", nil, &st.DefaultTTL},
		{"max-entries", &st.MaxEntries, nil},
		{"max-locks", &st.MaxLocks, nil},
		{"max-locks-per-session", &st.MaxLocksPerSession, nil},
		{"max-name-bytes", &st.MaxNameBytes, nil},
		{"max-name-len", &st.MaxNameLen, nil},
		{"max-offline-bytes", &st.MaxOfflineBytes, nil},
		{"max-queue-len", &st.MaxQueueLen, nil},
		{"max-resources", &st.MaxResources, nil},
		{"max-session-bytes", &st.MaxSessionBytes, nil},
		{"max-sessions", &st.MaxSessions, nil},
		{"max-timeout", nil, &st.MaxTimeout},
		{"max-ttl", nil, &st.MaxTTL},
		{"session-grace", nil, &st.SessionGrace},
	}
}

type settingField struct {
	name string
	n    *int
	d    *time.Duration
}

// String is the canonical text of the settings: "name=value" fields in
// name order, separated by one space (durations in Go's form, "1m0s"). It
// is what a leader proposes (opParams), what the genesis entry and the
// snapshot carry, and what a node logs.
func (st settings) String() string {
	var b strings.Builder
	for i, f := range st.fields() {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(f.name)
		b.WriteByte('=')
		if f.n != nil {
			b.WriteString(strconv.Itoa(*f.n))
		} else {
			b.WriteString(f.d.String())
		}
	}
	return b.String()
}

// parseSettings returns base with the fields of text (String's form) put
// over it: a field text does not name keeps base's value, a name it does
// not know is ignored (a newer leader's). A value that does not parse, or
// settings that are out of range, are an error: the caller then keeps the
// settings in force. It is a pure function of its arguments, so every node
// decides alike.
func parseSettings(text string, base settings) (settings, error) {
	st := base
	fs := st.fields()
	for _, kv := range strings.Fields(text) {
		name, v, ok := strings.Cut(kv, "=")
		if !ok {
			return base, fmt.Errorf("setting %q: no value", kv)
		}
		for _, f := range fs {
			if f.name != name {
				continue
			}
			if f.n != nil {
				n, err := strconv.Atoi(v)
				if err != nil {
					return base, fmt.Errorf("setting %s: %w", name, err)
				}
				*f.n = n
			} else {
				d, err := time.ParseDuration(v)
				if err != nil {
					return base, fmt.Errorf("setting %s: %w", name, err)
				}
				*f.d = d
			}
		}
	}
	if err := st.validate(); err != nil {
		return base, err
	}
	return st, nil
}

// validate reports settings out of range: those a Config with its
// defaults never has.
func (st *settings) validate() error {
	switch {
	case st.DedupWindow <= 0 || st.DedupWindow > 1<<30:
		return fmt.Errorf("dedup-window %d is out of range", st.DedupWindow)
	case st.DefaultTTL <= 0 || st.MaxTTL <= 0 || st.MaxTimeout <= 0:
		return errors.New("default-ttl, max-ttl and max-timeout must be positive")
	case st.DefaultTTL > st.MaxTTL:
		return fmt.Errorf("default-ttl %v is above max-ttl %v", st.DefaultTTL, st.MaxTTL)
	case st.SessionGrace == 0:
		return errors.New("session-grace is 0")
	case st.MaxSessions <= 0 || st.MaxOfflineBytes <= 0:
		return errors.New("max-sessions and max-offline-bytes must be positive")
	}
	ecfg := st.engineConfig()
	return ecfg.Validate()
}
