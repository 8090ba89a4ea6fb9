package server

import (
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/internal/auth"
	"github.com/mlock-dev/mlock/internal/core"
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
		"release r o a|b", "releaseall r o", "releasein r o a|b a", "releaseallin r o a", "releaseallin r o ", "locks r a", "status r", "renew r o a|b 5000", "ping", "connect x 1.0", "LOCK r  undefined",
		"evict r a|b", "locks r | 5 a", "locks r a 0 a:z", "release r o\x00p a", "lock r a 5000 0 0 o\x00p",
		"lock r a|b 5000 0 0  s|2/3", "trylock r a 5000 o s", "lock r a 5000 0 0  x|", "lock r a|a 1 0 0 o 1/1|s",
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
		defer srv.core().Close()
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

// FuzzHandshake feeds arbitrary bytes, from the first byte on, to a server
// with an auth file: the connect frame with its auth= field and whatever
// follows. Nothing may panic, nothing above the handshake frame limit is
// buffered before a connect succeeds, and a session, if one is made, belongs
// to a principal of the file with its name scoped into the session id.
func FuzzHandshake(f *testing.F) {
	tokA := "tokenA-0123456789"
	lineA, err := auth.Line("a", tokA, "prefix=a:")
	if err != nil {
		f.Fatal(err)
	}
	lineB, err := auth.Line("b", "tokenB-0123456789", "admin")
	if err != nil {
		f.Fatal(err)
	}
	file := filepath.Join(f.TempDir(), "auth")
	if err := os.WriteFile(file, []byte(lineA+"\n"+lineB+"\n"), 0o600); err != nil {
		f.Fatal(err)
	}
	for _, p := range []string{
		"connect s 1.0 auth=a:" + tokA, "connect s 1.0 auth=a:wrong", "connect s 1.0 auth=nobody:x", "connect s 1.0 auth=a",
		"connect s 1.0 auth=:", "connect s 1.0", "connect s\x00x 1.0 auth=a:" + tokA, "connect s 1.0 x=y auth=b:tokenB-0123456789",
	} {
		f.Add(append(protocol.Append(nil, p), protocol.Append(nil, "lock r a:x|b:y 5000 0 0 o\x00p")...), uint8(1))
	}
	f.Fuzz(func(t *testing.T, data []byte, seed uint8) {
		srv, err := New(Config{AuthFile: file, MaxPendingOutput: 64 << 10, SessionGrace: time.Millisecond, QuietPeriod: -1})
		if err != nil {
			t.Fatal(err)
		}
		defer srv.core().Close()
		c := srv.newConn(nopConn{}, "fuzz")
		srv.conns[c] = struct{}{}
		r := rand.New(rand.NewPCG(uint64(seed), 3))
		input := data
		var buf []byte
		var fields [][]byte
		for len(input) > 0 {
			k := 1 + r.IntN(len(input))
			buf = append(buf, input[:k]...)
			input = input[k:]
			if len(buf) > 0 && buf[0] != 0 {
				return // the plain status path, not frames
			}
			var stop bool
			buf, fields, stop = c.handleFrames(buf, fields)
			if !stop && !c.authed && len(buf) >= MaxHandshakeFrame+protocol.Overhead {
				t.Fatalf("%d unconsumed bytes before the handshake", len(buf))
			}
			_, _ = c.out.Flush(io.Discard)
			if stop {
				break
			}
		}
		srv.core().Batch(func(*core.Tx) {
			if sess := c.sess; sess != nil {
				if sess.p == nil || (sess.p.Name != "a" && sess.p.Name != "b") {
					t.Fatalf("session of principal %+v", sess.p)
				}
				if p, _ := unscope(sess.id); p != sess.p.Name {
					t.Fatalf("session id %q is not scoped to %q", sess.id, sess.p.Name)
				}
			}
		})
		c.cleanup()
	})
}
