package server

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/mlock-dev/mlock/internal/locktable"
)

// Version is the server version reported by status.
const Version = "0.1.0"

// Status is the status document: the original server's fields first, then
// this server's additions. Lock ids and socketIds are secrets, so locks are
// keyed by the first 8 hex digits of their id and sockets by a keyed hash of
// their socketId.
type Status struct {
	SocketCount       int                   `json:"socketCount"`  // live identified connections
	CurrentLocks      int                   `json:"currentLocks"` // live requests, held and waiting
	LiveTime          int64                 `json:"liveTime"`     // ms since start
	StartAt           int64                 `json:"startAt"`      // start, Unix ms
	LockCount         uint64                `json:"lockCount"`    // accepted lock requests
	IntoleranceCount  uint64                `json:"intoleranceCount"`
	TimeoutCount      uint64                `json:"timeoutCount"`
	LockedCount       uint64                `json:"lockedCount"` // grants
	ExpiredCount      uint64                `json:"expiredCount"`
	FinishedCount     uint64                `json:"finishedCount"` // unlocks and releases
	ExtendCount       uint64                `json:"extendCount"`
	ExtendFailedCount uint64                `json:"extendFailedCount"`
	Sockets           map[string]SocketInfo `json:"sockets"`
	Queues            map[string]int        `json:"queues"`
	Locks             map[string]LockInfo   `json:"locks"`

	Version             string  `json:"version"`
	HeldLocks           int     `json:"heldLocks"`
	Sessions            int     `json:"sessions"` // connected and in their grace period
	Connections         int     `json:"connections"`
	RejectedConnections uint64  `json:"rejectedConnections"`
	DroppedCount        uint64  `json:"droppedCount"` // requests dropped with their session
	LastToken           uint64  `json:"lastToken"`
	CPUTimeMs           float64 `json:"cpuTimeMs"` // process user+system CPU time
	Truncated           bool    `json:"truncated"` // listings cut at the status limit
}

// SocketInfo describes one connected session in Status.
type SocketInfo struct {
	Address  string `json:"address"`
	LiveTime int64  `json:"liveTime"` // ms since the connection was accepted
	LastLive int64  `json:"lastLive"` // ms since its last frame
}

// LockInfo describes one request in Status.
type LockInfo struct {
	Locked    bool   `json:"locked"`
	TTL       int64  `json:"ttl"`               // ms
	Expire    *int64 `json:"expire,omitempty"`  // ms left, when locked
	Timeout   *int64 `json:"timeout,omitempty"` // ms left of the wait, when waiting with a timeout
	Resources string `json:"resources"`
}

func (s *Server) shortHash(id string) string {
	m := hmac.New(sha256.New, s.hashKey[:])
	m.Write([]byte(id))
	return hex.EncodeToString(m.Sum(nil)[:4])
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// status builds the Status document. It runs under mu.
func (s *Server) status(now int64) *Status {
	st := s.tab.Stats()
	nowT := time.Now()
	doc := &Status{
		CurrentLocks:        st.Live,
		LiveTime:            (now - s.startNs) / int64(time.Millisecond),
		StartAt:             s.start.UnixMilli(),
		LockCount:           st.Requests,
		IntoleranceCount:    s.counters.intolerance,
		TimeoutCount:        st.TimedOut,
		LockedCount:         st.Granted,
		ExpiredCount:        st.Expired,
		FinishedCount:       st.Unlocked,
		ExtendCount:         st.Extended,
		ExtendFailedCount:   st.ExtendFails,
		Sockets:             map[string]SocketInfo{},
		Queues:              map[string]int{},
		Locks:               map[string]LockInfo{},
		Version:             Version,
		HeldLocks:           st.Held,
		Sessions:            st.Sessions,
		Connections:         len(s.conns),
		RejectedConnections: s.counters.rejected,
		DroppedCount:        st.Dropped,
		LastToken:           st.LastToken,
		CPUTimeMs:           float64(cpuTime()) / float64(time.Millisecond),
	}
	limit := s.cfg.StatusLimit
	for _, sess := range s.sessions {
		if sess.c == nil {
			continue
		}
		doc.SocketCount++
		if len(doc.Sockets) >= limit {
			doc.Truncated = true
			continue
		}
		doc.Sockets[sess.hash] = SocketInfo{
			Address:  sess.c.remote,
			LiveTime: nowT.Sub(sess.c.accepted).Milliseconds(),
			LastLive: (nowT.UnixNano() - sess.c.lastLive.Load()) / int64(time.Millisecond),
		}
	}
	s.tab.Queues("", limit, func(q locktable.QueueInfo) bool {
		doc.Queues[q.Resource] = len(q.Entries)
		return true
	})
	s.tab.Locks(limit, func(li locktable.LockInfo) bool {
		d := LockInfo{Locked: li.Granted, TTL: li.TTL.Milliseconds(), Resources: strings.Join(li.Resources, "|")}
		if left := (li.Deadline - now) / int64(time.Millisecond); li.Granted {
			d.Expire = &left
		} else if li.Deadline != 0 {
			d.Timeout = &left
		}
		doc.Locks[li.ID.Short()] = d
		return true
	})
	if st.Queues > limit || st.Live > limit {
		doc.Truncated = true
	}
	return doc
}

func (s *Server) statusJSON(now int64) []byte {
	b, err := json.Marshal(s.status(now))
	if err != nil {
		return []byte("{}")
	}
	return b
}

// LocksEntry is one request in a resource's queue in the locks listing.
type LocksEntry struct {
	Lock          string `json:"lock"`    // first 8 hex digits of the lock id
	Session       string `json:"session"` // keyed hash of the socketId
	Owner         string `json:"owner,omitempty"`
	State         string `json:"state"`    // "held" or "waiting"
	Position      int    `json:"position"` // 0 is the head of the queue
	Token         uint64 `json:"token,omitempty"`
	AgeMs         int64  `json:"ageMs"`                   // since the request arrived
	TTLLeftMs     *int64 `json:"ttlLeftMs,omitempty"`     // held
	TimeoutLeftMs *int64 `json:"timeoutLeftMs,omitempty"` // waiting with a timeout
}

// LocksQueue is one resource in the locks listing.
type LocksQueue struct {
	Resource string       `json:"resource"`
	Entries  []LocksEntry `json:"entries"`
}

// Locks is the answer to the locks command.
type Locks struct {
	Queues    []LocksQueue `json:"queues"` // sorted by resource
	Truncated bool         `json:"truncated"`
}

func (s *Server) locksJSON(now int64, prefix string) []byte {
	doc := Locks{Queues: []LocksQueue{}}
	limit := s.cfg.StatusLimit
	s.tab.Queues(prefix, limit+1, func(q locktable.QueueInfo) bool {
		if len(doc.Queues) == limit {
			doc.Truncated = true
			return false
		}
		lq := LocksQueue{Resource: q.Resource, Entries: make([]LocksEntry, 0, len(q.Entries))}
		for i, e := range q.Entries {
			le := LocksEntry{Lock: e.ID.Short(), Owner: e.Owner, Position: i,
				AgeMs: (now - e.Created) / int64(time.Millisecond), State: "waiting"}
			if sess := s.sessions[e.Session]; sess != nil {
				le.Session = sess.hash
			}
			left := (e.Deadline - now) / int64(time.Millisecond)
			if e.Granted {
				le.State, le.Token, le.TTLLeftMs = "held", e.Token, &left
			} else if e.Deadline != 0 {
				le.TimeoutLeftMs = &left
			}
			lq.Entries = append(lq.Entries, le)
		}
		doc.Queues = append(doc.Queues, lq)
		return true
	})
	slices.SortFunc(doc.Queues, func(a, b LocksQueue) int { return strings.Compare(a.Resource, b.Resource) })
	b, err := json.Marshal(doc)
	if err != nil {
		return []byte("{}")
	}
	return b
}

// statusText renders the status as the original's plain text: "key: value"
// lines, nested objects indented by two spaces.
func (s *Server) statusText() []byte {
	var out bytes.Buffer
	dec := json.NewDecoder(bytes.NewReader(s.statusJSON(s.now())))
	dec.UseNumber()
	var obj func(indent string)
	obj = func(indent string) {
		for dec.More() {
			k, _ := dec.Token()
			v, _ := dec.Token()
			if d, ok := v.(json.Delim); ok && d == '{' {
				fmt.Fprintf(&out, "%s%v:\n", indent, k)
				obj(indent + "  ")
				dec.Token() // '}'
				continue
			}
			if v == nil {
				v = "null"
			}
			fmt.Fprintf(&out, "%s%v: %v\n", indent, k, v)
		}
	}
	if t, err := dec.Token(); err == nil && t == json.Delim('{') {
		obj("")
	}
	return bytes.TrimSpace(out.Bytes())
}
