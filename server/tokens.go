package server

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// tokenBlock is how many tokens the server reserves at a time: the
// high-water mark on disk is always at least this far ahead of the last
// token given, and is rewritten when less than half of it is left.
const tokenBlock = 1 << 20

// tokenStore keeps the fencing-token high-water mark: every token ever given
// is below the mark on disk. Without a data directory it does nothing.
type tokenStore struct {
	path  string
	first uint64 // the first token to give
	mark  uint64 // the mark on disk
}

func openTokens(dir string, clock uint64) (*tokenStore, error) {
	ts := &tokenStore{first: max(clock, 1)}
	if dir == "" {
		return ts, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("server: data dir: %w", err)
	}
	ts.path = filepath.Join(dir, "token-mark")
	b, err := os.ReadFile(ts.path)
	switch {
	case err == nil:
		mark, perr := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		if perr != nil {
			return nil, fmt.Errorf("server: %s: %w", ts.path, perr)
		}
		ts.first = max(ts.first, mark)
	case !os.IsNotExist(err):
		return nil, fmt.Errorf("server: data dir: %w", err)
	}
	if err := ts.save(ts.first + tokenBlock); err != nil {
		return nil, err
	}
	return ts, nil
}

// reserve moves the mark ahead when fewer than half a block of tokens is
// left above last.
func (ts *tokenStore) reserve(last uint64) error {
	if ts.path == "" || last+tokenBlock/2 < ts.mark {
		return nil
	}
	return ts.save(last + tokenBlock)
}

// save writes mark durably: a temporary file, fsync, rename.
func (ts *tokenStore) save(mark uint64) error {
	if ts.path == "" || mark <= ts.mark {
		return nil
	}
	tmp := ts.path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	_, err = f.WriteString(strconv.FormatUint(mark, 10) + "\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, ts.path)
	}
	if err != nil {
		return fmt.Errorf("server: saving token mark: %w", err)
	}
	ts.mark = mark
	return nil
}
