package locktable

import "github.com/mlock-dev/mlock/internal/protocol"

// ID identifies one lock request: the wire vocabulary's protocol.ID, 128
// bits (the lock's slot in the table and 96 bits from a ChaCha8 generator
// seeded from crypto/rand, so unguessable), 32 lowercase hex digits on the
// wire.
type ID = protocol.ID

// NoID is the zero ID, which no lock ever has: Extend, Unlock and Lookup
// of it find nothing. Extending it counts a failed extend (Stats.ExtendFails)
// for a request that names no lock at all, such as a malformed lock id.
var NoID = protocol.NoID

// IDLen is the length of an ID's text form.
const IDLen = protocol.IDLen

// ParseID parses the 32-hex-digit form of an ID; see protocol.ParseID.
func ParseID(b []byte) (ID, bool) { return protocol.ParseID(b) }
