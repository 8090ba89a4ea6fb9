package datadir

import (
	"bytes"
	"errors"
	"strconv"
	"time"
)

// The state file, three lines:
//
//	mlockd-state 1
//	status running|clean
//	quiet-until <Unix ns, 0: none>
const stateMagic = "mlockd-state 1"

// ErrBadState is the error of a state file that is not in the format.
var ErrBadState = errors.New("datadir: malformed state file")

func formatState(st State) []byte {
	status := "running"
	if st.Ending == EndingClean {
		status = "clean"
	}
	q := int64(0)
	if !st.QuietUntil.IsZero() {
		q = max(st.QuietUntil.UnixNano(), 0)
	}
	b := make([]byte, 0, 64)
	b = append(b, stateMagic+"\nstatus "+status+"\nquiet-until "...)
	b = strconv.AppendInt(b, q, 10)
	return append(b, '\n')
}

// parseState parses a state file: EndingClean or EndingUnclean and the
// quiet-until time, or ErrBadState.
func parseState(b []byte) (State, error) {
	lines := bytes.Split(b, []byte{'\n'})
	if len(lines) != 4 || len(lines[3]) != 0 || string(lines[0]) != stateMagic {
		return State{}, ErrBadState
	}
	var st State
	switch string(lines[1]) {
	case "status running":
		st.Ending = EndingUnclean
	case "status clean":
		st.Ending = EndingClean
	default:
		return State{}, ErrBadState
	}
	v, ok := bytes.CutPrefix(lines[2], []byte("quiet-until "))
	if !ok || len(v) == 0 || v[0] == '+' || v[0] == '-' || (v[0] == '0' && len(v) > 1) {
		return State{}, ErrBadState
	}
	q, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil {
		return State{}, ErrBadState
	}
	if q > 0 {
		st.QuietUntil = time.Unix(0, q)
	}
	return st, nil
}
