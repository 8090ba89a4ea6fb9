// Package layers holds the module's layering rule and its tests: every
// package of the module belongs to one layer of layers, and imports only
// packages of the layers its row names. The README's "Layout" table lists
// the same rows, and a test checks that it does.
package layers

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/mlock-dev/mlock"

// layer is one row of the layering: its name (the README's first column),
// its packages (paths inside the module; a trailing "/..." takes every
// package below), and the layers its packages may import (their own
// included only when listed).
type layer struct {
	name     string
	packages []string
	may      []string
}

// layers, lowest first. The back edges the rows rule out: the vocabulary
// imports nothing of the module; the engine only the vocabulary; the client
// never links the engine or the core, and never the server; the server never
// the client.
var layers = []layer{
	{"vocabulary", []string{"internal/protocol", "internal/buildinfo"}, nil},
	{"fencing", []string{"fence", "fence/..."}, []string{"fencing"}},
	{"helpers", []string{"internal/lease", "internal/datadir", "internal/auth", "internal/rawio"}, []string{"helpers"}},
	{"engine", []string{"internal/locktable"}, []string{"vocabulary"}},
	{"core", []string{"internal/core"}, []string{"engine", "vocabulary"}},
	{"replication", []string{"internal/cluster"}, []string{"helpers"}},
	{"client", []string{""}, []string{"vocabulary", "helpers"}},
	{"server", []string{"server", "server/..."}, []string{"server", "replication", "core", "vocabulary", "helpers"}},
	{"module", []string{"locking", "locking/..."}, []string{"module", "client", "core", "vocabulary", "helpers"}},
	{"commands", []string{"cmd/..."}, []string{"commands", "module", "client", "server", "vocabulary", "helpers"}},
}

// layerOf returns the layer of a package of the module (by its path inside
// the module). Test-only packages (internal/*test, internal/scenario,
// internal/jstest, deploy) are in no layer: they may use anything.
func layerOf(rel string) (*layer, bool) {
	for i := range layers {
		for _, p := range layers[i].packages {
			if p == rel || (strings.HasSuffix(p, "/...") && strings.HasPrefix(rel, strings.TrimSuffix(p, "...")) ||
				(strings.HasSuffix(p, "/...") && rel == strings.TrimSuffix(p, "/..."))) {
				return &layers[i], true
			}
		}
	}
	return nil, false
}

// testOnly are the packages outside the layers: test suites and deployment.
var testOnly = regexp.MustCompile(`^(internal/\w*test|internal/testenv|internal/scenario|internal/layers|internal/testcert|deploy(/.*)?)$`)

func TestNoImportRunsUpTheLayers(t *testing.T) {
	out, err := exec.Command("go", "list", "-json=ImportPath,Imports", module+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	seen := 0
	for {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		from := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		lf, ok := layerOf(from)
		if !ok {
			if !testOnly.MatchString(from) {
				t.Errorf("%s is in no layer: add it to layers and to the README's Layout table", p.ImportPath)
			}
			continue
		}
		seen++
		for _, imp := range p.Imports {
			if imp != module && !strings.HasPrefix(imp, module+"/") {
				continue
			}
			to := strings.TrimPrefix(strings.TrimPrefix(imp, module), "/")
			lt, ok := layerOf(to)
			if !ok {
				t.Errorf("%s imports %s, which is in no layer", p.ImportPath, imp)
				continue
			}
			if !slices.Contains(lf.may, lt.name) {
				t.Errorf("%s (%s) imports %s (%s): the %s layer may import only %v", p.ImportPath, lf.name, imp, lt.name, lf.name, lf.may)
			}
		}
	}
	if seen < 15 {
		t.Fatalf("only %d packages listed; the module layout changed?", seen)
	}
}

// TestClientLinksNoServerPart checks the client's whole dependency graph,
// not only its direct imports: a Go program that uses the client links
// neither the engine nor the server's libraries.
func TestClientLinksNoServerPart(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", module).Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{module + "/internal/locktable", module + "/internal/core", module + "/server",
			"github.com/hashicorp/raft", "github.com/prometheus/", "github.com/chromedp/", "github.com/moby/buildkit", "github.com/google/btree"} {
			if strings.HasPrefix(dep, banned) {
				t.Errorf("the client (%s) links %s", module, dep)
			}
		}
	}
}

// TestReadmeLayoutIsTheTable checks that the README's "Layout" table has
// one row per layer, top first, with the same packages.
func TestReadmeLayoutIsTheTable(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "\n## Layout\n")
	if !ok {
		t.Fatal("README.md has no Layout section")
	}
	row := regexp.MustCompile(`(?m)^\| (\w+) \| ([^|]*) \|`)
	code := regexp.MustCompile("`([^`]*)`")
	var got []string
	for _, m := range row.FindAllStringSubmatch(rest, -1) {
		if m[1] == "layer" {
			continue
		}
		var pkgs []string
		for _, c := range code.FindAllStringSubmatch(m[2], -1) {
			p := c[1]
			if p == "mlock" {
				p = ""
			}
			pkgs = append(pkgs, p)
		}
		got = append(got, m[1]+": "+strings.Join(pkgs, " "))
	}
	var want []string
	for i := len(layers) - 1; i >= 0; i-- {
		want = append(want, layers[i].name+": "+strings.Join(layers[i].packages, " "))
	}
	if !slices.Equal(got, want) {
		t.Errorf("README.md's Layout table:\n%s\nthe layers of this test, top first:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestNoLongFunctions keeps the functions of the client (the root package)
// and the server (server/...) under 100 lines: a longer one is a sequence
// of steps that want names. Test files are not counted.
func TestNoLongFunctions(t *testing.T) {
	const limit = 100
	dirs := []string{"../.."}
	sub, _ := filepath.Glob("../../server*")
	more, _ := filepath.Glob("../../server/*")
	dirs = append(dirs, sub...)
	dirs = append(dirs, more...)
	checked := 0
	for _, dir := range dirs {
		files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			fs := token.NewFileSet()
			af, err := parser.ParseFile(fs, f, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range af.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || fd.Body == nil {
					continue
				}
				checked++
				if n := fs.Position(fd.End()).Line - fs.Position(fd.Pos()).Line + 1; n > limit {
					t.Errorf("%s: %s is %d lines (at most %d)", fs.Position(fd.Pos()), fd.Name.Name, n, limit)
				}
			}
		}
	}
	if checked < 300 {
		t.Fatalf("only %d functions checked: the layout changed?", checked)
	}
}
