package mlock

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mlock-dev/mlock/internal/wire"
)

// pool holds one shared connection per server address.
var pool = struct {
	sync.Mutex
	m map[string]*conn
}{m: map[string]*conn{}}

// conn is the connection shared by every Client of one server address: one
// TCP connection at a time, one session (socketId) for its whole life.
//
// Goroutines: run (owner of the reconnect loop, reads frames), and per TCP
// connection a writer and a pinger; all end when the last Client closes.
type conn struct {
	addr string
	sid  string
	opts Options
	log  *slog.Logger

	mu      sync.Mutex
	refs    int              // guarded by mu
	closed  bool             // guarded by mu
	nc      net.Conn         // guarded by mu: nil while down
	up      chan struct{}    // guarded by mu: closed while connected
	out     []byte           // guarded by mu: frames to write
	spare   []byte           // guarded by mu: the last written buffer, for reuse
	writing bool             // guarded by mu: a write is under way
	nextReq uint64           // guarded by mu
	calls   map[string]*call // guarded by mu: in flight, by request id
	locks   map[string]*Lock // guarded by mu: waiting and held, by lock id
	everUp  bool             // guarded by mu
	wake    chan struct{}    // cap 1: out has frames
	quit    chan struct{}    // closed by the last Close
	done    chan struct{}    // closed when run returns
	ctx     context.Context  // cancelled by the last Close: ends a dial
	cancel  context.CancelFunc
}

type call struct {
	ch        chan reply
	lock      *Lock // lock and trylock: registered by the reader on success
	abandoned bool  // the caller gave up: unlock the lock when its id arrives
}

type reply struct {
	payload string
	err     *Error
}

// calls are reused: a call goes back to the pool once its reply has been
// received (never while the reader may still answer it).
var callPool = sync.Pool{New: func() any { return &call{ch: make(chan reply, 1)} }}

// acquireConn returns the shared connection for o's address, starting it if
// needed.
func acquireConn(o Options) (*conn, error) {
	addr := o.addr()
	pool.Lock()
	defer pool.Unlock()
	if c := pool.m[addr]; c != nil {
		if o.SocketID != "" && o.SocketID != c.sid {
			return nil, &Error{Type: TypeRequest, Msg: "a client of " + addr + " already uses another socketId"}
		}
		c.mu.Lock()
		c.refs++
		c.mu.Unlock()
		return c, nil
	}
	sid := o.SocketID
	if sid == "" {
		sid = randomID()
	}
	c := &conn{addr: addr, sid: sid, opts: o, log: o.Logger.With("server", addr), refs: 1,
		up: make(chan struct{}), calls: map[string]*call{}, locks: map[string]*Lock{},
		wake: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	pool.m[addr] = c
	go c.run()
	return c, nil
}

// release drops one reference; the last one shuts the connection down after
// flushing what is queued, and waits for its goroutines.
func (c *conn) release() {
	pool.Lock()
	c.mu.Lock()
	c.refs--
	last := c.refs == 0
	if last {
		c.closed = true
		delete(pool.m, c.addr)
	}
	c.mu.Unlock()
	pool.Unlock()
	if last {
		close(c.quit)
		c.cancel()
		<-c.done
	}
}

func (c *conn) run() {
	defer close(c.done)
	var backoff time.Duration
	for {
		select {
		case <-c.quit:
			c.shutdown()
			return
		default:
		}
		nc, r, resumed, err := c.dial()
		if err != nil {
			backoff = min(max(2*backoff, 50*time.Millisecond), c.opts.MaxBackoff)
			wait := time.Duration(float64(backoff) * (0.5 + rand.Float64()/2))
			c.log.Warn("mlock: connecting failed; retrying", "err", err, "in", wait)
			select {
			case <-c.quit:
				c.shutdown()
				return
			case <-time.After(wait):
			}
			continue
		}
		backoff = 0
		c.serve(nc, r, resumed)
	}
}

// dial connects and identifies the session.
func (c *conn) dial() (net.Conn, *bufio.Reader, bool, error) {
	d := net.Dialer{Timeout: c.opts.DialTimeout, KeepAlive: 15 * time.Second}
	ctx, cancel := context.WithTimeout(c.ctx, c.opts.DialTimeout)
	defer cancel()
	nc, err := d.DialContext(ctx, "tcp", c.addr)
	if err != nil {
		return nil, nil, false, err
	}
	_ = nc.SetDeadline(time.Now().Add(c.opts.DialTimeout))
	if _, err := nc.Write(wire.Append(nil, "connect", c.sid, "1.0")); err != nil {
		nc.Close()
		return nil, nil, false, err
	}
	r := bufio.NewReaderSize(nc, 32<<10)
	p, err := readFrame(r)
	if err == nil && !strings.HasPrefix(p, "connected ") {
		err = fmt.Errorf("server answered %q", p)
	}
	if err != nil {
		nc.Close()
		return nil, nil, false, err
	}
	_ = nc.SetDeadline(time.Time{})
	return nc, r, strings.HasSuffix(p, " resumed"), nil
}

func readFrame(r *bufio.Reader) (string, error) {
	b, err := readFrameInto(r, nil)
	return string(b), err
}

// readFrameInto reads one frame's payload into buf (grown as needed).
func readFrameInto(r *bufio.Reader, buf []byte) ([]byte, error) {
	var h [4]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, err
	}
	l := int64(int32(binary.BigEndian.Uint32(h[:])))
	if l < wire.Overhead || l-wire.Overhead > wire.MaxFrameLimit {
		return nil, fmt.Errorf("mlock: server sent a frame of length %d", l)
	}
	n := int(l - 4)
	if cap(buf) < n {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, err
	}
	return buf[:n-1], nil
}

// serve runs one TCP connection until it breaks or the conn shuts down.
func (c *conn) serve(nc net.Conn, r *bufio.Reader, resumed bool) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		nc.Close()
		return
	}
	if c.everUp && !resumed {
		c.sessionLostLocked()
	}
	c.everUp = true
	c.nc = nc
	c.out = c.out[:0]
	close(c.up)
	c.mu.Unlock()
	c.log.Debug("mlock: connected", "resumed", resumed)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go c.writeLoop(nc, stop, &wg)
	go c.pingLoop(nc, stop, &wg)
	var err error
	var buf []byte
	for {
		var p []byte
		if p, err = readFrameInto(r, buf); err != nil {
			break
		}
		c.dispatch(p)
		if cap(p) <= 64<<10 {
			buf = p[:0]
		}
	}
	close(stop)
	nc.Close()
	wg.Wait()

	c.mu.Lock()
	c.nc = nil
	c.up = make(chan struct{})
	c.out = nil
	for _, l := range c.locks {
		l.armBackstopLocked()
	}
	cerr := &Error{Type: TypeConnection, Msg: "connection lost", Err: err}
	if c.closed {
		cerr.Err = ErrClosed
	}
	for id, cl := range c.calls {
		delete(c.calls, id)
		cl.ch <- reply{err: cerr}
	}
	c.mu.Unlock()
	if !errors.Is(err, net.ErrClosed) {
		c.log.Warn("mlock: connection lost; reconnecting", "err", err)
	}
}

// shutdown fails whatever is still waiting once the conn is closed.
func (c *conn) shutdown() {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := &Error{Type: TypeConnection, Err: ErrClosed}
	for id, cl := range c.calls {
		delete(c.calls, id)
		cl.ch <- reply{err: e}
	}
	for id, l := range c.locks {
		delete(c.locks, id)
		l.failLocked(e, e)
	}
}

// flush writes the queued frames to nc, unless a write is under way (that
// writer picks up what was queued meanwhile) or nc is no longer current.
func (c *conn) flush(nc net.Conn) error {
	for {
		c.mu.Lock()
		if c.writing || len(c.out) == 0 || c.nc != nc {
			c.mu.Unlock()
			return nil
		}
		c.writing = true
		buf := c.out
		c.out, c.spare = c.spare[:0], nil
		c.mu.Unlock()
		_, err := nc.Write(buf)
		c.mu.Lock()
		c.writing = false
		if cap(buf) <= 64<<10 {
			c.spare = buf[:0]
		}
		c.mu.Unlock()
		if err != nil {
			return err
		}
	}
}

// writeLoop writes the queued frames, gathering those of concurrent callers
// into one write, and flushes on shutdown.
func (c *conn) writeLoop(nc net.Conn, stop chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	for {
		select {
		case <-c.wake:
			if c.flush(nc) != nil {
				nc.Close()
				return
			}
		case <-stop:
			return
		case <-c.quit:
			_ = nc.SetWriteDeadline(time.Now().Add(time.Second))
			c.flush(nc)
			nc.Close()
			return
		}
	}
}

// pingLoop checks an idle connection every PingInterval and drops it if the
// server does not answer within the interval.
func (c *conn) pingLoop(nc net.Conn, stop chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	t := time.NewTicker(c.opts.PingInterval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), c.opts.PingInterval)
			_, err := c.roundTrip(ctx, nil, "ping")
			cancel()
			if errors.Is(err, ErrTimeout) {
				c.log.Warn("mlock: server does not answer pings; reconnecting")
				nc.Close()
			}
		}
	}
}

// sendLocked queues one frame "cmd req args..." and wakes the writer.
func (c *conn) sendLocked(cmd, req string, args ...string) {
	b, st := wire.Begin(c.out)
	b = append(b, cmd...)
	b = append(b, ' ')
	b = append(b, req...)
	for _, a := range args {
		b = append(b, ' ')
		b = append(b, a...)
	}
	c.out = wire.End(b, st)
}

// kickLocked asks the writer goroutine to flush.
func (c *conn) kickLocked() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// forgetLocked asks the server to drop a lock nobody waits for; its result
// is ignored.
func (c *conn) forgetLocked(id string) {
	if c.nc != nil {
		c.nextReq++
		c.sendLocked("unlock", "u"+strconv.FormatUint(c.nextReq, 36), id)
		c.kickLocked()
	}
}

// waitUp waits until the connection is up, at most DialTimeout.
func (c *conn) waitUp(ctx context.Context) *Error {
	c.mu.Lock()
	up, closed := c.up, c.closed
	c.mu.Unlock()
	if closed {
		return &Error{Type: TypeConnection, Err: ErrClosed}
	}
	select {
	case <-up:
		return nil
	default:
	}
	t := time.NewTimer(c.opts.DialTimeout)
	defer t.Stop()
	select {
	case <-up:
		return nil
	case <-ctx.Done():
		return ctxError(ctx)
	case <-t.C:
		return &Error{Type: TypeConnection, Msg: "server unreachable: " + c.addr}
	}
}

// roundTrip sends a command and waits for its result. For lock and trylock,
// l is registered under the id the server returns.
func (c *conn) roundTrip(ctx context.Context, l *Lock, cmd string, args ...string) (string, error) {
	for {
		if err := c.waitUp(ctx); err != nil {
			return "", err
		}
		c.mu.Lock()
		if c.nc == nil {
			c.mu.Unlock()
			continue // went down again
		}
		c.nextReq++
		req := strconv.FormatUint(c.nextReq, 36)
		cl := callPool.Get().(*call)
		cl.lock, cl.abandoned = l, false
		c.calls[req] = cl
		c.sendLocked(cmd, req, args...)
		// The writer goroutine gathers the requests of every caller into one
		// write: fewer system calls here and on the server.
		c.kickLocked()
		c.mu.Unlock()
		select {
		case r := <-cl.ch:
			cl.lock = nil
			callPool.Put(cl)
			if r.err != nil {
				return "", r.err
			}
			return r.payload, nil
		case <-ctx.Done():
			c.mu.Lock()
			if _, pending := c.calls[req]; pending {
				if l != nil {
					cl.abandoned = true // the reader unlocks it when its id arrives
				} else {
					delete(c.calls, req)
				}
				c.mu.Unlock()
				return "", ctxError(ctx)
			}
			c.mu.Unlock()
			r := <-cl.ch // answered meanwhile
			cl.lock = nil
			callPool.Put(cl)
			if r.err != nil {
				return "", r.err
			}
			return r.payload, nil
		}
	}
}

// cut splits b at the first space.
func cut(b []byte) (before, after []byte) {
	if i := bytes.IndexByte(b, ' '); i >= 0 {
		return b[:i], b[i+1:]
	}
	return b, nil
}

// dispatch handles one frame from the server. p is only valid during the
// call.
func (c *conn) dispatch(p []byte) {
	cmd, rest := cut(p)
	c.mu.Lock()
	defer c.mu.Unlock()
	switch string(cmd) {
	case "result":
		req, rest := cut(rest)
		status, payload := cut(rest)
		cl := c.calls[string(req)]
		if cl == nil {
			return
		}
		delete(c.calls, string(req))
		if string(status) != "success" {
			cl.ch <- reply{err: serverError(string(payload))}
			return
		}
		id := string(payload)
		if l := cl.lock; l != nil {
			if cl.abandoned {
				c.forgetLocked(id)
				cl.ch <- reply{err: &Error{Type: TypeConnection, Err: ErrClosed}}
				return
			}
			if old := c.locks[id]; old != nil && old.state == held {
				// An owner's renewal of a lock it holds: the same lock.
				l.renewed = old
				old.ttl = l.ttl
				old.armLocked(time.Now().Add(l.ttl))
			} else {
				l.id = id
				c.locks[id] = l
			}
		}
		cl.ch <- reply{payload: id}
	case "locked":
		idb, rest := cut(rest)
		expb, tokb := cut(rest)
		l := c.locks[string(idb)]
		if l == nil {
			// A grant nobody waits for (its request's answer was lost with a
			// connection): give it back at once.
			c.forgetLocked(string(idb))
			return
		}
		exp, _ := strconv.ParseInt(string(expb), 10, 64)
		token, _ := strconv.ParseUint(string(tokb), 10, 64)
		l.grantedLocked(token, time.UnixMilli(exp))
	case "timeout":
		if l := c.locks[string(rest)]; l != nil {
			delete(c.locks, l.id)
			l.failLocked(&Error{Type: TypeTimeout, Msg: "Lock timeout"}, nil)
		}
	case "expired":
		if l := c.locks[string(rest)]; l != nil {
			delete(c.locks, l.id)
			l.failLocked(nil, &Error{Type: TypeLost, Msg: "lock expired", Err: ErrExpired})
		}
	case "error":
		c.log.Warn("mlock: server error", "msg", string(rest))
	}
}

// sessionLostLocked handles a reconnect into a new session: every lock of
// the old one is gone.
func (c *conn) sessionLostLocked() {
	c.log.Warn("mlock: the server lost this session; its locks are gone")
	waitErr := &Error{Type: TypeConnection, Msg: "session lost", Err: ErrSessionLost}
	lostErr := &Error{Type: TypeLost, Msg: "session lost", Err: ErrSessionLost}
	for id, l := range c.locks {
		delete(c.locks, id)
		l.failLocked(waitErr, lostErr)
	}
}

// ctxError is the error of a call given up through ctx; ctx.Err() (and the
// cause, if one was given) stay in its chain.
func ctxError(ctx context.Context) *Error {
	err := ctx.Err()
	if cause := context.Cause(ctx); cause != nil && cause != err {
		err = fmt.Errorf("%w: %w", err, cause)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return &Error{Type: TypeTimeout, Err: err}
	}
	return &Error{Type: TypeRequest, Msg: "cancelled", Err: err}
}
