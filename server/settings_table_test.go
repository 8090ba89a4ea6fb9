package server

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/internal/core"
)

// The table covers Config: every field but Logger and Cluster is one
// setting, of a unique name, whose default has the field's type.
func TestSettingsTableCoversConfig(t *testing.T) {
	names, fields := map[string]bool{}, map[string]bool{}
	var cfg Config
	cfg.Cluster = &ClusterConfig{}
	for _, s := range Settings() {
		if names[s.Name] || fields[s.Field] {
			t.Errorf("setting %s (%s) twice", s.Name, s.Field)
		}
		names[s.Name], fields[s.Field] = true, true
		p := s.Ptr(&cfg)
		if p == nil {
			t.Errorf("%s: no field %s", s.Name, s.Field)
			continue
		}
		if s.Default == nil && s.DefaultText == "" {
			t.Errorf("%s: neither a default nor its text", s.Name)
		}
		if s.Default != nil && reflect.TypeOf(p).Elem() != reflect.TypeOf(s.Default) {
			t.Errorf("%s: field of type %v, default of type %T", s.Name, reflect.TypeOf(p).Elem(), s.Default)
		}
		if s.Doc == "" || strings.ContainsAny(s.Doc, "\n|") {
			t.Errorf("%s: doc %q, want one line without '|'", s.Name, s.Doc)
		}
	}
	typ := reflect.TypeFor[Config]()
	for i := range typ.NumField() {
		if f := typ.Field(i).Name; f != "Logger" && f != "Cluster" && !fields[f] {
			t.Errorf("Config.%s has no setting", f)
		}
	}
	if (&Setting{Name: "max-queue-len"}).Env() != "MLOCK_MAX_QUEUE_LEN" {
		t.Error("the variable of max-queue-len is not MLOCK_MAX_QUEUE_LEN")
	}
	if s := settingByField("Cluster.DedupWindow"); s.Env() != "" || s.Ptr(&Config{}) != nil {
		t.Error("the de-duplication window has no flag, and no field without a ClusterConfig")
	}
}

// The replicated settings are exactly the fields of settings, and those
// marked for the engine are core.EngineConfig's fields of the same name
// and type.
func TestReplicatedSettingsAreTheSettingsFields(t *testing.T) {
	rep := map[string]*Setting{}
	for _, s := range replicatedSettings {
		rep[s.goName()] = s
	}
	st := reflect.TypeFor[settings]()
	if st.NumField() != len(rep) {
		t.Errorf("settings has %d fields, the table %d replicated settings", st.NumField(), len(rep))
	}
	et := reflect.TypeFor[core.EngineConfig]()
	for i := range st.NumField() {
		f := st.Field(i)
		s, ok := rep[f.Name]
		if !ok {
			t.Errorf("settings.%s is not a replicated setting", f.Name)
			continue
		}
		if ef, ok := et.FieldByName(f.Name); ok != s.engine || ok && ef.Type != f.Type {
			t.Errorf("settings.%s: in core.EngineConfig %v (type %v), marked for the engine %v", f.Name, ok, ef.Type, s.engine)
		}
	}
	for i := 1; i < len(replicatedSettings); i++ {
		if replicatedSettings[i-1].Name >= replicatedSettings[i].Name {
			t.Fatal("the replicated settings are not in name order")
		}
	}
}

// withDefaults applies each setting's Zero rule: 0 takes the default,
// a negative limit means no limit, and the engine's limits and the
// settings used as they are stay as given.
func TestWithDefaultsFollowsTheTable(t *testing.T) {
	zero := Config{}.withDefaults()
	neg := Config{}
	nv := reflect.ValueOf(&neg).Elem()
	for _, s := range Settings() {
		if v := s.value(nv); v.IsValid() && (v.Kind() == reflect.Int || v.Kind() == reflect.Int64) {
			v.SetInt(-1)
		}
	}
	neg = neg.withDefaults()
	for _, s := range Settings() {
		p := s.Ptr(&zero)
		if p == nil {
			continue // ClusterConfig's: applied by the cluster
		}
		got := reflect.ValueOf(p).Elem().Interface()
		gotNeg := reflect.ValueOf(s.Ptr(&neg)).Elem()
		switch s.Zero {
		case ZeroIsDefault, NonPositiveIsDefault, ZeroIsDefaultNegativeNoLimit:
			if got != s.Default {
				t.Errorf("%s: 0 becomes %v, want the default %v", s.Name, got, s.Default)
			}
		case ZeroAsIs, EngineLimit:
			if !reflect.ValueOf(p).Elem().IsZero() && s.Field != "QuietPeriod" {
				t.Errorf("%s: 0 becomes %v, want it kept", s.Name, got)
			}
		}
		switch s.Zero {
		case NonPositiveIsDefault:
			if gotNeg.Interface() != s.Default {
				t.Errorf("%s: -1 becomes %v, want the default", s.Name, gotNeg)
			}
		case ZeroIsDefaultNegativeNoLimit:
			if gotNeg.Int() != int64(noLimit) {
				t.Errorf("%s: -1 becomes %v, want no limit", s.Name, gotNeg)
			}
		case EngineLimit, ZeroIsDefault:
			if gotNeg.IsValid() && gotNeg.Kind() != reflect.String && gotNeg.Int() != -1 {
				t.Errorf("%s: -1 becomes %v, want it kept", s.Name, gotNeg)
			}
		}
	}
	if zero.QuietPeriod != 15155*time.Millisecond {
		t.Errorf("the quiet period of the default grace: %v", zero.QuietPeriod)
	}
}

// Validate refuses each setting's values out of its range with a
// *ConfigError naming it, and takes those at its bounds.
func TestValidateFollowsTheTable(t *testing.T) {
	for _, s := range Settings() {
		if !s.NonNegative && s.Max == 0 {
			continue
		}
		cfg := Config{Cluster: &ClusterConfig{}}
		v := reflect.ValueOf(s.Ptr(&cfg)).Elem()
		check := func(n int64, ok bool, want string) {
			t.Helper()
			v.SetInt(n)
			err := cfg.Validate()
			var ce *ConfigError
			switch {
			case ok && err != nil:
				t.Errorf("%s %d refused: %v", s.Name, n, err)
			case !ok && (!errors.As(err, &ce) || ce.Settings[0].Name != s.Name || err.Error() != want):
				t.Errorf("%s %d: %v, want %q", s.Name, n, err, want)
			}
		}
		if s.NonNegative {
			check(0, true, "")
			check(-1, false, "server: Config."+s.Field+" "+s.format(-1)+" is negative")
		}
		if s.Max != 0 {
			check(s.Max, true, "")
			check(s.Max+1, false, "server: Config."+s.Field+" "+s.format(s.Max+1)+" is above "+s.format(s.Max))
		}
		if s.Range() == "" {
			t.Errorf("%s has a range and no text for it", s.Name)
		}
	}
	err := (&Config{DefaultTTL: 2 * time.Hour, MaxTTL: time.Hour}).Validate()
	var ce *ConfigError
	if !errors.As(err, &ce) || len(ce.Settings) != 2 || err.Error() != "server: Config.DefaultTTL 2h0m0s is above MaxTTL 1h0m0s" {
		t.Fatalf("default above max: %v", err)
	}
	if got := ce.Message(func(s *Setting) string { return "<" + s.Name + ">" }); got != "<default-ttl> 2h0m0s is above <max-ttl> 1h0m0s" {
		t.Fatalf("Message: %q", got)
	}
	// The same rule for the replicated settings, named as in their text.
	cfg := Config{}.withDefaults()
	base := settingsOf(&cfg)
	if _, err := parseSettings("max-ttl=2h0m0s default-ttl=3h0m0s", base); err == nil ||
		err.Error() != "default-ttl 3h0m0s is above max-ttl 2h0m0s" {
		t.Fatalf("replicated default above max: %v", err)
	}
	for text, want := range map[string]string{
		"dedup-window=0":                   "dedup-window 0 must be positive",
		"dedup-window=1073741825":          "dedup-window 1073741825 is out of range",
		"max-timeout=-1s":                  "max-timeout -1s must be positive",
		"session-grace=0s":                 "session-grace is 0",
		"max-locks=0":                      "max-locks 0 must be positive",
		"max-queue-len=0 max-resources=-1": "",
	} {
		_, err := parseSettings(text, base)
		if (err == nil) != (want == "") || err != nil && err.Error() != want {
			t.Errorf("%q: %v, want %q", text, err, want)
		}
	}
}
