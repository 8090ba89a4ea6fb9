//go:build unix

package scenario

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/mlock-dev/mlock/fence/postgres"
	"github.com/mlock-dev/mlock/internal/pgtest"
	"github.com/mlock-dev/mlock/internal/proctest"
)

// The fenced flash sale: the proof that fenced writes keep a sale from
// overselling when holders outlive their leases.
//
// Each round sells 5 SKUs of limited stock, kept in a real PostgreSQL, twice
// at once on the same servers: once written as most users write it (read
// the stock under the lock, write the stock read less one: naive) and once
// with the write fenced by the lock's token (fence/postgres: fenced). Every
// buyer is a process of its own that buys one unit. A third of the buyers
// stop themselves (SIGSTOP) inside their critical section once they have
// read a stock above 0, and are resumed (SIGCONT) after 2.5 ttl, when their
// lease has ended and the lock has passed on; half of the fenced ones stop
// inside the fenced transaction (holding its fence row) rather than before
// it. Meanwhile mlockd is killed (SIGKILL) and started again on its data
// directory, or on a cluster the leader is.
//
// The naive sale must oversell (that proves the fault bites); the fenced
// one must not, in any round: 0 units sold beyond the stock, the stock left
// equal to the stock less the units sold (no update lost), every sale a
// buyer was told of (acknowledged) in the table, and every buyer done.

// fencedSizes are a run's counts of the fenced flash sale.
type fencedSizes struct {
	rounds   []string // the target of each round: single or cluster
	buyers   int      // per sale and round
	stock    int      // per SKU
	ttl      time.Duration
	limit    time.Duration // bound on one round's processes
	nodeEach int           // every nodeEach-th fenced buyer is a Node.js one (0: none)
}

var (
	fencedShort = fencedSizes{rounds: []string{"single", "cluster"}, buyers: 40, stock: 3, ttl: time.Second, limit: 5 * time.Minute, nodeEach: 5}
	fencedLong  = fencedSizes{rounds: []string{"single", "cluster", "single", "cluster", "single", "cluster"}, buyers: 50, stock: 4,
		ttl: 1500 * time.Millisecond, limit: 6 * time.Minute, nodeEach: 4}
)

const skus = 5

var buyerProgram = proctest.NewPrograms("./internal/scenario/testdata/buyer")

// saleRow is one sale's row of the table.
type saleRow struct {
	round         int
	target, mode  string
	buyers, node  int
	stock, sold   int
	oversold      int // units sold beyond the stock, summed over the SKUs
	stale, pauses int
	lostAcked     int // sales a buyer was told of, missing from the table
	badStock      int // SKUs whose stock left is not the stock less the units sold
	errors        []string
	restarts      int
}

const fencedHeader = "round target  mode    buyers node stock sold oversold stale pauses acked-lost restarts"

func (r saleRow) String() string {
	return fmt.Sprintf("%5d %-7s %-7s %6d %4d %5d %4d %8d %5d %6d %10d %8d", r.round, r.target, r.mode, r.buyers, r.node,
		r.stock, r.sold, r.oversold, r.stale, r.pauses, r.lostAcked, r.restarts)
}

func TestFencedFlashSale(t *testing.T) {
	// Not parallel: its hundred processes a round would starve the other
	// scenarios' on a small machine (their leases are the premise); it runs
	// alone, before them.
	if testing.Short() {
		t.Skip("-short: skipping the user-scenario suite")
	}
	sz, version := fencedShort, "short"
	if os.Getenv("MLOCK_SCENARIO_LONG") == "1" {
		sz, version = fencedLong, "long (MLOCK_SCENARIO_LONG=1)"
	}
	node := findNode(t) // before PostgreSQL and the builds: a skip costs nothing
	if sz.nodeEach > 0 {
		node.need(t)
	}
	pg := pgtest.Start(t, "the fenced flash sale needs PostgreSQL")
	bins := build(t)
	buyer := buyerProgram.Paths(t)[0]
	db, err := sql.Open("pgx", pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if err := postgres.CreateSchema(ctx, db); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE skus (sale text, sku int, stock int NOT NULL, PRIMARY KEY (sale, sku));
		CREATE TABLE sales (id bigserial PRIMARY KEY, sale text NOT NULL, sku int NOT NULL, token bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	var rows []saleRow
	defer func() {
		var b strings.Builder
		for _, r := range rows {
			b.WriteString("\n" + r.String())
		}
		t.Logf("%s version; ttl %v, buyers paused for 2.5 ttl; acked-lost: sales a buyer was told of, missing from the table\n%s%s",
			version, sz.ttl, fencedHeader, b.String())
	}()
	for i, topo := range sz.rounds {
		round := i + 1
		ok := t.Run(fmt.Sprintf("round-%d-%s", round, topo), func(t *testing.T) {
			var tg *target
			dir := t.TempDir()
			var single []string
			if topo == "single" {
				// A short session grace: the quiet period after the crash
				// (grace + 1 % + 5 ms) ends in the round.
				single = []string{"--session-grace", "2s"}
				tg = &target{name: "single", daemons: []*daemon{startDaemon(t, bins.mlockd, dir, "mlockd", proctest.FreeAddr(t), single...)}}
			} else {
				tg = startCluster(t, bins.mlockd)
			}
			naive, fenced := fmt.Sprintf("r%d-naive", round), fmt.Sprintf("r%d-fenced", round)
			for _, sale := range []string{naive, fenced} {
				for k := 1; k <= skus; k++ {
					if _, err := db.ExecContext(ctx, `INSERT INTO skus VALUES ($1, $2, $3)`, sale, k, sz.stock); err != nil {
						t.Fatal(err)
					}
				}
			}
			var specs []buyerSpec
			for _, sale := range []string{naive, fenced} {
				mode := strings.TrimPrefix(sale, fmt.Sprintf("r%d-", round))
				for b := range sz.buyers {
					sp := buyerSpec{id: fmt.Sprintf("%s-%d", sale, b), sale: sale, mode: mode, sku: b%skus + 1, pause: b%3 == 0}
					sp.inside = mode == "fenced" && sp.pause && b%6 == 0
					sp.node = mode == "fenced" && sz.nodeEach > 0 && b%sz.nodeEach == sz.nodeEach-1
					uri := tg.uri(b, "")
					if sp.node {
						sp.argv = []string{node.node, script(t, "buyer.js"), node.js, uri, pg.URL, sale, strconv.Itoa(sp.sku),
							strconv.FormatInt(sz.ttl.Milliseconds(), 10), strconv.FormatBool(sp.pause), strconv.FormatBool(sp.inside)}
					} else {
						sp.argv = []string{buyer, "-uri", uri, "-pg", pg.URL, "-sale", sale, "-sku", strconv.Itoa(sp.sku),
							"-mode", mode, "-ttl", sz.ttl.String(), "-pause=" + strconv.FormatBool(sp.pause), "-pause-inside=" + strconv.FormatBool(sp.inside)}
					}
					specs = append(specs, sp)
				}
			}
			restarts := 0
			fault := func() {
				time.Sleep(sz.ttl * 3 / 2) // the first holders are in their sections, some stopped
				if topo == "single" {
					d := tg.daemons[0]
					d.stop()
					tg.daemons[0] = startDaemon(t, bins.mlockd, dir, "mlockd", d.addr, single...)
				} else {
					li := leaderIndex(tg)
					if li < 0 {
						t.Error("no leader to kill")
						return
					}
					d := tg.daemons[li]
					d.stop()
					time.Sleep(time.Second) // the others elect a leader meanwhile
					tg.daemons[li] = startDaemon(t, bins.mlockd, d.cmd.Dir, d.name, d.addr, d.cmd.Args[5:]...)
				}
				restarts++
			}
			outs := runBuyers(t, dir, specs, sz.ttl*5/2, sz.limit, fault, tg)
			slowest := 0
			for i := range outs {
				if outs[i].took > outs[slowest].took {
					slowest = i
				}
			}
			t.Logf("the last buyer, %s, exited %v after the start", specs[slowest].id, outs[slowest].took.Round(time.Millisecond))
			for _, sale := range []string{naive, fenced} {
				r := tally(t, db, sale, sz.stock, specs, outs)
				r.round, r.target, r.restarts = round, topo, restarts
				rows = append(rows, r)
				t.Logf("\n%s\n%s", fencedHeader, r)
				for _, e := range r.errors {
					t.Errorf("%s: %s", sale, e)
				}
				if r.mode == "naive" && r.oversold == 0 {
					t.Errorf("%s: the naive sale did not oversell: the faults did not make holders outlive their leases", sale)
				}
				if r.mode == "fenced" && (r.oversold != 0 || r.lostAcked != 0 || r.badStock != 0) {
					t.Errorf("%s: oversold %d, acknowledged sales lost %d, SKUs whose stock does not match the sales %d; want 0, 0, 0",
						sale, r.oversold, r.lostAcked, r.badStock)
				}
				if r.pauses == 0 {
					t.Errorf("%s: no buyer paused", sale)
				}
			}
			if t.Failed() {
				t.Logf("servers' logs:\n%s", tg.logTails())
			}
		})
		if !ok {
			break
		}
	}
}

// buyerSpec is one buyer process.
type buyerSpec struct {
	id, sale, mode string
	sku            int
	pause, inside  bool
	node           bool
	argv           []string
}

// buyerOut is what a buyer said and how it ended.
type buyerOut struct {
	lines  []string
	paused int
	exit   int
	took   time.Duration // from the start signal to its exit
}

// runBuyers starts every buyer, waits until all are ready, gives them the
// start signal together, runs fault (in its own goroutine), resumes each
// buyer that stops itself after pause, and waits (at most limit) for all to
// exit. Every process is killed by its PID at the end of the test.
func runBuyers(t *testing.T, dir string, specs []buyerSpec, pause, limit time.Duration, fault func(), tg *target) []buyerOut {
	t.Helper()
	outs := make([]buyerOut, len(specs))
	cmds := make([]*exec.Cmd, len(specs))
	stdins := make([]io.WriteCloser, len(specs))
	ready := make(chan int, len(specs))
	var mu sync.Mutex
	var readers, resumers sync.WaitGroup
	dones := make([]chan struct{}, len(specs))
	eofs := make([]chan struct{}, len(specs)) // closed when a buyer's output is read to its end
	exitAt := make([]time.Time, len(specs))
	t.Cleanup(func() {
		for i, c := range cmds {
			if c == nil {
				continue
			}
			select {
			case <-dones[i]:
			default:
				_ = syscall.Kill(c.Process.Pid, syscall.SIGKILL)
				_ = syscall.Kill(c.Process.Pid, syscall.SIGCONT)
				<-dones[i]
			}
		}
	})
	for i, sp := range specs {
		cmd := exec.Command(sp.argv[0], sp.argv[1:]...)
		cmd.Env = proctest.CleanEnv()
		errf, err := os.Create(filepath.Join(dir, sp.id+".err"))
		if err != nil {
			t.Fatal(err)
		}
		defer errf.Close()
		cmd.Stderr = errf
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if stdins[i], err = cmd.StdinPipe(); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatalf("starting %s: %v", sp.id, err)
		}
		cmds[i], dones[i], eofs[i] = cmd, make(chan struct{}), make(chan struct{})
		readers.Add(1)
		go func() {
			defer readers.Done()
			defer close(eofs[i])
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				line := sc.Text()
				f := strings.Fields(line)
				mu.Lock()
				outs[i].lines = append(outs[i].lines, line)
				if len(f) == 2 && f[0] == "pause" {
					outs[i].paused++
				}
				mu.Unlock()
				switch {
				case line == "ready":
					ready <- i
				case len(f) == 2 && f[0] == "pause":
					pid, _ := strconv.Atoi(f[1])
					resumers.Add(1)
					go func() {
						defer resumers.Done()
						time.Sleep(pause) // the buyer stays stopped past its lease
						if pid == cmd.Process.Pid {
							_ = syscall.Kill(pid, syscall.SIGCONT)
						}
					}()
				}
			}
		}()
		go func() {
			<-eofs[i] // Wait closes the pipe: read it whole first
			_ = cmd.Wait()
			outs[i].exit, exitAt[i] = cmd.ProcessState.ExitCode(), time.Now()
			close(dones[i])
		}()
	}
	// A bound, not a measure: loading a Node.js buyer (Medusa's framework)
	// takes over a second of CPU, and a hundred processes start at once on
	// a machine that may be busy.
	deadline := time.After(5 * time.Minute)
	isReady := make([]bool, len(specs))
	for range specs {
		select {
		case i := <-ready:
			isReady[i] = true
		case <-deadline:
			var b strings.Builder
			for i, sp := range specs {
				if isReady[i] {
					continue
				}
				mu.Lock()
				said := strings.Join(outs[i].lines, " / ")
				mu.Unlock()
				exited := "running"
				select {
				case <-dones[i]:
					exited = "exited"
				default:
				}
				fmt.Fprintf(&b, "---- %s (%s): said %q\n%s\n", sp.id, exited, said, tail(filepath.Join(dir, sp.id+".err"), 5))
			}
			t.Fatalf("not every buyer was ready within 5 minutes\n%s%s", b.String(), tg.logTails())
		}
	}
	started := time.Now()
	for _, w := range stdins {
		w.Close()
	}
	faulted := make(chan struct{})
	go func() {
		defer close(faulted)
		fault()
	}()
	timeout := time.After(limit)
	for i := range specs {
		select {
		case <-dones[i]:
		case <-timeout:
			t.Fatalf("the buyers did not all exit within %v (%s still runs)\n%s", limit, specs[i].id, tg.logTails())
		}
	}
	readers.Wait()
	resumers.Wait()
	<-faulted
	for i := range outs {
		outs[i].took = exitAt[i].Sub(started)
	}
	return outs
}

// tally counts a sale: from the buyers' lines and from the database.
func tally(t *testing.T, db *sql.DB, sale string, stock int, specs []buyerSpec, outs []buyerOut) saleRow {
	t.Helper()
	ctx := context.Background()
	r := saleRow{stock: stock * skus}
	acked := map[int64]bool{}
	for i, sp := range specs {
		if sp.sale != sale {
			continue
		}
		r.mode = sp.mode
		r.buyers++
		if sp.node {
			r.node++
		}
		o := outs[i]
		r.pauses += o.paused
		outcome := ""
		for _, line := range o.lines {
			f := strings.Fields(line)
			switch f[0] {
			case "sold":
				if id, err := strconv.ParseInt(f[2], 10, 64); err == nil && len(f) == 4 {
					acked[id] = true
				}
				outcome = line
			case "stale":
				r.stale++
				outcome = line
			case "soldout", "error":
				outcome = line
			}
		}
		if o.exit != 0 || outcome == "" || strings.HasPrefix(outcome, "error") {
			r.errors = append(r.errors, fmt.Sprintf("buyer %s exited %d, last said %q", sp.id, o.exit, outcome))
		}
	}
	for k := 1; k <= skus; k++ {
		var sold, left int
		if err := db.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM sales WHERE sale = $1 AND sku = $2),
			(SELECT stock FROM skus WHERE sale = $1 AND sku = $2)`, sale, k).Scan(&sold, &left); err != nil {
			t.Fatal(err)
		}
		r.sold += sold
		r.oversold += max(0, sold-stock)
		if left != stock-sold {
			r.badStock++
		}
	}
	for id := range acked {
		var n int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM sales WHERE id = $1 AND sale = $2`, id, sale).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			r.lostAcked++
		}
	}
	return r
}

// leaderIndex returns the index of the cluster's leader in tg.daemons, or
// -1 if no node says it leads (asked for at most 10 s).
func leaderIndex(tg *target) int {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for i, d := range tg.daemons {
			if ok, _ := leads(d.addr); ok {
				return i
			}
		}
		time.Sleep(100 * time.Millisecond) // status is rate-limited
	}
	return -1
}
