// Package testenv decides, in one place, what a test does when something it
// needs from outside the module is missing: a program on PATH (node,
// chromium, systemd-analyze, redis-server) or a service named by an
// environment variable (REDIS_URL, ETCD_ENDPOINTS).
//
// By default such a test is skipped, with a message that names what is
// missing and what needs it (go test -v shows it on the SKIP line). Under
// CI=true, the one switch, it fails instead, so that a CI run cannot pass
// by skipping. CI services (GitHub Actions, GitLab CI and others) set CI=true
// themselves; .ci/run sets it too.
//
// Only tests import this package.
package testenv

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// Strict reports whether a missing requirement fails the test rather than
// skipping it: the environment variable CI holds a true value as
// strconv.ParseBool reads it (true, 1, TRUE, t). Unset, empty, false or
// anything else, missing requirements skip.
func Strict() bool {
	on, err := strconv.ParseBool(os.Getenv("CI"))
	return err == nil && on
}

// Missing ends t because what is missing: it skips t, or fails it under
// CI=true. why says what needs it, so the message tells a reader what was
// not tested. Like t.Skip and t.Fatal it does not return.
func Missing(t testing.TB, what, why string) {
	t.Helper()
	if Strict() {
		t.Fatalf("%s: %s; required under CI=true", what, why)
	}
	t.Skipf("%s: %s; skipped (under CI=true this fails)", what, why)
}

// LookPath returns the path of the first of names found on PATH. If none
// is found it calls Missing: the test is skipped, or fails under CI=true.
func LookPath(t testing.TB, why string, names ...string) string {
	t.Helper()
	for _, name := range names {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	what := "no " + strings.Join(names, ", ") + " on PATH"
	if len(names) == 1 {
		what = names[0] + " not found on PATH"
	}
	Missing(t, what, why)
	return ""
}

// Getenv returns the value of the environment variable name. If it is
// unset or empty it calls Missing: the test is skipped, or fails under
// CI=true.
func Getenv(t testing.TB, name, why string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		Missing(t, name+" is not set", why)
	}
	return v
}

// WaitBound raises go test's -parallel, when the command line does not set
// it, to n: for a package whose parallel tests mostly wait (elections,
// leases, processes) rather than compute, the default (GOMAXPROCS) leaves
// the CPU idle. Call it from TestMain before m.Run. An explicit -parallel
// wins.
func WaitBound(n int) {
	if !flag.Parsed() {
		flag.Parse()
	}
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", strconv.Itoa(n))
	}
}

// SkipExamples is Missing for a package's examples, which have no
// testing.T to skip: called from TestMain before m.Run, it keeps the
// package's examples from running (it adds ^Example to -test.skip) and
// says so on standard output; under CI=true it runs nothing and returns
// the error TestMain fails with. A -test.skip given with subtests (a /)
// cannot be joined to ^Example: an error too.
func SkipExamples(what, why string) error {
	if Strict() {
		return fmt.Errorf("%s: %s; required under CI=true", what, why)
	}
	if !flag.Parsed() {
		flag.Parse()
	}
	skip := "^Example"
	if given := flag.Lookup("test.skip").Value.String(); given != "" {
		if strings.Contains(given, "/") {
			return fmt.Errorf("%s: %s; the examples cannot be skipped beside -test.skip %q", what, why, given)
		}
		skip = given + "|" + skip
	}
	if err := flag.Set("test.skip", skip); err != nil {
		return err
	}
	fmt.Printf("%s: %s; the examples are skipped (under CI=true this fails)\n", what, why)
	return nil
}
