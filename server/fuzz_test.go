package server

import (
	"io"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/internal/protocol"
)

// nopConn is a net.Conn that discards writes.
type nopConn struct{ net.Conn }

func (nopConn) Write(b []byte) (int, error)      { return len(b), nil }
func (nopConn) Close() error                     { return nil }
func (nopConn) SetReadDeadline(time.Time) error  { return nil }
func (nopConn) SetWriteDeadline(time.Time) error { return nil }

// FuzzCommands feeds arbitrary bytes, after a connect, to a connection's
// frame handling, split at random points: nothing may panic, the unconsumed
// input never exceeds one frame, and queued output stays within its limit.
func FuzzCommands(f *testing.F) {
	for _, p := range []string{
		"lock r a|b 5000 0 0", "lock r a|a 1 -1 x owner", "trylock r a 5000 o", "extend r 00 5", "unlock r",
		"release r o a|b", "releaseall r o", "locks r a", "status r", "renew r o a|b 5000", "ping", "connect x 1.0", "LOCK r  undefined",
	} {
		f.Add(protocol.Append(nil, p), uint8(1))
	}
	f.Add([]byte{0, 0, 0, 0}, uint8(2))
	f.Fuzz(func(t *testing.T, data []byte, seed uint8) {
		const maxFrame = 512
		srv, err := New(Config{MaxFrame: maxFrame, MaxPendingOutput: 64 << 10, SessionGrace: time.Millisecond, QuietPeriod: -1})
		if err != nil {
			t.Fatal(err)
		}
		defer srv.core.Close()
		c := srv.newConn(nopConn{}, "fuzz")
		srv.conns[c] = struct{}{}
		r := rand.New(rand.NewPCG(uint64(seed), 2))
		input := append(protocol.Append(nil, "connect fuzz 1.0"), data...)
		var buf []byte
		var fields [][]byte
		for len(input) > 0 {
			k := 1 + r.IntN(len(input))
			buf = append(buf, input[:k]...)
			input = input[k:]
			var stop bool
			buf, fields, stop = c.handleFrames(buf, fields)
			if !stop && len(buf) >= maxFrame+protocol.Overhead {
				t.Fatalf("%d unconsumed bytes: more than one frame", len(buf))
			}
			n, _ := c.out.Flush(io.Discard)
			if n > 64<<10+maxFrame+64 {
				t.Fatalf("%d bytes queued", n)
			}
			if stop {
				break
			}
		}
		c.cleanup()
	})
}
