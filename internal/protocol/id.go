package protocol

import "encoding/hex"

// ID identifies one lock request. It is 128 random bits from a
// cryptographically strong generator, so it cannot be guessed; it travels on
// the wire as 32 lowercase hex digits.
type ID [16]byte

// NoID is the zero ID, which no lock ever has.
var NoID ID

// IDLen is the length of an ID's text form.
const IDLen = 2 * len(ID{})

// String returns the 32-character hex form of id.
func (id ID) String() string { return string(id.AppendText(nil)) }

// AppendText appends the hex form of id to b and returns the extended buffer.
func (id ID) AppendText(b []byte) []byte {
	const digits = "0123456789abcdef"
	for _, c := range id {
		b = append(b, digits[c>>4], digits[c&0x0f])
	}
	return b
}

// Short returns 8 hex digits of id's random part: enough to tell locks
// apart in a listing, not enough to act on one.
func (id ID) Short() string { return string(id.AppendText(make([]byte, 0, IDLen))[8:16]) }

// ParseID parses the 32-hex-digit form of an ID. It accepts lowercase and
// uppercase digits and reports false for anything else.
func ParseID(b []byte) (ID, bool) {
	var id ID
	if len(b) != IDLen {
		return id, false
	}
	if _, err := hex.Decode(id[:], b); err != nil {
		return id, false
	}
	return id, true
}
