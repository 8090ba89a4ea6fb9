package protocol

// The JSON documents of the status and locks commands (and of the HTTP
// listener): the wire vocabulary of inspection. The client re-exports them
// under the same names.

// Status is the server status document (the status command): the original
// server's fields first, then mlockd's additions. Lock ids and socketIds are secrets, so locks are
// keyed by 8 hex digits of the random part of their id and sockets by a keyed hash of
// their socketId.
type Status struct {
	SocketCount       int                     `json:"socketCount"`  // live identified connections
	CurrentLocks      int                     `json:"currentLocks"` // live requests, held and waiting
	LiveTime          int64                   `json:"liveTime"`     // ms since start
	StartAt           int64                   `json:"startAt"`      // start, Unix ms
	LockCount         uint64                  `json:"lockCount"`    // accepted lock requests
	IntoleranceCount  uint64                  `json:"intoleranceCount"`
	TimeoutCount      uint64                  `json:"timeoutCount"`
	LockedCount       uint64                  `json:"lockedCount"` // grants
	ExpiredCount      uint64                  `json:"expiredCount"`
	FinishedCount     uint64                  `json:"finishedCount"` // unlocks and releases
	ExtendCount       uint64                  `json:"extendCount"`
	ExtendFailedCount uint64                  `json:"extendFailedCount"`
	Sockets           map[string]StatusSocket `json:"sockets"`
	Queues            map[string]int          `json:"queues"`
	Locks             map[string]StatusLock   `json:"locks"`

	Version             string  `json:"version"`
	HeldLocks           int     `json:"heldLocks"`
	Sessions            int     `json:"sessions"` // connected and in their grace period
	Connections         int     `json:"connections"`
	RejectedConnections uint64  `json:"rejectedConnections"`
	DroppedCount        uint64  `json:"droppedCount"` // requests dropped with their session
	LastToken           uint64  `json:"lastToken"`
	CPUTimeMs           float64 `json:"cpuTimeMs"` // process user+system CPU time
	Reads               uint64  `json:"reads"`     // read system calls that returned data
	Writes              uint64  `json:"writes"`    // write system calls
	FramesIn            uint64  `json:"framesIn"`  // frames received
	Truncated           bool    `json:"truncated"` // listings cut at the status limit
	// QuietUntil is the end (Unix ms) of the quiet period in force after a
	// start that may follow a crash: nothing is granted before it. 0 when
	// the server grants.
	QuietUntil int64 `json:"quietUntil,omitempty"`
	// Disk is the state of a single server's data directory; nil without
	// one (and on a cluster node).
	Disk *StatusDisk `json:"disk,omitempty"`
	// Limits are the server's limits against exhaustion, what they count
	// now and how often they refused.
	Limits *StatusLimits `json:"limits,omitempty"`
	// Principals is the use and quota of every principal with a session or
	// a connection (detailed status, on a server with credentials; at most
	// the status limit of them, by name: Truncated is set past it).
	Principals map[string]StatusPrincipal `json:"principals,omitempty"`

	// AnsweredBy is set by Client.Status, not by the server: the address
	// (host:port, as the Client names it) of the node that answered.
	AnsweredBy string `json:"-"`

	// Cluster is the answering node's view of its cluster; nil for a
	// single server.
	Cluster *StatusCluster `json:"cluster,omitempty"`
}

// StatusCluster is a cluster node's view of its cluster in Status.
type StatusCluster struct {
	ID           string              `json:"id"`         // this node
	Role         string              `json:"role"`       // leader, follower, candidate, shutdown
	Ready        bool                `json:"ready"`      // this node is the leader and accepts commands (false on every follower)
	Leader       string              `json:"leader"`     // the leader's id, "" while none is known
	LeaderAddr   string              `json:"leaderAddr"` // the leader's client address
	Term         uint64              `json:"term"`
	LastIndex    uint64              `json:"lastIndex"`
	CommitIndex  uint64              `json:"commitIndex"`
	AppliedIndex uint64              `json:"appliedIndex"`
	Peers        []StatusClusterNode `json:"peers"`
	// Version is the cluster version: the highest log format every member
	// reads, which every node writes (docs/cluster.md).
	Version int `json:"version,omitempty"`
	// LogFormat is the highest log format this node's build reads.
	LogFormat int `json:"logFormat,omitempty"`
	// Halted says why this node stopped applying the log ("": it applies).
	Halted string `json:"halted,omitempty"`
	// Pinned: a rollback lowered the cluster version, and the leader does
	// not raise it again until mlock cluster rollback --cancel.
	Pinned bool `json:"pinned,omitempty"`
	// RollbackReady: the version is pinned at 1 and a snapshot covers
	// every command of a higher format this node applied: the previous
	// release may be started on its raft directory (docs/cluster.md,
	// "Rollback").
	RollbackReady bool `json:"rollbackReady,omitempty"`
}

// StatusClusterNode is one member of the cluster in StatusCluster.
type StatusClusterNode struct {
	ID       string `json:"id"`
	Addr     string `json:"addr"`              // its Raft address
	Suffrage string `json:"suffrage"`          // voter, nonvoter
	Failing  bool   `json:"failing,omitempty"` // (on the leader) heartbeats to it fail
	// LogFormat is (on the leader) the highest log format the member said
	// its build reads; 0: not known (a build that does not say reads
	// format 1).
	LogFormat int `json:"logFormat,omitempty"`
	// Stale (on the leader) says why the member cannot read what the
	// cluster writes ("": it can): the leader refuses its forwarded
	// commands and keeps it a nonvoter until it says it reads the cluster
	// version (docs/cluster.md, "Rollback").
	Stale string `json:"stale,omitempty"`
}

// StatusLimits describes the server's limits in Status: the current use,
// the refusals since the start, and the configured caps (the flags of the
// same names; 0 or negative: no limit, for those that allow it; on a
// cluster node, those in force: the leader's).
type StatusLimits struct {
	Entries   int   `json:"entries"`   // queue entries (a request counts once per distinct resource)
	NameBytes int64 `json:"nameBytes"` // bytes of names held: len(resource) per queue entry, plus len(owner) per request

	RejectedPerIP   uint64 `json:"rejectedPerIp"`   // connections refused: too many from their address
	AuthFailed      uint64 `json:"authFailed"`      // connects refused: credentials missing or wrong, protected mode
	SessionsRefused uint64 `json:"sessionsRefused"` // connects refused: too many sessions
	IdleClosed      uint64 `json:"idleClosed"`      // connections closed by the idle timeout
	Forbidden       uint64 `json:"forbidden"`       // commands refused: permission denied
	ServerFull      uint64 `json:"serverFull"`      // requests refused: a server-wide cap on locks, entries or name bytes
	RateLimited     uint64 `json:"rateLimited"`     // detailed status and locks refused by the rate limit

	MaxConns         int   `json:"maxConns"`
	MaxConnsPerIP    int   `json:"maxConnsPerIp"`
	MaxSessions      int   `json:"maxSessions"` // connected and in their grace period
	IdleTimeoutMs    int64 `json:"idleTimeoutMs"`
	MaxLocks         int   `json:"maxLocks"`
	MaxEntries       int   `json:"maxEntries"`
	MaxNameBytes     int   `json:"maxNameBytes"`
	MaxSessionBytes  int   `json:"maxSessionBytes"`
	MaxLocksPerSess  int   `json:"maxLocksPerSession"`
	StatusRatePerSec int   `json:"statusRatePerSec"` // detailed status and locks listings per second, per principal

	Unauthenticated         int    `json:"unauthenticated"`         // connections before their handshake now
	Evicted                 uint64 `json:"evicted"`                 // connections before their handshake evicted to make room for a newcomer
	QuotaRefused            uint64 `json:"quotaRefused"`            // connects and lock requests refused by a principal's quota
	MaxUnauthenticated      int    `json:"maxUnauthenticated"`      // connections before their handshake, in all
	MaxUnauthenticatedPerIP int    `json:"maxUnauthenticatedPerIp"` // connections before their handshake, per address
}

// StatusPrincipal is one principal's use and quota in Status (detailed
// status, for administrators): its live lock requests and sessions (on a
// cluster, over every node) and its authenticated connections (on the node
// that answers). A Max field is 0 when there is no quota.
type StatusPrincipal struct {
	Locks       int `json:"locks"`
	Sessions    int `json:"sessions"`
	Conns       int `json:"conns"`
	MaxLocks    int `json:"maxLocks"`
	MaxSessions int `json:"maxSessions"`
	MaxConns    int `json:"maxConns"`
}

// StatusSocket describes one connected session in Status.
type StatusSocket struct {
	Address  string `json:"address"`
	LiveTime int64  `json:"liveTime"` // ms since the connection was accepted
	LastLive int64  `json:"lastLive"` // ms since its last frame
}

// StatusLock describes one request in Status.
type StatusLock struct {
	Locked    bool   `json:"locked"`
	TTL       int64  `json:"ttl"`               // ms
	Expire    *int64 `json:"expire,omitempty"`  // ms left, when locked
	Timeout   *int64 `json:"timeout,omitempty"` // ms left of the wait, when waiting with a timeout
	Resources string `json:"resources"`
}

// LocksEntry is one request in a resource's queue in the locks listing.
type LocksEntry struct {
	Lock    string `json:"lock"`    // 8 hex digits of the random part of the lock id
	Session string `json:"session"` // keyed hash of the socketId
	Owner   string `json:"owner,omitempty"`
	// Principal is the name of the principal the request belongs to
	// (servers with authentication; "" for the anonymous principal).
	// Entries of other principals shown to one that does not administer
	// have no lock, session, owner or token.
	Principal string `json:"principal,omitempty"`
	// Mode is how the entry takes the resource: "x" (exclusive), "s"
	// (shared) or "k/n" (k of n permits). Several shared or permits
	// entries of one queue may be held at once.
	Mode          string `json:"mode"`
	State         string `json:"state"`    // "held" or "waiting"
	Position      int    `json:"position"` // 0 is the head of the queue
	Token         uint64 `json:"token,omitempty"`
	AgeMs         int64  `json:"ageMs"`                   // since the request arrived
	HeldMs        *int64 `json:"heldMs,omitempty"`        // held: since the grant (absent when the server does not know it)
	TTLLeftMs     *int64 `json:"ttlLeftMs,omitempty"`     // held
	TimeoutLeftMs *int64 `json:"timeoutLeftMs,omitempty"` // waiting with a timeout
}

// LocksQueue is one resource in the locks listing.
type LocksQueue struct {
	Resource string `json:"resource"`
	// Length is the queue's length; Entries may be cut shorter (then the
	// listing is Truncated).
	Length  int          `json:"length"`
	Entries []LocksEntry `json:"entries"`
}

// Locks is the answer to the locks command.
type Locks struct {
	Queues    []LocksQueue `json:"queues"` // sorted by resource
	Truncated bool         `json:"truncated"`
	// Next, when set, is the cursor of the next page: more resources
	// follow; pass it to Client.LocksPage as after.
	Next string `json:"next,omitempty"`
}

// StatusDisk is the state of a single server's data directory: whether the
// fencing-token high-water mark could be written the last time it was.
type StatusDisk struct {
	// Healthy: the last write of the mark succeeded.
	Healthy bool `json:"healthy"`
	// Error is why the last write failed (the system's words, e.g. "no
	// space left on device"); empty while Healthy.
	Error string `json:"error,omitempty"`
	// Errors counts the writes that failed since the start.
	Errors uint64 `json:"errors"`
	// TokensLeft is how many tokens are still below the mark on disk: what
	// can be granted while writes fail; at 0 new lock requests are refused.
	TokensLeft uint64 `json:"tokensLeft"`
}
