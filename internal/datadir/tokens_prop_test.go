package datadir_test

import (
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/mlock-dev/mlock/internal/datadir"
	"github.com/mlock-dev/mlock/internal/locktable"
)

// run is one run of a server on the directory, wired as mlockd's single
// server is (server/disk.go): the engine's first token comes from
// FirstToken with the start time as floor, its token limit is the mark on
// disk, raised only after a write succeeds; a failed write makes the limit
// refuse.
type run struct {
	d   *datadir.Dir
	tab *locktable.Table
	now int64
}

// TestTokensNeverRepeat is the property: over any sequence of grants, write
// failures at any step of the mark's writes (and their end), crashes, a
// wall clock stepped back or forward, and restarts on the same directory,
// no fencing token is given twice, and each is above every earlier one.
func TestTokensNeverRepeat(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		dir, err := os.MkdirTemp(t.TempDir(), "prop")
		if err != nil {
			rt.Fatal(err)
		}
		var failOp datadir.Op // "": no failure
		datadir.SetFaultHook(func(op datadir.Op, file string) error {
			if op == failOp {
				return syscall.ENOSPC
			}
			return nil
		})
		defer datadir.SetFaultHook(nil)
		block := uint64(rapid.IntRange(2, 40).Draw(rt, "block"))
		clock := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro() // the wall clock, µs
		var last uint64                                                  // the highest token ever given
		var r *run
		n := 0

		start := func() {
			d, err := datadir.Open(dir)
			if err != nil {
				rt.Fatalf("open: %v", err)
			}
			d.SetTokenBlock(block)
			first, err := d.FirstToken(uint64(clock))
			if err != nil {
				d.Close() // a start that cannot write the mark does not serve
				return
			}
			if first <= last {
				rt.Fatalf("first token %d of a run, after %d was given", first, last)
			}
			seed := [32]byte{3}
			tab, err := locktable.New(locktable.Config{Seed: &seed, FirstToken: first, TokenLimit: d.TokenMark()})
			if err != nil {
				rt.Fatal(err)
			}
			tab.Attach(0, "s")
			r = &run{d: d, tab: tab}
		}
		start()
		ops := []datadir.Op{"", datadir.OpCreate, datadir.OpWrite, datadir.OpSync, datadir.OpRename, datadir.OpSyncDir}
		rt.Repeat(map[string]func(*rapid.T){
			"grant": func(rt *rapid.T) {
				if r == nil {
					rt.Skip("not running")
				}
				r.now++
				n++
				g, err := r.tab.Lock(r.now, &locktable.Request{Session: "s", Resources: []string{"r"}, TTL: time.Second})
				if errors.Is(err, locktable.ErrNoTokens) {
					if r.tab.TokenLimit() > r.tab.LastToken()+1 {
						rt.Fatalf("refused with tokens left")
					}
					// The marker's next try.
					if r.d.ReserveTokens(r.tab.LastToken()) == nil {
						r.tab.SetTokenLimit(r.now, r.d.TokenMark(), false)
					}
					return
				}
				if err != nil {
					rt.Fatal(err)
				}
				if g.Granted {
					if g.Token <= last || g.Token >= r.d.TokenMark() {
						rt.Fatalf("token %d: the last given was %d, the mark on disk is %d", g.Token, last, r.d.TokenMark())
					}
					last = g.Token
				}
				if err := r.tab.Unlock(r.now, g.ID, "s"); err != nil {
					rt.Fatal(err)
				}
				// What the marker does after the batch.
				if r.d.MarkDue(r.tab.LastToken()) {
					if err := r.d.ReserveTokens(r.tab.LastToken()); err != nil {
						r.tab.SetTokenLimit(r.now, r.tab.TokenLimit(), true)
					} else {
						r.tab.SetTokenLimit(r.now, r.d.TokenMark(), false)
					}
				}
				if r.tab.LastToken() > last && r.tab.LastToken() != 0 {
					last = r.tab.LastToken() // a waiter granted by the unlock
				}
			},
			"fail": func(rt *rapid.T) {
				failOp = rapid.SampledFrom(ops).Draw(rt, "op")
			},
			"crash": func(rt *rapid.T) {
				if r != nil {
					r.d.Close() // nothing recorded: the process is gone
					r = nil
				}
				start()
			},
			"clock": func(rt *rapid.T) {
				clock += int64(rapid.IntRange(-3_600_000_000, 1_000).Draw(rt, "step µs"))
			},
		})
		if r != nil {
			r.d.Close()
		}
	})
}
