package observe

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// MaxVerbs bounds the command kinds counted by Snapshot.Requests.
const MaxVerbs = 32

// Outcomes of a command, the second index of Snapshot.Requests.
const (
	OK     = 0 // answered with success (or, for bye, ended as asked)
	Failed = 1 // answered with a failure, or the connection was ended with an error
)

// Snapshot is the server's state for one scrape, copied in one batch of
// its core so that its numbers agree with each other.
type Snapshot struct {
	Version string
	Start   time.Time

	// Requests counts commands by kind (index: the protocol's verb; 0 for
	// what is not a command) and outcome (OK, Failed). VerbNames names the
	// kinds; an empty name is not exported.
	Requests  [MaxVerbs][2]uint64
	VerbNames [MaxVerbs]string

	Wait  Durations // from request to grant (0 for a grant at once)
	Hold  Durations // from grant to its end (unlock, release, expiry, eviction, session drop)
	Depth Depths    // entries ahead of each accepted request when it was queued

	Grants, Timeouts, Expiries, Unlocks, Evictions uint64
	BusyRefusals, TolerateRefusals                 uint64 // try-locks refused, and refusals by tolerate
	QuotaRefusals                                  uint64 // lock requests and connects refused by a principal's quota
	ServerFull, Forbidden, RateLimited             uint64
	Extends, ExtendFails                           uint64
	Dropped                                        uint64 // requests dropped with their lost session
	SessionsLost                                   uint64 // sessions whose grace period ended while they held or waited for locks
	Held, Waiting, Queues, Entries                 int
	MaxQueue                                       int // the longest queue (entries, holder included)
	Sessions, Online                               int
	Conns                                          int
	ConnsAccepted, ConnsRejected                   uint64
	// Connections refused by cause: past max-conns-per-ip, by a full
	// pre-handshake pool (evicted, or refused at once), past max-conns.
	ConnsPerIPRefused, ConnsEvicted, MaxConnsRefused uint64
	FramesIn, FramesOut, BytesIn, BytesOut           uint64
	LastToken                                        uint64
	Quiet                                            bool // grants are held (a quiet start)

	// Disk is nil without a data directory (and on a cluster node).
	Disk *DiskSnapshot

	// Cluster is nil on a single node.
	Cluster *ClusterSnapshot
}

// DiskSnapshot is the state of a single server's data directory.
type DiskSnapshot struct {
	Healthy    bool   // the last write of the token high-water mark succeeded
	Errors     uint64 // writes of it that failed since the start
	TokensLeft uint64 // tokens still below the mark on disk: what can be given while writes fail
}

// ClusterSnapshot is a cluster node's view for the metrics.
type ClusterSnapshot struct {
	Role                                       string // follower, candidate, leader, shutdown
	Term, LastIndex, CommitIndex, AppliedIndex uint64
	LastContact                                time.Duration // a follower's time since it heard from the leader (or started); 0 on the leader
	LeaderKnown                                bool
	Peers                                      []Peer
}

// Peer is a member of the cluster as this node sees it.
type Peer struct {
	ID      string
	Failing bool // the leader's heartbeats to it fail (known on the leader only)
	Stale   bool // its build cannot read the cluster version: fenced (known on the leader only)
}

// collector exports Snapshots. Every scrape takes one snapshot.
type collector struct {
	snap func(*Snapshot)
	mu   sync.Mutex // one Collect at a time: they share last
	last Snapshot   // reused buffers; the collector is called by one scrape at a time (see Handler)
}

var (
	dRequests = prometheus.NewDesc("mlock_requests_total", "Commands handled, by command and outcome (ok, failed).", []string{"command", "outcome"}, nil)
	dWait     = prometheus.NewDesc("mlock_wait_seconds", "Time from a lock request to its grant (0 for a grant at once).", nil, nil)
	dHold     = prometheus.NewDesc("mlock_hold_seconds", "Time a lock was held: from its grant to its unlock, release, expiry, eviction or the end of its session.", nil, nil)
	dDepth    = prometheus.NewDesc("mlock_queue_depth_at_enqueue", "Entries ahead of a lock request (holder included) in the longest queue it joined, when it was accepted (0: granted at once).", nil, nil)
	dGrants   = prometheus.NewDesc("mlock_grants_total", "Locks granted.", nil, nil)
	dTimeouts = prometheus.NewDesc("mlock_timeouts_total", "Waiting requests that reached their wait timeout.", nil, nil)
	dExpiries = prometheus.NewDesc("mlock_expiries_total", "Granted locks that reached their expiry (evicted locks included).", nil, nil)
	dUnlocks  = prometheus.NewDesc("mlock_unlocks_total", "Successful unlocks and releases.", nil, nil)
	dEvict    = prometheus.NewDesc("mlock_evictions_total", "Locks revoked by evict.", nil, nil)
	dRefused  = prometheus.NewDesc("mlock_refusals_total", "Requests and connections refused, by reason: busy (try-lock), tolerate, server_full (a server-wide limit), forbidden (permission denied), rate_limited (status and locks listings), quota (a principal's quota: lock requests and connects); connections: max_conns_per_ip (too many connections from this address!), pool_full (too many unauthenticated connections!: the pre-handshake pool is full, a connection evicted or a newcomer of the address holding the most of it refused), max_conns (too many connections!).", []string{"reason"}, nil)
	dExtends  = prometheus.NewDesc("mlock_extends_total", "Extend and renew calls, by outcome.", []string{"outcome"}, nil)
	dDropped  = prometheus.NewDesc("mlock_session_lost_requests_total", "Requests (held or waiting) freed because their session's grace period ended.", nil, nil)
	dLost     = prometheus.NewDesc("mlock_sessions_lost_total", "Sessions whose client did not come back within the session grace while they held or waited for locks.", nil, nil)
	dHeld     = prometheus.NewDesc("mlock_locks_held", "Granted locks now.", nil, nil)
	dWaiting  = prometheus.NewDesc("mlock_locks_waiting", "Waiting lock requests now.", nil, nil)
	dQueues   = prometheus.NewDesc("mlock_queues", "Resources held or waited for now.", nil, nil)
	dEntries  = prometheus.NewDesc("mlock_queue_entries", "Queue entries now (a request on k resources is k entries).", nil, nil)
	dMaxQueue = prometheus.NewDesc("mlock_queue_depth_max", "Entries (holder included) of the longest queue now; at most a second old.", nil, nil)
	dSessions = prometheus.NewDesc("mlock_sessions", "Sessions now, by state: online (connected), grace (disconnected, keeping their locks for the session grace).", []string{"state"}, nil)
	dConns    = prometheus.NewDesc("mlock_connections", "Open client connections.", nil, nil)
	dAccepted = prometheus.NewDesc("mlock_connections_accepted_total", "Client connections accepted.", nil, nil)
	dRejected = prometheus.NewDesc("mlock_connections_rejected_total", "Client connections refused by max-conns, max-unauthenticated or max-conns-per-ip.", nil, nil)
	dFrames   = prometheus.NewDesc("mlock_frames_total", "Protocol frames, by direction (in: received; out: queued for clients).", []string{"direction"}, nil)
	dBytes    = prometheus.NewDesc("mlock_bytes_total", "Bytes on client connections, by direction.", []string{"direction"}, nil)
	dToken    = prometheus.NewDesc("mlock_fencing_token_last", "The last fencing token given (the high-water mark).", nil, nil)
	dDiskOK   = prometheus.NewDesc("mlock_disk_healthy", "1 while the last write of the data directory's token high-water mark succeeded; 0 from a failed write (full, failing or read-only disk) until one succeeds. Single server with a data directory only.", nil, nil)
	dDiskErr  = prometheus.NewDesc("mlock_disk_errors_total", "Writes of the data directory's token high-water mark that failed (each retry counts).", nil, nil)
	dTokLeft  = prometheus.NewDesc("mlock_tokens_left", "Fencing tokens still below the token high-water mark on disk: how many grants can still be made while its writes fail (new lock requests are refused at 0).", nil, nil)
	dQuiet    = prometheus.NewDesc("mlock_quiet", "1 while grants are held after a start that may follow a crash, or during shutdown.", nil, nil)
	dInfo     = prometheus.NewDesc("mlock_build_info", "The server's version (value 1).", []string{"version"}, nil)
	dStart    = prometheus.NewDesc("mlock_start_time_seconds", "When the server started (Unix seconds).", nil, nil)

	dRole     = prometheus.NewDesc("mlock_cluster_role", "1 for this node's role in the cluster (follower, candidate, leader, shutdown), 0 for the others.", []string{"role"}, nil)
	dTerm     = prometheus.NewDesc("mlock_cluster_term", "The node's current Raft term.", nil, nil)
	dIndex    = prometheus.NewDesc("mlock_cluster_index", "The node's Raft log indexes: last (stored), commit, applied.", []string{"index"}, nil)
	dLag      = prometheus.NewDesc("mlock_cluster_apply_lag", "Committed log entries this node has not applied yet.", nil, nil)
	dContact  = prometheus.NewDesc("mlock_cluster_leader_contact_seconds", "On a follower, the time since it last heard from the leader, or since it started if it has not yet (0 on the leader).", nil, nil)
	dLeader   = prometheus.NewDesc("mlock_cluster_leader_known", "1 if this node knows a leader.", nil, nil)
	dPeers    = prometheus.NewDesc("mlock_cluster_peers", "Members of the cluster configuration.", nil, nil)
	dFailing  = prometheus.NewDesc("mlock_cluster_peer_failing", "On the leader, 1 for a member whose heartbeats fail (label: the member's id, bounded by the cluster's size).", []string{"peer"}, nil)
	dStale    = prometheus.NewDesc("mlock_cluster_peer_stale", "On the leader, 1 for a member whose build cannot read the cluster version: its forwarded commands are refused and it is kept a nonvoter (label: the member's id).", []string{"peer"}, nil)
	allDescs  = []*prometheus.Desc{dRequests, dWait, dHold, dDepth, dGrants, dTimeouts, dExpiries, dUnlocks, dEvict, dRefused, dExtends, dDropped, dLost, dHeld, dWaiting, dQueues, dEntries, dMaxQueue, dSessions, dConns, dAccepted, dRejected, dFrames, dBytes, dToken, dQuiet, dDiskOK, dDiskErr, dTokLeft, dInfo, dStart, dRole, dTerm, dIndex, dLag, dContact, dLeader, dPeers, dFailing, dStale}
	roleNames = []string{"follower", "candidate", "leader", "shutdown"}
)

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range allDescs {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := &c.last
	s.Cluster = nil
	c.snap(s)
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for v := range s.Requests {
		if s.VerbNames[v] == "" {
			continue
		}
		counter(dRequests, s.Requests[v][OK], s.VerbNames[v], "ok")
		counter(dRequests, s.Requests[v][Failed], s.VerbNames[v], "failed")
	}
	hist := func(d *prometheus.Desc, h *hist, scale float64, exported []float64) {
		ch <- prometheus.MustNewConstHistogram(d, h.n, h.sum*scale, h.cumulative(exported))
	}
	hist(dWait, &s.Wait.h, 1e-9, DurationBuckets)
	hist(dHold, &s.Hold.h, 1e-9, DurationBuckets)
	hist(dDepth, &s.Depth.h, 1, DepthBuckets)
	counter(dGrants, s.Grants)
	counter(dTimeouts, s.Timeouts)
	counter(dExpiries, s.Expiries)
	counter(dUnlocks, s.Unlocks)
	counter(dEvict, s.Evictions)
	counter(dRefused, s.BusyRefusals, "busy")
	counter(dRefused, s.TolerateRefusals, "tolerate")
	counter(dRefused, s.ServerFull, "server_full")
	counter(dRefused, s.Forbidden, "forbidden")
	counter(dRefused, s.RateLimited, "rate_limited")
	counter(dRefused, s.QuotaRefusals, "quota")
	counter(dRefused, s.ConnsPerIPRefused, "max_conns_per_ip")
	counter(dRefused, s.ConnsEvicted, "pool_full")
	counter(dRefused, s.MaxConnsRefused, "max_conns")
	counter(dExtends, s.Extends, "ok")
	counter(dExtends, s.ExtendFails, "failed")
	counter(dDropped, s.Dropped)
	counter(dLost, s.SessionsLost)
	gauge(dHeld, float64(s.Held))
	gauge(dWaiting, float64(s.Waiting))
	gauge(dQueues, float64(s.Queues))
	gauge(dEntries, float64(s.Entries))
	gauge(dMaxQueue, float64(s.MaxQueue))
	gauge(dSessions, float64(s.Online), "online")
	gauge(dSessions, float64(max(s.Sessions-s.Online, 0)), "grace")
	gauge(dConns, float64(s.Conns))
	counter(dAccepted, s.ConnsAccepted)
	counter(dRejected, s.ConnsRejected)
	counter(dFrames, s.FramesIn, "in")
	counter(dFrames, s.FramesOut, "out")
	counter(dBytes, s.BytesIn, "in")
	counter(dBytes, s.BytesOut, "out")
	gauge(dToken, float64(s.LastToken))
	gauge(dQuiet, b2f(s.Quiet))
	if d := s.Disk; d != nil {
		gauge(dDiskOK, b2f(d.Healthy))
		counter(dDiskErr, d.Errors)
		gauge(dTokLeft, float64(d.TokensLeft))
	}
	gauge(dInfo, 1, s.Version)
	gauge(dStart, float64(s.Start.UnixNano())/1e9)
	if cs := s.Cluster; cs != nil {
		for _, r := range roleNames {
			gauge(dRole, b2f(cs.Role == r), r)
		}
		gauge(dTerm, float64(cs.Term))
		gauge(dIndex, float64(cs.LastIndex), "last")
		gauge(dIndex, float64(cs.CommitIndex), "commit")
		gauge(dIndex, float64(cs.AppliedIndex), "applied")
		gauge(dLag, float64(cs.CommitIndex-min(cs.AppliedIndex, cs.CommitIndex)))
		gauge(dContact, cs.LastContact.Seconds())
		gauge(dLeader, b2f(cs.LeaderKnown))
		gauge(dPeers, float64(len(cs.Peers)))
		for _, p := range cs.Peers {
			gauge(dFailing, b2f(p.Failing), p.ID)
			gauge(dStale, b2f(p.Stale), p.ID)
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// NewRegistry returns a registry with the server's metrics (read through
// snap at every scrape), Go's runtime metrics and the process's.
func NewRegistry(snap func(*Snapshot)) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(&collector{snap: snap})
	reg.MustRegister(collectors.NewGoCollector())
	reg.MustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}
