package main

import (
	"bytes"
	"io"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// On a terminal mlock top fits its lines to the terminal's width, read
// from the terminal itself: shells do not export $COLUMNS, and a line
// wider than the terminal wraps and scrolls the screen.
func TestTopFitsTheTerminal(t *testing.T) {
	t.Parallel()
	uri, base := startObserved(t)
	holder(t, uri, "orders:1", "alice")
	ptm, pts := openPty(t)
	if err := unix.IoctlSetWinsize(int(pts.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: 30, Col: 60}); err != nil {
		t.Fatal(err)
	}
	cmd := mlockCmd("top", "--http", base, "-n", "1")
	var env []string
	for _, kv := range cmd.Env {
		if !strings.HasPrefix(kv, "COLUMNS=") && !strings.HasPrefix(kv, "LINES=") {
			env = append(env, kv)
		}
	}
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = pts, pts
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	out := make(chan []byte, 1)
	go func() { b, _ := io.ReadAll(ptm); out <- b }()
	if code := exitCodeOf(t, cmd.Wait()); code != 0 {
		t.Fatalf("exit %d", code)
	}
	pts.Close() // the reader then ends (EIO) once the output is read
	b := <-out
	b = regexp.MustCompile(`\x1b\[[0-9;]*[A-Za-z]`).ReplaceAll(b, nil)
	if !bytes.Contains(b, []byte("orders:1")) {
		t.Fatalf("no orders:1 in\n%s", b)
	}
	for _, l := range strings.Split(strings.ReplaceAll(string(b), "\r", ""), "\n") {
		if n := utf8.RuneCountInString(l); n > 60 {
			t.Errorf("a line of %d characters on a terminal of 60 columns: %q", n, l)
		}
	}
}
