package server

import (
	"testing"
)

// FuzzParseSettings: the settings text of a log entry (a leader's, or a
// damaged one) never panics the node applying it; what it accepts is in
// range, and its text form reads back to the same settings; what it
// refuses leaves the settings in force unchanged. The fields and their
// rules are the replicated settings of the table (settings_table.go).
func FuzzParseSettings(f *testing.F) {
	cfg := Config{}.withDefaults()
	base := settingsOf(&cfg)
	f.Add(base.String())
	f.Add("max-ttl=1m0s session-grace=-1s")
	f.Add("dedup-window=0")
	f.Add("max-ttl=9223372036854775807ns default-ttl=1ns")
	f.Add("unknown=1 max-sessions=7")
	f.Add("max-ttl")
	f.Add("max-locks=0 max-queue-len=-1 dedup-window=1073741825")
	// mlockd's defaults as the build before the settings table wrote them
	f.Add("dedup-window=65536 default-ttl=1m0s max-entries=4000000 max-locks=1000000 max-locks-per-session=100000 max-name-bytes=268435456 max-name-len=512 max-offline-bytes=1048576 max-queue-len=100000 max-resources=64 max-session-bytes=8388608 max-sessions=20000 max-timeout=24h0m0s max-ttl=24h0m0s session-grace=15s")
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
