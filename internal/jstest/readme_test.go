//go:build unix

package jstest

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mlock-dev/mlock/internal/pgtest"
	"github.com/mlock-dev/mlock/internal/proctest"
	"github.com/mlock-dev/mlock/internal/testenv"
)

// mdBlock returns the n-th (from 0) fenced block of lang in the section of
// the Markdown file path that starts at the line heading ("## ...").
func mdBlock(t *testing.T, path, heading, lang string, n int) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("%s has no section %q", path, heading)
	}
	s = s[i+len(heading)+2:]
	if j := strings.Index(s, "\n## "); j >= 0 {
		s = s[:j]
	}
	open := "```" + lang + "\n"
	for k := 0; ; k++ {
		i = strings.Index(s, open)
		if i < 0 {
			t.Fatalf("%s, section %q: no block %s number %d", path, heading, open, n)
		}
		s = s[i+len(open):]
		j := strings.Index(s, "```\n")
		if j < 0 {
			t.Fatalf("%s, section %q: a %s block does not end", path, heading, lang)
		}
		if k == n {
			return s[:j]
		}
		s = s[j:]
	}
}

// TestReadmeSnippets runs the Node.js snippets of README.md and
// js/README.md as written, each as a file run by node (a CommonJS .cjs, an
// ES module .mjs, or TypeScript compiled by the workspace's tsc), against a
// real mlockd built from this repository, and checks that each ran to its
// end and exited by itself. What the test changes, and only that: the
// server's address (localhost:12340 becomes the test server's; the
// cluster's 10.0.0.x nodes become loopback ports where nothing listens),
// and, before each snippet, stand-ins for the application's own functions
// it calls (deductStock, doSomething, processOrder, db, sku, runReport),
// which print that they ran.
func TestReadmeSnippets(t *testing.T) {
	t.Parallel()
	root := proctest.ModuleRoot(t)
	js := filepath.Join(root, "js")
	const why = "the README's Node.js snippets run in node"
	node := testenv.LookPath(t, why, "node")
	if _, err := os.Stat(filepath.Join(js, "node_modules", ".bin", "tsc")); err != nil {
		testenv.Missing(t, "js/node_modules/.bin/tsc missing (run npm ci in js/)", why)
	}
	// The packages' dist as their sources are now: built once, with
	// TestNodePackages, by the test script's build steps.
	script, err := readTestScript(js)
	if err != nil {
		t.Fatal(err)
	}
	if err := jsBuild.do(js, script.build); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"packages/mlock/dist/index.js", "packages/locking-mlock/dist/index.js"} {
		if _, err := os.Stat(filepath.Join(js, p)); err != nil {
			t.Fatalf("js/%s missing after the build: %v", p, err)
		}
	}
	bins := programs.Paths(t)
	addr := startMlockd(t, bins[0])
	_, port, _ := net.SplitHostPort(addr)
	dead := []string{proctest.FreeAddr(t), proctest.FreeAddr(t), proctest.FreeAddr(t)} // nothing listens there
	rewrite := strings.NewReplacer(
		"mlock://10.0.0.1:12340,10.0.0.2:12340,10.0.0.3:12340", "mlock://"+strings.Join(dead, ","),
		"mlock://localhost:12340", "mlock://"+addr,
		"{ host: 'localhost', port: 12340 }", "{ host: '127.0.0.1', port: "+port+" }",
	)
	// Under js/build (git ignores it), so that node and tsc find the
	// workspace's packages.
	if err := os.MkdirAll(filepath.Join(js, "build"), 0o755); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(filepath.Join(js, "build"), "readme-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	write := func(name, text string) string {
		t.Helper()
		if strings.Contains(text, "12340") {
			t.Fatalf("%s: an address the test does not rewrite is left:\n%s", name, text)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	var extraEnv []string // for the next run
	run := func(name string, file string, want ...string) {
		t.Helper()
		defer func() { extraEnv = nil }()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, node, file)
		cmd.Dir, cmd.Env = dir, append(proctest.CleanEnv(), extraEnv...) // no MLOCK_URL of the caller's

		cmd.WaitDelay = 5 * time.Second
		out, err := cmd.CombinedOutput()
		if ctx.Err() != nil {
			t.Errorf("%s: node did not exit within a minute (a client left open?)\n%s", name, out)
			return
		}
		if err != nil {
			t.Errorf("%s: node %s: %v\n%s", name, filepath.Base(file), err, out)
			return
		}
		for _, w := range want {
			if !strings.Contains(string(out), w) {
				t.Errorf("%s: the output lacks %q:\n%s", name, w, out)
			}
		}
		t.Logf("%s:\n%s", name, out)
	}
	tsc := func(name string, files ...string) {
		t.Helper()
		args := append([]string{"--target", "es2022", "--lib", "es2022,esnext.disposable", "--module", "nodenext",
			"--moduleResolution", "nodenext", "--types", "node", "--strict", "--skipLibCheck", "--esModuleInterop",
			"--outDir", dir}, files...)
		cmd := exec.Command(filepath.Join(js, "node_modules", ".bin", "tsc"), args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s does not compile as written: %v\n%s", name, err, out)
		}
	}

	// README.md: the Node.js section's block, an ES module.
	readme := filepath.Join(root, "README.md")
	run("README.md, Node.js", write("order.mjs", `async function deductStock({ fence, signal }) {
  if (!(fence > 0) || signal.aborted) throw new Error('deductStock: no usable lock');
  console.log('deducted with fence', fence);
}
`+rewrite.Replace(mdBlock(t, readme, "## Node.js", "js", 0))), "deducted with fence")

	// js/README.md: the original client's example (CommonJS), then the
	// TypeScript quick start and "What is new", one module (the second
	// uses the first's client).
	jsReadme := filepath.Join(js, "README.md")
	run("js/README.md, the original client's example", write("quickstart.cjs", `async function doSomething() { console.log('did something'); }
`+rewrite.Replace(mdBlock(t, jsReadme, "## Quick start (the original client's example)", "js", 0))), "did something")

	src := write("whatsnew.mts", `async function processOrder() { console.log('order processed'); }
const sku = 'product:1001';
const db = { async query(_sql: string, args: unknown[]) { console.log('stock written with fence', args[1]); } };
async function runReport({ signal }: { signal: AbortSignal }) { return signal.aborted ? 0 : 42; }
`+rewrite.Replace(mdBlock(t, jsReadme, "## Quick start (the original client's example)", "ts", 0))+
		rewrite.Replace(mdBlock(t, jsReadme, "## What is new", "ts", 0))+
		"console.log('report total', total, 'tried', l !== null);\n")
	tsc("js/README.md, quick start and what is new", src)
	run("js/README.md, quick start and what is new", filepath.Join(dir, "whatsnew.mjs"),
		"order processed", "stock written with fence", "report total 42 tried true")

	// js/README.md: the fenced write, against a real PostgreSQL
	// (internal/pgtest) whose stock table the test makes first.
	if pgtest.Found() || testenv.Strict() {
		pg := pgtest.Start(t, "the README's fenced-write snippet runs against PostgreSQL")
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, pg.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(ctx, "CREATE TABLE stock (sku text PRIMARY KEY, qty int NOT NULL); INSERT INTO stock VALUES ('1001', 3)"); err != nil {
			t.Fatal(err)
		}
		extraEnv = []string{"DATABASE_URL=" + pg.URL}
		run("js/README.md, fenced write", write("fenced.mjs", rewrite.Replace(mdBlock(t, jsReadme, "## What is new", "js", 0))))
		var qty int
		if err := conn.QueryRow(ctx, "SELECT qty FROM stock WHERE sku = '1001'").Scan(&qty); err != nil || qty != 2 {
			t.Errorf("js/README.md, fenced write: stock %d (%v), want 2", qty, err)
		}
		var token int64
		if err := conn.QueryRow(ctx, "SELECT token FROM mlock_fence WHERE resource = 'product:1001'").Scan(&token); err != nil || token <= 0 {
			t.Errorf("js/README.md, fenced write: the fence recorded token %d (%v), want the lock's", token, err)
		}
	}

	// js/README.md: the medusa-config snippet, imported as Medusa does.
	cfg := write("medusa-config.mts", rewrite.Replace(mdBlock(t, jsReadme, "## Medusa: `locking-mlock`", "ts", 0)))
	tsc("js/README.md, medusa-config", cfg)
	run("js/README.md, medusa-config", write("load-config.mjs", `import config from './medusa-config.mjs';
console.log(JSON.stringify(config.modules.locking ?? config.modules));
`), `"resolve":"locking-mlock"`, `"url":"mlock://`+addr+`"`)
}

// startMlockd starts the mlockd at bin on a free loopback port (no data
// directory, no quiet period) and returns its address; it is stopped, by
// its PID, when the test ends.
func startMlockd(t *testing.T, bin string) string {
	t.Helper()
	addr := proctest.FreeAddr(t)
	cmd := exec.Command(bin, "--listen", addr, "--data-dir", "none", "--quiet-period", "0")
	cmd.Env = proctest.CleanEnv()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	proctest.WaitFor(t, 20*time.Second, "mlockd listens on "+addr, func() bool {
		nc, err := net.Dial("tcp", addr)
		if err == nil {
			nc.Close()
		}
		return err == nil
	})
	return addr
}
