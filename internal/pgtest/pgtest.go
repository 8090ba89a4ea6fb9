//go:build unix

// Package pgtest starts a private PostgreSQL server for a test: a new data
// directory (initdb), postgres on a free loopback port with no Unix socket
// elsewhere than that directory, stopped by its process id when the test
// ends and its directory removed.
//
// postgres and initdb are found on PATH, else in /usr/lib/postgresql/*/bin
// (where Debian's packages put them). Without them the test is skipped, or
// fails under CI=true (internal/testenv). Both refuse to run as root: run as
// root, the test runs them as the user nobody, in a directory it owns.
package pgtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/mlock-dev/mlock/internal/proctest"
	"github.com/mlock-dev/mlock/internal/testenv"
)

// Server is a running PostgreSQL server.
type Server struct {
	// URL connects to its database postgres as the superuser mlock, with
	// no password and no TLS: postgres://mlock@127.0.0.1:PORT/postgres?sslmode=disable.
	URL string
	// Addr is its host:port.
	Addr string
	dir  string
	log  string
	cmd  *exec.Cmd
	done chan struct{}
}

// bin returns the directory holding postgres and initdb, or "".
func bin() string {
	if p, err := exec.LookPath("postgres"); err == nil {
		if _, err := exec.LookPath("initdb"); err == nil {
			return filepath.Dir(p)
		}
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	slices.SortFunc(found, func(a, b string) int { return version(b) - version(a) }) // newest first
	for _, p := range found {
		if _, err := os.Stat(filepath.Join(filepath.Dir(p), "initdb")); err == nil {
			return filepath.Dir(p)
		}
	}
	return ""
}

// version reads the major version of /usr/lib/postgresql/N/bin/postgres.
func version(p string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(p))))
	return n
}

// Found reports whether postgres and initdb were found.
func Found() bool { return bin() != "" }

// Start starts a server for t (at most 60 s for initdb and the first
// connection) and stops it when t ends. why says what needs it, for the
// message when PostgreSQL is missing.
func Start(t testing.TB, why string) *Server {
	t.Helper()
	dir := bin()
	if dir == "" {
		testenv.Missing(t, "PostgreSQL (postgres and initdb) not found on PATH or in /usr/lib/postgresql/*/bin", why)
	}
	s, err := start(dir, proctest.FreeAddr(t))
	if s != nil {
		t.Cleanup(s.Stop)
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Examples is a server for a package's examples, which have no testing.T
// to start one: TestMain calls NewExamples before m.Run and Stop after it,
// and an example calls URL, which starts the server on its first call (a
// package whose examples do not run starts none).
type Examples struct {
	bin  string
	once sync.Once
	s    *Server
	err  error
}

// NewExamples finds PostgreSQL for the examples. Without it the examples
// do not run (testenv.SkipExamples: it says why) and it returns nil, or,
// under CI=true, an error for TestMain to fail with.
func NewExamples(why string) (*Examples, error) {
	dir := bin()
	if dir == "" {
		return nil, testenv.SkipExamples("PostgreSQL (postgres and initdb) not found on PATH or in /usr/lib/postgresql/*/bin", why)
	}
	return &Examples{bin: dir}, nil
}

// RunWithExamples is a TestMain's body for a package with PostgreSQL
// examples: it sets *ex (NewExamples(why); an error ends the process with
// status 1), runs the tests and examples, stops the server, checks that no
// goroutine leaked (goleak) when they passed, and exits with their status.
func RunWithExamples(m *testing.M, why string, ex **Examples) {
	var err error
	if *ex, err = NewExamples(why); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	(*ex).Stop()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// URL starts the server on its first call and returns its URL. A server
// that does not start panics: the example fails with the reason.
func (e *Examples) URL() string {
	e.once.Do(func() {
		var addr string
		if addr, e.err = proctest.NewFreeAddr(); e.err == nil {
			e.s, e.err = start(e.bin, addr)
		}
	})
	if e.err != nil {
		panic(e.err)
	}
	return e.s.URL
}

// Stop stops the server if URL started one (nil: nothing to stop).
func (e *Examples) Stop() {
	if e != nil && e.s != nil {
		e.s.Stop()
	}
}

func start(bindir, addr string) (*Server, error) {
	host, port, _ := strings.Cut(addr, ":")
	root, err := os.MkdirTemp("", "mlock-pg-")
	if err != nil {
		return nil, err
	}
	s := &Server{Addr: addr, dir: root, log: filepath.Join(root, "postgres.log"), done: make(chan struct{}),
		URL: "postgres://mlock@" + addr + "/postgres?sslmode=disable"}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		u, err := user.Lookup("nobody")
		if err != nil {
			os.RemoveAll(root)
			return nil, fmt.Errorf("PostgreSQL refuses to run as root, and there is no user nobody: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(root, uid, gid); err != nil {
			os.RemoveAll(root)
			return nil, err
		}
	}
	data := filepath.Join(root, "data")
	env := []string{"PATH=" + bindir + ":/usr/bin:/bin", "HOME=" + root, "LC_ALL=C", "TZ=UTC"}
	initdb := exec.Command(filepath.Join(bindir, "initdb"), "-D", data, "-U", "mlock", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
	initdb.Dir, initdb.Env = root, env
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		os.RemoveAll(root)
		return nil, fmt.Errorf("initdb: %v\n%s", err, out)
	}
	logf, err := os.Create(s.log)
	if err != nil {
		os.RemoveAll(root)
		return nil, err
	}
	defer logf.Close()
	s.cmd = exec.Command(filepath.Join(bindir, "postgres"), "-D", data, "-p", port,
		"-c", "listen_addresses="+host, "-c", "unix_socket_directories="+root,
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "max_connections=300", "-c", "shared_buffers=16MB")
	s.cmd.Dir, s.cmd.Env = root, env
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if err := s.cmd.Start(); err != nil {
		os.RemoveAll(root)
		return nil, err
	}
	go func() {
		_ = s.cmd.Wait()
		close(s.done)
	}()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		c, err := pgx.Connect(ctx, s.URL)
		if err == nil {
			err = c.Ping(ctx)
			c.Close(ctx)
		}
		cancel()
		if err == nil {
			return s, nil
		}
		select {
		case <-s.done:
			return s, fmt.Errorf("postgres exited before accepting connections:\n%s", s.Log())
		default:
		}
		if time.Now().After(deadline) {
			return s, fmt.Errorf("postgres not accepting connections on %s after 60s: %v\n%s", addr, err, s.Log())
		}
		time.Sleep(50 * time.Millisecond) // poll interval while it starts
	}
}

// Log returns the server's log.
func (s *Server) Log() string {
	b, _ := os.ReadFile(s.log)
	return string(b)
}

// Stop stops the server by its PID (SIGQUIT: immediate shutdown, then
// SIGKILL after 10 s), waits for it and removes its directory.
func (s *Server) Stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		select {
		case <-s.done:
		default:
			_ = s.cmd.Process.Signal(syscall.SIGQUIT)
			select {
			case <-s.done:
			case <-time.After(10 * time.Second):
				_ = s.cmd.Process.Kill()
				<-s.done
			}
		}
	}
	_ = os.RemoveAll(s.dir)
}
