package server

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/mlock-dev/mlock/internal/auth"
	"github.com/mlock-dev/mlock/internal/buildinfo"
	"github.com/mlock-dev/mlock/internal/core"
	"github.com/mlock-dev/mlock/internal/protocol"
)

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

// status builds the Status document: counters only, or with detail the
// listings of sessions, queues and locks too (at most StatusLimit of each).
// It runs in a core batch.
func (s *Server) status(tx *core.Tx, detail bool) *protocol.Status {
	now := tx.Now()
	st := tx.Stats()
	doc := &protocol.Status{
		SocketCount:         s.online,
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
		Sockets:             map[string]protocol.StatusSocket{},
		Queues:              map[string]int{},
		Locks:               map[string]protocol.StatusLock{},
		Version:             buildinfo.Version,
		HeldLocks:           st.Held,
		Sessions:            st.Sessions,
		Connections:         len(s.conns),
		RejectedConnections: s.counters.rejected,
		DroppedCount:        st.Dropped,
		LastToken:           st.LastToken,
		CPUTimeMs:           float64(cpuTime()) / float64(time.Millisecond),
		Reads:               s.reads.Load(),
		Writes:              s.writes.Load(),
		FramesIn:            s.framesIn.Load(),
		Limits:              s.limitsStatus(&st),
	}
	if s.quietUntil > tx.Now() {
		doc.QuietUntil = (s.quietUntil + int64(time.Millisecond) - 1) / int64(time.Millisecond) // rounded up
	}
	if lim := tx.TokenLimit(); s.dir != nil && lim != 0 {
		d := s.diskState()
		doc.Disk = &protocol.StatusDisk{Healthy: !d.failing, Error: d.lastErr, Errors: d.errors,
			TokensLeft: lim - min(lim, st.LastToken+1)}
	}
	if !detail {
		return doc
	}
	limit := s.cfg.StatusLimit
	s.detailStatus(tx, doc, limit)
	if st.Queues > limit || st.Live > limit {
		doc.Truncated = true
	}
	if s.credentialed() {
		var cut bool
		doc.Principals, cut = s.principalsStatus(tx, limit)
		doc.Truncated = doc.Truncated || cut
	}
	return doc
}

// limitsStatus is the Limits part of the status document: the current use,
// the refusals since the start and the configured caps.
func (s *Server) limitsStatus(st *core.Stats) *protocol.StatusLimits {
	return &protocol.StatusLimits{
		Entries:          st.Entries,
		NameBytes:        st.NameBytes,
		RejectedPerIP:    s.counters.rejectedPerIP,
		AuthFailed:       s.counters.authFailed,
		SessionsRefused:  s.counters.sessionsRefused,
		IdleClosed:       s.counters.idleClosed,
		Forbidden:        s.counters.forbidden,
		ServerFull:       s.counters.serverFull,
		RateLimited:      s.counters.rateLimited,
		MaxConns:         s.cfg.MaxConns,
		MaxConnsPerIP:    s.cfg.MaxConnsPerIP,
		MaxSessions:      s.set.MaxSessions,
		IdleTimeoutMs:    max(s.cfg.IdleTimeout, 0).Milliseconds(),
		MaxLocks:         s.set.MaxLocks,
		MaxEntries:       s.set.MaxEntries,
		MaxNameBytes:     s.set.MaxNameBytes,
		MaxSessionBytes:  s.set.MaxSessionBytes,
		MaxLocksPerSess:  s.set.MaxLocksPerSession,
		StatusRatePerSec: s.cfg.StatusRate,

		Unauthenticated:         s.unauthed,
		Evicted:                 s.counters.evicted,
		QuotaRefused:            s.counters.quotaRefused,
		MaxUnauthenticated:      s.cfg.MaxUnauthenticated,
		MaxUnauthenticatedPerIP: s.preCapPerIP(),
	}
}

// detailStatus adds the listings of sessions, queues and locks, at most
// limit of each, to doc.
func (s *Server) detailStatus(tx *core.Tx, doc *protocol.Status, limit int) {
	now, nowT := tx.Now(), time.Now()
	for _, sess := range s.sessions {
		if sess.c == nil {
			continue
		}
		if len(doc.Sockets) >= limit {
			doc.Truncated = true
			break
		}
		doc.Sockets[sess.hash] = protocol.StatusSocket{
			Address:  sess.c.remote,
			LiveTime: nowT.Sub(sess.c.accepted).Milliseconds(),
			LastLive: (nowT.UnixNano() - sess.c.lastLive.Load()) / int64(time.Millisecond),
		}
	}
	tx.QueuesPage("", "", limit, limit, func(q core.QueueInfo) bool {
		doc.Queues[q.Resource] = q.Len
		return true
	})
	tx.Locks(limit, func(li core.LockInfo) bool {
		d := protocol.StatusLock{Locked: li.Granted, TTL: li.TTL.Milliseconds(), Resources: strings.Join(li.Resources, "|")}
		if left := (li.Deadline - now) / int64(time.Millisecond); li.Granted {
			d.Expire = &left
		} else if li.Deadline != 0 {
			d.Timeout = &left
		}
		doc.Locks[li.ID.Short()] = d
		return true
	})
}

func (s *Server) statusJSON(tx *core.Tx, detail bool) []byte {
	doc := s.status(tx, detail)
	if s.cl != nil {
		// A node of a cluster adds its view of the cluster.
		doc.Cluster = s.cl.status.Load()
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return []byte("{}")
	}
	return b
}

// locksJSON builds one page of the locks listing for principal p: at most
// limit queues and StatusLimit entries in all. Entries of other principals
// are shown without owner, token, lock or session unless p administers.
func (s *Server) locksJSON(tx *core.Tx, p *auth.Principal, prefix, after string, limit int) []byte {
	now := tx.Now()
	doc := protocol.Locks{Queues: []protocol.LocksQueue{}}
	doc.Next = tx.QueuesPage(prefix, after, limit, s.cfg.StatusLimit, func(q core.QueueInfo) bool {
		lq := s.locksQueue(now, p, q)
		if len(q.Entries) < q.Len {
			doc.Truncated = true
		}
		doc.Queues = append(doc.Queues, lq)
		return true
	})
	doc.Truncated = doc.Truncated || doc.Next != ""
	b, err := json.Marshal(doc)
	if err != nil {
		return []byte("{}")
	}
	return b
}

// locksQueue is one queue in the locks listing for principal p: entries of
// other principals without owner, token, lock or session unless p
// administers.
func (s *Server) locksQueue(now int64, p *auth.Principal, q core.QueueInfo) protocol.LocksQueue {
	lq := protocol.LocksQueue{Resource: q.Resource, Length: q.Len, Entries: make([]protocol.LocksEntry, 0, len(q.Entries))}
	for i, e := range q.Entries {
		le := protocol.LocksEntry{Position: i, AgeMs: (now - e.Created) / int64(time.Millisecond), State: "waiting",
			Mode: e.Mode.String()}
		left := (e.Deadline - now) / int64(time.Millisecond)
		if e.Granted {
			le.State, le.TTLLeftMs = "held", &left
			if e.GrantedAt != 0 {
				held := (now - e.GrantedAt) / int64(time.Millisecond)
				le.HeldMs = &held
			}
		} else if e.Deadline != 0 {
			le.TimeoutLeftMs = &left
		}
		principal, _ := unscope(e.Session)
		if p.Admin || principal == p.Name {
			_, le.Owner = unscope(e.Owner)
			le.Lock = e.ID.Short()
			if e.Granted {
				le.Token = e.Token
			}
			if sess := s.sessions[e.Session]; sess != nil {
				le.Session = sess.hash
			}
			if p.Admin {
				le.Principal = principal
			}
		}
		lq.Entries = append(lq.Entries, le)
	}
	return lq
}

// statusText renders the status as the original's plain text: "key: value"
// lines, nested objects indented by two spaces.
func (s *Server) statusText(tx *core.Tx, detail bool) []byte {
	var out bytes.Buffer
	dec := json.NewDecoder(bytes.NewReader(s.statusJSON(tx, detail)))
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
