package mlock_test

import (
	"strconv"
	"sync"
	"testing"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/server"
)

// Callers sharing the connection keep going when the reader answers them
// together, and the commands they send next go out together: the server
// reads several frames per read.
func TestCallersAnsweredTogetherSendTogether(t *testing.T) {
	addr, _ := startServer(t, server.Config{}, "")
	c := client(t, addr, mlock.Options{})
	ctx := ctxT(t)
	st0, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const workers, cycles = 16, 200
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := "together:" + strconv.Itoa(w)
			for range cycles {
				l, err := c.Lock(ctx, res, nil)
				if err == nil {
					err = l.Unlock(ctx)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	st1, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	frames, reads := st1.FramesIn-st0.FramesIn, st1.Reads-st0.Reads
	if frames < 2*workers*cycles {
		t.Fatalf("server received %d frames, want at least %d", frames, 2*workers*cycles)
	}
	if float64(frames) < 1.5*float64(reads) {
		t.Fatalf("%d frames in %d reads: the callers' commands were not gathered", frames, reads)
	}
}
