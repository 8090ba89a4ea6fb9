package main

import (
	"bytes"
	"net"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mlock-dev/mlock/internal/proctest"
	"github.com/mlock-dev/mlock/server"
	"github.com/mlock-dev/mlock/server/servertest"
)

// The help says each default once, and says the true one: --kill-after's
// depends on --ttl and the server (no "(default 10s)"), --uri's is
// $MLOCK_URI, else the built-in address (shown redacted when set), and
// mlock token lists every right of an auth-file line, the quotas too.
func TestHelpDefaultsTellTheTruth(t *testing.T) {
	t.Parallel()
	stdout, _, code := runMlock(t, "run", "--help")
	if code != 0 {
		t.Fatalf("run --help: exit %d", code)
	}
	ka := stdout[strings.Index(stdout, "  -kill-after"):]
	ka = ka[:strings.Index(ka, "\n  -owner")]
	if strings.Contains(ka, "(default 10s)") || !strings.Contains(ka, "when not given: the shortest of 10s, ttl/4") {
		t.Errorf("run --help, --kill-after:\n%s", ka)
	}
	for _, c := range []struct {
		env, want string
	}{
		{"", "(default $MLOCK_URI, else mlock://127.0.0.1:12340)"},
		{"mlock://ops:s3cret@127.0.0.1:7", "(default $MLOCK_URI, now mlock://ops:xxxxx@127.0.0.1:7, else mlock://127.0.0.1:12340)"},
	} {
		for _, cmd := range []string{"run", "status", "bench", "top"} {
			p := mlockCmd(cmd, "--help")
			p.Env = append(p.Env, "MLOCK_URI="+c.env)
			out, err := p.Output()
			if err != nil {
				t.Fatalf("%s --help: %v", cmd, err)
			}
			s := string(out)
			line := s[strings.Index(s, "  -uri string\n"):]
			line = line[:strings.Index(line[len("  -uri string\n"):], "\n")+len("  -uri string\n")]
			if strings.Count(line, "(default") != 1 || !strings.HasSuffix(line, c.want) || strings.Contains(line, "s3cret") {
				t.Errorf("MLOCK_URI=%q %s --help: --uri\n%s\nwant one default, %q", c.env, cmd, line, c.want)
			}
		}
	}
	stdout, _, code = runMlock(t, "token", "--help")
	for _, right := range []string{"prefix=P", "prefix=*", "admin", "from=CIDR", "cert", "max-locks=N", "max-sessions=N", "max-conns=N", "unlimited"} {
		if code != 0 || !strings.Contains(stdout, right) {
			t.Errorf("token --help (exit %d) does not name %s:\n%s", code, right, stdout)
		}
	}
	// What token --help lists, the auth file takes.
	if _, stderr, code := runMlock(t, "token", "orders", "prefix=order:", "max-locks=10", "max-sessions=unlimited", "max-conns=3"); code != 0 {
		t.Errorf("token with quotas: exit %d: %s", code, stderr)
	}
}

// A refused connection is told in one form by every command that talks to a
// server, mlock top included (with --uri and with --http): "server
// unreachable: ADDR: connection refused", exit 125.
func TestRefusedConnectionInOneForm(t *testing.T) {
	t.Parallel()
	addr := proctest.FreeAddr(t) // nothing listens there
	want := "server unreachable: " + addr + ": connection refused\n"
	for _, args := range [][]string{
		{"ping", "--uri", "mlock://" + addr},
		{"status", "--uri", "mlock://" + addr},
		{"locks", "--uri", "mlock://" + addr},
		{"top", "-n", "1", "--uri", "mlock://" + addr},
		{"top", "-n", "1", "--http", addr},
		{"top", "-n", "1", "--http", "http://" + addr + "/"},
	} {
		stdout, stderr, code := runMlock(t, args...)
		if code != exitError || stdout != "" || stderr != "mlock "+args[0]+": "+want {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 125 and %q", args, code, stdout, stderr, "mlock "+args[0]+": "+want)
		}
	}
}

// A bench target beyond loopback without --allow-remote is a usage error:
// exit 2, the reason once (no "bench: bench:"), and the pointer to --help.
func TestBenchRemoteTargetIsAUsageError(t *testing.T) {
	t.Parallel()
	for _, target := range []string{"mlock://192.0.2.1:12340", "redis://192.0.2.1:6379/0"} {
		stdout, stderr, code := runMlock(t, "bench", "--duration", "100ms", target)
		want := "mlock bench: 192.0.2.1 is not a loopback address; pass --allow-remote to load it\nRun 'mlock bench --help' for usage.\n"
		if code != exitUsage || stdout != "" || stderr != want {
			t.Errorf("bench %s: exit %d, stdout %q, stderr %q; want exit 2 and %q", target, code, stdout, stderr, want)
		}
	}
}

// mlock run's messages say each thing once: a server that accepts the
// connection and never answers is "no answer ... within --timeout", not
// that and the client's own timeout after it; an interrupted wait is
// "interrupted while waiting", not "canceled error: context canceled".
func TestRunWaitMessages(t *testing.T) {
	t.Parallel()
	t.Run("no answer", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() { // accepts, reads, answers nothing
			for {
				nc, err := ln.Accept()
				if err != nil {
					return
				}
				go func() { defer nc.Close(); _, _ = nc.Read(make([]byte, 4096)); time.Sleep(30 * time.Second) }()
			}
		}()
		_, stderr, code := runMlock(t, "run", "--uri", "mlock://"+ln.Addr().String(), "--timeout", "1s", "r", "--", "true")
		want := "mlock run: lock not taken: no answer from " + ln.Addr().String() + " within --timeout 1s: the lock was not asked for\n"
		if code != exitNotTaken || stderr != want {
			t.Errorf("exit %d, stderr %q; want exit 124 and %q", code, stderr, want)
		}
	})
	t.Run("interrupted", func(t *testing.T) {
		t.Parallel()
		uri := startServer(t)
		c, _ := holder(t, uri, "busy", "")
		cmd := mlockCmd("run", "--uri", uri, "busy", "--", "true")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer cmd.Process.Kill()
		waitQueued(t, c, "busy", 2)
		if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		code := exitCodeOf(t, cmd.Wait())
		if want := "mlock run: lock not taken: interrupted while waiting\n"; code != exitNotTaken || stderr.String() != want {
			t.Errorf("exit %d, stderr %q; want exit 124 and %q", code, stderr.String(), want)
		}
	})
}

// A server whose session grace leaves nothing to believe (a negative grace,
// announced as 0) is refused by mlock run with the reason, and no negative
// duration in it.
func TestRunZeroGraceMessage(t *testing.T) {
	t.Parallel()
	addr, _ := servertest.Start(t, server.Config{SessionGrace: -1}, "")
	_, stderr, code := runMlock(t, "run", "--uri", "mlock://"+addr, "--ttl", "8s", "job", "--", "true")
	if code != exitError || !strings.Contains(stderr, "a lock is not believed held at all") ||
		regexp.MustCompile(`-\d`).MatchString(stderr) || !strings.Contains(stderr, "give the server a longer --session-grace") {
		t.Errorf("exit %d, stderr %q", code, stderr)
	}
}
