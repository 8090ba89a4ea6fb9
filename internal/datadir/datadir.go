package datadir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mlock-dev/mlock/internal/lease"
)

// DefaultDir is the data directory mlockd uses when none is given, relative
// to its working directory.
const DefaultDir = "mlockd.data"

// File names inside the directory.
const (
	lockFile  = "lock"
	stateFile = "state"
	tokenFile = "token-mark"
)

// MaxRecordedQuiet bounds what a state file records: a quiet-until more
// than this far ahead of the start is not believed (the file or the clock
// is wrong) and the start is quiet for its own period instead; a recorded
// quiet period longer than this counts as this long.
const MaxRecordedQuiet = 24 * time.Hour

// ErrInUse is returned by Open when another process holds the directory.
var ErrInUse = errors.New("datadir: data directory is in use by another process")

// ErrClosed is returned by the methods of a closed Dir that write.
var ErrClosed = errors.New("datadir: closed")

// QuietPeriod returns the quiet period that covers a session grace period
// grace: grace plus a margin for the clocks' rates (1 %) and scheduling
// (5 ms), the margin clients subtract from what they believe.
func QuietPeriod(grace time.Duration) time.Duration {
	return grace + lease.Margin(grace) // the clients' own drift margin
}

// Ending says how the previous run of the server on a directory ended.
type Ending uint8

const (
	// EndingNone: no run is recorded; the directory is new (or empty).
	EndingNone Ending = iota
	// EndingClean: the previous run shut down and recorded that no client
	// can believe it holds a lock (QuietUntil is zero).
	EndingClean
	// EndingUnclean: the previous run recorded that it was running and
	// nothing since: it crashed or was killed.
	EndingUnclean
	// EndingUnknown: there is no state file but other data (an older
	// mlockd), or the state file cannot be read or parsed.
	EndingUnknown
	// EndingUnconfirmed: the previous run shut down, but a client may
	// believe it holds a lock until QuietUntil (never zero): a holder did
	// not confirm the shutdown, a session in its grace period held locks,
	// or the run stopped within its own start's quiet period.
	EndingUnconfirmed
)

var endingNames = [...]string{"none", "clean", "unclean", "unknown", "unconfirmed"}

func (e Ending) String() string {
	if int(e) < len(endingNames) {
		return endingNames[e]
	}
	return "Ending(" + strconv.Itoa(int(e)) + ")"
}

// State is what a directory says about the previous run.
type State struct {
	Ending Ending
	// QuietUntil is the recorded time until which a holder of an earlier
	// run may believe it holds a lock; zero if none was recorded.
	QuietUntil time.Time
	// QuietPeriod is the quiet period in force in the run that wrote the
	// state (what Start was given): a client of that run may believe it
	// holds a lock for up to this long after its last answer. Zero if none
	// was recorded (quiet periods off, or a file of an earlier version).
	QuietPeriod time.Duration
	// Err says why the Ending is EndingUnknown, if a file was unreadable.
	Err error
}

// Dir is an open data directory. Create one with Open. A nil *Dir stands
// for "no data directory": its history is unknown (Start always returns a
// quiet period), tokens start at the floor given and nothing is written.
type Dir struct {
	path string
	lock *os.File // holds the flock until Close
	prev State
	mark atomic.Uint64 // the token mark on disk; written under mu
	// block: the tokens one write of the mark reserves (TokenBlock unless
	// SetTokenBlock); set before the Dir is shared.
	block uint64

	mu         sync.Mutex
	closed     bool          // guarded by mu
	started    bool          // guarded by mu
	startQuiet time.Time     // guarded by mu: what Start returned
	period     time.Duration // guarded by mu: the period Start was given
}

// Lock takes the exclusive lock of the existing directory path (its file
// "lock", created 0600, holding this process's pid): a directory is used by
// one process at a time. It returns an error wrapping ErrInUse, naming the
// holder's pid, if another process holds it, without waiting. Closing the
// returned file releases the lock (the process's exit releases it too).
// Open takes it for a data directory; a cluster node takes it for its Raft
// directory.
func Lock(path string) (*os.File, error) {
	// The descriptor kept open (it holds the flock) is read-only: a file
	// system remounted read-only under a running server (by an operator,
	// or the kernel after an error) is then possible, and the server's
	// writes get its errors (see the token mark).
	lf, err := os.OpenFile(filepath.Join(path, lockFile), os.O_RDONLY|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("datadir: %w", err)
	}
	if err := lockFileExclusive(lf); err != nil {
		lf.Close()
		if errors.Is(err, errWouldBlock) {
			who := ""
			if b, rerr := os.ReadFile(lf.Name()); rerr == nil && len(b) > 0 {
				who = " (pid " + strings.TrimSpace(string(b)) + ")"
			}
			return nil, fmt.Errorf("%w: %s%s", ErrInUse, path, who)
		}
		return nil, fmt.Errorf("datadir: locking %s: %w", lf.Name(), err)
	}
	// The pid is for the message of a second process; failing to write it
	// changes nothing else.
	if wf, err := os.OpenFile(lf.Name(), os.O_WRONLY|os.O_TRUNC, 0); err == nil {
		_, _ = wf.WriteString(strconv.Itoa(os.Getpid()) + "\n")
		_ = wf.Close()
	}
	return lf, nil
}

// Open opens (creating it with mode 0700, and its parents, if missing) the
// data directory at path and takes its lock. It returns an error wrapping
// ErrInUse if another process holds the directory, and an error if the
// directory cannot be created or locked or if the token mark exists but
// cannot be read (tokens could go backwards). An unreadable state file is
// not an error: Previous reports EndingUnknown and Start is quiet. The Dir
// must be closed to release the lock (the process's exit releases it too).
func Open(path string) (*Dir, error) {
	if path == "" {
		return nil, errors.New("datadir: empty path")
	}
	if err := os.MkdirAll(path, 0o700); err != nil {
		return nil, fmt.Errorf("datadir: %w", err)
	}
	lf, err := Lock(path)
	if err != nil {
		return nil, err
	}
	d := &Dir{path: path, lock: lf, block: TokenBlock}
	mark, markErr := d.readMark()
	if markErr != nil {
		d.Close()
		return nil, markErr
	}
	d.mark.Store(mark)
	d.prev = d.readState(mark != 0)
	return d, nil
}

// Path returns the directory's path.
func (d *Dir) Path() string {
	if d == nil {
		return ""
	}
	return d.path
}

// Previous returns what the directory said, at Open, about the previous run.
func (d *Dir) Previous() State {
	if d == nil {
		return State{Ending: EndingUnknown}
	}
	return d.prev
}

// readState reads the state file; tokens tells whether the directory holds
// a token mark, i.e. an earlier run used it.
func (d *Dir) readState(tokens bool) State {
	b, err := os.ReadFile(filepath.Join(d.path, stateFile))
	switch {
	case errors.Is(err, os.ErrNotExist) && !tokens:
		return State{Ending: EndingNone}
	case errors.Is(err, os.ErrNotExist):
		return State{Ending: EndingUnknown, Err: errors.New("datadir: token mark without state: written by an earlier version")}
	case err != nil:
		return State{Ending: EndingUnknown, Err: fmt.Errorf("datadir: %w", err)}
	}
	st, err := parseState(b)
	if err != nil {
		return State{Ending: EndingUnknown, Err: err}
	}
	return st
}

// Start decides whether this start of the server is quiet, records that the
// server is running and returns the time until which it must grant nothing
// (zero: grant at once). now is the wall-clock time of the start and period
// the quiet period after a crash (QuietPeriod of the session grace; 0 turns
// quiet periods after crashes off, which is unsafe). The decision:
//
//   - new directory (EndingNone), clean shutdown (EndingClean): zero;
//   - shutdown not confirmed (EndingUnconfirmed): the recorded quiet-until
//     if it is still ahead of now, else zero;
//   - otherwise (crash, unreadable state, older data): the later of the
//     recorded quiet-until and now + the longer of period and the quiet
//     period the crashed run recorded, since its clients may believe for
//     as long as that run's settings allowed, whatever this run's are.
//
// A recorded time more than MaxRecordedQuiet ahead of now is not believed:
// the start is then quiet for period; a recorded period counts as at most
// MaxRecordedQuiet. The time returned and period are recorded with
// "running", so a crash during the quiet period keeps it for the next
// start, and a crash of this run makes the next start quiet for at least
// period. Start may be called once; it returns an error if the state cannot
// be written (the server must then not serve: a crash would go unnoticed).
// On a nil Dir it returns now + period (the history is unknown).
func (d *Dir) Start(now time.Time, period time.Duration) (time.Time, error) {
	if d == nil {
		return quietUntil(State{Ending: EndingUnknown}, now, period), nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return time.Time{}, ErrClosed
	}
	if d.started {
		return time.Time{}, errors.New("datadir: Start called twice")
	}
	period = max(period, 0)
	until := quietUntil(d.prev, now, period)
	if err := d.writeStateLocked(State{Ending: EndingUnclean, QuietUntil: until, QuietPeriod: period}); err != nil {
		return time.Time{}, err
	}
	d.started, d.startQuiet, d.period = true, until, period
	return until, nil
}

// quietUntil is Start's decision.
func quietUntil(prev State, now time.Time, period time.Duration) time.Time {
	n := now.UnixNano()
	rec := int64(0)
	if !prev.QuietUntil.IsZero() {
		rec = prev.QuietUntil.UnixNano()
	}
	believable := rec <= n+int64(MaxRecordedQuiet)
	var until int64
	switch prev.Ending {
	case EndingNone:
		return time.Time{}
	case EndingClean, EndingUnconfirmed:
		if !believable {
			until = n + int64(max(period, 0))
		} else {
			until = rec
		}
	default:
		until = n + int64(max(period, min(prev.QuietPeriod, MaxRecordedQuiet), 0))
		if believable {
			until = max(until, rec)
		}
	}
	if until <= n {
		return time.Time{}
	}
	return time.Unix(0, until)
}

// CleanShutdown records that the server stopped cleanly at now. quietUntil
// is the wall-clock time until which a client may still believe it holds a
// lock (a holder that did not confirm the shutdown: now + the quiet period),
// or zero if no client can; the quiet period of this run's own Start is
// carried over if it ends later. The state then says "clean" if that time is
// not after now, else "unconfirmed" with the time (see State). The period
// Start was given is recorded as well (for information: the next start
// decides by the recorded time alone). After it the server must grant
// nothing. It returns the state recorded (Ending EndingClean or
// EndingUnconfirmed), or ErrClosed after Close, or the write's error. On a
// nil Dir it does nothing and returns a State of EndingUnknown.
func (d *Dir) CleanShutdown(now, quietUntil time.Time) (State, error) {
	if d == nil {
		return State{Ending: EndingUnknown}, nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return State{}, ErrClosed
	}
	if d.startQuiet.After(quietUntil) {
		quietUntil = d.startQuiet
	}
	st := State{Ending: EndingClean, QuietPeriod: d.period}
	if quietUntil.After(now) {
		st.Ending, st.QuietUntil = EndingUnconfirmed, quietUntil
	}
	if err := d.writeStateLocked(st); err != nil {
		return State{}, err
	}
	return st, nil
}

func (d *Dir) writeStateLocked(st State) error {
	if err := writeAtomic(d.path, stateFile, formatState(st)); err != nil {
		return fmt.Errorf("datadir: writing state: %w", err)
	}
	return nil
}

// Close releases the directory's lock. It does not record a clean shutdown
// (CleanShutdown does). It is idempotent.
func (d *Dir) Close() error {
	if d == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	return d.lock.Close() // closing the descriptor releases the flock
}

// writeAtomic replaces dir/name with data: a temporary file, written and
// synced, renamed over the old one, then the directory synced.
func writeAtomic(dir, name string, data []byte) error {
	path := filepath.Join(dir, name)
	tmp := path + ".tmp"
	if err := fault(OpCreate, name); err != nil {
		return err
	}
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if err = fault(OpWrite, name); err == nil {
		_, err = f.Write(data)
	}
	if err == nil {
		if err = fault(OpSync, name); err == nil {
			err = f.Sync()
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		if err = fault(OpRename, name); err == nil {
			err = os.Rename(tmp, path)
		}
	}
	if err == nil {
		if err = fault(OpSyncDir, name); err == nil {
			err = syncDir(dir)
		}
	}
	if err != nil {
		_ = os.Remove(tmp)
	}
	return err
}
