package datadir

import (
	"bytes"
	"testing"
	"time"
)

func TestStateRoundTrip(t *testing.T) {
	for _, st := range []State{
		{Ending: EndingUnclean},
		{Ending: EndingClean},
		{Ending: EndingClean, QuietUntil: time.Unix(0, 1_700_000_000_123_456_789)},
		{Ending: EndingUnclean, QuietUntil: time.Unix(0, 1)},
		{Ending: EndingUnclean, QuietPeriod: 15155 * time.Millisecond},
		{Ending: EndingClean, QuietUntil: time.Unix(0, 1_700_000_000_123_456_789), QuietPeriod: 1},
	} {
		got, err := parseState(formatState(st))
		if err != nil || got.Ending != st.Ending || !got.QuietUntil.Equal(st.QuietUntil) || got.QuietPeriod != st.QuietPeriod {
			t.Fatalf("%+v: round trip %+v %v", st, got, err)
		}
	}
}

// FuzzParseState: the parser never panics, accepts only what it would
// write, and what it accepts survives a round trip.
func FuzzParseState(f *testing.F) {
	f.Add([]byte("mlockd-state 1\nstatus running\nquiet-until 0\n"))
	f.Add([]byte("mlockd-state 1\nstatus clean\nquiet-until 1700000000000000000\n"))
	f.Add([]byte("mlockd-state 1\nstatus clean\nquiet-until -1\n"))
	f.Add([]byte("mlockd-state 1\nstatus running\nquiet-until 0\nquiet-period 15155000000\n"))
	f.Add([]byte("mlockd-state 1\nstatus running\nquiet-until 0\nquiet-period 0\n"))
	f.Add([]byte("mlockd-state 1\r\nstatus clean\nquiet-until 99999999999999999999\n"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := parseState(b)
		if err != nil {
			if st != (State{}) {
				t.Fatalf("error with a state: %+v", st)
			}
			return
		}
		if st.Ending != EndingClean && st.Ending != EndingUnclean {
			t.Fatalf("parsed ending %v", st.Ending)
		}
		if out := formatState(st); !bytes.Equal(out, b) {
			t.Fatalf("accepted %q, which formats as %q", b, out)
		}
	})
}
