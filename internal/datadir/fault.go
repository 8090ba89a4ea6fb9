package datadir

import "sync/atomic"

// Op names one step of a write of the data directory's files, at which
// SetFaultHook can inject an error.
type Op string

// The steps of a write: the temporary file is created, written and synced,
// renamed over the file, and the directory synced.
const (
	OpCreate  Op = "create"
	OpWrite   Op = "write"
	OpSync    Op = "sync"
	OpRename  Op = "rename"
	OpSyncDir Op = "syncdir"
)

// faultHook is the hook in force (nil: none).
var faultHook atomic.Pointer[func(op Op, file string) error]

// SetFaultHook installs fn, for tests: it is called before each step of
// every write of the data directory's files (file is "state" or
// "token-mark"), and an error it returns fails that step as the disk's own
// error would (the write is abandoned, its temporary file removed). Nil
// removes the hook. It applies to every Dir of the process.
func SetFaultHook(fn func(op Op, file string) error) {
	if fn == nil {
		faultHook.Store(nil)
		return
	}
	faultHook.Store(&fn)
}

func fault(op Op, file string) error {
	if fn := faultHook.Load(); fn != nil {
		return (*fn)(op, file)
	}
	return nil
}
