package core

// Busiest calls fn for the n longest queues whose resource starts with
// prefix, longest first, with at most maxEntries entries each, until fn
// returns false, and returns how many queues match prefix. It visits every
// matching queue: O(Q log n) for Q of them. See locktable.Table.Busiest.
func (tx *Tx) Busiest(prefix string, n, maxEntries int, fn func(QueueInfo) bool) int {
	return tx.c.tab.Busiest(prefix, n, maxEntries, fn)
}
