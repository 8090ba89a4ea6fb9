package protocol

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"strings"
	"testing"
)

func TestEncodeMatchesOriginal(t *testing.T) {
	got := Append(nil, "ab")
	if want := []byte{0, 0, 0, 7, 'a', 'b', '\n'}; !bytes.Equal(got, want) {
		t.Fatalf("encode(ab) = %v, want %v", got, want)
	}
	got = Append(nil, "result", "r1", "success", "pong")
	if string(got[4:]) != "result r1 success pong\n" || int(got[3]) != len(got) {
		t.Fatalf("frame = %q", got)
	}
}

func TestNext(t *testing.T) {
	tests := []struct {
		name    string
		in      []byte
		payload string
		n, want int
		err     error
	}{
		{"empty", nil, "", 0, 0, nil},
		{"partial header", []byte{0, 0}, "", 0, 0, nil},
		{"zero length", []byte{0, 0, 0, 0}, "", 0, 0, ErrShortFrame},
		{"length 4", []byte{0, 0, 0, 4, 'x'}, "", 0, 0, ErrShortFrame},
		{"negative length", []byte{0xff, 0xff, 0xff, 0xff}, "", 0, 0, ErrShortFrame},
		{"too long", []byte{0, 1, 0, 0}, "", 0, 0, ErrLongFrame},
		{"incomplete body", []byte{0, 0, 0, 7, 'a'}, "", 0, 7, nil},
		{"empty payload", []byte{0, 0, 0, 5, '\n'}, "", 5, 5, nil},
		{"bad trailer", []byte{0, 0, 0, 7, 'a', 'b', 'X'}, "", 0, 0, ErrTrailer},
		{"one frame and more", append(Append(nil, "ping r"), 0, 0), "ping r", 11, 11, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, n, want, err := Next(tc.in, 1024)
			if !errors.Is(err, tc.err) || n != tc.n || want != tc.want || string(p) != tc.payload {
				t.Fatalf("Next = %q, %d, %d, %v; want %q, %d, %d, %v", p, n, want, err, tc.payload, tc.n, tc.want, tc.err)
			}
		})
	}
}

func TestSplit(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{"", []string{""}},
		{"ping r1", []string{"ping", "r1"}},
		{"lock r  5000 0 0", []string{"lock", "r", "", "5000", "0", "0"}},
		{"a ", []string{"a", ""}},
		{strings.Repeat("x ", 20), append(strings.Split(strings.Repeat("x ", MaxFields-1), " ")[:MaxFields-1], strings.Repeat("x ", 20-MaxFields+1))},
	}
	for _, tc := range tests {
		var got []string
		for _, f := range Split(nil, []byte(tc.in)) {
			got = append(got, string(f))
		}
		if strings.Join(got, "\x00") != strings.Join(tc.want, "\x00") {
			t.Errorf("Split(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestInt(t *testing.T) {
	tests := []struct {
		in string
		n  int64
		ok bool
	}{
		{"0", 0, true}, {"5000", 5000, true}, {"-1", -1, true}, {"", 0, false}, {"-", 0, false},
		{"1.5", 0, false}, {"1000abc", 0, false}, {"1e3", 0, false}, {"undefined", 0, false},
		{"99999999999999999999", 0, false}, {"9223372036854775807", 9223372036854775807, true},
		// 19 digits past the range: no wrap-around to a number of the other sign.
		{"9223372036854775808", 0, false}, {"9999999999999999999", 0, false},
		{"-9223372036854775807", -9223372036854775807, true}, {"-9999999999999999999", 0, false},
	}
	for _, tc := range tests {
		n, ok := Int([]byte(tc.in))
		if n != tc.n || ok != tc.ok {
			t.Errorf("Int(%q) = %d, %v", tc.in, n, ok)
		}
	}
	if !Unset([]byte("undefined")) || !Unset(nil) || Unset([]byte("0")) {
		t.Fatal("Unset")
	}
	if !Lower([]byte("LoCk"), "lock") || Lower([]byte("locks"), "lock") {
		t.Fatal("Lower")
	}
}

// FuzzNext feeds arbitrary bytes, split at random points, to a decoder loop
// shaped like the server's: it must never panic, never return a payload
// longer than the limit, and must consume exactly the frames it reports.
func FuzzNext(f *testing.F) {
	f.Add(Append(nil, "connect abc 1.0"), uint8(3))
	f.Add(append(Append(nil, "lock r a|b 5000 0 0"), Append(nil, "ping p")...), uint8(1))
	f.Add([]byte{0, 0, 0, 0}, uint8(2))
	f.Add([]byte{0x7f, 0xff, 0xff, 0xff, 'x'}, uint8(0))
	f.Fuzz(func(t *testing.T, data []byte, seed uint8) {
		const max = 64
		r := rand.New(rand.NewPCG(uint64(seed), 1))
		var buf []byte
		var frames [][]byte
		rest := data
		for len(rest) > 0 {
			k := 1 + r.IntN(len(rest))
			buf = append(buf, rest[:k]...)
			rest = rest[k:]
			for {
				p, n, _, err := Next(buf, max)
				if err != nil {
					return // the connection would be closed
				}
				if n == 0 {
					break
				}
				if len(p) > max || n != len(p)+Overhead {
					t.Fatalf("payload %d bytes, frame %d", len(p), n)
				}
				frames = append(frames, append([]byte(nil), p...))
				buf = buf[n:]
			}
		}
		// Re-encoding what was decoded gives back the consumed input.
		var again []byte
		for _, p := range frames {
			again = Append(again, string(p))
		}
		if !bytes.Equal(again, data[:len(again)]) {
			t.Fatalf("decoded frames do not re-encode to the input")
		}
	})
}

// FuzzSplit: the fields of any payload join back to it.
func FuzzSplit(f *testing.F) {
	f.Add([]byte("lock r a|b 5000 0 0 owner"))
	f.Add([]byte("  "))
	f.Fuzz(func(t *testing.T, p []byte) {
		fields := Split(nil, p)
		if len(fields) > MaxFields {
			t.Fatalf("%d fields", len(fields))
		}
		if !bytes.Equal(bytes.Join(fields, []byte(" ")), p) {
			t.Fatalf("fields of %q do not join back", p)
		}
		for _, fl := range fields {
			Int(fl)
		}
	})
}

func TestUint(t *testing.T) {
	tests := []struct {
		in string
		n  uint64
		ok bool
	}{
		{"0", 0, true}, {"17", 17, true}, {"18446744073709551615", 1<<64 - 1, true},
		{"18446744073709551616", 0, false}, {"", 0, false}, {"-1", 0, false}, {"1x", 0, false},
	}
	for _, tc := range tests {
		n, ok := Uint([]byte(tc.in))
		if n != tc.n || ok != tc.ok {
			t.Errorf("Uint(%q) = %d, %v", tc.in, n, ok)
		}
	}
}

// chunkReader returns its data a few bytes at a time.
type chunkReader struct {
	data []byte
	r    *rand.Rand
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := min(len(p), 1+c.r.IntN(len(c.data)))
	copy(p, c.data[:n])
	c.data = c.data[n:]
	return n, nil
}

func TestReadFrame(t *testing.T) {
	big := strings.Repeat("x", 100)
	in := Append(Append(Append(nil, "result r1 success pong"), big), "")
	r := bufio.NewReaderSize(&chunkReader{data: in, r: rand.New(rand.NewPCG(1, 2))}, 16)
	var buf []byte
	for _, want := range []string{"result r1 success pong", big, ""} {
		p, err := ReadFrame(r, buf, 1000)
		if err != nil || string(p) != want {
			t.Fatalf("ReadFrame = %q, %v; want %q", p, err, want)
		}
	}
	if _, err := ReadFrame(r, buf, 1000); err != io.EOF {
		t.Fatalf("at the end: %v", err)
	}
	tests := []struct {
		name string
		in   []byte
		err  error
	}{
		{"short", []byte{0, 0, 0, 4}, ErrShortFrame},
		{"long", Append(nil, big), ErrLongFrame},
		{"trailer", []byte{0, 0, 0, 6, 'a', 'b'}, ErrTrailer},
		{"cut header", []byte{0, 0}, io.ErrUnexpectedEOF},
		{"cut body", []byte{0, 0, 0, 9, 'a'}, io.ErrUnexpectedEOF},
		{"cut big body", append([]byte{0, 0, 1, 0}, big...), io.ErrUnexpectedEOF},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := bufio.NewReaderSize(bytes.NewReader(tc.in), 16)
			if _, err := ReadFrame(r, nil, 50+strings.Count(tc.name, "big")*1000); !errors.Is(err, tc.err) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
		})
	}
}
