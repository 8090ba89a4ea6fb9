//go:build !linux || race

package rawio

import "syscall"

// Elsewhere, and under the race detector, File uses the os.File's own calls.
const fileSupported = false

func rawPwrite(uintptr, []byte, int64) (int, syscall.Errno) { return 0, syscall.EINVAL }
func rawFsync(uintptr) syscall.Errno                        { return syscall.EINVAL }
