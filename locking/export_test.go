package locking

import "github.com/mlock-dev/mlock/internal/core"

// QueueLen returns the entries of key's queue (m's namespace before it),
// holder included: for the tests that wait for a caller to be queued.
func (m *Memory) QueueLen(key string) int {
	n := 0
	m.core.Batch(func(tx *core.Tx) { n = tx.QueueLen(m.ns + key) })
	return n
}
