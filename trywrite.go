package mlock

import (
	"net"

	"github.com/mlock-dev/mlock/internal/rawio"
)

// tryWriter returns a write to nc that never blocks: it writes what the
// socket takes at once and returns its length (0 when the socket's buffer
// is full). ok is false when nc offers no such write (TLS, or a platform
// without raw system calls: the writer goroutine then writes everything).
func tryWriter(nc net.Conn) (w func([]byte) (int, error), ok bool) {
	raw, ok := rawio.New(nc)
	if !ok {
		return nil, false
	}
	return raw.TryWrite, true
}
