package protocol

import (
	"bufio"
	"bytes"
	"io"
	"testing"
)

var sinkMsg Message

func BenchmarkParseMessage(b *testing.B) {
	frames := [][]byte{
		[]byte("result 1z success 0123456789abcdef0123456789abcdef"),
		[]byte("locked 0123456789abcdef0123456789abcdef 1700000000123 123456789"),
		[]byte("result 20 success done"),
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		m, err := ParseMessage(frames[i%len(frames)])
		if err != nil {
			b.Fatal(err)
		}
		sinkMsg = m
	}
}

func BenchmarkParseVerb(b *testing.B) {
	words := [][]byte{[]byte("lock"), []byte("UNLOCK"), []byte("extend"), []byte("releaseall")}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, ok := ParseVerb(words[i%len(words)]); !ok {
			b.Fatal("verb")
		}
	}
}

func BenchmarkBuilders(b *testing.B) {
	id := ID{1, 2, 3}
	req := []byte("1z")
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendOKID(buf[:0], req, id)
		buf = AppendLocked(buf, id, 1700000000123, 123456789)
		buf = AppendOK(buf, req, []byte("done"))
		buf = AppendFailed(buf, req, CodeBusy, "order:1")
		buf = AppendPush(buf, PushExpired, id)
		buf = AppendCommandSeq(buf, VerbLock, 12345, "order:1|order:2", "60000", "0", "0")
		buf = AppendCommand(buf, VerbUnlock, "1z", "0123456789abcdef0123456789abcdef")
	}
}

func BenchmarkReadFrame(b *testing.B) {
	var in []byte
	for range 64 {
		in = AppendOK(in, []byte("1z"), []byte("0123456789abcdef0123456789abcdef"))
	}
	rd := bytes.NewReader(in)
	r := bufio.NewReaderSize(rd, 4096)
	b.ReportAllocs()
	for b.Loop() {
		p, err := ReadFrame(r, nil, MaxFrameLimit)
		if err == io.EOF {
			rd.Reset(in)
			r.Reset(rd)
			continue
		}
		if err != nil || len(p) == 0 {
			b.Fatal(err)
		}
	}
}

func BenchmarkOutbox(b *testing.B) {
	o := NewOutbox(0)
	b.ReportAllocs()
	for b.Loop() {
		o.Build(func(dst []byte) []byte { return AppendCommandSeq(dst, VerbPing, 7) })
		o.Flush(io.Discard)
	}
}
