package server

import (
	"bytes"
	"errors"
	"testing"

	"github.com/mlock-dev/mlock/internal/protocol"
)

// logCmdSeeds are commands of every op and request kind, in both formats.
func logCmdSeeds() []logCmd {
	reqs := []request{
		{kind: reqLock, req: []byte("1"), lock: protocol.LockArgs{Resources: "a|b", TTL: 100, Timeout: 5, Tolerate: 1 << 31, Owner: "o", Modes: "sx"}},
		{kind: reqTryLock, req: []byte("2"), lock: protocol.LockArgs{Try: true, Resources: "a"}},
		{kind: reqExtend, req: []byte("3"), extend: protocol.ExtendArgs{ID: "abc", TTL: 9}},
		{kind: reqUnlock, req: []byte("4"), unlock: protocol.IDArgs{ID: "abc"}},
		{kind: reqRenew, req: []byte("5"), renew: protocol.RenewArgs{Owner: "o", Resources: "a", TTL: 1}},
		{kind: reqRelease, req: []byte("6"), release: protocol.ReleaseArgs{All: true, In: true, Owner: "o", Prefix: "p:"}},
		{kind: reqEvict, req: []byte("7"), evict: protocol.EvictArgs{Resources: "a|b"}},
		{kind: reqPing, req: []byte("8")},
		{kind: reqRefused, req: []byte("9"), refusedVerb: protocol.VerbExtend, refusedCode: protocol.CodeInvalidTTL},
	}
	g := newGenesis(1<<50, "max-ttl=1h")
	g1 := *g
	g1.hasParams, g1.params = false, ""
	seeds := []logCmd{
		{op: opFrames, node: "n1", conn: "n1/ab/1", seq: 3, session: "s", frames: [][]byte{[]byte("lock 1 a 100 0 0"), []byte("unlock 2 x")}},
		{op: opAttach, node: "n2", conn: "k", seq: 1, session: "p\x00s", principal: "p"},
		{op: opDetach, node: "n", conn: "k", session: "s"},
		{op: opDetachNode, node: "n", conn: "n/x/"},
		{op: opFailover, until: 1 << 60},
		{op: opHoldGrants, until: -5},
		{op: opParams, params: "max-ttl=1h"},
		*g, g1,
		{format: logFormat2, op: opRequests, node: "n1", conn: "n1/ab/1", seq: 4, session: "s", reqs: reqs},
		{format: logFormat2, op: opAttach, node: "n2", conn: "k", seq: 1, session: "s", principal: "p"},
		{format: logFormat2, op: opFailover, until: 7},
		{format: logFormat2, op: opVersion, version: logFormat2},
		{format: logFormat2, op: opParams, params: "x"},
	}
	g2 := *g
	g2.format = logFormat2
	// Format 3: a lock with a deadline among the others.
	reqs3 := append(append([]request(nil), reqs...),
		request{kind: reqLock, req: []byte("10"), lock: protocol.LockArgs{Resources: "a", Timeout: 2000}, deadline: 1<<60 + 3},
		request{kind: reqLock, req: []byte("11"), lock: protocol.LockArgs{Resources: "a", Timeout: 1}, deadline: -1})
	seeds = append(seeds,
		logCmd{format: logFormat3, op: opRequests, node: "n1", conn: "n1/ab/1", seq: 5, session: "s", reqs: reqs3},
		logCmd{format: logFormat3, op: opVersion, version: logFormat3},
		logCmd{format: logFormat3, op: opCancel, session: "s", ids: []protocol.ID{{1, 2, 3}, {15: 0xff}}},
		// Format 4: format 3's commands, the mark of a build that applies a
		// rollback's lowering.
		logCmd{format: logFormat4, op: opRequests, node: "n1", conn: "n1/ab/1", seq: 6, session: "s", reqs: reqs3},
		logCmd{format: logFormat4, op: opVersion, version: logFormat1},
		logCmd{format: logFormat4, op: opCancel, session: "s", ids: []protocol.ID{{4}}})
	return append(seeds, g2)
}

// FuzzLogCmd: decoding never panics, what decodes encodes back to the same
// bytes, and a format above this build's is refused as such.
func FuzzLogCmd(f *testing.F) {
	for _, m := range logCmdSeeds() {
		f.Add(appendLogCmd(nil, &m))
	}
	f.Add([]byte{versionMark, logFormat + 1, opParams, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		var m logCmd
		err := decodeLogCmd(b, &m)
		var future *errFutureFormat
		if errors.As(err, &future) {
			if future.got <= logFormat {
				t.Fatalf("format %d refused as a future one", future.got)
			}
			return
		}
		if err != nil {
			return
		}
		if got := appendLogCmd(nil, &m); !bytes.Equal(got, b) {
			t.Fatalf("re-encoded %x, want %x", got, b)
		}
	})
}

// Every seed decodes to itself; the requests survive the round trip.
func TestLogCmdRoundTrip(t *testing.T) {
	for _, m := range logCmdSeeds() {
		b := appendLogCmd(nil, &m)
		var got logCmd
		if err := decodeLogCmd(b, &got); err != nil {
			t.Fatalf("op %d format %d: %v", m.op, m.format, err)
		}
		if again := appendLogCmd(nil, &got); !bytes.Equal(again, b) {
			t.Fatalf("op %d format %d: re-encoded %x, want %x", m.op, m.format, again, b)
		}
		for i := range m.reqs {
			w, g := m.reqs[i], got.reqs[i]
			if w.kind != g.kind || !bytes.Equal(w.req, g.req) || w.lock != g.lock || w.extend != g.extend ||
				w.unlock != g.unlock || w.renew != g.renew || w.release != g.release || w.evict != g.evict ||
				w.refusedVerb != g.refusedVerb || w.refusedCode != g.refusedCode || w.deadline != g.deadline {
				t.Fatalf("request %d: %+v, want %+v", i, g, w)
			}
		}
		if m.format == 0 && b[0] == versionMark || m.format >= logFormat2 && b[0] != versionMark {
			t.Fatalf("op %d format %d: header %x", m.op, m.format, b[:1])
		}
	}
	// A cancel is a format 3 command; it names at least one lock, whole.
	cancel := logCmd{format: logFormat3, op: opCancel, session: "s", ids: []protocol.ID{{1}}}
	b := appendLogCmd(nil, &cancel)
	var got logCmd
	if err := decodeLogCmd(b, &got); err != nil || got.session != "s" || len(got.ids) != 1 || got.ids[0] != cancel.ids[0] {
		t.Fatalf("cancel: %+v, %v", got, err)
	}
	if err := decodeLogCmd(b[:len(b)-1], &got); err == nil {
		t.Fatal("a cancel with a short lock id accepted")
	}
	cancel.format = logFormat2
	if err := decodeLogCmd(appendLogCmd(nil, &cancel), &got); err == nil {
		t.Fatal("a cancel accepted in a format 2 command")
	}
	cancel.format, cancel.ids = logFormat3, nil
	if err := decodeLogCmd(appendLogCmd(nil, &cancel), &got); err == nil {
		t.Fatal("a cancel of no lock accepted")
	}
	// A typed request or the cluster version are not format 1 commands.
	for _, op := range []byte{opRequests, opVersion} {
		if err := decodeLogCmd([]byte{op, 0}, new(logCmd)); err == nil {
			t.Fatalf("op %d accepted without the format header", op)
		}
	}
}

// A lock with a deadline (reqLockBy) is a format 3 request: refused in a
// format 2 command, and refused with a deadline of 0 (a lock without one
// is a reqLock: one encoding per command).
func TestLogCmdLockDeadline(t *testing.T) {
	lock := request{kind: reqLock, req: []byte("1"), lock: protocol.LockArgs{Resources: "a", Timeout: 2000}, deadline: 12345}
	m := logCmd{format: logFormat3, op: opRequests, node: "n", conn: "k", seq: 1, session: "s", reqs: []request{lock}}
	b := appendLogCmd(nil, &m)
	var got logCmd
	if err := decodeLogCmd(b, &got); err != nil || got.reqs[0].kind != reqLock || got.reqs[0].deadline != 12345 {
		t.Fatalf("format 3: %+v, %v", got.reqs, err)
	}
	m.format = logFormat2
	if err := decodeLogCmd(appendLogCmd(nil, &m), &got); err == nil {
		t.Fatal("a lock with a deadline accepted in a format 2 command")
	}
	// The deadline 0 spelled out: the last byte is the varint 12345's;
	// rewrite it as a one-byte 0.
	m.format = logFormat3
	m.reqs[0].deadline = 1 // a one-byte varint (2)
	b = appendLogCmd(nil, &m)
	b[len(b)-1] = 0
	if err := decodeLogCmd(b, &got); err == nil {
		t.Fatal("a lock with deadline 0 accepted as reqLockBy")
	}
	// Format 4 carries it as format 3 does.
	m.format, m.reqs[0].deadline = logFormat4, 12345
	if err := decodeLogCmd(appendLogCmd(nil, &m), &got); err != nil || got.format != logFormat4 || got.reqs[0].deadline != 12345 {
		t.Fatalf("format 4: %+v, %v", got.reqs, err)
	}
	// Without a deadline it is a plain lock, in every format.
	m.reqs[0].deadline = 0
	for _, f := range []int{logFormat2, logFormat3, logFormat4} {
		m.format = f
		b = appendLogCmd(nil, &m)
		if err := decodeLogCmd(b, &got); err != nil || got.reqs[0].deadline != 0 {
			t.Fatalf("format %d, no deadline: %+v, %v", f, got.reqs, err)
		}
	}
}
