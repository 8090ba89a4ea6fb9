package mlock

// SetMaxPending sets the most bytes of commands a session queues for one
// connection, for the sessions started afterwards, and returns a function
// that restores the default.
func SetMaxPending(n int) (restore func()) {
	old := maxPending
	maxPending = n
	return func() { maxPending = old }
}
