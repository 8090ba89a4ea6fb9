//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package datadir

import (
	"errors"
	"os"
)

// On these systems the directory is not locked: two servers on one data
// directory are not detected.
var errWouldBlock = errors.New("datadir: locked")

func lockFileExclusive(*os.File) error { return nil }

// syncDir does nothing here: renames are as durable as the system makes them.
func syncDir(string) error { return nil }
