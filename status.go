package mlock

// Version is the version of this module's server and client.
const Version = "0.1.0"

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
	Lock          string `json:"lock"`    // 8 hex digits of the random part of the lock id
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
