package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mlock-dev/mlock/internal/datadir"
	"github.com/mlock-dev/mlock/server"
)

const recoverUsage = `Usage: mlockd recover --cluster-id ID [--raft-dir DIR] [--raft-addr HOST:PORT] [--token-floor N] [--dry-run] [--force]

Recovers a cluster that lost a majority of its nodes for good: turns this stopped node's Raft state
into a new cluster of one node, itself, keeping every lock, queue, session and offline push it knew
of. Then start mlockd on the directory as before (the same --cluster-id and --raft-addr): it leads
alone at once; add nodes with 'mlock cluster join ID RAFTADDR'. See docs/operations.md.

What is lost: what the other nodes committed that this node never received. Fencing tokens never
repeat: the next token is raised above the last this node knew by the requests waiting in its
state, 10 tokens per microsecond since its last entry and a minute's worth more (see
docs/operations.md), or to --token-floor if that is higher.

Run it on a stopped node only (it refuses a directory a running mlockd holds, and, without --force,
refuses while another old member accepts connections on its Raft address), and never start the other
old members on their old directories again: together they would elect a leader of their own.

Exit status: 0 recovered (or --dry-run reported); 1 it could not (nothing was changed); 2 a bad flag.

Flags:
`

// pidRE finds the process id in datadir.ErrInUse's message.
var pidRE = regexp.MustCompile(` \(pid [0-9]+\)`)

// recoverStatus runs "mlockd recover" and returns its exit status.
func recoverStatus(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("mlockd recover", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	id := fs.String("cluster-id", "", "this node's `id` (its --cluster-id; required)")
	dir := fs.String("raft-dir", defaultRaftDir, "the node's Raft `directory` (its --raft-dir)")
	addr := fs.String("raft-addr", "", "the Raft `host:port` the node will run with (default: its address in the old configuration)")
	floor := fs.String("token-floor", "", "make the next fencing token at least `N` (when above the computed floor; e.g. the highest token a fenced store accepted + 1)")
	dry := fs.Bool("dry-run", false, "read and report, change nothing")
	force := fs.Bool("force", false, "recover even if other old members accept connections on their Raft addresses")
	usage := func(msg string) int {
		fmt.Fprintf(stderr, "mlockd recover: %s\nRun 'mlockd recover --help' for usage.\n", msg)
		return exitUsage
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, recoverUsage)
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return exitOK
		}
		return usage(err.Error())
	}
	switch {
	case fs.NArg() > 0:
		return usage(fmt.Sprintf("unexpected argument %q", fs.Arg(0)))
	case *id == "":
		return usage("--cluster-id is required: the id this node ran with")
	case *dir == "":
		return usage("--raft-dir must not be empty")
	}
	cfg := server.RecoverConfig{Dir: *dir, ID: *id, RaftAddr: *addr, DryRun: *dry,
		Logger: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	if *floor != "" {
		n, err := strconv.ParseUint(*floor, 10, 64)
		if err != nil || n == 0 {
			return usage(fmt.Sprintf("--token-floor %q: want a positive integer", *floor))
		}
		cfg.TokenFloor = n
	}
	if !*dry && !*force {
		// The same replay without changes first: the old members, to check
		// that none of them still runs.
		probe := cfg
		probe.DryRun = true
		rep, err := server.RecoverCluster(probe)
		if err == nil {
			if alive := answering(rep, time.Second); len(alive) > 0 {
				fmt.Fprintf(stderr, "mlockd recover: old members accept connections on their Raft addresses: %s; "+
					"if they run, the old cluster may still have a majority, and this node would make a second one: "+
					"stop them, or make sure those addresses are not theirs, and run again (--force recovers anyway; nothing was changed)\n",
					strings.Join(alive, ", "))
				return exitError
			}
		}
		// An error is the real run's to report.
	}
	rep, err := server.RecoverCluster(cfg)
	if err != nil {
		msg := strings.TrimPrefix(err.Error(), "server: ")
		switch {
		case errors.Is(err, datadir.ErrInUse):
			msg = *dir + " is in use by a running mlockd" + pidRE.FindString(err.Error()) + ": stop that node first"
		case errors.Is(err, server.ErrRecoverNoState):
			msg += ": nothing to recover (is --raft-dir the node's directory?)"
		}
		fmt.Fprintf(stderr, "mlockd recover: %s (nothing was changed)\n", msg)
		return exitError
	}
	printRecoverReport(stdout, *dir, rep, *dry)
	return exitOK
}

func printRecoverReport(w io.Writer, dir string, rep *server.RecoverReport, dry bool) {
	var prev []string
	var others []string
	for _, p := range rep.Previous {
		prev = append(prev, fmt.Sprintf("%s (%s, %s)", p.ID, p.Addr, strings.ToLower(p.Suffrage)))
		if p.ID != rep.Voter.ID {
			others = append(others, p.ID)
		}
	}
	fmt.Fprintf(w, "directory:        %s\n", dir)
	fmt.Fprintf(w, "old members:      %s\n", strings.Join(prev, ", "))
	member := false
	for _, p := range rep.Previous {
		member = member || p.ID == rep.Voter.ID
	}
	if !member {
		fmt.Fprintf(w, "warning:          %s is not in the latest configuration (its removal reached it): its state may be old\n", rep.Voter.ID)
	}
	state := fmt.Sprintf("%d log entries replayed", rep.Replayed)
	if rep.SnapshotIndex > 0 {
		state = fmt.Sprintf("snapshot at index %d + %s", rep.SnapshotIndex, state)
	}
	fmt.Fprintf(w, "state:            %s, up to index %d (term %d)\n", state, rep.LastIndex, rep.LastTerm)
	if rep.LastNow > 0 {
		fmt.Fprintf(w, "last entry:       %s (%s before now)\n", time.Unix(0, rep.LastNow).UTC().Format(time.RFC3339Nano),
			rep.Gap.Round(time.Millisecond))
	}
	fmt.Fprintf(w, "kept:             %d held locks, %d waiting requests, %d sessions\n", rep.Held, rep.Waiting, rep.Sessions)
	if rep.Genesis {
		fmt.Fprintf(w, "fencing tokens:   last given %d, next %d\n", rep.LastToken, rep.NextToken)
	} else {
		fmt.Fprintf(w, "fencing tokens:   none given yet; the first leader starts them at its time in µs\n")
	}
	if dry {
		fmt.Fprintf(w, "dry run:          nothing was changed\n")
		return
	}
	fmt.Fprintf(w, "recovered:        %s at %s is the only voter of a new cluster of one node\n", rep.Voter.ID, rep.Voter.Addr)
	fmt.Fprintf(w, "next:             start mlockd on %s with --cluster-id %s --raft-addr %s, then add nodes with\n"+
		"                  mlock cluster join ID RAFTADDR (new ids, empty directories)\n", dir, rep.Voter.ID, rep.Voter.Addr)
	if len(others) > 0 {
		fmt.Fprintf(w, "never:            start %s on their old directories again (empty their --raft-dir first)\n", strings.Join(others, ", "))
	}
}

// answering returns the old members other than the recovered node whose
// Raft address accepts a TCP connection within timeout (dialled together).
func answering(rep *server.RecoverReport, timeout time.Duration) []string {
	var (
		mu    sync.Mutex
		alive []string
		wg    sync.WaitGroup
	)
	for _, p := range rep.Previous {
		if p.ID == rep.Voter.ID {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.DialTimeout("tcp", p.Addr, timeout)
			if err != nil {
				return
			}
			c.Close()
			mu.Lock()
			alive = append(alive, p.ID+" at "+p.Addr)
			mu.Unlock()
		}()
	}
	wg.Wait()
	slices.Sort(alive)
	return alive
}
