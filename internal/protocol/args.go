package protocol

import "strconv"

// The typed commands: one struct per command that carries arguments, with
// Append (the client's encoder) and Parse (the server's decoder), so that
// no code knows a command's arguments by their position. Parse checks only
// what the wire grammar says (a field present, a number well formed); the
// server then checks its own limits (the longest ttl, the rights of the
// principal). A Parse takes the fields of a frame as Split returns them
// (f[0] the verb, f[1] the request id) and returns CodeUnknown when the
// arguments are well formed, or the code to answer otherwise; it never
// allocates more than the strings it fills in.

// Command is a typed command the client sends.
type Command interface {
	// Verb returns the command's word.
	Verb() Verb
	// AppendArgs appends the arguments, each preceded by a space.
	AppendArgs(dst []byte) []byte
}

// AppendTyped appends the frame "<verb> <seq> <args...>" of cmd, seq written
// as AppendCommandSeq writes it.
func AppendTyped(dst []byte, seq uint64, cmd Command) []byte {
	dst, st := Begin(dst)
	dst = append(dst, cmd.Verb().String()...)
	dst = append(dst, ' ')
	dst = strconv.AppendUint(dst, seq, 36)
	dst = cmd.AppendArgs(dst)
	return End(dst, st)
}

// arg returns field i of f, or nil.
func arg(f [][]byte, i int) []byte {
	if i < len(f) {
		return f[i]
	}
	return nil
}

// optInt parses an optional non-negative number: an unset field (see
// Unset) is 0, ok.
func optInt(b []byte) (int64, bool) {
	if Unset(b) {
		return 0, true
	}
	n, ok := Int(b)
	return n, ok && n >= 0
}

func appendField(dst []byte, s string) []byte {
	dst = append(dst, ' ')
	return append(dst, s...)
}

func appendNum(dst []byte, n int64) []byte {
	dst = append(dst, ' ')
	return strconv.AppendInt(dst, n, 10)
}

// appendTTL appends a ttl: 0 (unset) as an empty field, which the server
// reads as its default.
func appendTTL(dst []byte, ms int64) []byte {
	if ms == 0 {
		return append(dst, ' ')
	}
	return appendNum(dst, ms)
}

// LockArgs are the arguments of
//
//	lock <req> <resources> <ttl> <timeout> <tolerate> [<owner> [<modes>]]
//	trylock <req> <resources> <ttl> [<owner> [<modes>]]
type LockArgs struct {
	Try       bool   // trylock: no timeout, no tolerate
	Resources string // "a|b|c", as sent
	TTL       int64  // lease in ms; 0: unset, the server's default
	Timeout   int64  // wait in ms (lock only); 0 also when unset
	Tolerate  int64  // longest queue accepted (lock only); 0: no limit
	Owner     string // "": none
	Modes     string // "": every resource exclusive; see ParseModes
}

// Verb returns VerbTryLock or VerbLock.
func (a *LockArgs) Verb() Verb {
	if a.Try {
		return VerbTryLock
	}
	return VerbLock
}

// AppendArgs appends the arguments in wire order. The ttl is always sent,
// so is a lock's timeout and tolerate; the owner is sent (empty) when modes
// follow it.
func (a *LockArgs) AppendArgs(dst []byte) []byte {
	dst = appendField(dst, a.Resources)
	dst = appendTTL(dst, a.TTL)
	if !a.Try {
		dst = appendNum(dst, a.Timeout)
		dst = appendNum(dst, a.Tolerate)
	}
	if a.Owner != "" || a.Modes != "" {
		dst = appendField(dst, a.Owner)
	}
	if a.Modes != "" {
		dst = appendField(dst, a.Modes)
	}
	return dst
}

// Parse fills a from the fields of a lock (try false) or trylock frame. A
// ttl that is set must be a number > 0 (CodeInvalidTTL), a timeout a
// number >= 0 (CodeInvalidTimeout), a tolerate a number >= 0
// (CodeInvalidTolerate, and values above 2^31 are 2^31); missing resources
// are CodeInvalidResource. Modes are left as sent: their number depends on
// the resources, which the caller splits.
func (a *LockArgs) Parse(f [][]byte, try bool) Code {
	*a = LockArgs{Try: try}
	if t := arg(f, 3); !Unset(t) {
		n, ok := Int(t)
		if !ok || n <= 0 {
			return CodeInvalidTTL
		}
		a.TTL = n
	}
	ownerAt := 4
	if !try {
		ownerAt = 6
		n, ok := optInt(arg(f, 4))
		if !ok {
			return CodeInvalidTimeout
		}
		a.Timeout = n
		if n, ok = optInt(arg(f, 5)); !ok {
			return CodeInvalidTolerate
		}
		a.Tolerate = min(n, 1<<31)
	}
	a.Owner = string(arg(f, ownerAt))
	if len(f) < 3 {
		return CodeInvalidResource
	}
	a.Resources = string(f[2])
	a.Modes = string(arg(f, ownerAt+1))
	return CodeUnknown
}

// ExtendArgs are the arguments of "extend <req> <lockId> <ttl>".
type ExtendArgs struct {
	ID  string // the lock id, as sent
	TTL int64  // ms; 0: unset, the server's default
}

// Verb returns VerbExtend.
func (a *ExtendArgs) Verb() Verb { return VerbExtend }

// AppendArgs appends the lock id and the ttl.
func (a *ExtendArgs) AppendArgs(dst []byte) []byte {
	return appendTTL(appendField(dst, a.ID), a.TTL)
}

// Parse fills a from the fields of an extend frame: a missing lock id is
// CodeMissingArguments, a ttl that is set and not a number > 0
// CodeInvalidTTL. The id is checked by the caller (an unknown or malformed
// one is CodeLockNotExist).
func (a *ExtendArgs) Parse(f [][]byte) Code {
	*a = ExtendArgs{}
	if len(f) < 3 {
		return CodeMissingArguments
	}
	if t := arg(f, 3); !Unset(t) {
		n, ok := Int(t)
		if !ok || n <= 0 {
			return CodeInvalidTTL
		}
		a.TTL = n
	}
	a.ID = string(f[2])
	return CodeUnknown
}

// IDArgs are the arguments of "unlock <req> <lockId>".
type IDArgs struct {
	ID string // the lock id, as sent
}

// Verb returns VerbUnlock.
func (a *IDArgs) Verb() Verb { return VerbUnlock }

// AppendArgs appends the lock id.
func (a *IDArgs) AppendArgs(dst []byte) []byte { return appendField(dst, a.ID) }

// Parse fills a from the fields of an unlock frame: a missing lock id is
// CodeMissingArguments.
func (a *IDArgs) Parse(f [][]byte) Code {
	if len(f) < 3 {
		*a = IDArgs{}
		return CodeMissingArguments
	}
	a.ID = string(f[2])
	return CodeUnknown
}

// RenewArgs are the arguments of "renew <req> <owner> <resources> <ttl>".
type RenewArgs struct {
	Owner     string
	Resources string // "a|b", as sent
	TTL       int64  // ms; 0: unset, the server's default
}

// Verb returns VerbRenew.
func (a *RenewArgs) Verb() Verb { return VerbRenew }

// AppendArgs appends the owner, the resources and the ttl.
func (a *RenewArgs) AppendArgs(dst []byte) []byte {
	return appendTTL(appendField(appendField(dst, a.Owner), a.Resources), a.TTL)
}

// Parse fills a from the fields of a renew frame: a missing or empty owner
// or resources is CodeMissingArguments, a ttl that is set and not a number
// > 0 CodeInvalidTTL.
func (a *RenewArgs) Parse(f [][]byte) Code {
	*a = RenewArgs{}
	if len(f) < 4 || len(f[2]) == 0 || len(f[3]) == 0 {
		return CodeMissingArguments
	}
	if t := arg(f, 4); !Unset(t) {
		n, ok := Int(t)
		if !ok || n <= 0 {
			return CodeInvalidTTL
		}
		a.TTL = n
	}
	a.Owner, a.Resources = string(f[2]), string(f[3])
	return CodeUnknown
}

// ReleaseArgs are the arguments of release and releasein, and of releaseall
// and releaseallin (All: no resources):
//
//	release <req> <owner> <resources>
//	releasein <req> <owner> <resources> <prefix>
//	releaseall <req> <owner>
//	releaseallin <req> <owner> <prefix>
type ReleaseArgs struct {
	All       bool   // releaseall, releaseallin
	In        bool   // releasein, releaseallin: confined to Prefix
	Owner     string // not empty
	Resources string // "a|b" (release, releasein)
	Prefix    string // releasein, releaseallin; may be empty
}

// Verb returns the command's word.
func (a *ReleaseArgs) Verb() Verb {
	switch {
	case a.All && a.In:
		return VerbReleaseAllIn
	case a.All:
		return VerbReleaseAll
	case a.In:
		return VerbReleaseIn
	}
	return VerbRelease
}

// AppendArgs appends the owner, the resources unless All, and the prefix if
// In.
func (a *ReleaseArgs) AppendArgs(dst []byte) []byte {
	dst = appendField(dst, a.Owner)
	if !a.All {
		dst = appendField(dst, a.Resources)
	}
	if a.In {
		dst = appendField(dst, a.Prefix)
	}
	return dst
}

// Parse fills a from the fields of a frame of verb v (one of the four): a
// missing or empty owner, missing or empty resources, or a missing prefix
// is CodeMissingArguments.
func (a *ReleaseArgs) Parse(v Verb, f [][]byte) Code {
	*a = ReleaseArgs{All: v == VerbReleaseAll || v == VerbReleaseAllIn, In: v == VerbReleaseIn || v == VerbReleaseAllIn}
	n := 3 // fields before the prefix
	if !a.All {
		n = 4
	}
	if len(f) < n || len(f[2]) == 0 || !a.All && len(f[3]) == 0 || a.In && len(f) < n+1 {
		return CodeMissingArguments
	}
	a.Owner = string(f[2])
	if !a.All {
		a.Resources = string(f[3])
	}
	if a.In {
		a.Prefix = string(f[n])
	}
	return CodeUnknown
}

// EvictArgs are the arguments of "evict <req> <resources>".
type EvictArgs struct {
	Resources string // "a|b", not empty
}

// Verb returns VerbEvict.
func (a *EvictArgs) Verb() Verb { return VerbEvict }

// AppendArgs appends the resources.
func (a *EvictArgs) AppendArgs(dst []byte) []byte { return appendField(dst, a.Resources) }

// Parse fills a from the fields of an evict frame: missing or empty
// resources are CodeMissingArguments.
func (a *EvictArgs) Parse(f [][]byte) Code {
	if len(f) < 3 || len(f[2]) == 0 {
		*a = EvictArgs{}
		return CodeMissingArguments
	}
	a.Resources = string(f[2])
	return CodeUnknown
}

// Words is a command given as its word and its arguments, for the commands
// with no struct of their own (ping, status, locks, cluster, bye).
type Words struct {
	V    Verb
	Args []string // written as given: the caller checks that they hold no space
}

// Verb returns w.V.
func (w *Words) Verb() Verb { return w.V }

// AppendArgs appends the arguments.
func (w *Words) AppendArgs(dst []byte) []byte {
	for _, a := range w.Args {
		dst = appendField(dst, a)
	}
	return dst
}
