package main

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/mlock-dev/mlock/server"
)

// addSettingFlags defines a flag for every setting of the server's table
// (server.Settings) that has one, on its field of cfg, with its default
// and doc line: the table is the one list of the server's flags.
func addSettingFlags(fs *flag.FlagSet, cfg *server.Config) {
	for _, s := range server.Settings() {
		if s.NoFlag {
			continue
		}
		usage := s.Doc
		if s.DefaultText != "" {
			usage += " (default: " + s.DefaultText + ")"
		}
		switch p := s.Ptr(cfg).(type) {
		case *string:
			fs.StringVar(p, s.Name, s.Default.(string), usage)
		case *bool:
			fs.BoolVar(p, s.Name, s.Default.(bool), usage)
		case *int:
			if s.FlagZero == server.FlagZeroAsConfig {
				fs.IntVar(p, s.Name, s.Default.(int), usage)
				continue
			}
			fs.Var(newOffFlag(p, &s, strconv.Atoi, "want an integer", "number"), s.Name, usage)
		case *time.Duration:
			if s.FlagZero == server.FlagZeroAsConfig {
				fs.DurationVar(p, s.Name, s.Default.(time.Duration), usage)
				continue
			}
			fs.Var(newOffFlag(p, &s, time.ParseDuration, "want a duration such as 15s", "duration"), s.Name, usage)
		default:
			panic(fmt.Sprintf("mlockd: setting %s: no flag for %T", s.Name, p))
		}
	}
}

// offFlag is the flag of a setting that 0 turns off (server.FlagZeroIsOff,
// server.FlagNonPositiveIsOff): in server.Config, 0 is the default and a
// negative value is off. Unset, the field keeps the setting's default (or
// 0, where the server computes it).
type offFlag[T int | time.Duration] struct {
	p      *T
	negOff bool // a negative value turns it off too; else it is refused
	parse  func(string) (T, error)
	want   string // what it takes, for a value that does not parse
	noun   string // what a value is: "duration"
}

func newOffFlag[T int | time.Duration](p *T, s *server.Setting, parse func(string) (T, error), want, noun string) *offFlag[T] {
	if s.Default != nil {
		*p = s.Default.(T)
	}
	return &offFlag[T]{p: p, negOff: s.FlagZero == server.FlagNonPositiveIsOff, parse: parse, want: want, noun: noun}
}

func (v *offFlag[T]) String() string {
	switch {
	case v == nil || v.p == nil || *v.p == 0:
		return "" // the server's default
	case *v.p < 0:
		return fmt.Sprint(T(0)) // "0s" or "0": off
	}
	return fmt.Sprint(*v.p)
}

func (v *offFlag[T]) Set(s string) error {
	n, err := v.parse(s)
	switch {
	case err != nil:
		return errors.New(v.want)
	case n < 0 && !v.negOff:
		return errors.New("negative " + v.noun)
	case n <= 0:
		n = -1
	}
	*v.p = n
	return nil
}

func (v *offFlag[T]) Get() any { return *v.p }

// badValue keeps the first bad value given to a flag, in mlockd's words:
// the flag package's own error says it in its words.
type badValue struct{ err error }

// recordErrors wraps every flag of fs so that a value its flag refuses is
// kept in the returned badValue, naming the flag, the value and what the
// flag wants.
func recordErrors(fs *flag.FlagSet) *badValue {
	var bad badValue
	fs.VisitAll(func(f *flag.Flag) {
		f.Value = &recorded{Value: f.Value, name: f.Name, bad: &bad}
	})
	return &bad
}

// unwrapFlags undoes recordErrors, so that fs.PrintDefaults names each
// flag's type (the flag package reads it from the value's type).
func unwrapFlags(fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		if r, ok := f.Value.(*recorded); ok {
			f.Value = r.Value
		}
	})
}

// recorded is a flag's value that keeps its first bad value.
type recorded struct {
	flag.Value
	name string
	bad  *badValue
}

func (r *recorded) Set(v string) error {
	err := r.Value.Set(v)
	if err != nil && r.bad.err == nil {
		r.bad.err = usagef("--%s %q: %s", r.name, v, want(r.Value, err))
	}
	return err
}

func (r *recorded) String() string {
	if r == nil || r.Value == nil {
		return ""
	}
	return r.Value.String()
}

// IsBoolFlag keeps a boolean flag one that takes no value.
func (r *recorded) IsBoolFlag() bool {
	b, ok := r.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

func (r *recorded) Get() any {
	if g, ok := r.Value.(flag.Getter); ok {
		return g.Get()
	}
	return nil
}

// want says what a flag whose value is v wants, given the error of
// setting it: the flag package's "parse error" and "value out of range"
// say too little.
func want(v flag.Value, err error) string {
	msg := err.Error()
	if msg != "value out of range" && !strings.HasPrefix(msg, "parse error") {
		return msg
	}
	g, ok := v.(flag.Getter)
	if !ok {
		return msg
	}
	switch g.Get().(type) {
	case int, int64:
		if msg == "value out of range" {
			return "out of range for an integer"
		}
		return "want an integer"
	case uint, uint64:
		return "want a non-negative integer"
	case time.Duration:
		return "want a duration such as 15s or 1m30s"
	case bool:
		return "want true or false"
	case float64:
		return "want a number"
	}
	return msg
}

// envName is the environment variable of a flag: MLOCK_ and the name in
// upper case with '-' as '_' (as server.Setting.Env says).
func envName(flagName string) string {
	return "MLOCK_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// applyEnv sets every flag not given on the command line from its MLOCK_
// environment variable, and returns the flags so set, by name, with their
// variable. A bad value is a usage error naming the variable, its value and
// what it wants.
func applyEnv(fs *flag.FlagSet, lookup func(string) (string, bool)) (map[string]string, error) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	fromEnv := map[string]string{}
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil {
			return
		}
		name := envName(f.Name)
		if v, ok := lookup(name); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = usagef("%s=%q: %s (see --%s)", name, v, want(f.Value, e), f.Name)
				return
			}
			fromEnv[f.Name] = name
		}
	})
	return fromEnv, err
}

// source is how a setting was given: its variable if it came from the
// environment, else its flag.
func source(fromEnv map[string]string, flagName string) string {
	if v, ok := fromEnv[flagName]; ok {
		return v
	}
	return "--" + flagName
}

// configError is an error of server.Config.Validate with each setting
// named by its flag, or its variable if the value came from the
// environment: "--max-frame 100000000 is above 16777216".
func configError(err error, fromEnv map[string]string) string {
	var ce *server.ConfigError
	if !errors.As(err, &ce) {
		return strings.TrimPrefix(err.Error(), "server: ")
	}
	return ce.Message(func(s *server.Setting) string {
		if s.NoFlag {
			return "Config." + s.Field // set only through the server's API
		}
		return source(fromEnv, s.Name)
	})
}
