//go:build !unix

package mlock

import "net"

// tryWriter reports that this platform has no non-blocking write: the
// writer goroutine writes everything.
func tryWriter(net.Conn) (func([]byte) (int, error), bool) { return nil, false }
