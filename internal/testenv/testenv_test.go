package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestMain(m *testing.M) {
	if os.Getenv("MLOCK_TESTENV_CASE") == "examples" {
		if err := SkipExamples("no service", "the helper's examples case"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	os.Exit(m.Run())
}

func TestStrict(t *testing.T) {
	for _, tc := range []struct {
		ci   string
		want bool
	}{
		{"", false}, {"true", true}, {"1", true}, {"TRUE", true}, {"t", true},
		{"false", false}, {"0", false}, {"yes", false}, {" true", false},
	} {
		t.Setenv("CI", tc.ci)
		if got := Strict(); got != tc.want {
			t.Errorf("CI=%q: Strict() = %v, want %v", tc.ci, got, tc.want)
		}
	}
}

// A program found on PATH is returned, whatever CI says: the first of the
// names that is found.
func TestLookPathFound(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"mlock-testenv-b", "mlock-testenv-c"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", dir)
	for _, ci := range []string{"", "true"} {
		t.Setenv("CI", ci)
		got := LookPath(t, "the test of LookPath", "mlock-testenv-a", "mlock-testenv-b", "mlock-testenv-c")
		if got != filepath.Join(dir, "mlock-testenv-b") {
			t.Errorf("CI=%q: LookPath = %q, want mlock-testenv-b in %s", ci, got, dir)
		}
	}
}

func TestGetenvSet(t *testing.T) {
	t.Setenv("MLOCK_TESTENV_SET", "redis://127.0.0.1:1/0")
	for _, ci := range []string{"", "true"} {
		t.Setenv("CI", ci)
		if got := Getenv(t, "MLOCK_TESTENV_SET", "the test of Getenv"); got != "redis://127.0.0.1:1/0" {
			t.Errorf("CI=%q: Getenv = %q", ci, got)
		}
	}
}

// TestHelperProcess is not a test: the tests below run the test binary
// with MLOCK_TESTENV_CASE set, and this function then plays the case, so
// that a skip and a failure are seen from outside as go test reports them.
func TestHelperProcess(t *testing.T) {
	switch os.Getenv("MLOCK_TESTENV_CASE") {
	case "lookpath":
		LookPath(t, "the helper's LookPath case", "mlock-testenv-none")
	case "lookpath-several":
		LookPath(t, "the helper's LookPath case", "mlock-testenv-x", "mlock-testenv-y")
	case "getenv":
		Getenv(t, "MLOCK_TESTENV_UNSET", "the helper's Getenv case")
	case "missing":
		Missing(t, "js/ packages not built", "the helper's Missing case")
	default:
		return
	}
	t.Log("after the call") // never reached: the call ends the test
}

// Each missing requirement skips the test with a message naming it and
// what needs it; under CI=true it fails the test instead, with the same
// message; the test never goes on after the call. (Which values of CI
// count as true is TestStrict's.)
func TestMissingSkipsOrFails(t *testing.T) {
	cases := []struct{ name, msg string }{
		{"lookpath", "mlock-testenv-none not found on PATH: the helper's LookPath case"},
		{"lookpath-several", "no mlock-testenv-x, mlock-testenv-y on PATH: the helper's LookPath case"},
		{"getenv", "MLOCK_TESTENV_UNSET is not set: the helper's Getenv case"},
		{"missing", "js/ packages not built: the helper's Missing case"},
	}
	for _, tc := range cases {
		for _, ci := range []string{"", "true"} {
			t.Run(tc.name+"/CI="+ci, func(t *testing.T) {
				t.Parallel()
				cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.v", "-test.count=1")
				cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool {
					return strings.HasPrefix(kv, "CI=") || strings.HasPrefix(kv, "MLOCK_TESTENV_")
				}), "CI="+ci, "MLOCK_TESTENV_CASE="+tc.name, "PATH="+t.TempDir())
				out, err := cmd.CombinedOutput()
				strict := ci == "true"
				switch {
				case strict && (err == nil || !strings.Contains(string(out), "--- FAIL: TestHelperProcess")):
					t.Errorf("want a failure, got %v:\n%s", err, out)
				case !strict && (err != nil || !strings.Contains(string(out), "--- SKIP: TestHelperProcess")):
					t.Errorf("want a skip, got %v:\n%s", err, out)
				}
				want := tc.msg + "; skipped (under CI=true this fails)"
				if strict {
					want = tc.msg + "; required under CI=true"
				}
				if !strings.Contains(string(out), want) {
					t.Errorf("the output lacks %q:\n%s", want, out)
				}
				if strings.Contains(string(out), "after the call") {
					t.Errorf("the test went on after the call:\n%s", out)
				}
			})
		}
	}
}

// Example_skipped is the example SkipExamples keeps from running: run in
// the examples case, its output would not match.
func Example_skipped() {
	if os.Getenv("MLOCK_TESTENV_CASE") == "examples" {
		fmt.Println("ran although skipped")
	}
	fmt.Println("ok")
	// Output: ok
}

// SkipExamples (from TestMain) keeps the examples from running and says
// why; beside a -test.skip of top-level names it keeps that one too, and
// beside one of subtests it cannot, and fails; under CI=true it fails.
func TestSkipExamples(t *testing.T) {
	const msg = "no service: the helper's examples case"
	for _, tc := range []struct {
		name, ci, skip string
		ok             bool
		want           string
	}{
		{"skipped", "", "", true, msg + "; the examples are skipped (under CI=true this fails)"},
		{"beside a skip", "", "TestStrict", true, msg + "; the examples are skipped (under CI=true this fails)"},
		{"beside a skip of subtests", "", "TestX/y", false, msg + `; the examples cannot be skipped beside -test.skip "TestX/y"`},
		{"CI", "true", "", false, msg + "; required under CI=true"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^(Example_skipped|TestStrict)$", "-test.v", "-test.count=1", "-test.skip="+tc.skip)
			cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool {
				return strings.HasPrefix(kv, "CI=") || strings.HasPrefix(kv, "MLOCK_TESTENV_")
			}), "CI="+tc.ci, "MLOCK_TESTENV_CASE=examples")
			out, err := cmd.CombinedOutput()
			if (err == nil) != tc.ok || !strings.Contains(string(out), tc.want) {
				t.Errorf("exit %v, want success %v, and the output %q:\n%s", err, tc.ok, tc.want, out)
			}
			if strings.Contains(string(out), "Example_skipped") {
				t.Errorf("the example ran:\n%s", out)
			}
			if ran := strings.Contains(string(out), "--- PASS: TestStrict"); ran != (tc.ok && tc.skip == "") {
				t.Errorf("TestStrict ran %v; want it run only without a skip of its own:\n%s", ran, out)
			}
		})
	}
}
