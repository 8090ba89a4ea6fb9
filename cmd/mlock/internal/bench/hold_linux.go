package bench

import (
	"syscall"
	"time"
)

// hold emulates holding a lock for d. It sleeps in nanosleep(2) rather than
// time.Sleep: Go's timer-driven sleep can wake up to a millisecond late in a
// process whose network poller is busy (measured: a 1 ms Sleep lasting 1.31 ms
// on average in the client, 1.12 ms in an idle process), which would charge
// the load generator's own inaccuracy to network targets.
func hold(d time.Duration) {
	ts := syscall.NsecToTimespec(int64(d))
	for {
		var rem syscall.Timespec
		if err := syscall.Nanosleep(&ts, &rem); err != syscall.EINTR {
			return
		}
		ts = rem
	}
}
