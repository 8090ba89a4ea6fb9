package main

import (
	"flag"
	"net"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

func TestApplyEnv(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:12340", "")
	grace := fs.Duration("session-grace", time.Second, "")
	limit := fs.Int("max-queue-len", 5, "")
	if err := fs.Parse([]string{"--max-queue-len", "7"}); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"MLOCK_LISTEN": "127.0.0.1:9", "MLOCK_SESSION_GRACE": "30s", "MLOCK_MAX_QUEUE_LEN": "99"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	if err := applyEnv(fs, lookup); err != nil {
		t.Fatal(err)
	}
	if *listen != "127.0.0.1:9" || *grace != 30*time.Second {
		t.Fatalf("env not applied: %s %v", *listen, *grace)
	}
	if *limit != 7 {
		t.Fatalf("a flag on the command line must win over the environment, got %d", *limit)
	}
	env["MLOCK_SESSION_GRACE"] = "soon"
	fs2 := flag.NewFlagSet("t", flag.ContinueOnError)
	fs2.Duration("session-grace", time.Second, "")
	if err := applyEnv(fs2, lookup); err == nil {
		t.Fatal("a bad environment value must be an error naming the variable")
	}
}

func TestRunRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{{"--log-format", "xml"}, {"--log-level", "loud"}, {"extra"}, {"--max-frame", "99999999"}} {
		if err := run(args, nil); err == nil {
			t.Errorf("run(%q) succeeded", args)
		}
	}
}

// TestMain lets the test binary run as mlockd for TestSignalShutdown.
func TestMain(m *testing.M) {
	if os.Getenv("MLOCKD_TEST_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestSignalShutdown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(os.Args[0], "--listen", addr)
	cmd.Env = append(os.Environ(), "MLOCKD_TEST_MAIN=1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	var nc net.Conn
	for i := 0; ; i++ {
		if nc, err = net.Dial("tcp", addr); err == nil {
			break
		}
		if i > 200 {
			t.Fatalf("mlockd did not start: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	defer nc.Close()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("mlockd exited with %v, want 0", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("mlockd did not stop on SIGTERM")
	}
	nc.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := nc.Read(make([]byte, 1)); err == nil {
		t.Fatal("connection still open after shutdown")
	}
}
