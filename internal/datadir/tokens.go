package datadir

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// TokenBlock is how many fencing tokens are reserved at a time: the mark on
// disk is kept at least TokenBlock/2 above the last token given and, when
// it must move, is set TokenBlock above it.
const TokenBlock = 1 << 20

// readMark reads the token mark: 0 if there is none.
func (d *Dir) readMark() (uint64, error) {
	path := filepath.Join(d.path, tokenFile)
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("datadir: %w", err)
	}
	mark, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("datadir: %s: %w", path, err)
	}
	return mark, nil
}

// TokenMark returns the token mark on disk: every token given by a run on
// this directory is below it. 0: none was ever written.
func (d *Dir) TokenMark() uint64 {
	if d == nil {
		return 0
	}
	return d.mark.Load()
}

// FirstToken returns the first fencing token this run may give, the largest
// of floor, the token mark and 1, and durably moves the mark TokenBlock
// above it. The server passes its start time in microseconds as floor, so
// that tokens grow across restarts even without a data directory. On a nil
// Dir it returns max(floor, 1) and writes nothing.
func (d *Dir) FirstToken(floor uint64) (uint64, error) {
	first := max(floor, 1)
	if d == nil {
		return first, nil
	}
	first = max(first, d.mark.Load())
	if err := d.saveMark(first, true); err != nil {
		return 0, err
	}
	return first, nil
}

// ReserveTokens keeps the token mark ahead of the tokens given: when fewer
// than TokenBlock/2 tokens are left above last (the last token given), it
// writes last + TokenBlock, durably, before it returns. Otherwise it returns
// nil at once, without a lock, I/O or allocation, so it may be called after
// every batch of grants. It returns the write's error (the server must then
// give no token at or above TokenMark until a write succeeds: later tokens
// are not covered) or ErrClosed. Safe for
// concurrent use. On a nil Dir it does nothing.
func (d *Dir) ReserveTokens(last uint64) error {
	if !d.MarkDue(last) {
		return nil
	}
	return d.saveMark(last, false)
}

// MarkDue reports whether ReserveTokens(last) would write: fewer than half
// a block of tokens is left between last and the mark on disk. It takes no
// lock and does no I/O. False on a nil Dir.
func (d *Dir) MarkDue(last uint64) bool {
	if d == nil {
		return false
	}
	mark := d.mark.Load()
	return last >= mark-min(mark, d.block/2)
}

// SetTokenBlock sets how many tokens one write of the mark reserves (the
// mark is kept at least n/2 above the last token given, and set n above it
// when it moves): TokenBlock by default. A smaller block writes more often
// and notices a failing disk sooner, within n/2 grants; n below 2 counts
// as 2. Call it before the first FirstToken; it is not safe for concurrent
// use.
func (d *Dir) SetTokenBlock(n uint64) {
	if d != nil {
		d.block = max(n, 2)
	}
}

// saveMark writes base + TokenBlock (saturating) as the mark if that is
// above the mark on disk and, unless force, fewer than TokenBlock/2 tokens
// are left above base.
func (d *Dir) saveMark(base uint64, force bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return ErrClosed
	}
	cur := d.mark.Load()
	if !force && base < cur-min(cur, d.block/2) {
		return nil // another caller moved it
	}
	mark := uint64(math.MaxUint64)
	if base < math.MaxUint64-d.block {
		mark = base + d.block
	}
	if mark <= cur {
		return nil
	}
	if err := writeAtomic(d.path, tokenFile, []byte(strconv.FormatUint(mark, 10)+"\n")); err != nil {
		return fmt.Errorf("datadir: saving the token mark: %w", err)
	}
	d.mark.Store(mark)
	return nil
}
