package protocol

import "strconv"

// Verb is a command a client sends. The zero Verb is not a command.
type Verb uint8

// The commands: the original protocol's (connect, lock, extend, unlock,
// ping, status) and the extensions (trylock, locks, release, releaseall,
// renew, bye, evict, cluster, releasein, releaseallin), which a 1.0 client
// never sends. docs/protocol.md specifies each.
const (
	VerbConnect      Verb = iota + 1 // connect <socketId> <apiVersion>
	VerbLock                         // lock <req> <resources> <ttl> <timeout> <tolerate> [<owner> [<modes>]]
	VerbTryLock                      // trylock <req> <resources> <ttl> [<owner> [<modes>]]
	VerbExtend                       // extend <req> <lockId> <ttl>
	VerbUnlock                       // unlock <req> <lockId>
	VerbPing                         // ping <req>
	VerbStatus                       // status <req>
	VerbLocks                        // locks <req> [<prefix>]
	VerbRelease                      // release <req> <owner> <resources>
	VerbReleaseAll                   // releaseall <req> <owner>
	VerbRenew                        // renew <req> <owner> <resources> <ttl>
	VerbBye                          // bye <req>: the client heard "server shutting down!" and dropped its locks
	VerbEvict                        // evict <req> <resources>: (admin) release the holders of resources, whoever they are
	VerbCluster                      // cluster <req> join <id> <raftAddr> | remove <id>: (admin) change a cluster's members
	VerbReleaseIn                    // releasein <req> <owner> <resources> <prefix>: release confined to resources starting with prefix
	VerbReleaseAllIn                 // releaseallin <req> <owner> <prefix>: releaseall confined to resources starting with prefix
	numVerbs
)

var verbNames = [numVerbs]string{
	VerbConnect: "connect", VerbLock: "lock", VerbTryLock: "trylock", VerbExtend: "extend",
	VerbUnlock: "unlock", VerbPing: "ping", VerbStatus: "status", VerbLocks: "locks",
	VerbRelease: "release", VerbReleaseAll: "releaseall", VerbRenew: "renew", VerbBye: "bye",
	VerbEvict: "evict", VerbCluster: "cluster", VerbReleaseIn: "releasein", VerbReleaseAllIn: "releaseallin",
}

// String returns the command word as sent (lowercase); "" for a Verb that
// is not a command.
func (v Verb) String() string {
	if v < numVerbs {
		return verbNames[v]
	}
	return ""
}

// ParseVerb looks up a command word, ASCII case-insensitively, without
// allocating. It reports false for anything that is not a command.
func ParseVerb(b []byte) (Verb, bool) {
	var low [len("releaseallin")]byte
	if len(b) == 0 || len(b) > len(low) {
		return 0, false
	}
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		low[i] = c
	}
	switch string(low[:len(b)]) {
	case "lock":
		return VerbLock, true
	case "unlock":
		return VerbUnlock, true
	case "extend":
		return VerbExtend, true
	case "trylock":
		return VerbTryLock, true
	case "ping":
		return VerbPing, true
	case "connect":
		return VerbConnect, true
	case "status":
		return VerbStatus, true
	case "locks":
		return VerbLocks, true
	case "release":
		return VerbRelease, true
	case "releaseall":
		return VerbReleaseAll, true
	case "renew":
		return VerbRenew, true
	case "bye":
		return VerbBye, true
	case "evict":
		return VerbEvict, true
	case "cluster":
		return VerbCluster, true
	case "releasein":
		return VerbReleaseIn, true
	case "releaseallin":
		return VerbReleaseAllIn, true
	}
	return 0, false
}

// AppendCommand appends one command frame "<verb> <req> <args...>" (for
// VerbConnect, req is the socketId and args the apiVersion). Arguments are
// written as given: the caller checks that they hold no space.
func AppendCommand(dst []byte, v Verb, req string, args ...string) []byte {
	dst, st := Begin(dst)
	dst = append(dst, v.String()...)
	dst = append(dst, ' ')
	dst = append(dst, req...)
	for _, a := range args {
		dst = append(dst, ' ')
		dst = append(dst, a...)
	}
	return End(dst, st)
}

// AppendCommandSeq is AppendCommand with a numeric request id, written in
// base 36 (a client's choice: the server echoes any request id verbatim).
// ParseSeq reads it back from a result.
func AppendCommandSeq(dst []byte, v Verb, seq uint64, args ...string) []byte {
	dst, st := Begin(dst)
	dst = append(dst, v.String()...)
	dst = append(dst, ' ')
	dst = strconv.AppendUint(dst, seq, 36)
	for _, a := range args {
		dst = append(dst, ' ')
		dst = append(dst, a...)
	}
	return End(dst, st)
}

// ParseSeq parses a request id written by AppendCommandSeq (lowercase base
// 36, no sign, no leading zero). It reports false for anything else.
func ParseSeq(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 13 || (b[0] == '0' && len(b) > 1) {
		return 0, false
	}
	var n uint64
	for _, c := range b {
		var d uint64
		switch {
		case '0' <= c && c <= '9':
			d = uint64(c - '0')
		case 'a' <= c && c <= 'z':
			d = uint64(c-'a') + 10
		default:
			return 0, false
		}
		if n > (1<<64-1-d)/36 {
			return 0, false
		}
		n = n*36 + d
	}
	return n, true
}
