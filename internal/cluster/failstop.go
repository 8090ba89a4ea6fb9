package cluster

import "github.com/hashicorp/raft"

// A node whose disk fails stops: fail-stop, as etcd and ZooKeeper do.
//
// raft never acknowledges an entry its log store did not write: a leader
// whose write fails answers the entries' futures with the error and steps
// down, a follower does not acknowledge them, and a failed write of the term
// panics. But a node whose disk keeps failing would be elected again, and
// fail again. So the first failed write of the log or the stable store
// (raft.LogStore's StoreLog, StoreLogs and DeleteRange; raft.StableStore's
// Set and SetUint64) logs it at error level, calls Config.OnStoreFailure,
// and closes the node (Close, in the background): it stops raft, gives up
// its leadership (the others elect a leader and serve), answers its pending
// proposals and closes the stores. The error still reaches raft, which
// acknowledges nothing of that write. A restart on the same directory once
// the disk works catches up from the leader.

// failStopLogs is a raft.LogStore whose failed writes stop the node.
type failStopLogs struct {
	raft.LogStore
	n *Node
}

func (s failStopLogs) StoreLog(l *raft.Log) error {
	return s.n.storeWrite("log", func() error { return s.LogStore.StoreLog(l) })
}

func (s failStopLogs) StoreLogs(ls []*raft.Log) error {
	return s.n.storeWrite("log", func() error { return s.LogStore.StoreLogs(ls) })
}

func (s failStopLogs) DeleteRange(min, max uint64) error {
	return s.n.storeWrite("log", func() error { return s.LogStore.DeleteRange(min, max) })
}

// failStopStable is a raft.StableStore whose failed writes stop the node.
type failStopStable struct {
	raft.StableStore
	n *Node
}

func (s failStopStable) Set(k, v []byte) error {
	return s.n.storeWrite("stable", func() error { return s.StableStore.Set(k, v) })
}

func (s failStopStable) SetUint64(k []byte, v uint64) error {
	return s.n.storeWrite("stable", func() error { return s.StableStore.SetUint64(k, v) })
}

// storeWrite runs one write of store ("log" or "stable"), after the tests'
// injected fault if any, and stops the node if it fails.
func (n *Node) storeWrite(store string, write func() error) error {
	var err error
	if f := n.cfg.WriteFault; f != nil {
		err = f(store)
	}
	if err == nil {
		err = write()
	}
	if err != nil {
		n.storeFailed(store, err)
	}
	return err
}

// storeFailed stops the node after a failed write of store: once.
func (n *Node) storeFailed(store string, err error) {
	if !n.failed.CompareAndSwap(false, true) {
		return
	}
	n.cfg.Logger.Error("cluster: the Raft "+store+" store cannot be written: this node stops (fail-stop) and lets the others lead; restart it once its disk works",
		"err", err, "dir", n.cfg.Dir)
	if f := n.cfg.OnStoreFailure; f != nil {
		f(err)
	}
	go func() {
		<-n.opened
		if n.raft != nil {
			_ = n.Close()
		}
	}()
}

// Failed reports whether a write of the node's stores failed (the node
// then stops: see Config.OnStoreFailure).
func (n *Node) Failed() bool { return n.failed.Load() }
