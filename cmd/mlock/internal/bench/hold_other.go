//go:build !linux

package bench

import "time"

// hold emulates holding a lock for d.
func hold(d time.Duration) { time.Sleep(d) }
