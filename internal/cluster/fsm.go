package cluster

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"
)

// Log entry layout (all integers big-endian or uvarint):
//
//	kind   byte     entryBatch or entryLeader
//	now    8 bytes  the leader's Unix ns
//	[entryLeader only] uvarint len + leader id, uvarint len + leader client address
//	count  uvarint  number of commands
//	count × (uvarint len + command bytes)
const (
	entryBatch  byte = 1
	entryLeader byte = 2
)

// errCorrupt reports a log entry or snapshot that does not decode.
var errCorrupt = errors.New("cluster: corrupt log entry or snapshot")

// entry is one decoded log entry.
type entry struct {
	kind     byte
	now      int64
	leaderID string // entryLeader
	client   string // entryLeader
	cmds     [][]byte
}

// appendEntry encodes e onto dst.
func appendEntry(dst []byte, e *entry) []byte {
	dst = append(dst, e.kind)
	dst = binary.BigEndian.AppendUint64(dst, uint64(e.now))
	if e.kind == entryLeader {
		dst = appendBytes(dst, []byte(e.leaderID))
		dst = appendBytes(dst, []byte(e.client))
	}
	dst = binary.AppendUvarint(dst, uint64(len(e.cmds)))
	for _, c := range e.cmds {
		dst = appendBytes(dst, c)
	}
	return dst
}

// entrySize is the encoded size of a batch entry with cmds (an upper bound for the leader form too,
// without its two strings).
func entrySize(cmds [][]byte) int {
	n := 1 + 8 + binary.MaxVarintLen64
	for _, c := range cmds {
		n += binary.MaxVarintLen64 + len(c)
	}
	return n
}

// decodeEntry decodes p. The commands alias p.
func decodeEntry(p []byte) (entry, error) {
	var e entry
	if len(p) < 9 {
		return e, errCorrupt
	}
	e.kind = p[0]
	if e.kind != entryBatch && e.kind != entryLeader {
		return e, errCorrupt
	}
	e.now = int64(binary.BigEndian.Uint64(p[1:9]))
	p = p[9:]
	var ok bool
	if e.kind == entryLeader {
		var id, client []byte
		if id, p, ok = readBytes(p); !ok {
			return e, errCorrupt
		}
		if client, p, ok = readBytes(p); !ok {
			return e, errCorrupt
		}
		e.leaderID, e.client = string(id), string(client)
	}
	n, k := binary.Uvarint(p)
	if k <= 0 || n > uint64(len(p)) {
		return e, errCorrupt
	}
	p = p[k:]
	if n > 0 {
		e.cmds = make([][]byte, n)
	}
	for i := range e.cmds {
		if e.cmds[i], p, ok = readBytes(p); !ok {
			return e, errCorrupt
		}
	}
	if len(p) != 0 {
		return e, errCorrupt
	}
	return e, nil
}

func appendBytes(dst, b []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}

// readBytes reads one length-prefixed byte string (aliasing p) and returns the rest.
func readBytes(p []byte) (b, rest []byte, ok bool) {
	n, k := binary.Uvarint(p)
	if k <= 0 || n > uint64(len(p)-k) {
		return nil, p, false
	}
	p = p[k:]
	return p[:n:n], p[n:], true
}

// applyResult is what the FSM returns to raft for one log entry; the leader's Propose picks its
// command's result out of it.
type applyResult struct {
	results [][]byte
	err     error // the entry did not decode: a bug, reported to the proposers
}

// fsm adapts a StateMachine to raft.BatchingFSM. raft calls Apply, ApplyBatch, Snapshot and Restore
// from one goroutine, in log order.
type fsm struct {
	sm StateMachine
	// applied (cap 1) is poked after an applied entry when the leader's tick may be due earlier than
	// its timer is set for (the leader then re-arms it): when nextDeadline is nil, after every one;
	// else when the state machine's next deadline is earlier than armed, the deadline the leader's
	// timer is set for (math.MinInt64 while this node does not lead: never; math.MaxInt64 while
	// the leader's timer is stopped). A deadline that moves later needs no poke: the timer fires
	// early and is set again.
	applied      chan struct{}
	nextDeadline func() (int64, bool)
	armed        atomic.Int64

	mu sync.Mutex
	// lastNow is the time of the last applied entry (never decreases); guarded by mu.
	lastNow int64
	// leaderID and leaderClient come from the last applied leader entry; guarded by mu.
	leaderID, leaderClient string
	// onLeaderInfo is called (without mu) when a leader entry is applied.
	onLeaderInfo func()

	// index is the index of the last entry given to the state machine (commands and configurations:
	// raft keeps its no-op and barrier entries to itself), stored once it was applied; advanced is
	// closed and replaced when it moves and someone waits (see waitApplied). Guarded by imu.
	imu      sync.Mutex
	index    uint64
	advanced chan struct{}

	// opened counts the snapshots open for reading (indexedSnaps), and openedAt is the index of the
	// last one opened: the index of the snapshot Restore reads, when it is the only one open (a
	// leader may read one at the same time to send it; guarded by imu).
	opened   int
	openedAt uint64
}

// at tells the state machine, if it wants to know (IndexedStateMachine), the raft index of what it
// is given next.
func (f *fsm) at(index uint64) {
	if ism, ok := f.sm.(IndexedStateMachine); ok {
		ism.At(index)
	}
}

// restoreIndex returns the index of the snapshot being restored (0: not known).
func (f *fsm) restoreIndex() uint64 {
	f.imu.Lock()
	defer f.imu.Unlock()
	if f.opened != 1 {
		return 0
	}
	return f.openedAt
}

// indexedSnaps is the snapshot store raft uses: it records which snapshot is open for reading, so
// that the state machine learns the index of the one it restores (fsm.restoreIndex).
type indexedSnaps struct {
	raft.SnapshotStore
	f *fsm
}

func (s indexedSnaps) Open(id string) (*raft.SnapshotMeta, io.ReadCloser, error) {
	meta, rc, err := s.SnapshotStore.Open(id)
	if err != nil {
		return meta, rc, err
	}
	s.f.imu.Lock()
	s.f.opened++
	s.f.openedAt = meta.Index
	s.f.imu.Unlock()
	return meta, &openSnap{ReadCloser: rc, f: s.f}, nil
}

// openSnap is a snapshot open for reading (indexedSnaps).
type openSnap struct {
	io.ReadCloser
	f    *fsm
	once sync.Once
}

func (o *openSnap) Close() error {
	o.once.Do(func() {
		o.f.imu.Lock()
		o.f.opened--
		o.f.imu.Unlock()
	})
	return o.ReadCloser.Close()
}

// setIndex records that the entries up to i are applied, and wakes the waiters.
func (f *fsm) setIndex(i uint64) {
	f.imu.Lock()
	if i > f.index {
		f.index = i
		if f.advanced != nil {
			close(f.advanced)
			f.advanced = nil
		}
	}
	f.imu.Unlock()
}

// appliedIndex returns the index of the last applied entry, and a channel closed when it moves.
func (f *fsm) appliedIndex() (uint64, <-chan struct{}) {
	f.imu.Lock()
	defer f.imu.Unlock()
	if f.advanced == nil {
		f.advanced = make(chan struct{})
	}
	return f.index, f.advanced
}

var _ raft.BatchingFSM = (*fsm)(nil)

// Apply applies one log entry.
func (f *fsm) Apply(l *raft.Log) any {
	if l.Type != raft.LogCommand {
		return nil
	}
	f.at(l.Index)
	r := f.applyOne(l.Data)
	f.setIndex(l.Index)
	f.pokeIfEarlier()
	return r
}

// ApplyBatch applies consecutive log entries, one StateMachine.Apply call per command entry.
func (f *fsm) ApplyBatch(logs []*raft.Log) []any {
	out := make([]any, len(logs))
	for i, l := range logs {
		if l.Type == raft.LogCommand {
			f.at(l.Index)
			out[i] = f.applyOne(l.Data)
		}
	}
	if len(logs) > 0 {
		f.setIndex(logs[len(logs)-1].Index)
	}
	f.pokeIfEarlier()
	return out
}

// pokeIfEarlier pokes applied if the next deadline is earlier than the one the leader's tick timer
// is armed for (see applied). It runs on raft's FSM goroutine, after the entries were applied.
func (f *fsm) pokeIfEarlier() {
	armed := f.armed.Load()
	if armed == math.MinInt64 {
		return // not leading: nothing to re-arm (a new leadership arms its timer when it starts)
	}
	if f.nextDeadline != nil {
		d, ok := f.nextDeadline()
		if !ok || d >= armed {
			return
		}
	}
	f.poke()
}

func (f *fsm) poke() {
	select {
	case f.applied <- struct{}{}:
	default:
	}
}

func (f *fsm) applyOne(data []byte) *applyResult {
	e, err := decodeEntry(data)
	if err != nil {
		return &applyResult{err: err}
	}
	f.mu.Lock()
	now := max(e.now, f.lastNow)
	f.lastNow = now
	leaderChanged := false
	if e.kind == entryLeader {
		f.leaderID, f.leaderClient = e.leaderID, e.client
		leaderChanged = true
	}
	f.mu.Unlock()
	if leaderChanged && f.onLeaderInfo != nil {
		f.onLeaderInfo()
	}
	res := f.sm.Apply(now, e.cmds)
	if len(res) != len(e.cmds) {
		panic(fmt.Sprintf("cluster: StateMachine.Apply returned %d results for %d commands", len(res), len(e.cmds)))
	}
	return &applyResult{results: res}
}

// state returns the last applied time and leader announcement.
func (f *fsm) state() (lastNow int64, leaderID, leaderClient string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastNow, f.leaderID, f.leaderClient
}

// Snapshot layout: magic "MLCS" 1, lastNow 8 bytes, leader id, leader client address (length-prefixed),
// then the state machine's snapshot to the end.
const snapMagic = "MLCS\x01"

// Snapshot takes the state machine's snapshot in log order (raft calls it between Applies).
func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	data, err := f.sm.Snapshot()
	if err != nil {
		return nil, err
	}
	lastNow, id, client := f.state()
	b := make([]byte, 0, len(snapMagic)+8+2*binary.MaxVarintLen64+len(id)+len(client)+len(data))
	b = append(b, snapMagic...)
	b = binary.BigEndian.AppendUint64(b, uint64(lastNow))
	b = appendBytes(b, []byte(id))
	b = appendBytes(b, []byte(client))
	b = append(b, data...)
	return fsmSnapshot(b), nil
}

// Restore replaces the whole state with a snapshot's.
func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return err
	}
	if len(b) < len(snapMagic)+8 || string(b[:len(snapMagic)]) != snapMagic {
		return errCorrupt
	}
	p := b[len(snapMagic):]
	lastNow := int64(binary.BigEndian.Uint64(p))
	p = p[8:]
	id, p, ok := readBytes(p)
	if !ok {
		return errCorrupt
	}
	client, p, ok := readBytes(p)
	if !ok {
		return errCorrupt
	}
	f.at(f.restoreIndex())
	if err := f.sm.Restore(p); err != nil {
		return err
	}
	f.mu.Lock()
	f.lastNow, f.leaderID, f.leaderClient = lastNow, string(id), string(client)
	f.mu.Unlock()
	if f.onLeaderInfo != nil {
		f.onLeaderInfo()
	}
	f.poke()
	return nil
}

// fsmSnapshot is an encoded snapshot, written out by Persist.
type fsmSnapshot []byte

func (s fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(s); err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}

func (s fsmSnapshot) Release() {}
