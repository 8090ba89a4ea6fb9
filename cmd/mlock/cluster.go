package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/mlock-dev/mlock"
)

const clusterUsage = `Usage:
  mlock cluster status [--json] [--uri URI] [--timeout D]   every node's role, term, indexes and lag
  mlock cluster join [--uri URI] [--timeout D] ID RAFTADDR   (admin) add a voter: its --cluster-id and --raft-addr
  mlock cluster remove [--uri URI] [--timeout D] ID          (admin) remove a member
  mlock cluster rollback [--uri URI] [--timeout D] [--dry-run] --to 1
                                                             (admin) lower the cluster version, pinned
  mlock cluster rollback [--uri URI] [--timeout D] --cancel  (admin) lift the pin: raise it again

--uri names the cluster's nodes (mlock://h1,h2,h3). status asks each of them (and the leader, if it is
not among them and still a member) for its view and prints one line per node: LAG is the leader's commit index less the
node's applied index; MEMBER is the member as the leader sees it (stale: its build cannot read the cluster version).
Each node answers with its own view at once, without a session, also while it knows no leader. It exits 0 when every node answered and a leader is known, else 125 after the
table. join, remove and rollback go through any node to the leader and return once the change is committed.
A node started with --cluster-join joins by itself; join is for a node started without it.
rollback --to 1 lowers the cluster version to what the previous release (v0.1.0) reads, or says why it
cannot (--dry-run only checks); the leader keeps it there until rollback --cancel. Replace a node by the
previous release only once status --json shows "rollbackReady": true for it (docs/cluster.md, "Rollback").
`

func cmdCluster(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, "mlock cluster: missing subcommand: status, join, remove or rollback\nRun 'mlock cluster --help' for usage.\n")
		return exitUsage
	}
	switch args[0] {
	case "status":
		return cmdClusterStatus(args[1:], stdout, stderr)
	case "join":
		fs := newFlagSet("cluster join")
		inspectUsage(fs, "mlock cluster join [--uri URI] [--timeout D] ID RAFTADDR",
			"Adds a voter to the cluster: ID is the new node's --cluster-id, RAFTADDR its --raft-addr.\nAdministrators only.\n")
		return withClient(fs, args[1:], stdout, stderr, 2, 2, func(ctx context.Context, c *mlock.Client, _ string, pos []string) error {
			if err := c.ClusterJoin(ctx, pos[0], pos[1]); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "node %s (%s) joined\n", pos[0], pos[1])
			return nil
		})
	case "remove":
		fs := newFlagSet("cluster remove")
		inspectUsage(fs, "mlock cluster remove [--uri URI] [--timeout D] ID",
			"Removes member ID (its --cluster-id) from the cluster; a leader removing itself steps down.\nAdministrators only.\n")
		return withClient(fs, args[1:], stdout, stderr, 1, 1, func(ctx context.Context, c *mlock.Client, _ string, pos []string) error {
			if err := c.ClusterRemove(ctx, pos[0]); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "node %s removed\n", pos[0])
			return nil
		})
	case "rollback":
		return cmdClusterRollback(args[1:], stdout, stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, clusterUsage)
		return exitOK
	}
	fmt.Fprintf(stderr, "mlock cluster: unknown subcommand %q\nRun 'mlock cluster --help' for usage.\n", args[0])
	return exitUsage
}

// nodeView is one node's answer to cluster status.
type nodeView struct {
	Addr   string               `json:"addr"`
	Status *mlock.StatusCluster `json:"cluster,omitempty"`
	Lag    *uint64              `json:"lag,omitempty"` // the leader's commit index less this node's applied index
	Error  string               `json:"error,omitempty"`
}

func cmdClusterStatus(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("cluster status")
	asJSON := fs.Bool("json", false, "print the nodes' views as JSON")
	uri := uriFlag(fs, uriServer)
	timeout := timeoutFlag(fs)
	inspectUsage(fs, "mlock cluster status [--json] [--uri URI] [--timeout D]",
		"Asks every node of --uri (and the leader) for its view of the cluster.\n")
	p := parse(fs, args, stdout, stderr)
	if p.done {
		return p.exit
	}
	if len(p.pos) > 0 {
		return usageError(fs, stderr, fmt.Sprintf("unexpected argument %q", p.pos[0]))
	}
	if *timeout <= 0 {
		return usageError(fs, stderr, "--timeout must be positive")
	}
	o, err := clientOptions(*uri, *timeout)
	if err != nil {
		return fail(fs, stderr, err)
	}
	addrs := o.Addrs
	if len(addrs) == 0 {
		host, port := o.Host, o.Port
		if host == "" {
			host = mlock.DefaultHost
		}
		if port == 0 {
			port = mlock.DefaultPort
		}
		addrs = []string{net.JoinHostPort(host, strconv.Itoa(port))}
	}
	ctx, stop := signalCtx()
	defer stop()
	ctx, cancel := context.WithTimeoutCause(ctx, *timeout, errNoAnswer)
	defer cancel()
	views := askNodes(ctx, o, addrs, *timeout)
	// The leader, if no node of --uri is it.
	var leader *nodeView
	for i := range views {
		if st := views[i].Status; st != nil && st.Role == "leader" {
			leader = &views[i]
		}
	}
	if leader == nil {
		for _, v := range views {
			// Not a leader the node's own view no longer counts as a member:
			// one that removed itself is stepping down and answers nobody.
			if st := v.Status; st != nil && st.LeaderAddr != "" && !slices.Contains(addrs, st.LeaderAddr) && isMember(st, st.Leader) {
				lv := askNodes(ctx, o, []string{st.LeaderAddr}, *timeout)[0]
				if lv.Status != nil && lv.Status.Role != "leader" {
					break // it no longer leads (one that removed itself has shut down): not a member to list
				}
				views = append(views, lv)
				if lv.Status != nil {
					leader = &views[len(views)-1]
				}
				break
			}
		}
	}
	healthy := leader != nil
	for i := range views {
		v := &views[i]
		if v.Status == nil {
			healthy = false
			continue
		}
		if leader != nil && leader.Status.CommitIndex >= v.Status.AppliedIndex {
			lag := leader.Status.CommitIndex - v.Status.AppliedIndex
			v.Lag = &lag
		}
	}
	if *asJSON {
		if err := printJSON(stdout, views); err != nil {
			return fail(fs, stderr, err)
		}
	} else {
		printClusterStatus(stdout, views, leader)
	}
	if !healthy {
		switch {
		case leader == nil:
			fmt.Fprintln(stderr, "mlock cluster status: no leader known")
		default:
			fmt.Fprintln(stderr, "mlock cluster status: some nodes did not answer")
		}
		return exitError
	}
	return exitOK
}

// isMember reports whether id is a member in st's view.
func isMember(st *mlock.StatusCluster, id string) bool {
	for _, p := range st.Peers {
		if p.ID == id {
			return true
		}
	}
	return false
}

// askNodes asks each address, alone, for its status, concurrently.
func askNodes(ctx context.Context, o mlock.Options, addrs []string, timeout time.Duration) []nodeView {
	views := make([]nodeView, len(addrs))
	var wg sync.WaitGroup
	for i, a := range addrs {
		views[i].Addr = a
		wg.Add(1)
		go func() {
			defer wg.Done()
			// The probe first: it needs no session, so a node without a
			// leader answers it at once; a build without it (v0.1.0) is
			// asked on a session.
			if st, err := probeCluster(ctx, o, a); err == nil {
				views[i].Status = st
				return
			} else if errors.Is(err, errNotClusterNode) {
				views[i].Error = "not a cluster node"
				return
			}
			one := o
			one.Host, one.Port, one.Addrs = "", 0, []string{a}
			c, err := mlock.NewClient(one)
			if err != nil {
				views[i].Error = describe(err)
				return
			}
			defer c.Close()
			ctx, settle := failFast(ctx, []string{a}, timeout)
			st, err := c.Status(ctx)
			settle(err)
			switch {
			case err != nil:
				views[i].Error = describe(explain(ctx, err, []string{a}, timeout))
			case st.Cluster == nil:
				views[i].Error = "not a cluster node"
			default:
				views[i].Status = st.Cluster
			}
		}()
	}
	wg.Wait()
	return views
}

func printClusterStatus(w io.Writer, views []nodeView, leader *nodeView) {
	if leader != nil {
		fmt.Fprintf(w, "leader %s at %s, term %d, commit index %d, cluster version %d\n", leader.Status.ID, leader.Addr,
			leader.Status.Term, leader.Status.CommitIndex, leader.Status.Version)
	} else {
		fmt.Fprintln(w, "no leader known")
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tADDRESS\tROLE\tTERM\tLAST\tCOMMIT\tAPPLIED\tLAG\tMEMBER")
	seen := map[string]bool{}
	member := func(id string) string {
		if leader == nil {
			return "-"
		}
		for _, p := range leader.Status.Peers {
			if p.ID == id {
				s := strings.ToLower(p.Suffrage)
				if p.Failing {
					s += ", failing"
				}
				if p.Stale != "" {
					s += ", stale"
				}
				return s
			}
		}
		return "not a member"
	}
	for _, v := range views {
		if v.Status == nil {
			fmt.Fprintf(tw, "?\t%s\t-\t-\t-\t-\t-\t-\t%s\n", v.Addr, v.Error)
			continue
		}
		st := v.Status
		seen[st.ID] = true
		lag := "-"
		if v.Lag != nil {
			lag = strconv.FormatUint(*v.Lag, 10)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\n", st.ID, v.Addr, st.Role, st.Term, st.LastIndex,
			st.CommitIndex, st.AppliedIndex, lag, member(st.ID))
	}
	if leader != nil {
		// Members the leader knows that no address of --uri reached.
		for _, p := range leader.Status.Peers {
			if !seen[p.ID] {
				fmt.Fprintf(tw, "%s\t(raft %s)\t-\t-\t-\t-\t-\t-\t%s, not asked\n", p.ID, p.Addr, member(p.ID))
			}
		}
	}
	tw.Flush()
	if leader != nil {
		for _, p := range leader.Status.Peers {
			if p.Stale != "" {
				fmt.Fprintf(w, "%s is stale: %s (the cluster refuses its raft connections and commands: it is sent no log and never elected until it runs a build that reads the cluster version)\n", p.ID, p.Stale)
			}
		}
	}
}

// errNotClusterNode: the probed server is a single server.
var errNotClusterNode = errors.New("not a cluster node")

// probeCluster asks the node at addr for its own view of its cluster with
// the unframed "cluster" request (over TLS if o says so): no session, no
// log, answered at once even by a node without a leader. An error that is
// not errNotClusterNode means the node does not answer it (a build before
// it answers "error invalid frame!"), or could not be reached.
func probeCluster(ctx context.Context, o mlock.Options, addr string) (*mlock.StatusCluster, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = nc.SetDeadline(dl)
	}
	if o.TLS != nil {
		cfg := o.TLS.Clone()
		if cfg.ServerName == "" {
			cfg.ServerName, _, _ = net.SplitHostPort(addr)
		}
		tc := tls.Client(nc, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			return nil, err
		}
		nc = tc
	}
	if _, err := nc.Write([]byte("cluster\n")); err != nil {
		return nil, err
	}
	line, err := bufio.NewReaderSize(io.LimitReader(nc, 1<<20), 64<<10).ReadBytes('\n')
	if err != nil {
		return nil, err
	}
	if string(line) == "error not a cluster node!\n" {
		return nil, errNotClusterNode
	}
	var st mlock.StatusCluster
	if len(line) == 0 || line[0] != '{' {
		return nil, fmt.Errorf("no cluster probe: %q", strings.TrimSpace(string(line)))
	}
	if err := json.Unmarshal(line, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

func cmdClusterRollback(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("cluster rollback")
	to := fs.Int("to", 0, "the cluster version to lower to: 1 (the previous release's log format)")
	dry := fs.Bool("dry-run", false, "only check that the rollback is possible now")
	cancel := fs.Bool("cancel", false, "lift a rollback's pin: raise the cluster version to the highest format every member reads")
	inspectUsage(fs, "mlock cluster rollback [--uri URI] [--timeout D] [--dry-run] --to 1 | --cancel",
		"Lowers the cluster version to what the previous release reads and pins it (--to 1), or says why it\n"+
			"cannot; --cancel raises it again once every member runs this build. Administrators only.\n")
	check := func() string {
		switch {
		case *cancel && (*to != 0 || *dry):
			return "--cancel takes neither --to nor --dry-run"
		case !*cancel && *to <= 0:
			return "--to is required (1: the previous release's log format), or --cancel"
		}
		return ""
	}
	return withClientChecked(fs, args, stdout, stderr, 0, 0, check, func(ctx context.Context, c *mlock.Client, _ string, _ []string) error {
		var err error
		var msg string
		switch {
		case *cancel:
			err = c.ClusterRollbackCancel(ctx)
			msg = "rollback cancelled: the cluster version is raised to the highest log format every member reads\n"
		case *dry:
			err = c.ClusterRollback(ctx, *to, true)
			msg = fmt.Sprintf("the cluster version can be lowered to %d now\n", *to)
		default:
			err = c.ClusterRollback(ctx, *to, false)
			msg = fmt.Sprintf("cluster version lowered to %d and pinned: replace a node by the previous release once "+
				"mlock cluster status --json shows \"rollbackReady\": true for it\n", *to)
		}
		if err == nil {
			fmt.Fprint(stdout, msg)
		}
		return err
	})
}
