// Command storm is the worker of the storm scenario (see the package
// documentation of scenario): it holds -n sessions of its own, each on a
// connection of its own from the local address -from, speaking the wire
// protocol as the original client does (connect with the same socketId
// again after a drop), and writes what they see to the suite's shared log.
//
// Session i (of the worker) locks the resource storm:(i/2) of the worker,
// so that of every two sessions one holds a lock and one waits for it. A
// session whose connection drops connects again with a jittered backoff
// (50 ms doubling up to 1 s, each wait between half and all of it),
// trying the nodes in turn. When the worker's standard input closes, every
// session releases: a holder checks its lock is still its own (extend),
// then unlocks; a waiter waits for its grant, then unlocks. An unlock whose
// connection ends before its answer (a cluster node closes a connection
// whose request it could not commit within 5 s) is sent again on the next
// connection, as the clients do; there `lock not exist!` means the first
// one took effect, and a new session means the lock went with the old one.
//
// Log lines (times in Unix ns): ready SID NS; grant SID NS TOKEN RESOURCE;
// drop SID NS WHY...; back SID NS new|resumed; refused SID NS TEXT...; loss SID NS
// WHY...; release SID NS TOKEN RESOURCE; done SID NS; error SID NS WHAT....
//
// Exit status: 0 every session released its lock; 1 otherwise; 2 a usage
// error.
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mlock-dev/mlock/internal/protocol"
	"github.com/mlock-dev/mlock/internal/scenario"
)

func main() { os.Exit(run()) }

var (
	logMu sync.Mutex
	logF  *os.File
)

// logLine writes one line to the shared log, in one write.
func logLine(kind, sid string, args ...any) {
	line := scenario.LogLine(kind, sid, time.Now(), args...)
	logMu.Lock()
	defer logMu.Unlock()
	_, _ = logF.WriteString(line + "\n")
}

func run() int {
	addrs := flag.String("addrs", "", "the nodes' client addresses, comma separated, the first tried first")
	from := flag.String("from", "127.0.0.1", "the local address to connect from")
	name := flag.String("name", "", "the worker's name (socketIds and resources start with it)")
	n := flag.Int("n", 10, "sessions")
	logPath := flag.String("log", "", "the shared log")
	flag.Parse()
	if *addrs == "" || *name == "" || *logPath == "" || *n < 1 {
		fmt.Fprintln(os.Stderr, "storm: -addrs, -name, -log and -n are required")
		return 2
	}
	f, err := os.OpenFile(*logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, "storm:", err)
		return 2
	}
	defer f.Close()
	logF = f
	release := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(release)
	}()
	nodes := strings.Split(*addrs, ",")
	var wg sync.WaitGroup
	var failed sync.Map
	for i := range *n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := &session{sid: *name + "-" + strconv.Itoa(i), res: "storm:" + *name + "-" + strconv.Itoa(i/2),
				nodes: nodes, from: *from, next: 0}
			if err := s.run(release); err != nil {
				logLine("error", s.sid, err)
				failed.Store(i, true)
			}
		}()
	}
	wg.Wait()
	bad := 0
	failed.Range(func(any, any) bool { bad++; return true })
	if bad > 0 {
		fmt.Fprintf(os.Stderr, "storm: %d sessions failed\n", bad)
		return 1
	}
	return 0
}

// session is one session of the worker, on one connection at a time.
type session struct {
	sid, res string
	nodes    []string
	from     string
	next     int // the node to try next

	nc       net.Conn    // nil while dropped
	frames   chan string // the connection's frames; closed when it ends
	ended    *error      // why the reader ended, set before frames closes
	lockID   string      // the session's lock request (held or waiting)
	held     bool        // granted, and believed held (not while dropped)
	token    string
	needAsk  bool // the lock request is to be sent (again)
	inFlight bool // a lock request was sent and its answer lost with the connection
	// unlocking: released (its release line written), the unlock not
	// answered yet; unlockSent: an unlock was sent before (its answer lost).
	unlocking, unlockSent bool
	backoff               time.Duration
	req                   int
}

// errDropped: the connection ended before the answer.
var errDropped = errors.New("connection dropped")

// run is the session's life: connect, lock, ride out drops until release,
// then release.
func (s *session) run(release <-chan struct{}) error {
	if err := s.connect(); err != nil {
		return err
	}
	s.needAsk = true
	ready := false
	ping := time.NewTicker(15 * time.Second)
	defer ping.Stop()
	released := false
	for {
		switch {
		case s.nc == nil:
			if err := s.reconnect(); err != nil {
				return err
			}
			if s.unlocking && s.needAsk {
				// A new session: the lock went with the old one.
				s.finish()
				return nil
			}
			continue
		case s.unlocking:
			done, err := s.unlock()
			if err != nil || done {
				return err
			}
			continue
		case s.needAsk:
			if err := s.ask(); err != nil && err != errDropped {
				return err
			}
			if !ready && !s.needAsk {
				ready = true
				logLine("ready", s.sid)
			}
			continue
		case released && s.held:
			done, err := s.release()
			if err != nil || done {
				return err
			}
			continue
		}
		select {
		case <-release:
			release = nil
			released = true
		case <-ping.C:
			if err := s.send("ping " + s.nextReq()); err != nil {
				s.dropWhy("ping: " + err.Error())
			}
		case p, ok := <-s.frames:
			if !ok {
				s.drop()
				continue
			}
			s.push(p)
		}
	}
}

// release checks the held lock is still the session's own (extend), then
// unlocks it; done once unlocked.
func (s *session) release() (bool, error) {
	req := s.nextReq()
	if err := s.send("extend " + req + " " + s.lockID + " 120000"); err != nil {
		s.dropWhy("extend: " + err.Error())
		return false, nil
	}
	p, ok := s.answer(req)
	if !ok {
		s.drop()
		return false, nil
	}
	if !strings.HasPrefix(p, "result "+req+" success ") {
		logLine("loss", s.sid, "at-release", strings.ReplaceAll(p, " ", "_"))
		s.held, s.needAsk = false, true
		return false, nil
	}
	logLine("release", s.sid, s.token, s.res)
	s.held, s.unlocking = false, true
	return s.unlock()
}

// unlock sends the unlock of the released lock; done once answered. A
// connection that ends first is dropped (unlocking stays set: the unlock
// is sent again on the next connection).
func (s *session) unlock() (bool, error) {
	req := s.nextReq()
	if err := s.send("unlock " + req + " " + s.lockID); err != nil {
		s.dropWhy("unlock: " + err.Error())
		return false, nil
	}
	again := s.unlockSent
	s.unlockSent = true
	p, ok := s.answer(req)
	if !ok {
		s.drop()
		return false, nil
	}
	if p != "result "+req+" success done" && (!again || p != "result "+req+" failed lock not exist!") {
		return false, fmt.Errorf("unlock: %q", p)
	}
	s.finish()
	return true, nil
}

// finish logs the session done (its lock unlocked) and closes its
// connection.
func (s *session) finish() {
	s.unlocking = false
	logLine("done", s.sid)
	s.nc.Close()
	for range s.frames {
	}
}

func (s *session) nextReq() string {
	s.req++
	return "q" + strconv.Itoa(s.req)
}

// push handles a frame that is not an awaited answer: a grant, an expiry,
// an error (then the connection ends).
func (s *session) push(p string) {
	f := strings.Fields(p)
	switch {
	case len(f) >= 4 && f[0] == "locked" && f[1] == s.lockID:
		// A resumed session's holds are announced again: one being
		// unlocked is not believed again.
		if !s.held && !s.unlocking {
			s.held, s.token = true, f[3]
			logLine("grant", s.sid, s.token, s.res)
		}
	case len(f) >= 2 && f[0] == "expired" && f[1] == s.lockID:
		if s.held {
			logLine("loss", s.sid, "expired")
		}
		// Gone (a shutdown tells every holder so): asked again on the
		// next connection.
		s.held = false
		s.dropWhy("expired")
		s.needAsk = true
	}
}

// answer waits for the answer to req, handling pushes meanwhile; false if
// the connection ended first.
func (s *session) answer(req string) (string, bool) {
	for s.nc != nil {
		p, ok := <-s.frames
		if !ok {
			return "", false
		}
		if strings.HasPrefix(p, "result "+req+" ") {
			return p, true
		}
		s.push(p)
	}
	return "", false
}

// ask sends the session's lock request (held for 120 s, no wait timeout).
func (s *session) ask() error {
	req := s.nextReq()
	if err := s.send("lock " + req + " " + s.res + " 120000 0 0"); err != nil {
		s.dropWhy("lock: " + err.Error())
		return errDropped
	}
	s.inFlight = true
	p, ok := s.answer(req)
	if !ok {
		s.drop()
		return errDropped
	}
	s.inFlight = false
	f := strings.Fields(p)
	if len(f) != 4 || f[2] != "success" {
		// A server shutting down, say: asked again on the next connection.
		logLine("error", s.sid, "lock", strings.ReplaceAll(p, " ", "_"))
		s.dropWhy("lock answered with an error")
		return errDropped
	}
	s.lockID, s.needAsk = f[3], false
	return nil
}

func (s *session) send(text string) error {
	_ = s.nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_, err := s.nc.Write(protocol.Append(nil, text))
	return err
}

// drop ends the connection (once): the session's lock is not believed
// held until it is back. The drop line says why the connection's reader
// ended (the server closed it, say), or that the session closed it.
func (s *session) drop() { s.dropWhy("") }

// dropWhy is drop for a reason of the session's own (why not empty).
func (s *session) dropWhy(why string) {
	if s.nc == nil {
		return
	}
	s.nc.Close()
	for range s.frames {
	}
	if why == "" {
		why = "closed by the session"
		if *s.ended != nil {
			why = (*s.ended).Error()
		}
	}
	s.nc, s.frames, s.ended = nil, nil, nil
	logLine("drop", s.sid, why)
}

// reconnect connects again with the backoff. A new session has lost what
// it held and asks again; a resumed one believes its lock again.
func (s *session) reconnect() error {
	for {
		mode, err := s.dial()
		if err != nil {
			s.wait()
			continue
		}
		s.backoff = 0
		logLine("back", s.sid, mode)
		switch {
		case mode == "new":
			if s.held {
				logLine("loss", s.sid, "session-new")
			}
			s.held, s.needAsk, s.inFlight = false, true, false
		case s.inFlight:
			return errors.New("resumed with a lock request whose answer was lost")
		case s.held:
			logLine("grant", s.sid, s.token, s.res) // believed again
		}
		return nil
	}
}

// wait sleeps the jittered backoff: 50 ms doubling up to 1 s, each wait
// between half and all of it.
func (s *session) wait() {
	s.backoff = min(max(2*s.backoff, 50*time.Millisecond), time.Second)
	time.Sleep(time.Duration(float64(s.backoff) * (0.5 + rand.Float64()/2)))
}

// connect makes the session's first connection.
func (s *session) connect() error {
	for range 100 {
		mode, err := s.dial()
		if err == nil {
			if mode != "new" {
				return fmt.Errorf("first connect: %s", mode)
			}
			s.backoff = 0
			return nil
		}
		s.wait()
	}
	return errors.New("could not connect")
}

// dial connects to the next node from s.from and sends connect; it returns
// the mode of the answer (new, resumed). A refusal is logged.
func (s *session) dial() (string, error) {
	addr := s.nodes[s.next%len(s.nodes)]
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(s.from)}, Timeout: 5 * time.Second}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		s.next++
		return "", err
	}
	_ = nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := nc.Write(protocol.Append(nil, "connect "+s.sid+" 1.0")); err != nil {
		nc.Close()
		s.next++
		return "", err
	}
	frames := make(chan string, 64)
	ended := new(error)
	go readFrames(nc, frames, ended)
	var first string
	select {
	case p, ok := <-frames:
		if !ok {
			nc.Close()
			s.next++
			return "", errors.New("closed before connected")
		}
		first = p
	case <-time.After(10 * time.Second):
		nc.Close()
		for range frames {
		}
		s.next++
		return "", errors.New("no answer to connect")
	}
	f := strings.Fields(first)
	if len(f) < 3 || f[0] != "connected" {
		if f[0] == "error" && first != "error auth timeout!" {
			logLine("refused", s.sid, strings.TrimPrefix(first, "error "))
		}
		nc.Close()
		for range frames {
		}
		s.next++
		return "", fmt.Errorf("connect: %q", first)
	}
	s.nc, s.frames, s.ended = nc, frames, ended
	return f[2], nil
}

// readFrames sends every frame read from nc to out, and closes out when
// the connection ends, having set *ended to why (the server closing it is
// "closed by the server").
func readFrames(nc net.Conn, out chan<- string, ended *error) {
	defer close(out)
	r := bufio.NewReaderSize(nc, 4096)
	var buf []byte
	tmp := make([]byte, 4096)
	for {
		for {
			p, n, _, err := protocol.Next(buf, protocol.MaxFrameLimit)
			if err != nil {
				*ended = fmt.Errorf("a bad frame: %w", err)
				return
			}
			if n == 0 {
				break
			}
			out <- string(p)
			buf = buf[n:]
		}
		m, err := r.Read(tmp)
		buf = append(buf, tmp[:m]...)
		if errors.Is(err, io.EOF) {
			err = errors.New("closed by the server")
		}
		if err != nil {
			*ended = err
			return
		}
	}
}
