package server

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/mlock-dev/mlock/internal/core"
)

// settings are the settings that commands are applied with: the limits of
// the command handlers, the engine's limits and session grace, and (in a
// cluster) the de-duplication window. A single node applies its own
// (Config's). In a cluster they are replicated state: the genesis entry
// and every opParams entry put the proposing leader's in force on every
// node, so that the same log gives the same state whatever each node's
// flags (see docs/cluster.md). Its fields are the replicated settings of
// the table (Settings), by their Go names; the table says how each is
// written, read and checked.
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

// settingsOf returns the settings of c, a Config with its defaults: its
// replicated settings (see Settings), and the cluster's de-duplication
// window, default or given.
func settingsOf(c *Config) settings {
	var st settings
	cfg, sv := reflect.ValueOf(c).Elem(), reflect.ValueOf(&st).Elem()
	for _, s := range replicatedSettings {
		v := s.value(cfg)
		f := sv.FieldByName(s.goName())
		if !v.IsValid() || s.Zero == NonPositiveIsDefault && v.Int() <= 0 {
			f.SetInt(toInt64(s.Default)) // of a ClusterConfig, nil or without it
			continue
		}
		f.Set(v)
	}
	return st
}

// engineConfig returns the engine's part: its limits and session grace.
func (st *settings) engineConfig() core.EngineConfig {
	var ecfg core.EngineConfig
	sv, ev := reflect.ValueOf(st).Elem(), reflect.ValueOf(&ecfg).Elem()
	for _, s := range replicatedSettings {
		if s.engine {
			ev.FieldByName(s.goName()).Set(sv.FieldByName(s.goName()))
		}
	}
	return ecfg
}

// graceMs is the session grace announced in the handshake.
func (st *settings) graceMs() int64 { return max(st.SessionGrace, 0).Milliseconds() }

// String is the canonical text of the settings: "name=value" fields in
// name order, separated by one space (durations in Go's form, "1m0s"). It
// is what a leader proposes (opParams), what the genesis entry and the
// snapshot carry, and what a node logs. Its bytes are part of the log's
// format: a node of any build reads them alike.
func (st settings) String() string {
	var b strings.Builder
	sv := reflect.ValueOf(&st).Elem()
	for i, s := range replicatedSettings {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(s.Name)
		b.WriteByte('=')
		b.WriteString(s.format(sv.FieldByName(s.goName()).Int()))
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
	sv := reflect.ValueOf(&st).Elem()
	for _, kv := range strings.Fields(text) {
		name, v, ok := strings.Cut(kv, "=")
		if !ok {
			return base, fmt.Errorf("setting %q: no value", kv)
		}
		for _, s := range replicatedSettings {
			if s.Name != name {
				continue
			}
			n, err := s.parse(v)
			if err != nil {
				return base, fmt.Errorf("setting %s: %w", name, err)
			}
			sv.FieldByName(s.goName()).SetInt(n)
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
	sv := reflect.ValueOf(st).Elem()
	for _, s := range replicatedSettings {
		if err := s.checkInForce(sv.FieldByName(s.goName()).Int()); err != nil {
			return err
		}
	}
	var ce *ConfigError
	if errors.As(checkDefaultTTL(st.DefaultTTL, st.MaxTTL), &ce) {
		return errors.New(ce.Message(func(s *Setting) string { return s.Name })) // "default-ttl 3h0m0s is above max-ttl 2h0m0s"
	}
	ecfg := st.engineConfig()
	return ecfg.Validate()
}
