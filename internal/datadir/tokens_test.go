package datadir

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

func readMarkFile(t *testing.T, dir string) uint64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "token-mark"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(string(b), "\n") {
		t.Fatalf("token-mark %q: not one line", b)
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// The token mark keeps the format of earlier servers: a decimal number and
// a newline in token-mark, read with surrounding space trimmed.
func TestTokenMarkCompatible(t *testing.T) {
	dir := t.TempDir()
	// As an earlier server left it.
	if err := os.WriteFile(filepath.Join(dir, "token-mark"), []byte("123456789\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := open(t, dir)
	if d.TokenMark() != 123456789 {
		t.Fatalf("TokenMark = %d", d.TokenMark())
	}
	first, err := d.FirstToken(1000)
	if err != nil || first != 123456789 {
		t.Fatalf("FirstToken = %d, %v; want the mark", first, err)
	}
	if m := readMarkFile(t, dir); m != first+TokenBlock || d.TokenMark() != m {
		t.Fatalf("mark on disk %d, want %d", m, first+TokenBlock)
	}
	// A floor above the mark wins.
	d.Close()
	d = open(t, dir)
	if first, _ := d.FirstToken(1 << 40); first != 1<<40 || readMarkFile(t, dir) != 1<<40+TokenBlock {
		t.Fatalf("FirstToken with a higher floor = %d", first)
	}
	// Written with spaces around, as a hand edit might.
	d.Close()
	os.WriteFile(filepath.Join(dir, "token-mark"), []byte("  77 \n"), 0o644)
	d = open(t, dir)
	if d.TokenMark() != 77 {
		t.Fatalf("TokenMark = %d", d.TokenMark())
	}
}

func TestCorruptTokenMarkRefused(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "token-mark"), []byte("x\n"), 0o644)
	if _, err := Open(dir); err == nil {
		t.Fatal("a corrupt token mark was accepted: tokens could go backwards")
	}
	// The failed Open released the lock.
	os.Remove(filepath.Join(dir, "token-mark"))
	d, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
}

func TestReserveTokens(t *testing.T) {
	dir := t.TempDir()
	d := open(t, dir)
	first, err := d.FirstToken(100)
	if err != nil || first != 100 {
		t.Fatal(first, err)
	}
	mark := first + TokenBlock
	// More than half a block left: nothing written.
	if err := d.ReserveTokens(mark - TokenBlock/2 - 1); err != nil || readMarkFile(t, dir) != mark {
		t.Fatalf("reserve moved the mark early: %v", err)
	}
	// Half a block left: the mark moves a block above the last token.
	last := mark - TokenBlock/2
	if err := d.ReserveTokens(last); err != nil || readMarkFile(t, dir) != last+TokenBlock || d.TokenMark() != last+TokenBlock {
		t.Fatalf("reserve at half a block: %v, mark %d", err, readMarkFile(t, dir))
	}
	// A restart starts at the mark: above every token given.
	d.Close()
	d = open(t, dir)
	if f, _ := d.FirstToken(1); f != last+TokenBlock || f <= last {
		t.Fatalf("first token after a restart %d, last given %d", f, last)
	}
	d.Close()
	if err := d.ReserveTokens(1 << 62); err == nil {
		t.Fatal("ReserveTokens after Close wrote nothing and said nothing")
	}
}

func TestReserveTokensFastPathDoesNotAllocate(t *testing.T) {
	d := open(t, t.TempDir())
	first, _ := d.FirstToken(1)
	if n := testing.AllocsPerRun(1000, func() { _ = d.ReserveTokens(first + 10) }); n != 0 {
		t.Fatalf("ReserveTokens allocates %v times", n)
	}
}

func TestReserveTokensConcurrent(t *testing.T) {
	dir := t.TempDir()
	d := open(t, dir)
	first, _ := d.FirstToken(1)
	var wg sync.WaitGroup
	for i := range uint64(8) {
		wg.Go(func() {
			for j := range uint64(50) {
				if err := d.ReserveTokens(first + i*TokenBlock + j*TokenBlock/4); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	top := first + 7*TokenBlock + 49*TokenBlock/4
	if m := readMarkFile(t, dir); m < top+TokenBlock/2 || m != d.TokenMark() {
		t.Fatalf("mark %d, last reserved %d", m, top)
	}
}
