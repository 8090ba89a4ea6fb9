package server

import (
	"testing"
)

// FuzzParseSettings: the settings text of a log entry (a leader's, or a
// damaged one) never panics the node applying it; what it accepts is in
// range, and its text form reads back to the same settings; what it
// refuses leaves the settings in force unchanged.
func FuzzParseSettings(f *testing.F) {
	cfg := Config{}.withDefaults()
	base := settingsOf(&cfg)
	f.Add(base.String())
	f.Add("max-ttl=1m0s session-grace=-1s")
	f.Add("dedup-window=0")
	f.Add("max-ttl=9223372036854775807ns default-ttl=1ns")
	f.Add("unknown=1 max-sessions=7")
	f.Add("max-ttl")
	f.Fuzz(func(t *testing.T, text string) {
		st, err := parseSettings(text, base)
		if err != nil {
			if st != base {
				t.Fatalf("refused %q (%v) but changed the settings", text, err)
			}
			return
		}
		if err := st.validate(); err != nil {
			t.Fatalf("accepted %q out of range: %v", text, err)
		}
		back, err := parseSettings(st.String(), settings{})
		if err != nil || back != st {
			t.Fatalf("%q: its text %q reads back as %+v, %v", text, st.String(), back, err)
		}
	})
}
