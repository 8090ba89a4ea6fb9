package protocol

// Code names one text the server sends: a failure reason ("result <req>
// failed <text>") or a connection error ("error <text>"). The texts are
// the wire contract, byte for byte: the first group is the original
// server's, the rest are this server's additions. docs/protocol.md lists
// them all.
type Code uint8

// The codes. CodeUnknown is a text this table does not know.
const (
	CodeUnknown Code = iota

	// Failure reasons of the original protocol.
	CodeInvalidTTL      // "ttl should be integer!"
	CodeCannotTolerate  // "can not tolerate!": 1.0 clients compare it; never followed by a detail
	CodeLockNotExist    // "lock not exist!"
	CodeNotLockedYet    // "not locked yet!"
	CodeInvalidMessage  // "invalid message!": an unknown command
	CodeInvalidTimeout  // "timeout should be integer!"
	CodeInvalidTolerate // "tolerate should be integer!"

	// Failure reasons added by this server.
	CodeInvalidResource  // "invalid resource!"
	CodeTooManyResources // "too many resources!"
	CodeBusy             // "resource is locked!" (trylock); may be followed by the resource
	CodeQueueFull        // "queue is full!"
	CodeSessionLimit     // "too many locks in this session!"
	CodeInvalidOwner     // "invalid owner!"
	CodeOwnerConflict    // "owner holds an overlapping lock!"; may be followed by the resource
	CodeMissingArguments // "missing arguments!"
	CodeForbidden        // "permission denied!": the principal may not lock the resource or run the command; may be followed by the resource
	CodeServerFull       // "server is full!": a server-wide limit on locks, queue entries or name bytes
	CodeRateLimited      // "too many requests, retry later!": status or locks asked too often

	// Connection errors ("error <text>", then the server closes).
	CodeConnectFirst       // "should connect first!"
	CodeDuplicateConnect   // "duplicate connect!"
	CodeSocketIDRequired   // "socketId is required!"
	CodeAPIVersionRequired // "apiVersion is required!"
	CodeAuthTimeout        // "auth timeout!"
	CodeInvalidFrame       // "invalid frame!"
	CodeFrameTooLarge      // "frame too large!"
	CodeTooManyConnections // "too many connections!"
	CodeTakenOver          // "session taken over by a new connection!"
	CodeSocketIDTooLong    // "socketId is too long!"
	CodeShuttingDown       // "server shutting down!": every lock of the session is gone
	CodeAuthRequired       // "authentication required!": no credentials, and none match the client's address
	CodeAuthFailed         // "authentication failed!": unknown name, wrong token, or a credential not allowed here
	CodeAuthNotConfigured  // "authentication is not configured!": credentials sent to a server without an auth file
	CodeProtectedMode      // "protected mode: only loopback clients are accepted without authentication!"
	CodeTooManyFromAddr    // "too many connections from this address!"
	CodeTooManySessions    // "too many sessions!"
	CodeIdleTimeout        // "idle timeout!": nothing received for the idle timeout
	CodeTLSRequired        // "TLS required!": a plain client on a TLS listener
	CodeInvalidSocketID    // "invalid socketId!": it holds a NUL byte

	// Failures of the cluster command.
	CodeNotCluster    // "not a cluster node!"
	CodeClusterChange // "cluster change failed!", followed by why

	// Modes (extension).
	CodeInvalidMode     // "invalid mode!": a mode is not x, s or k/n, or the modes do not match the resources
	CodePermitsConflict // "permits do not match!": a semaphore used with another count; followed by the resource
	CodeModeChange      // "lock mode can not change!": an owner's re-entry in another mode; followed by the resource

	// Quotas per principal (extension).
	CodeQuotaLocks    // "too many locks for this principal!": a lock or trylock past the principal's max-locks
	CodeQuotaSessions // "too many sessions for this principal!": a connect that would start a session past max-sessions (then the server closes)
	CodeQuotaConns    // "too many connections for this principal!": a connect past max-conns (then the server closes)

	// Cluster versions (extension).
	CodeStaleNode // "node cannot read the cluster log!": this node's build reads a log format below the cluster version (then the server closes)

	// Admission (extension).
	CodeEvicted // "too many unauthenticated connections!": evicted before its connect from a full pre-handshake pool (then the server closes); trying again at once may succeed

	// The data directory (extension).
	CodeNoTokens // "no fencing token: data directory not writable!": a lock request while the tokens the mark on disk covers are used up

	numCodes
)

var codeTexts = [numCodes]string{
	CodeInvalidTTL:         "ttl should be integer!",
	CodeCannotTolerate:     "can not tolerate!",
	CodeLockNotExist:       "lock not exist!",
	CodeNotLockedYet:       "not locked yet!",
	CodeInvalidMessage:     "invalid message!",
	CodeInvalidTimeout:     "timeout should be integer!",
	CodeInvalidTolerate:    "tolerate should be integer!",
	CodeInvalidResource:    "invalid resource!",
	CodeTooManyResources:   "too many resources!",
	CodeBusy:               "resource is locked!",
	CodeQueueFull:          "queue is full!",
	CodeSessionLimit:       "too many locks in this session!",
	CodeInvalidOwner:       "invalid owner!",
	CodeOwnerConflict:      "owner holds an overlapping lock!",
	CodeMissingArguments:   "missing arguments!",
	CodeForbidden:          "permission denied!",
	CodeServerFull:         "server is full!",
	CodeRateLimited:        "too many requests, retry later!",
	CodeConnectFirst:       "should connect first!",
	CodeDuplicateConnect:   "duplicate connect!",
	CodeSocketIDRequired:   "socketId is required!",
	CodeAPIVersionRequired: "apiVersion is required!",
	CodeAuthTimeout:        "auth timeout!",
	CodeInvalidFrame:       "invalid frame!",
	CodeFrameTooLarge:      "frame too large!",
	CodeTooManyConnections: "too many connections!",
	CodeTakenOver:          "session taken over by a new connection!",
	CodeSocketIDTooLong:    "socketId is too long!",
	CodeShuttingDown:       "server shutting down!",
	CodeAuthRequired:       "authentication required!",
	CodeAuthFailed:         "authentication failed!",
	CodeAuthNotConfigured:  "authentication is not configured!",
	CodeProtectedMode:      "protected mode: only loopback clients are accepted without authentication!",
	CodeNotCluster:         "not a cluster node!",
	CodeClusterChange:      "cluster change failed!",
	CodeTooManyFromAddr:    "too many connections from this address!",
	CodeTooManySessions:    "too many sessions!",
	CodeIdleTimeout:        "idle timeout!",
	CodeTLSRequired:        "TLS required!",
	CodeInvalidSocketID:    "invalid socketId!",
	CodeInvalidMode:        "invalid mode!",
	CodePermitsConflict:    "permits do not match!",
	CodeModeChange:         "lock mode can not change!",
	CodeQuotaLocks:         "too many locks for this principal!",
	CodeQuotaSessions:      "too many sessions for this principal!",
	CodeQuotaConns:         "too many connections for this principal!",
	CodeStaleNode:          "node cannot read the cluster log!",
	CodeEvicted:            "too many unauthenticated connections!",
	CodeNoTokens:           "no fencing token: data directory not writable!",
}

// Text returns the code's wire text; "" for CodeUnknown.
func (c Code) Text() string {
	if c < numCodes {
		return codeTexts[c]
	}
	return ""
}

// String returns the wire text, or "unknown".
func (c Code) String() string {
	if t := c.Text(); t != "" {
		return t
	}
	return "unknown"
}

// CodeOf returns the code whose text is exactly text (CodeUnknown if none),
// without allocating. ParseMessage uses it; see there for texts followed by
// a detail.
func CodeOf(text []byte) Code {
	return codeOf[string(text)] // no allocation: the conversion is only a key
}

// codeOf is codeTexts reversed, plus the 0.1.x servers' spelling of
// "should connect first!".
var codeOf = func() map[string]Code {
	m := map[string]Code{"shoule connect first!": CodeConnectFirst}
	for c, t := range codeTexts {
		if t != "" {
			m[t] = Code(c)
		}
	}
	return m
}()

// HasDetail reports whether a failure with this code may carry a detail
// (the resource that is busy or conflicting, or why a cluster change
// failed) after its text. Only the extension reasons do: 1.0 clients
// compare "can not tolerate!" whole.
func (c Code) HasDetail() bool {
	return c == CodeBusy || c == CodeOwnerConflict || c == CodeForbidden || c == CodePermitsConflict ||
		c == CodeModeChange || c == CodeClusterChange
}

// Class is what a client does with a failure: which error type it reports.
type Class uint8

const (
	// ClassRequest: the request was refused (bad arguments, a limit, an
	// owner conflict); the default.
	ClassRequest Class = iota
	// ClassTolerate: a queue was too long (can not tolerate) or a try-lock
	// found a resource taken (busy): the original client's "tolerate" type.
	ClassTolerate
	// ClassNotFound: the lock does not exist (any more): for a holder, the
	// lock is lost.
	ClassNotFound
)

// Class returns the code's class.
func (c Code) Class() Class {
	switch c {
	case CodeCannotTolerate, CodeBusy:
		return ClassTolerate
	case CodeLockNotExist:
		return ClassNotFound
	}
	return ClassRequest
}
