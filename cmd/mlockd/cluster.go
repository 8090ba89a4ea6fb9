package main

import (
	"errors"
	"flag"
	"os"
	"strings"
	"time"

	"github.com/mlock-dev/mlock/server"
)

// defaultRaftDir is the Raft directory of a cluster node without
// --raft-dir.
const defaultRaftDir = "mlockd.raft"

// addClusterFlags defines the flags that make mlockd a node of a cluster
// (see docs/cluster.md). Setting any of them sets cfg.Cluster; without
// them mlockd is a single node, as before.
//
//	--cluster-id          this node's id (required for a cluster)
//	--raft-addr           its Raft peer address (host:port the others dial)
//	--raft-dir            its Raft log and snapshots (default mlockd.raft)
//	--cluster-peers       bootstrap a new cluster of id=addr,id=addr,...
//	--cluster-join        the client address of a member to join through
//	--cluster-secret-file the file holding the secret shared by the nodes
//	--cluster-advertise   the client address the other nodes forward to
//	--cluster-ca          the CA file verifying the other nodes' TLS certificates (forwarding, Raft)
//	--raft-heartbeat, --raft-election  Raft timeouts (default 500ms each)
//	--raft-commit-timeout how often raft tells idle followers the commit index (default 250ms)
func addClusterFlags(fs *flag.FlagSet, cfg *server.Config) {
	dirSet := false
	cc := func() *server.ClusterConfig {
		if cfg.Cluster == nil {
			cfg.Cluster = &server.ClusterConfig{}
		}
		if !dirSet && cfg.Cluster.Dir == "" {
			cfg.Cluster.Dir = defaultRaftDir
		}
		return cfg.Cluster
	}
	fs.Func("cluster-id", "run as a node of a cluster with this `id` (unique, stable across restarts; see docs/cluster.md)", func(v string) error {
		if v == "" || strings.ContainsAny(v, " /=,") {
			return errors.New("want a name without spaces, '/', '=' or ','")
		}
		cc().ID = v
		return nil
	})
	fs.Func("raft-addr", "cluster: the `host:port` this node listens on for Raft, as the other nodes dial it", func(v string) error {
		cc().RaftAddr = v
		return nil
	})
	fs.Func("raft-dir", "cluster: the `directory` of the Raft log and snapshots (default "+defaultRaftDir+")", func(v string) error {
		dirSet = true
		cc().Dir = v
		return nil
	})
	fs.Func("cluster-peers", "cluster: bootstrap a new cluster of these members, `id=host:port,...` (Raft addresses; every first node may be given the same list)", func(v string) error {
		c := cc()
		c.Bootstrap = true
		c.Peers = nil
		for p := range strings.SplitSeq(v, ",") {
			id, addr, ok := strings.Cut(strings.TrimSpace(p), "=")
			if !ok || id == "" || addr == "" {
				return errors.New("want id=host:port,id=host:port")
			}
			c.Peers = append(c.Peers, server.ClusterPeer{ID: id, Addr: addr})
		}
		return nil
	})
	fs.Func("cluster-join", "cluster: join a running cluster through the member at this client `host:port`", func(v string) error {
		cc().Join = v
		return nil
	})
	fs.Func("cluster-secret-file", "cluster: the `file` holding the secret every node shares (at least 16 bytes; authenticates Raft connections and forwarding between nodes)", func(v string) error {
		b, err := os.ReadFile(v)
		if err != nil {
			return err
		}
		cc().Secret = []byte(strings.TrimSpace(string(b)))
		return nil
	})
	fs.Func("cluster-advertise", "cluster: the client `host:port` the other nodes forward commands to (default --listen)", func(v string) error {
		cc().ClientAddr = v
		return nil
	})
	fs.Func("cluster-ca", "cluster: the CA `file` verifying the other nodes' certificates when the nodes speak TLS (--tls-cert): a\n"+
		"follower forwards to the leader over TLS, for the host of its client address, and the Raft port speaks TLS,\n"+
		"a peer's certificate verified for the host of its Raft address (default: the system's roots)", func(v string) error {
		cc().CAFile = v
		return nil
	})
	fs.Func("raft-heartbeat", "cluster: Raft heartbeat timeout, a `duration` (default 500ms)", func(v string) error {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return errors.New("want a positive duration such as 500ms")
		}
		cc().HeartbeatTimeout = d
		return nil
	})
	fs.Func("raft-election", "cluster: Raft election timeout, a `duration` (default 500ms)", func(v string) error {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return errors.New("want a positive duration such as 500ms")
		}
		cc().ElectionTimeout = d
		return nil
	})
	fs.Func("raft-commit-timeout", "cluster: how often raft tells idle followers what is committed, a `duration` (default 250ms);\n"+
		"the leader tells them within about 1 ms of going idle anyway (a notice entry), so this is a fallback:\n"+
		"lower values cost idle CPU", func(v string) error {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return errors.New("want a positive duration such as 5ms")
		}
		cc().CommitTimeout = d
		return nil
	})
}
