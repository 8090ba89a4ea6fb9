package mlock_test

import (
	"bufio"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/internal/protocol"
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

// pingRounds runs callers goroutines that each ping rounds times, sleeping
// pause(i) before each ping but the first, against a fake server that
// answers each round of pings in one write. It returns the number of reads
// that brought each round, and the client (closed when the test ends).
func pingRounds(t *testing.T, callers, rounds int, pause func(i int) time.Duration) ([]int, *mlock.Client) {
	t.Helper()
	readsPerRound := make(chan []int, 1)
	addr := fakeServer(t, func(c net.Conn, _ *bufio.Reader) {
		var buf []byte
		chunk := make([]byte, 64<<10)
		reads := 0
		// next returns the next frame, reading as needed.
		next := func() ([]string, bool) {
			for {
				p, n, _, err := protocol.Next(buf, protocol.MaxFrameLimit)
				if err != nil {
					return nil, false
				}
				if n > 0 {
					buf = buf[n:]
					return strings.Fields(string(p)), true
				}
				k, err := c.Read(chunk)
				if err != nil {
					return nil, false
				}
				reads++
				buf = append(buf, chunk[:k]...)
			}
		}
		if f, ok := next(); !ok || f[0] != "connect" {
			readsPerRound <- nil
			return
		}
		c.Write(protocol.Append(nil, "connected", "1.0", "new", "15000"))
		var counts []int
		for range rounds {
			reads = 0
			var answers []byte
			for range callers {
				f, ok := next()
				if !ok || f[0] != "ping" {
					readsPerRound <- nil
					return
				}
				answers = protocol.Append(answers, "result", f[1], "success", "pong")
			}
			counts = append(counts, reads)
			c.Write(answers)
		}
		readsPerRound <- counts
	})
	c := client(t, addr, mlock.Options{})
	ctx := ctxT(t)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				if r > 0 {
					time.Sleep(pause(i)) // fixed: the callers' think time, the test's input
				}
				if err := c.Ping(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	counts := <-readsPerRound
	if counts == nil {
		t.Fatal("the fake server read something else than pings")
	}
	return counts, c
}

// The reader waits for the callers it answered to send again before it
// writes: callers answered in one read send their next commands in one
// write, even if they take a while (here up to 8 ms, with the wait's bound
// raised to 300 ms).
func TestReaderWaitsForTheCallersItAnswered(t *testing.T) {
	defer mlock.SetWokenWait(300 * time.Millisecond)()
	counts, _ := pingRounds(t, 8, 10, func(i int) time.Duration { return time.Duration(i) * time.Millisecond })
	// The first round gathers callers that start at different times. The
	// writer goroutine, woken by a caller of the round before, may write
	// part of one round just before the reader starts to gather it.
	split := 0
	for _, n := range counts[1:] {
		split += n - 1
	}
	if split > 1 {
		t.Fatalf("the pings of callers answered in one write came in several reads: %v reads per round", counts)
	}
}

// A guard on the default bound of the wait (20 µs): a caller that does not
// send again at once does not hold back the others for long (here 50 ms;
// a bound of 100 ms would fail).
func TestReaderDoesNotWaitLong(t *testing.T) {
	counts, _ := pingRounds(t, 4, 5, func(i int) time.Duration {
		if i == 0 {
			return 50 * time.Millisecond
		}
		return 0
	})
	for i, n := range counts[1:] {
		if n < 2 {
			t.Fatalf("round %d: the pings of the callers that sent at once waited for the one that paused 50 ms (all rounds: %v)", i+2, counts)
		}
	}
}

// After a wait that ran out, the next 8 reads that answered callers end
// without waiting, and after another one in a row 16: a caller that
// pauses before it sends again (it holds its lock a while) costs the
// reader one wait per 8, 16, ... 256 reads.
func TestReaderBacksOff(t *testing.T) {
	defer mlock.SetWokenWait(time.Millisecond)()
	// Caller 1 pauses 20 ms before each ping: every wait for it runs out.
	// Round 1's wait runs out (8 skips), rounds 2-9 skip, round 10's wait
	// runs out again (16 skips).
	_, c := pingRounds(t, 2, 10, func(i int) time.Duration { return time.Duration(i) * 20 * time.Millisecond })
	// The reader may still be in round 10's wait when the callers return.
	skip, misses := c.Backoff()
	for end := time.Now().Add(2 * time.Second); misses < 2 && time.Now().Before(end); {
		time.Sleep(time.Millisecond) // poll interval
		skip, misses = c.Backoff()
	}
	if misses != 2 || skip != 16 {
		t.Fatalf("after 10 rounds whose waits ran out or were skipped: %d reads to skip, %d misses in a row; want 16 and 2", skip, misses)
	}
}
