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
		{Ending: EndingUnconfirmed, QuietUntil: time.Unix(0, 1_700_000_000_123_456_789)},
		{Ending: EndingUnclean, QuietUntil: time.Unix(0, 1)},
		{Ending: EndingUnclean, QuietPeriod: 15155 * time.Millisecond},
		{Ending: EndingUnconfirmed, QuietUntil: time.Unix(0, 1_700_000_000_123_456_789), QuietPeriod: 1},
	} {
		got, err := parseState(formatState(st))
		if err != nil || got.Ending != st.Ending || !got.QuietUntil.Equal(st.QuietUntil) || got.QuietPeriod != st.QuietPeriod {
			t.Fatalf("%+v: round trip %+v %v", st, got, err)
		}
	}
}

// One word for one fact: a clean ending with a quiet-until is written as
// unconfirmed, never as clean; a file of an earlier version that says clean
// with a quiet-until is read as unconfirmed; unconfirmed without a
// quiet-until is malformed.
func TestStateWords(t *testing.T) {
	qu := time.Unix(0, 1_700_000_000_123_456_789)
	if got := string(formatState(State{Ending: EndingClean, QuietUntil: qu})); got !=
		"mlockd-state 1\nstatus unconfirmed\nquiet-until 1700000000123456789\n" {
		t.Fatalf("clean with a quiet-until written as %q", got)
	}
	if got := string(formatState(State{Ending: EndingUnconfirmed})); got != "mlockd-state 1\nstatus clean\nquiet-until 0\n" {
		t.Fatalf("unconfirmed without a quiet-until written as %q", got)
	}
	st, err := parseState([]byte("mlockd-state 1\nstatus clean\nquiet-until 1700000000123456789\nquiet-period 15155000000\n"))
	if err != nil || st.Ending != EndingUnconfirmed || !st.QuietUntil.Equal(qu) || st.QuietPeriod != 15155*time.Millisecond {
		t.Fatalf("an earlier version's clean with a quiet-until: %+v %v", st, err)
	}
	if _, err := parseState([]byte("mlockd-state 1\nstatus unconfirmed\nquiet-until 0\n")); err != ErrBadState {
		t.Fatalf("unconfirmed without a quiet-until: %v", err)
	}
}

// FuzzParseState: the parser never panics, accepts only what it would
// write (and the earlier versions' "clean" with a quiet-until, which it
// writes as "unconfirmed"), and what it accepts survives a round trip.
func FuzzParseState(f *testing.F) {
	f.Add([]byte("mlockd-state 1\nstatus running\nquiet-until 0\n"))
	f.Add([]byte("mlockd-state 1\nstatus clean\nquiet-until 1700000000000000000\n"))
	f.Add([]byte("mlockd-state 1\nstatus clean\nquiet-until -1\n"))
	f.Add([]byte("mlockd-state 1\nstatus unconfirmed\nquiet-until 1700000000000000000\nquiet-period 15155000000\n"))
	f.Add([]byte("mlockd-state 1\nstatus unconfirmed\nquiet-until 0\n"))
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
		switch st.Ending {
		case EndingClean:
			if !st.QuietUntil.IsZero() {
				t.Fatalf("clean with a quiet-until: %+v", st)
			}
		case EndingUnconfirmed:
			if st.QuietUntil.IsZero() {
				t.Fatalf("unconfirmed without a quiet-until: %+v", st)
			}
		case EndingUnclean:
		default:
			t.Fatalf("parsed ending %v", st.Ending)
		}
		want := b
		if st.Ending == EndingUnconfirmed {
			// An earlier version's word for it.
			want = bytes.Replace(b, []byte("\nstatus clean\n"), []byte("\nstatus unconfirmed\n"), 1)
		}
		if out := formatState(st); !bytes.Equal(out, want) {
			t.Fatalf("accepted %q, which formats as %q", b, out)
		}
	})
}
