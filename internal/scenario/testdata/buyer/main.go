// Command buyer is the Go buyer of the scenario suite's fenced flash sale
// (fencing_test.go): one process, one session, that buys one unit of one
// SKU kept in PostgreSQL, under the SKU's lock.
//
// It connects to mlockd and to PostgreSQL, prints "ready", and waits for its
// standard input to close (the start signal). Then it locks sale:SKU and
// reads the stock. With -pause, once it has read a stock above 0 it prints
// "pause PID" and stops itself (SIGSTOP) inside its critical section: the
// test resumes it (SIGCONT) after longer than the ttl, when its lock may
// have passed to another buyer. Then it writes the sale:
//
//   - -mode naive, as most users write it: the stock it read, less one, and
//     a row in sales, without any check of the token;
//   - -mode fenced: in a transaction fenced by the lock's token
//     (fence/postgres), reading the stock again inside it. -pause-inside
//     stops it inside that transaction, after the fence, instead.
//
// It prints one line of its outcome: "sold SKU SALEID TOKEN", "stale SKU
// TOKEN HIGHEST" (the write refused), "soldout SKU", or "error WHAT", and
// exits 0 (1 after an error, 2 on a usage error).
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/mlock-dev/mlock"
	"github.com/mlock-dev/mlock/fence"
	"github.com/mlock-dev/mlock/fence/postgres"
)

func main() { os.Exit(run()) }

func say(format string, args ...any) { fmt.Printf(format+"\n", args...) }

// stop prints the pause line and stops the process until the test resumes
// it.
func stop() {
	say("pause %d", os.Getpid())
	_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
}

func run() int {
	uri := flag.String("uri", "", "mlockd or a cluster")
	pg := flag.String("pg", "", "PostgreSQL URL")
	sale := flag.String("sale", "", "the sale's name (its rows and resources)")
	sku := flag.Int("sku", 0, "the SKU to buy")
	mode := flag.String("mode", "fenced", "naive or fenced")
	ttl := flag.Duration("ttl", time.Second, "lease")
	pause := flag.Bool("pause", false, "stop inside the critical section, before the write")
	inside := flag.Bool("pause-inside", false, "with -mode fenced: stop inside the fenced transaction instead")
	flag.Parse()
	if *uri == "" || *pg == "" || *sale == "" || (*mode != "naive" && *mode != "fenced") {
		fmt.Fprintln(os.Stderr, "buyer: -uri, -pg, -sale and -mode naive|fenced are required")
		return 2
	}
	c, err := mlock.New(*uri)
	if err != nil {
		say("error client: %v", err)
		return 1
	}
	defer c.Close()
	db, err := sql.Open("pgx", *pg)
	if err != nil {
		say("error db: %v", err)
		return 1
	}
	defer db.Close()
	pctx, pcancel := context.WithTimeout(context.Background(), time.Minute)
	defer pcancel()
	if err := db.PingContext(pctx); err != nil {
		say("error db: %v", err)
		return 1
	}
	if err := c.Ping(pctx); err != nil {
		say("error ping: %v", err)
		return 1
	}
	say("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	res := "sale:" + *sale + ":sku:" + strconv.Itoa(*sku)
	// Ask again after a refusal or a dropped connection (a server
	// restarting), for as long as the context allows.
	var l *mlock.Lock
	for {
		l, err = c.Lock(ctx, res, &mlock.LockOptions{TTL: *ttl, Timeout: time.Minute})
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			say("error lock: %v", err)
			return 1
		}
		time.Sleep(100 * time.Millisecond) // before asking again
	}
	defer func() {
		uctx, ucancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = l.Unlock(uctx)
		ucancel()
	}()
	// The writes use a context of their own: the buyer, as written, does
	// not look at its lock again once it has it.
	wctx, wcancel := context.WithTimeout(context.Background(), time.Minute)
	defer wcancel()
	var stock int
	if err := db.QueryRowContext(wctx, `SELECT stock FROM skus WHERE sale = $1 AND sku = $2`, *sale, *sku).Scan(&stock); err != nil {
		say("error read: %v", err)
		return 1
	}
	if stock <= 0 {
		say("soldout %d", *sku)
		return 0
	}
	if *pause && !(*mode == "fenced" && *inside) {
		stop()
	}
	var id int64
	if *mode == "naive" {
		if _, err := db.ExecContext(wctx, `UPDATE skus SET stock = $3 WHERE sale = $1 AND sku = $2`, *sale, *sku, stock-1); err != nil {
			say("error write: %v", err)
			return 1
		}
		if err := db.QueryRowContext(wctx, `INSERT INTO sales (sale, sku, token) VALUES ($1, $2, $3) RETURNING id`, *sale, *sku, int64(l.Token())).Scan(&id); err != nil {
			say("error write: %v", err)
			return 1
		}
		say("sold %d %d %d", *sku, id, l.Token())
		return 0
	}
	soldOut := errors.New("sold out")
	err = postgres.Tx(wctx, db, nil, l.Token(), []string{res}, func(tx *sql.Tx) error {
		if *pause && *inside {
			stop()
		}
		if err := tx.QueryRowContext(wctx, `SELECT stock FROM skus WHERE sale = $1 AND sku = $2`, *sale, *sku).Scan(&stock); err != nil {
			return err
		}
		if stock <= 0 {
			return soldOut
		}
		if _, err := tx.ExecContext(wctx, `UPDATE skus SET stock = $3 WHERE sale = $1 AND sku = $2`, *sale, *sku, stock-1); err != nil {
			return err
		}
		return tx.QueryRowContext(wctx, `INSERT INTO sales (sale, sku, token) VALUES ($1, $2, $3) RETURNING id`, *sale, *sku, int64(l.Token())).Scan(&id)
	})
	var stale *fence.StaleError
	switch {
	case err == nil:
		say("sold %d %d %d", *sku, id, l.Token())
	case errors.As(err, &stale):
		say("stale %d %d %d", *sku, stale.Token, stale.Highest)
	case errors.Is(err, soldOut):
		say("soldout %d", *sku)
	default:
		say("error write: %v", err)
		return 1
	}
	return 0
}
