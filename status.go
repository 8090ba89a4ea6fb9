package mlock

import (
	"github.com/mlock-dev/mlock/internal/buildinfo"
	"github.com/mlock-dev/mlock/internal/protocol"
)

// Version is the version of this module's server and client.
const Version = buildinfo.Version

// The documents of the status and locks commands; their fields are
// documented in docs/protocol.md ("status", "locks").
type (
	// Status is the server status document (the status command): the original
	// server's fields first, then mlockd's additions. Lock ids and socketIds are secrets, so locks are
	// keyed by 8 hex digits of the random part of their id and sockets by a keyed hash of
	// their socketId.
	Status = protocol.Status
	// StatusCluster is a cluster node's view of its cluster in Status.
	StatusCluster = protocol.StatusCluster
	// StatusClusterNode is one member of the cluster in StatusCluster.
	StatusClusterNode = protocol.StatusClusterNode
	// StatusLimits describes the server's limits in Status: the current use,
	// the refusals since the start, and the configured caps (the flags of the
	// same names; 0 or negative: no limit, for those that allow it; on a
	// cluster node, those in force: the leader's).
	StatusLimits = protocol.StatusLimits
	// StatusPrincipal is one principal's use and quota in Status (detailed
	// status, for administrators): its live lock requests and sessions (on a
	// cluster, over every node) and its authenticated connections (on the node
	// that answers). A Max field is 0 when there is no quota.
	StatusPrincipal = protocol.StatusPrincipal
	// StatusSocket describes one connected session in Status.
	StatusSocket = protocol.StatusSocket
	// StatusLock describes one request in Status.
	StatusLock = protocol.StatusLock
	// LocksEntry is one request in a resource's queue in the locks listing.
	LocksEntry = protocol.LocksEntry
	// LocksQueue is one resource in the locks listing.
	LocksQueue = protocol.LocksQueue
	// Locks is the answer to the locks command.
	Locks = protocol.Locks
)
