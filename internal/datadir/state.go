package datadir

import (
	"bytes"
	"errors"
	"strconv"
	"time"
)

// The state file, three or four lines:
//
//	mlockd-state 1
//	status running|clean|unconfirmed
//	quiet-until <Unix ns, 0: none>
//	quiet-period <ns>
//
// One word for each way a run can have ended:
//
//   - running: a server runs on the directory, or ran and was killed or
//     crashed; quiet-until is the end of its start's quiet period (0: none);
//   - clean: it shut down and no client can believe it holds a lock;
//     quiet-until is always 0;
//   - unconfirmed: it shut down, but a client may believe it holds a lock
//     until quiet-until (never 0): a holder did not confirm the shutdown,
//     a session in its grace period held locks, or the run stopped within
//     the quiet period of its own start.
//
// Earlier versions wrote "clean" with a quiet-until for what is now
// "unconfirmed"; such a file is read as unconfirmed. An earlier version
// reading "unconfirmed" finds the file malformed, and starts quiet for its
// own period. The quiet-period line is written only for a positive period;
// a file without it (as earlier versions wrote) records none.
const stateMagic = "mlockd-state 1"

// ErrBadState is the error of a state file that is not in the format.
var ErrBadState = errors.New("datadir: malformed state file")

// formatState writes st; a clean ending is written as unconfirmed if it
// carries a quiet-until, so that the file never says clean with one.
func formatState(st State) []byte {
	q := int64(0)
	if !st.QuietUntil.IsZero() {
		q = max(st.QuietUntil.UnixNano(), 0)
	}
	status := "running"
	switch {
	case st.Ending == EndingUnclean:
	case q > 0:
		status = "unconfirmed"
	default:
		status = "clean"
	}
	b := make([]byte, 0, 96)
	b = append(b, stateMagic+"\nstatus "+status+"\nquiet-until "...)
	b = strconv.AppendInt(b, q, 10)
	b = append(b, '\n')
	if st.QuietPeriod > 0 {
		b = append(b, "quiet-period "...)
		b = strconv.AppendInt(b, int64(st.QuietPeriod), 10)
		b = append(b, '\n')
	}
	return b
}

// parseNumber parses a non-negative decimal number as formatState writes
// it: no sign, no leading zero.
func parseNumber(v []byte) (int64, bool) {
	if len(v) == 0 || v[0] == '+' || v[0] == '-' || (v[0] == '0' && len(v) > 1) {
		return 0, false
	}
	n, err := strconv.ParseInt(string(v), 10, 64)
	return n, err == nil
}

// parseState parses a state file: EndingClean, EndingUnconfirmed or
// EndingUnclean, the quiet-until time and the quiet period (0 if the file
// has none), or ErrBadState (also for "unconfirmed" without a quiet-until).
func parseState(b []byte) (State, error) {
	lines := bytes.Split(b, []byte{'\n'})
	n := len(lines)
	if (n != 4 && n != 5) || len(lines[n-1]) != 0 || string(lines[0]) != stateMagic {
		return State{}, ErrBadState
	}
	var st State
	switch string(lines[1]) {
	case "status running":
		st.Ending = EndingUnclean
	case "status clean":
		st.Ending = EndingClean
	case "status unconfirmed":
		st.Ending = EndingUnconfirmed
	default:
		return State{}, ErrBadState
	}
	v, ok := bytes.CutPrefix(lines[2], []byte("quiet-until "))
	q, num := parseNumber(v)
	if !ok || !num {
		return State{}, ErrBadState
	}
	switch {
	case q > 0 && st.Ending == EndingClean:
		st.Ending = EndingUnconfirmed // as earlier versions wrote it
	case q == 0 && st.Ending == EndingUnconfirmed:
		return State{}, ErrBadState
	}
	if q > 0 {
		st.QuietUntil = time.Unix(0, q)
	}
	if n == 5 {
		v, ok := bytes.CutPrefix(lines[3], []byte("quiet-period "))
		p, num := parseNumber(v)
		if !ok || !num || p == 0 {
			return State{}, ErrBadState
		}
		st.QuietPeriod = time.Duration(p)
	}
	return st, nil
}
