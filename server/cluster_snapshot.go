package server

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/mlock-dev/mlock/internal/core"
)

// Snapshot layout: "MLSS", the format (one byte), genesis byte, the
// settings in force (string, settings.String), [format 3 and later: the
// cluster version, uvarint], uvarint sessions, each: id, principal, node,
// key, offline (length-prefixed), pruned byte; in id order; then the
// core's snapshot. Format 1 has no settings: it restores with the node's
// own, until the next opParams. Format 2 is the previous build's: it
// restores with cluster version 1. Format 4 is format 3, written at cluster
// version 4 or more: a build that reads log format 3 at most (one before
// the rollback, see logFormat4) refuses it as it refuses the log.
//
// A build reads every format up to snapFormat and refuses a higher one
// (errFutureFormat). It writes format 4 once the cluster version is 4 or
// more, format 3 once it is 2 or more (every member reads it), format 2
// before: a snapshot goes to followers that lag, whatever their build.
const (
	snapMagic       = "MLSS"
	snapFormat      = 4
	sessionsMagic   = "MLSS\x02"
	sessionsMagicV1 = "MLSS\x01"
)

func (r *replica) Snapshot() ([]byte, error) {
	s := r.s
	if why := s.cl.halted.Load(); why != "" {
		// Its state is that of the entry before the one it could not
		// read: a snapshot would mark the later ones applied.
		return nil, errors.New("server: no snapshot: the node stopped applying the log: " + why)
	}
	b := []byte(snapMagic)
	s.batch(func(*core.Tx) {
		format := byte(2)
		switch {
		case s.cl.version >= logFormat4:
			format = snapFormat
		case s.cl.version >= logFormat2:
			format = 3
		}
		b = append(b, format)
		if s.cl.genesis {
			b = append(b, 1)
		} else {
			b = append(b, 0)
		}
		b = appendStr(b, s.set.String())
		if format >= 3 {
			b = binary.AppendUvarint(b, uint64(s.cl.version))
		}
		ids := make([]string, 0, len(s.sessions))
		for id := range s.sessions {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		b = binary.AppendUvarint(b, uint64(len(ids)))
		for _, id := range ids {
			sess := s.sessions[id]
			b = appendStr(b, id)
			b = appendStr(b, sess.pname)
			b = appendStr(b, sess.node)
			b = appendStr(b, sess.key)
			b = binary.AppendUvarint(b, uint64(len(sess.offline)))
			b = append(b, sess.offline...)
			if sess.pruned {
				b = append(b, 1)
			} else {
				b = append(b, 0)
			}
		}
	})
	cs, err := s.core().Snapshot()
	if err != nil {
		return nil, err
	}
	return append(b, cs...), nil
}

func (r *replica) Restore(snap []byte) error {
	s := r.s
	if why := s.cl.halted.Load(); why != "" {
		return errors.New("server: no restore: the node stopped applying the log: " + why)
	}
	if len(snap) < len(snapMagic)+2 || string(snap[:len(snapMagic)]) != snapMagic || snap[len(snapMagic)] == 0 {
		return errors.New("server: not a cluster snapshot")
	}
	format := snap[len(snapMagic)]
	if format > snapFormat {
		err := &errFutureFormat{what: "snapshot", got: uint64(format), max: snapFormat}
		s.halt(err)
		return err
	}
	genesis := snap[len(snapMagic)+1] == 1
	d := decoder{p: snap[len(snapMagic)+2:]}
	set := settingsOf(&s.cfg) // an older snapshot's: the node's own
	version := logFormat1
	if format >= 2 {
		text := d.str()
		if d.bad {
			return errBadCommand
		}
		st, err := parseSettings(text, set)
		if err != nil {
			return fmt.Errorf("server: cluster snapshot: %w", err)
		}
		set = st
	}
	if format >= 3 {
		v := d.uvarint()
		if d.bad || v < logFormat1 {
			return errBadCommand
		}
		version = int(min(v, logFormat))
	}
	restored, err := decodeSnapSessions(&d)
	if err != nil {
		return err
	}
	c, err := s.newCore(set, d.p, nil, 0)
	if err != nil {
		return err
	}
	// The snapshot's cluster version decides the rule of late grants
	// (newCore took the version applied before it).
	c.Batch(func(tx *core.Tx) { tx.SetLateGrants(lateGrants(version)) })
	old := s.core()
	changed := false
	old.Batch(func(*core.Tx) {
		for id, o := range s.sessions {
			if n := restored[id]; n != nil {
				n.hash, n.p, n.c = o.hash, o.p, o.c
				continue
			}
			if o.c != nil {
				o.c.sess = nil
				o.c.finish()
				s.online--
			}
		}
		s.sessions = restored
		for _, sess := range restored {
			if sess.hash == "" {
				sess.hash = s.shortHash(sess.id)
			}
			s.rebindLocked(sess, false)
		}
		s.cl.genesis = genesis
		s.setVersionLocked(version)
		changed = s.set != set
		s.set = set
		// The entries the snapshot covers are never applied here: the
		// answers this node's connections wait for from them would never
		// be written. Their clients reconnect, resume their sessions and
		// ask again (none at start-up).
		for _, lc := range s.cl.conns {
			lc.finish()
		}
		// Last: from here on batches run on the new core, beside this one
		// (see Server.batch).
		s.corep.Store(c)
	})
	old.Close()
	if changed {
		s.log.Info("cluster: settings in force (the snapshot's)", "settings", set.String())
	}
	return nil
}

// decodeSnapSessions decodes the sessions of a snapshot, by id, and leaves
// d at the core's encoding. Errors: errBadCommand.
func decodeSnapSessions(d *decoder) (map[string]*session, error) {
	n := d.uvarint()
	if d.bad || n > uint64(len(d.p)) {
		return nil, errBadCommand
	}
	restored := make(map[string]*session, n)
	for range n {
		sess := &session{id: d.str(), pname: d.str(), node: d.str(), key: d.str()}
		sess.offline = append([]byte(nil), d.bytes()...)
		if d.bad || len(d.p) == 0 {
			return nil, errBadCommand
		}
		sess.pruned = d.p[0] == 1
		d.p = d.p[1:]
		if len(sess.offline) == 0 {
			sess.offline = nil
		}
		restored[sess.id] = sess
	}
	return restored, nil
}
