// Package redis fences writes to Redis (through go-redis v9,
// github.com/redis/go-redis/v9): a Lua script checks the lock's fencing
// token against the highest one recorded beside the guarded keys, runs the
// write only if the token is at least that one, and records it, all in one
// atomic step.
//
// The token of a resource is kept in the key FenceKey(resource)
// ("mlock_fenced:{resource}", a string holding the decimal token, no
// expiry; not the locking module's Redis provider's counter,
// "mlock_fence:<namespace>"). Its hash tag is the resource: on a Redis Cluster, name the
// guarded keys with the same tag ("stock:{sku:1}") so that the script's
// keys share a slot.
package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/mlock-dev/mlock/fence"
)

// FenceKey returns the key that holds the highest token recorded for
// resource.
func FenceKey(resource string) string { return "mlock_fenced:{" + resource + "}" }

// prologue checks ARGV[1], the token (decimal, no leading zero), against
// the first ARGV[2] keys, the fence keys, and moves the rest of KEYS and
// ARGV to the body's. Tokens compare as decimal strings (length, then
// bytes): Lua's numbers are doubles, exact only below 2^53.
const prologue = `local tok, n = ARGV[1], tonumber(ARGV[2])
for i = 1, n do
  local high = redis.call('GET', KEYS[i])
  if high and (#tok < #high or (#tok == #high and tok < high)) then
    return redis.error_reply('STALE ' .. i .. ' ' .. high)
  end
end
local keys, argv = {}, {}
for i = n + 1, #KEYS do keys[#keys + 1] = KEYS[i] end
for i = 3, #ARGV do argv[#argv + 1] = ARGV[i] end
local result = (function(KEYS, ARGV)
`

// epilogue records the token once the body has returned without error
// (neither raised nor returned: redis.error_reply's table).
const epilogue = `
end)(keys, argv)
if type(result) == 'table' and result.err then return result end
for i = 1, n do redis.call('SET', KEYS[i], tok) end
return result
`

// Script is a write fenced by a token: a Lua body run only when the token
// is current, with its own KEYS and ARGV. It is safe for concurrent use.
type Script struct {
	s *goredis.Script
}

// NewScript returns the fenced Script of body, a Lua script body as for
// EVAL: it reads its keys in KEYS and its arguments in ARGV (from 1, as
// always) and returns its result. It runs only if the token is current;
// the token is recorded after it returns. A body that raises an error or
// returns one (redis.error_reply) leaves the token unrecorded (but, as any Redis script, keeps the writes
// it made before the error: check first, then write).
func NewScript(body string) *Script {
	return &Script{s: goredis.NewScript(prologue + body + epilogue)}
}

// Run runs the script fenced by token on resources (the lock's, "a|b"
// split: fence.Split), with keys and args as the body's KEYS and ARGV. It
// returns the body's result; a *fence.StaleError (errors.Is(err,
// fence.ErrStale)) if a higher token is recorded for one of the resources,
// the body not run; an error of kind fence.ErrInvalid for a token of 0 or
// above math.MaxInt64, or no resource; or Redis's error (a body's own error
// among them; goredis.Nil for a nil result).
func (s *Script) Run(ctx context.Context, c goredis.Scripter, token uint64, resources []string, keys []string, args ...any) (any, error) {
	res, err := fence.Resources(token, resources)
	if err != nil {
		return nil, err
	}
	all := make([]string, 0, len(res)+len(keys))
	for _, r := range res {
		all = append(all, FenceKey(r))
	}
	all = append(all, keys...)
	argv := append([]any{strconv.FormatUint(token, 10), len(res)}, args...)
	v, err := s.s.Run(ctx, c, all, argv...).Result()
	if err != nil {
		return v, staleError(err, token, res)
	}
	return v, nil
}

// staleError turns the script's "STALE i high" error into a
// *fence.StaleError.
func staleError(err error, token uint64, res []string) error {
	var re goredis.Error
	if !errors.As(err, &re) {
		return err
	}
	f := strings.Fields(re.Error())
	if len(f) != 3 || f[0] != "STALE" {
		return err
	}
	i, ierr := strconv.Atoi(f[1])
	high, herr := strconv.ParseUint(f[2], 10, 64)
	if ierr != nil || herr != nil || i < 1 || i > len(res) {
		return fmt.Errorf("fence: an unexpected answer from the script: %w", err)
	}
	return &fence.StaleError{Resource: res[i-1], Token: token, Highest: high}
}

// set is the body of Set.
var set = NewScript(`redis.call('SET', KEYS[1], ARGV[1]) return 1`)

// Set sets key to value, fenced by token on resources: a stale token is a
// *fence.StaleError and key is not written.
func Set(ctx context.Context, c goredis.Scripter, token uint64, resources []string, key string, value any) error {
	_, err := set.Run(ctx, c, token, resources, []string{key}, value)
	return err
}
