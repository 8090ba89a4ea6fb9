package locktable

import (
	"encoding/binary"
	"slices"

	"github.com/google/btree"
)

// The ordered index of queue names, which the listings (QueuesPage,
// Busiest) seek in, is kept off the hot path of Lock and Unlock:
//
//   - It exists only while listings use it. The first listing builds it
//     from the queues, in O(Q log Q) for Q queues; it is dropped again once
//     keeping it has cost more tree operations since the last listing than
//     a rebuild would (more than Q + dropSlack of them). A Table that is
//     never listed never pays for it, in time or memory.
//   - While it exists, a new queue goes into a small unsorted set of young
//     queues, in O(1), and a young queue that goes away leaves that set in
//     O(1): a lock taken and released between two listings never touches
//     the tree. The young queues move into the tree, sorted, when there are
//     youngMax of them or when a listing comes (O(youngMax log Q) at most);
//     only a queue that outlives that costs O(log Q) in the tree, to enter
//     it and to leave it.
//
// So a listing costs O(youngMax log Q + log Q + page) while listings keep
// coming, and a listing after a long pause (or the first one) rebuilds the
// index, at a cost that the tree operations it saved since the previous
// listing have paid for: amortised, the index costs O(log Q) per queue
// that lives between two listings, and nothing otherwise.
type nameIndex struct {
	tree  *btree.BTreeG[nameKey] // nil: no index
	young []*queue               // queues created since the last flush; queue.young is the position + 1
	ops   int                    // tree insertions and deletions since the last listing
	max   int                    // young queues that make a flush (youngMax; tests lower it)
	slack int                    // dropSlack (tests lower it)
}

const (
	// youngMax is the number of young queues that moves them into the tree.
	youngMax = 256
	// dropSlack is added to the number of queues to decide when the index
	// has cost more than a rebuild would, so that small tables do not
	// rebuild at every listing.
	dropSlack = 4096
)

// nameDegree is the degree of the B-tree of queue names: each node holds
// up to 2*nameDegree-1 names. Chosen by the engine benchmarks.
const nameDegree = 16

// nameKey is a queue name in the B-tree. pre, its first 8 bytes, orders
// most pairs of names without reading them: a comparison that reads the
// names costs a cache miss each in a large tree.
type nameKey struct {
	pre  uint64 // the first 8 bytes of name, big-endian, zero-padded
	name string
}

func keyOf(name string) nameKey {
	var b [8]byte
	copy(b[:], name)
	return nameKey{pre: binary.BigEndian.Uint64(b[:]), name: name}
}

// nameLess orders queue names by bytes, as <. Names that differ in their
// padded first 8 bytes are ordered by pre; if they differ at byte i there,
// either both have a byte at i, or the shorter one ends at i and is a
// prefix of the other (a padding 0 differs only from a non-zero byte). It
// is a variable so that tests can count the comparisons of a listing.
var nameLess btree.LessFunc[nameKey] = func(a, b nameKey) bool {
	if a.pre != b.pre {
		return a.pre < b.pre
	}
	return a.name < b.name
}

func nameCmp(a, b nameKey) int {
	switch {
	case nameLess(a, b):
		return -1
	case nameLess(b, a):
		return 1
	}
	return 0
}

// indexAdd records q, a new queue, in the index if there is one.
func (t *Table) indexAdd(q *queue) {
	x := &t.idx
	if x.tree == nil {
		return
	}
	if len(x.young) >= x.max {
		t.indexFlush()
		if t.indexCheck(); x.tree == nil {
			return
		}
	}
	x.young = append(x.young, q)
	q.young = int32(len(x.young))
}

// indexDel takes q, a queue about to be freed, out of the index.
func (t *Table) indexDel(q *queue) {
	x := &t.idx
	switch {
	case q.young > 0:
		i := int(q.young) - 1
		last := len(x.young) - 1
		if i != last {
			x.young[i] = x.young[last]
			x.young[i].young = int32(i + 1)
		}
		x.young[last] = nil
		x.young = x.young[:last]
		q.young = 0
	case x.tree != nil:
		x.tree.Delete(keyOf(q.name))
		x.ops++
		t.indexCheck()
	}
}

// indexFlush moves the young queues into the tree, in name order.
func (t *Table) indexFlush() {
	x := &t.idx
	if len(x.young) == 0 {
		return
	}
	slices.SortFunc(x.young, func(a, b *queue) int { return nameCmp(keyOf(a.name), keyOf(b.name)) })
	for i, q := range x.young {
		x.tree.ReplaceOrInsert(keyOf(q.name))
		q.young = 0
		x.young[i] = nil
	}
	x.ops += len(x.young)
	x.young = x.young[:0]
}

// indexCheck drops the index when keeping it has cost more tree operations
// since the last listing than a rebuild would.
func (t *Table) indexCheck() {
	x := &t.idx
	if x.ops <= t.queueCount()+x.slack {
		return
	}
	for i, q := range x.young {
		q.young = 0
		x.young[i] = nil
	}
	x.young = x.young[:0]
	x.tree = nil
	x.ops = 0
}

// index returns the ordered index of every queue's name, building it if
// there is none and moving the young queues into it.
func (t *Table) index() *btree.BTreeG[nameKey] {
	x := &t.idx
	if x.tree == nil {
		keys := make([]nameKey, 0, t.queueCount())
		for name, q := range t.queues {
			if q.parked == 0 {
				keys = append(keys, keyOf(name))
			}
		}
		slices.SortFunc(keys, nameCmp)
		x.tree = btree.NewG(nameDegree, nameLess)
		for _, k := range keys {
			x.tree.ReplaceOrInsert(k)
		}
	}
	t.indexFlush()
	x.ops = 0 // a listing: the index is in use
	return x.tree
}
