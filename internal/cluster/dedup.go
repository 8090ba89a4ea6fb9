package cluster

import (
	"encoding/binary"
	"errors"
)

// DefaultDedupWindow is Dedup's default window: the results of the last 65536 keyed commands.
const DefaultDedupWindow = 1 << 16

// DedupCommand frames cmd for a Dedup: (client, seq) is its de-duplication key. An empty client means
// no key: the command is applied every time it is proposed. A retry of a command whose outcome is
// unknown must use the same client, seq and cmd.
func DedupCommand(client string, seq uint64, cmd []byte) []byte {
	b := make([]byte, 0, 2*binary.MaxVarintLen64+len(client)+len(cmd))
	b = appendBytes(b, []byte(client))
	b = binary.AppendUvarint(b, seq)
	return append(b, cmd...)
}

// ParseDedupCommand splits a DedupCommand frame; cmd aliases p.
func ParseDedupCommand(p []byte) (client string, seq uint64, cmd []byte, err error) {
	c, rest, ok := readBytes(p)
	if !ok {
		return "", 0, nil, errCorrupt
	}
	seq, k := binary.Uvarint(rest)
	if k <= 0 {
		return "", 0, nil, errCorrupt
	}
	return string(c), seq, rest[k:], nil
}

// Dedup is a StateMachine that makes keyed commands exactly-once: it applies each (client, seq) key
// once and answers a repeat with the remembered result, without applying it again. It remembers the
// last Window keyed results in apply order (older ones are forgotten: a repeat of those is applied
// again, so the window must outlast any client's retries). The window is part of the snapshot, so
// every node and every restored state deduplicates alike.
//
// Commands must be DedupCommand frames; one that does not parse is not applied and gets a nil result.
// Like any StateMachine it is driven by one goroutine (the Node's); it is not safe for other
// concurrent use.
type Dedup struct {
	sm     StateMachine
	window int
	base   int // NewDedup's window: the one an older snapshot, without its window, restores with

	results map[dedupKey][]byte
	order   []dedupKey // ring of the remembered keys, oldest at head
	head    int
}

type dedupKey struct {
	client string
	seq    uint64
}

// NewDedup wraps sm. window <= 0 means DefaultDedupWindow.
func NewDedup(sm StateMachine, window int) *Dedup {
	if window <= 0 {
		window = DefaultDedupWindow
	}
	return &Dedup{sm: sm, window: window, base: window, results: make(map[dedupKey][]byte)}
}

// Window returns the window in force.
func (d *Dedup) Window() int { return d.window }

// SetWindow changes the window (<= 0: DefaultDedupWindow) for the results
// that come next; a smaller one forgets the oldest results beyond it at
// once. A replicated state machine calls it from its Apply (the Node's
// goroutine) when a command of the log changes it, at the same point on
// every node. The window is part of the snapshot.
func (d *Dedup) SetWindow(window int) {
	if window <= 0 {
		window = DefaultDedupWindow
	}
	if window == d.window {
		return
	}
	order := make([]dedupKey, 0, min(len(d.order), window))
	n := len(d.order)
	for i := range n {
		k := d.order[(d.head+i)%n]
		if n-i > window {
			delete(d.results, k)
			continue
		}
		order = append(order, k)
	}
	d.window, d.order, d.head = window, order, 0
}

// Apply applies the new commands of the batch (in one call of the wrapped Apply, even when none is
// new, so ticks and deadlines still run at now) and answers repeats from the window. A key repeated
// within one batch is applied once; both get its result.
func (d *Dedup) Apply(now int64, cmds [][]byte) [][]byte {
	res := make([][]byte, len(cmds))
	var (
		inner  [][]byte
		pos    []int      // pos[k]: index in cmds of inner[k]
		keys   []dedupKey // keys[k]: key of inner[k]
		keyed  []bool
		first  map[dedupKey]int // key → index in inner, within this batch
		copies [][2]int         // (index in cmds, index in inner) of in-batch repeats
	)
	for i, c := range cmds {
		client, seq, body, err := ParseDedupCommand(c)
		if err != nil {
			continue
		}
		k := dedupKey{client, seq}
		if client != "" {
			if r, ok := d.results[k]; ok {
				res[i] = r
				continue
			}
			if j, ok := first[k]; ok {
				copies = append(copies, [2]int{i, j})
				continue
			}
			if first == nil {
				first = make(map[dedupKey]int)
			}
			first[k] = len(inner)
		}
		inner = append(inner, body)
		pos = append(pos, i)
		keys = append(keys, k)
		keyed = append(keyed, client != "")
	}
	out := d.sm.Apply(now, inner)
	for j, r := range out {
		res[pos[j]] = r
		if keyed[j] {
			d.remember(keys[j], r)
		}
	}
	for _, c := range copies {
		res[c[0]] = out[c[1]]
	}
	return res
}

func (d *Dedup) remember(k dedupKey, r []byte) {
	if len(d.order) < d.window {
		d.order = append(d.order, k)
	} else {
		delete(d.results, d.order[d.head])
		d.order[d.head] = k
		d.head = (d.head + 1) % len(d.order)
	}
	d.results[k] = r
}

// Snapshot layout: magic "MLDD" 2, uvarint window, uvarint count, count × (client, uvarint seq,
// result with a uvarint len+1 prefix, 0 = nil), oldest first, then the wrapped snapshot to the end.
// Version 1 has no window: it restores with NewDedup's.
const (
	dedupMagic   = "MLDD\x02"
	dedupMagicV1 = "MLDD\x01"
)

// Snapshot returns the window and the wrapped state machine's snapshot.
func (d *Dedup) Snapshot() ([]byte, error) {
	inner, err := d.sm.Snapshot()
	if err != nil {
		return nil, err
	}
	b := binary.AppendUvarint([]byte(dedupMagic), uint64(d.window))
	b = binary.AppendUvarint(b, uint64(len(d.order)))
	for i := range d.order {
		k := d.order[(d.head+i)%len(d.order)]
		b = appendBytes(b, []byte(k.client))
		b = binary.AppendUvarint(b, k.seq)
		r := d.results[k]
		if r == nil {
			b = binary.AppendUvarint(b, 0)
		} else {
			b = binary.AppendUvarint(b, uint64(len(r))+1)
			b = append(b, r...)
		}
	}
	return append(b, inner...), nil
}

// Restore replaces the window, its size included, and the wrapped state with a snapshot's. An
// older snapshot, without its size, restores with NewDedup's and keeps only the newest keys that fit.
func (d *Dedup) Restore(snap []byte) error {
	var window int
	var p []byte
	switch {
	case len(snap) >= len(dedupMagic) && string(snap[:len(dedupMagic)]) == dedupMagic:
		p = snap[len(dedupMagic):]
		w, k := binary.Uvarint(p)
		if k <= 0 || w == 0 || w > 1<<40 {
			return errCorrupt
		}
		window, p = int(w), p[k:]
	case len(snap) >= len(dedupMagicV1) && string(snap[:len(dedupMagicV1)]) == dedupMagicV1:
		window, p = d.base, snap[len(dedupMagicV1):]
	default:
		return errors.New("cluster: not a Dedup snapshot")
	}
	n, k := binary.Uvarint(p)
	if k <= 0 || n > uint64(len(p)) {
		return errCorrupt
	}
	p = p[k:]
	results := make(map[dedupKey][]byte, min(int(n), window))
	order := make([]dedupKey, 0, min(int(n), window))
	for range n {
		c, rest, ok := readBytes(p)
		if !ok {
			return errCorrupt
		}
		seq, k1 := binary.Uvarint(rest)
		if k1 <= 0 {
			return errCorrupt
		}
		rest = rest[k1:]
		l, k2 := binary.Uvarint(rest)
		if k2 <= 0 || l > uint64(len(rest)-k2)+1 {
			return errCorrupt
		}
		rest = rest[k2:]
		var r []byte
		if l > 0 {
			r = append([]byte{}, rest[:l-1]...)
			rest = rest[l-1:]
		}
		key := dedupKey{string(c), seq}
		if _, dup := results[key]; dup {
			return errCorrupt
		}
		order = append(order, key)
		results[key] = r
		p = rest
	}
	if drop := len(order) - window; drop > 0 {
		for _, key := range order[:drop] {
			delete(results, key)
		}
		order = append([]dedupKey(nil), order[drop:]...)
	}
	if err := d.sm.Restore(p); err != nil {
		return err
	}
	d.results, d.order, d.head, d.window = results, order, 0, window
	return nil
}
