package core

import (
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/mlock-dev/mlock/internal/locktable"
)

// A core snapshot is "mlkc", a version (uvarint), the time of the latest
// batch (varint) and the engine's snapshot.
const (
	snapshotMagic   = "mlkc"
	snapshotVersion = 1
)

// ErrCorruptSnapshot is returned (wrapped) by Restore for data that is not
// a whole, consistent snapshot; it is the engine's error value.
var ErrCorruptSnapshot = locktable.ErrCorruptSnapshot

// Snapshot returns the whole state of the core: the engine's (every lock,
// queue, owner and session, the hold on grants, the token counter, the
// counters of Stats, the state of the generator of lock ids) and the time of
// the latest batch. Restore makes a Core of it that behaves exactly like
// this one: the same batches at the same times give the same results,
// events and snapshots, byte for byte. The snapshot can predict lock ids:
// keep it as secret as they are. It takes the core's lock: call it outside
// a batch. It costs O(n) for n live requests (about 50 bytes and 0.3 µs
// each).
func (c *Core) Snapshot() ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := append([]byte(nil), snapshotMagic...)
	b = binary.AppendUvarint(b, snapshotVersion)
	b = binary.AppendVarint(b, c.now)
	return c.tab.AppendBinary(b)
}

// Restore returns a Core holding the state of data, a snapshot made by
// Snapshot. Clock, Manual, OnBatch and the engine's limits and session
// grace come from cfg; the engine's Seed, FirstToken and GrantAfter are
// ignored (the generator of lock ids, the token counter and the hold on
// grants come from the snapshot). Without Manual the core arms its timer
// at the next deadline, as after a batch; a deadline already past is
// processed when the timer fires, at once. Nothing reaches OnBatch before
// the first batch.
//
// It returns the engine's configuration error, an error for an unknown
// version, or one wrapping ErrCorruptSnapshot; it never panics.
func Restore(cfg Config, data []byte) (*Core, error) {
	if !strings.HasPrefix(string(data), snapshotMagic) {
		return nil, fmt.Errorf("%w: not a core snapshot", ErrCorruptSnapshot)
	}
	data = data[len(snapshotMagic):]
	v, n := binary.Uvarint(data)
	if n <= 0 {
		return nil, fmt.Errorf("%w: version", ErrCorruptSnapshot)
	}
	if v != snapshotVersion {
		return nil, fmt.Errorf("core: snapshot version %d is not supported (want %d)", v, snapshotVersion)
	}
	data = data[n:]
	now, n := binary.Varint(data)
	if n <= 0 || n > 1 && data[n-1] == 0 {
		return nil, fmt.Errorf("%w: time", ErrCorruptSnapshot)
	}
	c := newBare(cfg)
	ecfg := cfg.Engine
	ecfg.OnEvent = c.onEvent
	tab, err := locktable.Restore(ecfg, data[n:])
	if err != nil {
		return nil, err
	}
	c.tab = tab
	c.now = max(now, tab.Now())
	c.mu.Lock()
	c.armLocked()
	c.mu.Unlock()
	return c, nil
}
