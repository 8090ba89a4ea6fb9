package locktable

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// The snapshot format. A snapshot is
//
//	"mlkt" version
//	now next seq hold [holdUntil] stats×11 len(rng) rng
//	len(slots) len(free) free...
//	len(locks) lock...    oldest (lowest seq) first
//	len(sessions) session...    by id
//
// with unsigned integers as uvarints, signed ones as (zigzag) varints,
// strings and byte strings as a uvarint length and the bytes. A lock is
//
//	id (16 bytes) seq-previous seq flags owner ttl created-now deadline-now
//	token len(resources) resource...
//
// where a resource is 0 and its name when the lock heads its queue (it is
// the queue's oldest entry), else 1 + the number of that queue among the
// queues named so far; queues list their requests in arrival order, so the
// order of the locks gives every queue's order. A lock whose flags have
// snapModes (version 2) follows each resource with its mode, permits and
// of as uvarints; without it every resource is exclusive. Which entries
// are admitted follows from the order and the modes. A session is
//
//	id state [graceEnd-now detachSeq] len(locks) slot...
//
// with its locks as the slots of their ids, newest in the session first.
// Everything else (counts, owners, the order of owners' locks, the deadline
// heap, the index of queue names) is derived on Restore. granted-now, the
// time a granted lock was granted, follows its token in version 2 only:
// Restore reads version 1 too (every resource exclusive), whose granted
// locks then have no grant time (0).
const (
	snapshotMagic   = "mlkt"
	snapshotVersion = 2 // 2: modes and grant times; version 1 (all exclusive, no grant times) still restores
)

// Lock flags in a snapshot.
const (
	snapGranted uint8 = 1 << iota
	snapNoReentry
	snapPartial
	snapRevoked
	snapTimer // the lock's deadline is pending (an expiry or a wait timeout)
	snapModes // version 2: a resource is followed by its mode
	snapAll   = snapGranted | snapNoReentry | snapPartial | snapRevoked | snapTimer | snapModes
)

// Session states in a snapshot.
const (
	snapAttached uint8 = iota
	snapDetached       // in its grace period
)

// ErrCorruptSnapshot is returned (wrapped, with what is wrong) by Restore for
// data that is not a whole, consistent snapshot.
var ErrCorruptSnapshot = errors.New("locktable: corrupt snapshot")

// MarshalBinary returns a snapshot of the whole state of the Table: every
// live request (with its id, session, owner, flags, lease, times, token and
// resources), every queue's order, the sessions and their grace periods,
// the hold on grants, the fencing token counter, the counters of Stats, the
// latest time seen, the slots of lock ids and the state of the generator of
// lock ids. Restore makes a Table of it that behaves exactly like this one.
// The snapshot is canonical: two Tables that went through the same calls
// give the same bytes. It costs O(n + S log S) time and O(n) memory for n
// live requests and S sessions. The error is always nil.
func (t *Table) MarshalBinary() ([]byte, error) {
	return t.AppendBinary(make([]byte, 0, 64+56*t.live))
}

// AppendBinary appends the snapshot of MarshalBinary to b.
func (t *Table) AppendBinary(b []byte) ([]byte, error) {
	return t.appendVersion(b, snapshotVersion)
}

// appendVersion appends a snapshot in format version (1 or 2; 1 for tests,
// and only of a table whose requests are all exclusive).
func (t *Table) appendVersion(b []byte, version uint64) ([]byte, error) {
	b = append(b, snapshotMagic...)
	b = binary.AppendUvarint(b, version)
	b = binary.AppendVarint(b, t.now)
	b = binary.AppendUvarint(b, t.next)
	b = binary.AppendUvarint(b, t.seq)
	if t.holding() {
		b = append(b, 1)
		b = binary.AppendVarint(b, t.holdUntil)
	} else {
		b = append(b, 0)
	}
	for _, v := range t.counters() {
		b = binary.AppendUvarint(b, *v)
	}
	rng, err := t.rng.MarshalBinary()
	if err != nil {
		return nil, err
	}
	b = appendBytes(b, rng)

	b = binary.AppendUvarint(b, uint64(len(t.slots)))
	b = binary.AppendUvarint(b, uint64(len(t.freeIdx)))
	for _, idx := range t.freeIdx {
		b = binary.AppendUvarint(b, uint64(idx))
	}

	// Oldest first: t.all is newest first.
	locks := make([]*lock, 0, t.live)
	for l := t.all; l != nil; l = l.anext {
		locks = append(locks, l)
	}
	slices.Reverse(locks)
	b = binary.AppendUvarint(b, uint64(len(locks)))
	var refs map[*queue]uint64 // numbers of the queues with more than one entry
	nq, seq := uint64(0), uint64(0)
	for _, l := range locks {
		b = append(b, l.id[:]...)
		b = binary.AppendUvarint(b, l.seq-seq)
		seq = l.seq
		f := t.snapFlags(l)
		b = append(b, f)
		b = appendBytes(b, l.owner())
		b = binary.AppendVarint(b, int64(l.ttl))
		b = binary.AppendVarint(b, l.created-t.now)
		b = binary.AppendVarint(b, l.deadline-t.now)
		b = binary.AppendUvarint(b, l.token)
		if l.state == stateGranted && version >= 2 {
			b = binary.AppendVarint(b, l.granted-t.now)
		}
		b = binary.AppendUvarint(b, uint64(l.live))
		nds := l.nodes()
		for i := range nds {
			n := &nds[i]
			q := n.q
			switch {
			case q == nil:
				continue // a duplicate, or released
			case q.head == n:
				b = append(b, 0)
				b = appendBytes(b, q.name)
				if q.n > 1 {
					if refs == nil {
						refs = make(map[*queue]uint64)
					}
					refs[q] = nq
				}
				nq++
			default:
				b = binary.AppendUvarint(b, refs[q]+1)
			}
			if f&snapModes != 0 {
				m := q.mode(n)
				b = binary.AppendUvarint(b, uint64(m.Permits))
				b = binary.AppendUvarint(b, uint64(m.Of))
			}
		}
	}

	return t.appendSessions(b), nil
}

// appendSessions appends the sessions, in id order, each with its state
// and the slots of its locks.
func (t *Table) appendSessions(b []byte) []byte {
	ids := make([]string, 0, len(t.sessions))
	for id := range t.sessions {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	b = binary.AppendUvarint(b, uint64(len(ids)))
	for _, id := range ids {
		s := t.sessions[id]
		b = appendBytes(b, id)
		if s.timed() {
			b = append(b, snapDetached)
			b = binary.AppendVarint(b, t.heap[s.tm.hidx].at-t.now)
			b = binary.AppendUvarint(b, s.tm.seq)
		} else {
			b = append(b, snapAttached)
		}
		b = binary.AppendUvarint(b, uint64(s.n))
		for l := s.head; l != nil; l = l.snext {
			b = binary.AppendUvarint(b, uint64(slotOf(l.id)))
		}
	}
	return b
}

// counters returns the counters of Stats that a snapshot keeps, in its
// order.
func (t *Table) counters() [11]*uint64 {
	s := &t.stats
	return [...]*uint64{&s.Requests, &s.Refused, &s.Granted, &s.TimedOut, &s.Expired, &s.Unlocked,
		&s.Extended, &s.ExtendFails, &s.Dropped, &s.Evicted, &s.ServerFull}
}

func (t *Table) snapFlags(l *lock) uint8 {
	var f uint8
	if l.state == stateGranted {
		f |= snapGranted
	}
	if l.flags&flagNoReentry != 0 {
		f |= snapNoReentry
	}
	if l.flags&flagPartial != 0 {
		f |= snapPartial
	}
	if l.flags&flagRevoked != 0 {
		f |= snapRevoked
	}
	if l.hidx >= 0 {
		f |= snapTimer
	}
	nds := l.nodes()
	for i := range nds {
		if nds[i].q != nil && nds[i].permits != 0 {
			f |= snapModes
			break
		}
	}
	return f
}

func appendBytes[S string | []byte](b []byte, s S) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// slotOf returns the slot index that id embeds.
func slotOf(id ID) uint32 {
	return uint32(id[0]) | uint32(id[1])<<8 | uint32(id[2])<<16 | uint32(id[3])<<24
}

// Restore returns a Table holding the state of data, a snapshot made by
// MarshalBinary. The limits, the session grace and OnEvent come from cfg;
// its Seed, FirstToken and GrantAfter are ignored: the generator of lock
// ids, the token counter and the hold on grants come from the snapshot.
// Nothing is reported through OnEvent. A Table restored from a snapshot of
// another behaves exactly like it, given the same Config, from then on.
// Limits lower than the snapshot's state refuse only new requests.
//
// It returns cfg's error (see Config.Validate), an error for an unknown
// version, or one wrapping ErrCorruptSnapshot for data that is not a whole,
// consistent snapshot; it never panics, whatever data holds. It costs
// O(n log n) time and O(n) memory for n live requests, and allocates
// nothing out of proportion to len(data).
func Restore(cfg Config, data []byte) (*Table, error) {
	t, err := newTable(cfg)
	if err != nil {
		return nil, err
	}
	if !strings.HasPrefix(string(data), snapshotMagic) {
		return nil, fmt.Errorf("%w: not a lock table snapshot", ErrCorruptSnapshot)
	}
	d := &decoder{b: data[len(snapshotMagic):]}
	v := d.uvarint("version")
	if d.err == nil && (v < 1 || v > snapshotVersion) {
		return nil, fmt.Errorf("locktable: snapshot version %d is not supported (want 1 to %d)", v, snapshotVersion)
	}
	d.version = v
	if err := t.decode(d); err != nil {
		return nil, err
	}
	return t, nil
}

// decode fills the empty Table t from d.
func (t *Table) decode(d *decoder) error {
	t.now = d.varint("now")
	t.next = d.uvarint("token counter")
	t.seq = d.uvarint("seq")
	switch d.byte("hold") {
	case 0:
	case 1:
		d.hold = true
		t.holdUntil = d.varint("hold")
	default:
		d.fail("hold")
	}
	for _, v := range t.counters() {
		*v = d.uvarint("stats")
	}
	rng := d.bytes(d.count("generator"), "generator")
	if d.err != nil {
		return d.err
	}
	t.rng = new(rand.ChaCha8)
	if t.next == 0 || t.rng.UnmarshalBinary(rng) != nil {
		return fmt.Errorf("%w: generator or token counter", ErrCorruptSnapshot)
	}

	if err := t.decodeLocks(d); err != nil {
		return err
	}
	if err := t.decodeSessions(d); err != nil {
		return err
	}
	if d.err != nil {
		return d.err
	}
	if len(d.b) != 0 {
		return d.fail("trailing bytes")
	}
	for l := t.all; l != nil; l = l.anext {
		if l.sess == nil {
			return d.fail("lock without a session")
		}
	}
	if d.hold {
		t.heap = append(t.heap, deadline{at: t.holdUntil, l: t.hold.tm})
	}
	t.heap.init()
	if t.holding() {
		// Every waiting request at the head of all its queues, in arrival
		// order (t.all is newest first).
		for l := t.all; l != nil; l = l.anext {
			if l.state == stateWaiting && l.waiting == 0 {
				t.ready = append(t.ready, readyLock{l: l, id: l.id})
			}
		}
		slices.Reverse(t.ready)
	}
	return nil
}

// decodeLocks decodes the slots and the locks of a snapshot.
func (t *Table) decodeLocks(d *decoder) error {
	// Slots: each is free or holds one lock; free marks the free ones
	// until the locks are in.
	var free lock
	t.slots = make([]*lock, d.count("slots"))
	t.freeIdx = make([]uint32, d.count("free slots"))
	for i := range t.freeIdx {
		idx := d.uvarint("free slot")
		if d.err != nil || idx >= uint64(len(t.slots)) || t.slots[idx] != nil {
			return d.fail("free slot")
		}
		t.slots[idx] = &free
		t.freeIdx[i] = uint32(idx)
	}

	nlocks := d.count("locks")
	t.queues = make(map[string]*queue, nlocks)
	var queues []*queue // by number
	seq := uint64(0)
	for range nlocks {
		if err := t.decodeLock(d, &seq, &queues); err != nil {
			return err
		}
	}
	if seq > t.seq {
		return d.fail("seq")
	}
	for i, l := range t.slots {
		switch l {
		case nil:
			return d.fail("slots")
		case &free:
			t.slots[i] = nil
		}
	}

	return nil
}

// decodeSessions decodes the sessions of a snapshot and puts their locks
// in them.
func (t *Table) decodeSessions(d *decoder) error {
	nsess := d.count("sessions")
	prev := ""
	for i := range nsess {
		id := d.string("session")
		if d.err != nil || i > 0 && id <= prev {
			return d.fail("session order")
		}
		prev = id
		s := t.newSession(id)
		switch d.byte("session state") {
		case snapAttached:
		case snapDetached:
			s.attached = false
			at := t.now + d.varint("grace")
			tm := s.timer()
			tm.seq = d.uvarint("detach seq")
			if tm.seq > t.seq {
				return d.fail("detach seq")
			}
			t.heap = append(t.heap, deadline{at: at, l: tm})
		default:
			return d.fail("session state")
		}
		n := d.count("session locks")
		mine := make([]*lock, n)
		for j := range mine {
			idx := d.uvarint("session lock")
			if d.err != nil || idx >= uint64(len(t.slots)) || t.slots[idx] == nil || t.slots[idx].sess != nil {
				return d.fail("session lock")
			}
			mine[j] = t.slots[idx]
			mine[j].sess = s // marks it as taken until s.add
		}
		for _, l := range slices.Backward(mine) {
			s.add(l)
			b := t.sizeOf(l)
			s.bytes += b
		}
		t.sessions[id] = s
	}
	return nil
}

// decodeLock decodes one lock, the next in arrival order after *seq, into
// its slot, its queues (numbered in queues) and the heap.
func (t *Table) decodeLock(d *decoder, seq *uint64, queues *[]*queue) error {
	var id ID
	copy(id[:], d.bytes(len(id), "id"))
	delta := d.uvarint("seq")
	f := d.byte("flags")
	owner := d.string("owner")
	ttl := d.varint("ttl")
	created := t.now + d.varint("created")
	dl := t.now + d.varint("deadline")
	token := d.uvarint("token")
	granted := f&snapGranted != 0
	var grantedAt int64
	if granted && d.version >= 2 {
		grantedAt = t.now + d.varint("granted")
	}
	nres := d.count("resources")
	idx := slotOf(id)
	switch {
	case d.err != nil:
		return d.err
	case idx >= uint32(len(t.slots)) || t.slots[idx] != nil:
		return d.fail("lock slot")
	case delta == 0 || *seq+delta < *seq:
		return d.fail("lock seq")
	case f&^snapAll != 0, !granted && f&(snapPartial|snapRevoked) != 0, granted && f&snapTimer == 0,
		d.version < 2 && f&snapModes != 0:
		return d.fail("lock flags")
	case ttl <= 0, nres == 0:
		return d.fail("lock")
	case granted && (token == 0 || token >= t.next), !granted && token != 0:
		return d.fail("lock token")
	}
	*seq += delta

	// As newLock, but in the given slot under the given id.
	l := &lock{id: id, hidx: -1, seq: *seq, token: token, ttl: time.Duration(ttl),
		created: created, granted: grantedAt, deadline: dl}
	l.setOwner(owner)
	l.setNodes(nres)
	t.slots[idx] = l
	l.anext = t.all
	if t.all != nil {
		t.all.aprev = l
	}
	t.all = l
	t.live++
	if granted {
		l.state = stateGranted
		t.held++
	}
	if f&snapNoReentry != 0 {
		l.flags |= flagNoReentry
	}
	if f&snapPartial != 0 {
		l.flags |= flagPartial
	}
	if f&snapRevoked != 0 {
		l.flags |= flagRevoked
	}
	b, err := t.decodeNodes(d, l, f&snapModes != 0, queues)
	if err != nil {
		return err
	}
	b += int64(len(owner))
	t.entries += int(l.live)
	t.bytes += b
	if owner != "" {
		t.ownerAdd(l)
	}
	switch {
	case granted && l.waiting != 0:
		return d.fail("granted lock behind another")
	case !granted && l.waiting == 0 && !d.hold:
		return d.fail("grantable lock not granted")
	}
	if f&snapTimer != 0 {
		t.heap = append(t.heap, deadline{at: dl, l: l})
	}
	return nil
}

// decodeNodes decodes the resources of l (and their modes if modes is
// set), queues l on them and returns their name bytes. queues are the
// queues decoded so far, by number.
func (t *Table) decodeNodes(d *decoder, l *lock, modes bool, queues *[]*queue) (int64, error) {
	b := int64(0)
	shared := false // some resource is not exclusive
	nds := l.nodes()
	for i := range nds {
		var q *queue
		if ref := d.uvarint("resource"); ref == 0 {
			name := d.string("resource")
			if d.err != nil || CheckName(name, 0) != nil {
				return 0, d.fail("resource")
			}
			nq := len(t.queues)
			if q = t.newQueue(name); len(t.queues) == nq {
				return 0, d.fail("resource in two queues")
			}
			*queues = append(*queues, q)
		} else {
			if d.err != nil || ref > uint64(len(*queues)) {
				return 0, d.fail("resource")
			}
			q = (*queues)[ref-1]
			if q.tail.l == l {
				return 0, d.fail("resource named twice")
			}
		}
		var m Mode
		if modes {
			p, of := d.uvarint("mode"), d.uvarint("mode")
			m = Mode{Permits: uint32(p), Of: uint32(of)}
			if d.err != nil || p > MaxPermits || of > MaxPermits || !m.Valid() ||
				m.Permits > 0 && q.nshared > 0 && q.of != m.Of {
				return 0, d.fail("mode")
			}
		}
		n := &nds[i]
		n.l = l
		t.enqueue(q, n, m)
		b += int64(len(q.name))
		shared = shared || m.Permits > 0
	}
	if modes && !shared {
		return 0, d.fail("modes of an exclusive lock") // one encoding per snapshot
	}
	return b, nil
}

// decoder reads a snapshot. Its first error sticks: later reads return
// zero values.
type decoder struct {
	b       []byte
	err     error
	hold    bool   // grants are held
	version uint64 // of the snapshot
}

// fail records that the snapshot is corrupt at what, and returns the error.
func (d *decoder) fail(what string) error {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrCorruptSnapshot, what)
	}
	return d.err
}

func (d *decoder) uvarint(what string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 || n > 1 && d.b[n-1] == 0 { // only the shortest form: one encoding per snapshot
		d.fail(what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint(what string) int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 || n > 1 && d.b[n-1] == 0 {
		d.fail(what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) byte(what string) byte {
	if d.err != nil || len(d.b) == 0 {
		d.fail(what)
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

// count reads the number of items that follow, each of which takes at
// least one byte, so that no count makes Restore allocate beyond the
// data's size.
func (d *decoder) count(what string) int {
	n := d.uvarint(what)
	if d.err == nil && n > uint64(len(d.b)) {
		d.fail(what)
	}
	if d.err != nil {
		return 0
	}
	return int(n)
}

func (d *decoder) bytes(n int, what string) []byte {
	if d.err != nil || n > len(d.b) {
		d.fail(what)
		return nil
	}
	p := d.b[:n]
	d.b = d.b[n:]
	return p
}

func (d *decoder) string(what string) string { return string(d.bytes(d.count(what), what)) }
