package redis

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/mlock-dev/mlock/fence"
)

// replyError is a Redis error reply as go-redis returns it.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

var _ goredis.Error = replyError("")

// FuzzStaleError: the script's error reply is read without a panic, as a
// StaleError only when it is exactly "STALE i high" with i naming one of
// the resources; anything else is the error as it came.
func FuzzStaleError(f *testing.F) {
	for _, s := range []string{"STALE 1 42", "STALE 2 7", "STALE 0 1", "STALE 1", "STALE x 1", "NOSCRIPT", "STALE 1 -3", "STALE 1 18446744073709551616", ""} {
		f.Add(s)
	}
	res := []string{"a", "b"}
	f.Fuzz(func(t *testing.T, msg string) {
		in := replyError(msg)
		err := staleError(in, 5, res)
		var se *fence.StaleError
		if errors.As(err, &se) {
			fs := strings.Fields(msg)
			i, _ := strconv.Atoi(fs[1])
			high, _ := strconv.ParseUint(fs[2], 10, 64)
			if len(fs) != 3 || fs[0] != "STALE" || se.Resource != res[i-1] || se.Highest != high || se.Token != 5 {
				t.Fatalf("%q read as %+v", msg, se)
			}
			return
		}
		if !errors.Is(err, in) {
			t.Fatalf("%q: %v does not wrap the reply", msg, err)
		}
	})
}

func TestStaleErrorOfAnotherError(t *testing.T) {
	other := errors.New("STALE 1 5") // not a Redis reply: a network error, say
	if err := staleError(other, 5, []string{"a"}); err != other {
		t.Fatalf("got %v", err)
	}
}
