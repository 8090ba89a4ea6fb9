package mlock

import "time"

// SetMaxPending sets the most bytes of commands a session queues for one
// connection, for the sessions started afterwards, and returns a function
// that restores the default.
func SetMaxPending(n int) (restore func()) {
	old := maxPending
	maxPending = n
	return func() { maxPending = old }
}

// SetWokenWait sets how long a session's reader waits for the callers it
// answered to send again, for the sessions started afterwards, and returns
// a function that restores the default.
func SetWokenWait(d time.Duration) (restore func()) {
	old := wokenWait
	wokenWait = d
	return func() { wokenWait = old }
}

// Backoff returns the state of the reader's back-off (see endBatch): the
// reads left to end without waiting, and the waits in a row that ran out.
func (c *Client) Backoff() (skipWaits, misses int) {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	return c.s.skipWaits, c.s.misses
}
