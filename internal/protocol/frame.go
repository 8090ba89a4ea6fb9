package protocol

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"strconv"
)

// Overhead is the frame bytes around a payload: 4 header bytes and '\n'.
const Overhead = 5

// MaxFrameLimit is the largest payload limit a decoder accepts: 16 MiB, so
// the first byte of every valid frame is 0x00, which tells frames apart from
// the unframed "status\n" request.
const MaxFrameLimit = 16 << 20

// Frame errors. A connection that sends one cannot be resynchronised and
// should be closed.
var (
	ErrShortFrame = errors.New("protocol: frame length below 5")
	ErrLongFrame  = errors.New("protocol: frame longer than the limit")
	ErrTrailer    = errors.New("protocol: frame does not end with a newline")
)

// Next looks for one complete frame at the start of buf. It returns the
// payload (aliasing buf) and the number of bytes the frame takes, or n == 0
// if more bytes are needed. want is then the total bytes the frame needs
// (0 when even the header is incomplete). Payloads longer than max are
// refused with ErrLongFrame as soon as the header is read.
func Next(buf []byte, max int) (payload []byte, n, want int, err error) {
	if len(buf) < 4 {
		return nil, 0, 0, nil
	}
	l := int64(int32(binary.BigEndian.Uint32(buf)))
	if l < Overhead {
		return nil, 0, 0, ErrShortFrame
	}
	if l-Overhead > int64(max) {
		return nil, 0, 0, ErrLongFrame
	}
	if int64(len(buf)) < l {
		return nil, 0, int(l), nil
	}
	if buf[l-1] != '\n' {
		return nil, 0, 0, ErrTrailer
	}
	return buf[4 : l-1], int(l), int(l), nil
}

// ReadFrame reads one frame from r and returns its payload. A frame that
// fits in r's buffer is returned in place: the payload aliases r's buffer
// and is valid only until the next read from r. A larger one is read into
// buf, grown as needed. Payloads longer than max (capped at MaxFrameLimit)
// fail with ErrLongFrame, malformed frames with ErrShortFrame or
// ErrTrailer; read errors are returned as they are (io.EOF before a header,
// io.ErrUnexpectedEOF inside a frame).
func ReadFrame(r *bufio.Reader, buf []byte, max int) ([]byte, error) {
	h, err := r.Peek(4)
	if err != nil {
		if err == io.EOF && len(h) > 0 {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	l := int64(int32(binary.BigEndian.Uint32(h)))
	if l < Overhead {
		return nil, ErrShortFrame
	}
	if l-Overhead > int64(min(max, MaxFrameLimit)) {
		return nil, ErrLongFrame
	}
	n := int(l)
	var p []byte
	if n <= r.Size() {
		if p, err = r.Peek(n); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
		_, _ = r.Discard(n) // buffered: no read, p stays valid
	} else {
		if cap(buf) < n {
			buf = make([]byte, n)
		}
		p = buf[:n]
		if _, err := io.ReadFull(r, p); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
	if p[n-1] != '\n' {
		return nil, ErrTrailer
	}
	return p[4 : n-1], nil
}

// Begin starts a frame at the end of dst; finish it with End.
func Begin(dst []byte) ([]byte, int) {
	return append(dst, 0, 0, 0, 0), len(dst)
}

// End closes the frame started at start: it appends '\n' and fills in the
// length.
func End(dst []byte, start int) []byte {
	dst = append(dst, '\n')
	binary.BigEndian.PutUint32(dst[start:], uint32(len(dst)-start))
	return dst
}

// Append appends one whole frame holding the fields, separated by spaces.
func Append(dst []byte, fields ...string) []byte {
	dst, start := Begin(dst)
	for i, p := range fields {
		if i > 0 {
			dst = append(dst, ' ')
		}
		dst = append(dst, p...)
	}
	return End(dst, start)
}

// MaxFields is the most fields Split returns; the rest of the payload stays
// in the last field.
const MaxFields = 12

// Split splits payload on single spaces, as the original server does (so
// empty fields survive), into at most MaxFields fields appended to dst. The
// fields alias payload.
func Split(dst [][]byte, payload []byte) [][]byte {
	start := 0
	for i := 0; i < len(payload); i++ {
		if payload[i] == ' ' && len(dst) < MaxFields-1 {
			dst = append(dst, payload[start:i])
			start = i + 1
		}
	}
	return append(dst, payload[start:])
}

// Lower reports whether b, ASCII-lowercased, equals s (which must be
// lowercase).
func Lower(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range b {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}

// Int parses a strict decimal integer with an optional '-'. It reports false
// for anything else, including an empty field, "1.5", "1e3" and overflow.
func Int(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	neg := b[0] == '-'
	if neg {
		b = b[1:]
		if len(b) == 0 {
			return 0, false
		}
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := int64(c - '0')
		if n > (1<<63-1-d)/10 {
			return 0, false // past the range: never wrapped to the other sign
		}
		n = n*10 + d
	}
	if neg {
		n = -n
	}
	return n, true
}

// Uint parses a strict unsigned decimal integer (a fencing token). It
// reports false for anything else, including an empty field and overflow.
func Uint(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	var n uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if n > (1<<64-1-d)/10 {
			return 0, false
		}
		n = n*10 + d
	}
	return n, true
}

// Unset reports whether a numeric field was left out by the client: empty,
// or the JavaScript words "undefined", "null" and "NaN".
func Unset(b []byte) bool {
	s := string(b) // no allocation for a comparison
	return s == "" || s == "undefined" || s == "null" || s == "NaN"
}

// AppendInt appends the decimal form of n.
func AppendInt(dst []byte, n int64) []byte { return strconv.AppendInt(dst, n, 10) }

// AppendUint appends the decimal form of n.
func AppendUint(dst []byte, n uint64) []byte { return strconv.AppendUint(dst, n, 10) }
