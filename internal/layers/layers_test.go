// Package layers holds one test: no package of the module imports a package
// of a higher layer. The layers, lowest first, are listed in layerOf; the
// README's "Layout" section shows the same table.
package layers

import (
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/mlock-dev/mlock"

// layerOf returns the layer of a package of the module (by its path inside
// the module), the lowest being 0. Test-only packages are not listed: they
// may use anything.
func layerOf(rel string) (int, bool) {
	switch {
	case rel == "internal/locktable":
		return 0, true
	case rel == "internal/lease", rel == "internal/datadir", rel == "internal/auth", rel == "internal/cluster":
		return 0, true // leaves: they import no other package of the module
	case rel == "internal/core":
		return 1, true
	case rel == "internal/protocol", rel == "internal/rawio":
		return 2, true // the wire: frames, and the socket's raw reads and writes
	case rel == "" || rel == "server" || strings.HasPrefix(rel, "server/"):
		return 3, true // the root package is the client
	case rel == "locking" || strings.HasPrefix(rel, "locking/"):
		return 4, true
	case strings.HasPrefix(rel, "cmd/"):
		return 5, true
	}
	return 0, false
}

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
			continue
		}
		seen++
		for _, imp := range p.Imports {
			if !strings.HasPrefix(imp, module) {
				continue
			}
			to := strings.TrimPrefix(strings.TrimPrefix(imp, module), "/")
			lt, ok := layerOf(to)
			if !ok {
				t.Errorf("%s imports %s, which has no layer", p.ImportPath, imp)
				continue
			}
			// The leaves import nothing of the module, but the data directory
			// takes the clients' drift margin from the lease watchdog, and a
			// cluster node locks its log directory with the data directory's
			// lock.
			leaf := (from == "internal/lease" || from == "internal/datadir" || from == "internal/auth" || from == "internal/cluster") &&
				!(from == "internal/datadir" && to == "internal/lease") &&
				!(from == "internal/cluster" && to == "internal/datadir")
			if lt > lf || (lt == lf && leaf) || (from == "internal/locktable" && to != from) {
				t.Errorf("%s (layer %d) imports %s (layer %d): imports run down the layers only", p.ImportPath, lf, imp, lt)
			}
			if from == "server" && to == "internal/locktable" {
				t.Errorf("the server uses the engine through internal/core only")
			}
		}
	}
	if seen < 10 {
		t.Fatalf("only %d packages listed; the module layout changed?", seen)
	}
}
