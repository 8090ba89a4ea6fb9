package faulttest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/mlock-dev/mlock"
)

// never is the response time of an operation of unknown outcome.
const never = math.MaxInt64

// Kinds of operations.
const (
	opLock   = "lock"
	opExtend = "extend"
	opUnlock = "unlock"
)

// Outcomes of operations.
const (
	resOK      = "ok"      // done
	resFail    = "fail"    // refused, nothing done (a lock's timeout, a bad request)
	resLost    = "lost"    // the server no longer had the lock
	resUnknown = "unknown" // connection error or abandoned wait: maybe done, maybe not
	resSkip    = "skip"    // not sent to the model: the client had already lost the lock
)

// op is one recorded call. Times are nanoseconds since the history's
// origin on the monotonic clock; Return is never for an unknown outcome.
type op struct {
	Worker   int
	Kind     string
	Res      string // resource
	Handle   int    // the lock handle: > 0, one per lock call
	Call     int64
	Return   int64
	Outcome  string
	Token    uint64 // lock ok
	Err      string
	Node     string // the client's node at the call
	Observed int64  // the time of the answer (= Return, except unknown: the time the error came)
	AtStop   bool   // failed because the worker was stopped at the end of the run
}

// grant is one lock the client held: its belief interval [Start, End).
type grant struct {
	Worker   int
	Res      string
	Handle   int
	Token    uint64
	Call     int64 // the lock call's invocation
	Start    int64 // the lock call's response
	End      int64 // min(latest Deadline, unlock invocation): see beliefEnd
	LeaseEnd int64 // the latest Deadline seen (0: none seen)
	Arrival  int64 // the Deadline when the lock call returned (0: lost already)
	Why      string
	// Idle: an idle holder's (a lease far longer than the session grace,
	// never extended): its belief ends with its session's, the last
	// answered request's send time (pings, while idle) plus the grace.
	Idle bool
}

// event is a fault or a milestone of the harness.
type event struct {
	T     int64
	Round int
	Kind  string // the fault kind
	What  string // kill, restart, stop, cont, healthy, ...
	Node  string
}

// history collects what the workers and the harness record. Safe for
// concurrent use.
type clusterHistory struct {
	origin time.Time
	mu     sync.Mutex
	ops    []op    // guarded by mu
	grants []grant // guarded by mu
	events []event // guarded by mu
	handle int     // last handle; guarded by mu
}

func newClusterHistory() *clusterHistory { return &clusterHistory{origin: time.Now()} }

// now is the time since the origin on the monotonic clock.
func (h *clusterHistory) now() int64 { return int64(time.Since(h.origin)) }

// at converts a monotonic time.Time of this process to history time.
func (h *clusterHistory) at(t time.Time) int64 { return int64(t.Sub(h.origin)) }

func (h *clusterHistory) newHandle() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.handle++
	return h.handle
}

func (h *clusterHistory) add(o op) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, o)
}

func (h *clusterHistory) addGrant(g grant) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.grants = append(h.grants, g)
}

func (h *clusterHistory) addEvent(e event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.events = append(h.events, e)
}

// snapshot returns copies of the recorded ops, grants and events.
func (h *clusterHistory) snapshot() ([]op, []grant, []event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]op(nil), h.ops...), append([]grant(nil), h.grants...), append([]event(nil), h.events...)
}

// classify maps a call's error to its outcome.
func classify(err error) string {
	switch {
	case err == nil:
		return resOK
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled),
		errors.Is(err, mlock.ErrCanceled), errors.Is(err, mlock.ErrConnection):
		return resUnknown
	case errors.Is(err, mlock.ErrLost):
		return resLost
	default:
		// A timeout of the server, a tolerate or request error: the
		// server answered; nothing was done.
		return resFail
	}
}

// errKind names an error for the statistics: its type and cause.
func errKind(err error) string {
	var e *mlock.Error
	if errors.As(err, &e) {
		s := string(e.Type)
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			s += "/ctx-deadline"
		case e.Err != nil && e.Err != context.Canceled:
			msg := e.Err.Error()
			if i := strings.IndexAny(msg, ":"); i > 0 && i < 40 {
				msg = msg[:i]
			}
			if len(msg) > 40 {
				msg = msg[:40]
			}
			s += "/" + msg
		}
		return s
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "ctx-deadline"
	}
	return "other"
}

// fmtT formats a history time in seconds.
func fmtT(t int64) string {
	if t == never {
		return "never"
	}
	return fmt.Sprintf("%.3fs", float64(t)/1e9)
}

func (o op) String() string {
	s := fmt.Sprintf("w%d %-6s %s h%d [%s, %s] %s", o.Worker, o.Kind, o.Res, o.Handle, fmtT(o.Call), fmtT(o.Return), o.Outcome)
	if o.Outcome == resUnknown {
		s += " (error at " + fmtT(o.Observed) + ")"
	}
	if o.Token != 0 {
		s += fmt.Sprintf(" token %d", o.Token)
	}
	if o.Node != "" {
		s += " via " + o.Node
	}
	if o.Err != "" {
		s += ": " + o.Err
	}
	return s
}

func (g grant) String() string {
	return fmt.Sprintf("w%d %s h%d token %d belief [%s, %s) lease to %s (%s)", g.Worker, g.Res, g.Handle, g.Token,
		fmtT(g.Start), fmtT(g.End), fmtT(g.LeaseEnd), g.Why)
}

func (e event) String() string {
	return fmt.Sprintf("%s round %d %s: %s %s", fmtT(e.T), e.Round, e.Kind, e.What, e.Node)
}

// excerpt lists, in time order, the operations on res and the events
// between from and to (padded by pad), at most limit lines.
func excerpt(ops []op, events []event, res string, from, to, pad int64, limit int) string {
	type line struct {
		t int64
		s string
	}
	var ls []line
	for _, o := range ops {
		end := o.Return
		if end == never {
			end = o.Observed
		}
		if o.Res == res && end >= from-pad && o.Call <= to+pad {
			ls = append(ls, line{o.Call, o.String()})
		}
	}
	for _, e := range events {
		if e.T >= from-pad && e.T <= to+pad {
			ls = append(ls, line{e.T, "FAULT " + e.String()})
		}
	}
	sort.SliceStable(ls, func(i, j int) bool { return ls[i].t < ls[j].t })
	var b strings.Builder
	for i, l := range ls {
		if i == limit {
			fmt.Fprintf(&b, "\t... %d more\n", len(ls)-limit)
			break
		}
		fmt.Fprintf(&b, "\t%s\n", l.s)
	}
	return b.String()
}
