//go:build !linux

package main

import "os"

// isTerminal reports whether f looks like a terminal: a character device.
// (Elsewhere than Linux /dev/null passes too.)
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// inForeground reports whether this process's group is the terminal's
// foreground group; not known here: false (signals are forwarded).
func inForeground(*os.File) bool { return false }

// winSize returns the size of the terminal f; not known here.
func winSize(*os.File) (rows, cols int, ok bool) { return 0, 0, false }
