package mlock

import (
	"context"
	"errors"
	"strconv"
	"strings"

	"github.com/mlock-dev/mlock/internal/protocol"
)

// Scoped releases.
//
// An owner name is one for the whole server: ReleaseAll(ctx, "u1") frees
// u1's locks on every resource, those of another application (or another
// tenant's namespace) too. ReleaseIn and ReleaseAllIn confine a release to
// the resources whose names start with a scope, the way a key-value store's
// release scans one key prefix: what an owner holds outside the scope is
// never touched, whoever asks, under the owner's name or the anonymous
// owner's ("*"). They are the server's releasein and releaseallin commands
// (extensions of mlockd 1.x; a server without them refuses the call with
// ErrScopeUnsupported rather than releasing beyond the scope).

// ErrScopeUnsupported is the cause of the Error (Type request) of ReleaseIn
// and ReleaseAllIn when the server does not know scoped releases: it
// released nothing.
var ErrScopeUnsupported = errors.New("mlock: the server does not support scoped releases")

// scopeOf returns the wire scope of scope: the Client's prefix, then scope.
func (c *Client) scopeOf(scope string) (string, error) {
	s := c.opts.Prefix + scope
	if strings.ContainsAny(s, " |") {
		return "", &Error{Type: TypeRequest, Msg: "invalid scope " + strconv.Quote(s)}
	}
	return s, nil
}

// ReleaseIn is Release confined to the resources whose names start with the
// Client's prefix followed by scope: a named resource outside it is left
// alone and makes the answer false. With an empty scope and no prefix it
// is Release.
func (c *Client) ReleaseIn(ctx context.Context, owner, resources, scope string) (bool, error) {
	sc, err := c.scopeOf(scope)
	if err != nil {
		return false, err
	}
	if sc == "" {
		return c.Release(ctx, owner, resources)
	}
	var one [1]string
	res, err := c.join(splitNames(resources, &one))
	if err != nil {
		return false, err
	}
	if err := checkOwner(owner); err != nil {
		return false, err
	}
	r, rerr, sent := c.s.exchange(ctx, c, nil, &protocol.ReleaseArgs{In: true, Owner: owner, Resources: res, Prefix: sc})
	if rerr != nil {
		if sent && unanswered(rerr) {
			c.s.mayBeReleased(owner, res)
		}
		return false, scopeErr(rerr)
	}
	return r.n == 1, nil
}

// ReleaseAllIn releases, of every lock owner holds, the resources whose
// names start with the Client's prefix followed by scope, and returns how
// many locks it released wholly or in part. A lock with no resource in the
// scope is not touched; a lock with resources on both sides keeps those
// outside and is lost for its holder (as after a partial Release). With an
// empty scope and no prefix it is ReleaseAll. It is not retried after a
// connection error; if it was sent but not answered, this session's held
// handles of owner are lost at once (ErrReleased).
func (c *Client) ReleaseAllIn(ctx context.Context, owner, scope string) (int, error) {
	sc, err := c.scopeOf(scope)
	if err != nil {
		return 0, err
	}
	if sc == "" {
		return c.ReleaseAll(ctx, owner)
	}
	if err := checkOwner(owner); err != nil {
		return 0, err
	}
	r, rerr, sent := c.s.exchange(ctx, c, nil, &protocol.ReleaseArgs{All: true, In: true, Owner: owner, Prefix: sc})
	if rerr != nil {
		if sent && unanswered(rerr) {
			c.s.mayBeReleased(owner, "")
		}
		return 0, scopeErr(rerr)
	}
	return int(r.n), nil
}

// scopeErr names an older server's refusal of a scoped release.
func scopeErr(err error) error {
	var e *Error
	if errors.As(err, &e) && e.code == protocol.CodeInvalidMessage {
		return &Error{Type: TypeRequest, Msg: "the server does not support scoped releases (releasein, releaseallin)", Node: e.Node, Err: ErrScopeUnsupported, code: e.code}
	}
	return err
}
