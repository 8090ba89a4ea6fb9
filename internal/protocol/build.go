package protocol

// PushKind is a push about one lock that is not a grant.
type PushKind uint8

const (
	// PushTimeout: "timeout <lockId>": the wait passed its timeout; the
	// request left every queue.
	PushTimeout PushKind = iota + 1
	// PushExpired: "expired <lockId>": the granted lock passed its expiry,
	// or was released (wholly or in part) by release or releaseall.
	PushExpired
	// PushReleased: "expired <lockId> released" (extension): the granted
	// lock was released, wholly or in part, by release or releaseall. 1.0
	// clients read it as expired.
	PushReleased
	// PushShutdown: "expired <lockId> shutdown" (extension): the granted
	// lock is gone because the server is shutting down. 1.0 clients read
	// it as expired.
	PushShutdown
	// PushEvicted: "expired <lockId> evicted" (extension): an administrator
	// revoked the granted lock (evict). 1.0 clients read it as expired.
	PushEvicted
)

// AppendConnected appends "connected 1.0 new <graceMs>" or, for a session
// that was kept, "connected 1.0 resumed <graceMs>". graceMs (extension) is
// the server's session grace period in milliseconds: how long the session
// outlives the server's last answer to it once its connection is gone. A
// negative graceMs is left out.
func AppendConnected(dst []byte, resumed bool, graceMs int64) []byte {
	return AppendConnectedLeader(dst, resumed, graceMs, "")
}

// AppendConnectedLeader is AppendConnected with a cluster follower's hint:
// "connected 1.0 new|resumed <graceMs> leader=<addr>", the client address
// of the cluster's leader (see Message.Leader). The hint needs graceMs >= 0
// (its position) and is left out when leader is "".
func AppendConnectedLeader(dst []byte, resumed bool, graceMs int64, leader string) []byte {
	dst, st := Begin(dst)
	if resumed {
		dst = append(dst, "connected 1.0 resumed"...)
	} else {
		dst = append(dst, "connected 1.0 new"...)
	}
	if graceMs >= 0 {
		dst = append(dst, ' ')
		dst = AppendInt(dst, graceMs)
		if leader != "" {
			dst = append(dst, " leader="...)
			dst = append(dst, leader...)
		}
	}
	return End(dst, st)
}

// AppendError appends "error <text>": a connection error, after which the
// server closes the connection.
func AppendError(dst []byte, c Code) []byte {
	dst, st := Begin(dst)
	dst = append(dst, "error "...)
	dst = append(dst, c.Text()...)
	return End(dst, st)
}

// AppendOK appends "result <req> success <payload>".
func AppendOK(dst []byte, req []byte, payload []byte) []byte {
	dst, st := Begin(dst)
	dst = append(dst, "result "...)
	dst = append(dst, req...)
	dst = append(dst, " success "...)
	dst = append(dst, payload...)
	return End(dst, st)
}

// AppendOKID appends "result <req> success <lockId>": the answer to a lock
// or trylock.
func AppendOKID(dst []byte, req []byte, id ID) []byte {
	dst, st := Begin(dst)
	dst = append(dst, "result "...)
	dst = append(dst, req...)
	dst = append(dst, " success "...)
	dst = id.AppendText(dst)
	return End(dst, st)
}

// AppendFailed appends "result <req> failed <text>", followed by " <detail>"
// when c may carry one (Code.HasDetail) and detail is not empty; for other
// codes detail is left out, so 1.0 texts stay byte for byte. For
// CodeUnknown, detail alone is the reason (an error with no wire text).
func AppendFailed(dst []byte, req []byte, c Code, detail string) []byte {
	dst, st := Begin(dst)
	dst = append(dst, "result "...)
	dst = append(dst, req...)
	dst = append(dst, " failed "...)
	switch {
	case c == CodeUnknown:
		dst = append(dst, detail...)
	case c.HasDetail() && detail != "":
		dst = append(dst, c.Text()...)
		dst = append(dst, ' ')
		dst = append(dst, detail...)
	default:
		dst = append(dst, c.Text()...)
	}
	return End(dst, st)
}

// AppendLocked appends the grant push "locked <lockId> <expiresAtMs>
// <token>" (expiresAtMs in Unix ms; the token is an extension).
func AppendLocked(dst []byte, id ID, expiresAtMs int64, token uint64) []byte {
	dst, st := Begin(dst)
	dst = append(dst, "locked "...)
	dst = id.AppendText(dst)
	dst = append(dst, ' ')
	dst = AppendInt(dst, expiresAtMs)
	dst = append(dst, ' ')
	dst = AppendUint(dst, token)
	return End(dst, st)
}

// AppendPush appends "timeout <lockId>", "expired <lockId>", "expired
// <lockId> released", "expired <lockId> shutdown" or "expired <lockId>
// evicted" for k.
func AppendPush(dst []byte, k PushKind, id ID) []byte {
	dst, st := Begin(dst)
	switch k {
	case PushTimeout:
		dst = append(dst, "timeout "...)
	default:
		dst = append(dst, "expired "...)
	}
	dst = id.AppendText(dst)
	switch k {
	case PushReleased:
		dst = append(dst, " released"...)
	case PushShutdown:
		dst = append(dst, " shutdown"...)
	case PushEvicted:
		dst = append(dst, " evicted"...)
	}
	return End(dst, st)
}
