package cluster

import (
	"bytes"
	"fmt"
	"testing"
)

func TestDedupApply(t *testing.T) {
	t.Parallel()
	toy := &toySM{}
	d := NewDedup(toy, 3)
	cmd := func(client string, seq uint64, s string) []byte { return DedupCommand(client, seq, []byte(s)) }
	res := d.Apply(1, [][]byte{cmd("a", 1, "x"), cmd("a", 1, "x"), cmd("", 0, "free"), cmd("", 0, "free"), []byte{0xff}})
	if want := []string{"1", "1", "2", "3", ""}; fmt.Sprint(str(res)) != fmt.Sprint(want) {
		t.Fatalf("results %q, want %q", str(res), want)
	}
	if len(toy.Log) != 3 {
		t.Fatalf("log %q: a repeat within a batch was applied", toy.Log)
	}
	// A later repeat is answered from the window; the wrapped machine still sees the (empty) entry.
	res = d.Apply(2, [][]byte{cmd("a", 1, "x")})
	if string(res[0]) != "1" || len(toy.Log) != 3 || toy.Entries != 2 {
		t.Fatalf("repeat: %q, log %q, entries %d", str(res), toy.Log, toy.Entries)
	}
	// The window keeps the last 3 keys: (a,1) is forgotten after three more.
	d.Apply(3, [][]byte{cmd("b", 1, "y"), cmd("b", 2, "y"), cmd("b", 3, "y")})
	res = d.Apply(4, [][]byte{cmd("a", 1, "x"), cmd("b", 3, "y")})
	if string(res[0]) != "7" || string(res[1]) != "6" {
		t.Fatalf("after eviction: %q", str(res))
	}

	// Snapshot and restore into a fresh Dedup: same window, same answers, same snapshot.
	snap, err := d.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	d2 := NewDedup(&toySM{}, 3)
	if err := d2.Restore(snap); err != nil {
		t.Fatal(err)
	}
	snap2, _ := d2.Snapshot()
	if !bytes.Equal(snap, snap2) {
		t.Fatalf("snapshot changed through restore:\n%q\n%q", snap, snap2)
	}
	for _, dd := range []*Dedup{d, d2} {
		res = dd.Apply(5, [][]byte{cmd("b", 2, "y"), cmd("a", 1, "x"), cmd("c", 1, "z")})
		if fmt.Sprint(str(res)) != "[5 7 8]" {
			t.Fatalf("after restore: %q", str(res))
		}
	}
	// The snapshot carries the window's size: a Dedup made with another
	// restores the snapshot's.
	d4 := NewDedup(&toySM{}, 1)
	if err := d4.Restore(snap); err != nil {
		t.Fatal(err)
	}
	if d4.Window() != 3 {
		t.Fatalf("restored window %d, want the snapshot's 3", d4.Window())
	}
	// An older snapshot, without the size, restores with NewDedup's: a
	// smaller window keeps the newest keys of a larger snapshot.
	v1 := append([]byte(dedupMagicV1), snap[len(dedupMagic)+1:]...) // the size 3 is one byte
	d3 := NewDedup(&toySM{}, 1)
	if err := d3.Restore(v1); err != nil {
		t.Fatal(err)
	}
	if res := d3.Apply(6, [][]byte{cmd("a", 1, "x"), cmd("b", 2, "y")}); string(res[0]) != "7" || string(res[1]) != "8" {
		t.Fatalf("window 1: %q", str(res))
	}
	if err := d3.Restore([]byte("junk")); err == nil {
		t.Fatal("Restore(junk) succeeded")
	}
}

// SetWindow changes the size from the next result on: a smaller one
// forgets the oldest at once, and the size goes with the snapshot.
func TestDedupSetWindow(t *testing.T) {
	t.Parallel()
	cmd := func(client string, seq uint64) []byte { return DedupCommand(client, seq, []byte("x")) }
	d := NewDedup(&toySM{}, 3)
	d.Apply(1, [][]byte{cmd("a", 1), cmd("a", 2), cmd("a", 3)})
	d.SetWindow(1)
	if res := d.Apply(2, [][]byte{cmd("a", 3), cmd("a", 2)}); string(res[0]) != "3" || string(res[1]) != "4" {
		t.Fatalf("after shrinking to 1: %q (want (a,3) answered from the window, (a,2) applied again)", str(res))
	}
	d.SetWindow(4)
	d.Apply(3, [][]byte{cmd("b", 1), cmd("b", 2), cmd("b", 3)})
	if res := d.Apply(4, [][]byte{cmd("a", 2), cmd("b", 1)}); string(res[0]) != "4" || string(res[1]) != "5" {
		t.Fatalf("after growing to 4: %q", str(res))
	}
	snap, _ := d.Snapshot()
	d2 := NewDedup(&toySM{}, 2)
	if err := d2.Restore(snap); err != nil {
		t.Fatal(err)
	}
	snap2, _ := d2.Snapshot()
	if d2.Window() != 4 || !bytes.Equal(snap, snap2) {
		t.Fatalf("restored window %d, snapshots equal %v", d2.Window(), bytes.Equal(snap, snap2))
	}
}

func str(b [][]byte) []string {
	out := make([]string, len(b))
	for i, x := range b {
		out[i] = string(x)
	}
	return out
}

func FuzzDedupRestore(f *testing.F) {
	d := NewDedup(&toySM{}, 4)
	d.Apply(1, [][]byte{DedupCommand("a", 1, []byte("x")), DedupCommand("b", 2, nil)})
	snap, _ := d.Snapshot()
	f.Add(snap)
	f.Fuzz(func(t *testing.T, p []byte) {
		d := NewDedup(&toySM{}, 4)
		if err := d.Restore(p); err != nil {
			return
		}
		d.Apply(2, [][]byte{DedupCommand("a", 1, []byte("x"))})
		if _, err := d.Snapshot(); err != nil {
			t.Fatal(err)
		}
	})
}
