package protocol

import (
	"bufio"
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"
)

func TestParseMessage(t *testing.T) {
	id := "0123456789abcdef0123456789abcdef"
	tests := []struct {
		in   string
		want Message
	}{
		{"connected 1.0 new", Message{Kind: MsgConnected, GraceMs: -1}},
		{"connected 1.0 resumed", Message{Kind: MsgConnected, Resumed: true, GraceMs: -1}},
		{"connected 1.0", Message{Kind: MsgConnected, GraceMs: -1}},
		{"connected 1.0 new 15000", Message{Kind: MsgConnected, GraceMs: 15000}},
		{"connected 1.0 resumed 0", Message{Kind: MsgConnected, Resumed: true, GraceMs: 0}},
		{"connected 1.0 new x", Message{Kind: MsgConnected, GraceMs: -1}},
		{"connected 1.0 resumed 15000 leader=10.0.0.3:12340", Message{Kind: MsgConnected, Resumed: true, GraceMs: 15000, Leader: "10.0.0.3:12340"}},
		{"connected 1.0 new 0 leader=[::1]:12340 more", Message{Kind: MsgConnected, GraceMs: 0, Leader: "[::1]:12340"}},
		{"connected 1.0 new 0 other=x", Message{Kind: MsgConnected, GraceMs: 0}},
		{"error frame too large!", Message{Kind: MsgError, Code: CodeFrameTooLarge, Text: "frame too large!"}},
		{"error what?", Message{Kind: MsgError, Text: "what?"}},
		{"result r1 success pong", Message{Kind: MsgResult, Req: []byte("r1"), OK: true, Payload: []byte("pong")}},
		{"result r1 success {\"a\": 1}", Message{Kind: MsgResult, Req: []byte("r1"), OK: true, Payload: []byte("{\"a\": 1}")}},
		{"result r1 success", Message{Kind: MsgResult, Req: []byte("r1"), OK: true}},
		{"result r2 failed can not tolerate!", Message{Kind: MsgResult, Req: []byte("r2"), Code: CodeCannotTolerate}},
		{"result r2 failed resource is locked!", Message{Kind: MsgResult, Req: []byte("r2"), Code: CodeBusy}},
		{"result r2 failed resource is locked! order:1", Message{Kind: MsgResult, Req: []byte("r2"), Code: CodeBusy, Detail: "order:1"}},
		{"result r2 failed resource is locked! a! b", Message{Kind: MsgResult, Req: []byte("r2"), Code: CodeBusy, Detail: "a! b"}},
		{"result r2 failed owner holds an overlapping lock! k", Message{Kind: MsgResult, Req: []byte("r2"), Code: CodeOwnerConflict, Detail: "k"}},
		{"result r2 failed can not tolerate! k", Message{Kind: MsgResult, Req: []byte("r2"), Detail: "can not tolerate! k"}},
		{"result r2 failed something new", Message{Kind: MsgResult, Req: []byte("r2"), Detail: "something new"}},
		{"locked " + id + " 1700000000123 42", Message{Kind: MsgLocked, ID: []byte(id), ExpiresAtMs: 1700000000123, Token: 42}},
		{"locked " + id + " 1700000000123", Message{Kind: MsgLocked, ID: []byte(id), ExpiresAtMs: 1700000000123}},
		{"timeout " + id, Message{Kind: MsgTimeout, ID: []byte(id)}},
		{"expired " + id, Message{Kind: MsgExpired, ID: []byte(id)}},
		{"expired " + id + " released", Message{Kind: MsgExpired, ID: []byte(id), Released: true}},
		{"expired " + id + " shutdown", Message{Kind: MsgExpired, ID: []byte(id), Shutdown: true}},
		{"expired " + id + " evicted", Message{Kind: MsgExpired, ID: []byte(id), Evicted: true}},
		{"expired " + id + " later", Message{Kind: MsgExpired, ID: []byte(id)}}, // an unknown cause: an expiry
	}
	for _, tc := range tests {
		got, err := ParseMessage([]byte(tc.in))
		if err != nil || !equal(got, tc.want) {
			t.Errorf("ParseMessage(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "hello", "result", "result r1", "result r1 maybe x", "locked", "locked " + id,
		"locked " + id + " x 1", "locked " + id + " 1 -1", "timeout", "expired ", "Result r1 success x"} {
		if m, err := ParseMessage([]byte(bad)); !errors.Is(err, ErrBadMessage) {
			t.Errorf("ParseMessage(%q) = %+v, %v", bad, m, err)
		}
	}
}

func equal(a, b Message) bool {
	return a.Kind == b.Kind && bytes.Equal(a.Req, b.Req) && a.OK == b.OK && bytes.Equal(a.Payload, b.Payload) &&
		a.Code == b.Code && a.Detail == b.Detail && bytes.Equal(a.ID, b.ID) && a.ExpiresAtMs == b.ExpiresAtMs &&
		a.Token == b.Token && a.Resumed == b.Resumed && a.Released == b.Released && a.Shutdown == b.Shutdown && a.Evicted == b.Evicted && a.Text == b.Text
}

// FuzzParseMessage frames the input's lines, feeds the frames to ReadFrame
// split at random points, and parses each: no panic, byte fields alias the
// payload, and what parses rebuilds to the same payload with the builders.
func FuzzParseMessage(f *testing.F) {
	id := "0123456789abcdef0123456789abcdef"
	for _, s := range []string{
		"result r1 success pong\nlocked " + id + " 17 3",
		"result r2 failed resource is locked! a\nexpired " + id + " released\ntimeout " + id,
		"connected 1.0 resumed\nerror auth timeout!",
		"result 1z failed can not tolerate!",
	} {
		f.Add([]byte(s), uint8(3))
	}
	f.Fuzz(func(t *testing.T, data []byte, seed uint8) {
		var in []byte
		lines := bytes.Split(data, []byte("\n"))
		for _, l := range lines {
			in = Append(in, string(l))
		}
		rnd := rand.New(rand.NewPCG(uint64(seed), 7))
		r := bufio.NewReaderSize(&chunkReader{data: in, r: rnd}, 16+rnd.IntN(64))
		var buf []byte
		for i, l := range lines {
			p, err := ReadFrame(r, buf, 1<<20)
			if err != nil || !bytes.Equal(p, l) {
				t.Fatalf("frame %d: %q, %v; want %q", i, p, err, l)
			}
			m, err := ParseMessage(p)
			if err != nil {
				continue
			}
			for _, b := range [][]byte{m.Req, m.Payload, m.ID} {
				if len(b) > 0 && !within(b, p) {
					t.Fatalf("%q: a field does not alias the payload", p)
				}
			}
			var again []byte
			switch {
			case m.Kind == MsgResult && m.OK && len(m.Payload) > 0:
				again = AppendOK(nil, m.Req, m.Payload)
			case m.Kind == MsgResult && !m.OK:
				again = AppendFailed(nil, m.Req, m.Code, m.Detail)
			case m.Kind == MsgLocked:
				if pid, ok := ParseID(m.ID); ok && m.Token > 0 {
					again = AppendLocked(nil, pid, m.ExpiresAtMs, m.Token)
				}
			}
			if again != nil {
				q, _, _, _ := Next(again, 1<<20)
				if !bytes.Equal(q, p) {
					// Only canonical forms rebuild exactly (no leading zeros,
					// lowercase ids): the rebuilt form must parse the same.
					m2, err := ParseMessage(q)
					if bytes.EqualFold(m.ID, m2.ID) {
						m2.ID = m.ID // lock ids are read case-insensitively
					}
					if err != nil || !equal(m, m2) {
						t.Fatalf("%q rebuilt as %q: %+v vs %+v (%v)", p, q, m, m2, err)
					}
				}
			}
		}
	})
}

// within reports whether b lies inside p's memory.
func within(b, p []byte) bool {
	if len(p) == 0 {
		return false
	}
	for i := range p {
		if &p[i] == &b[0] {
			return i+len(b) <= len(p)
		}
	}
	return false
}
