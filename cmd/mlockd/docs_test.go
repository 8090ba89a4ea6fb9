package main

import (
	"flag"
	"os"
	"strings"
	"testing"

	"github.com/mlock-dev/mlock/server"
)

const (
	docsPath     = "../../docs/configuration.md"
	docsBegin    = "<!-- BEGIN flag table: generated from server.Settings and mlockd's flags; MLOCK_UPDATE_DOCS=1 go test ./cmd/mlockd -run TestDocsFlagTable rewrites it -->\n"
	docsEnd      = "<!-- END flag table -->\n"
	docsTableTop = "| flag | variable | Config field | default | 0, negative, bounds | replicated | |\n|---|---|---|---|---|---|---|\n"
)

// flagTable is the flag table of docs/configuration.md: the server's
// settings in their table's order (the flag of each, its variable, field,
// default, range, whether a cluster replicates it, its doc line), then
// mlockd's own flags, its HTTP listener's and a cluster node's.
func flagTable() string {
	var cfg server.Config
	fs, _ := newFlagSet(&cfg)
	unwrapFlags(fs)
	var b strings.Builder
	b.WriteString(docsTableTop)
	row := func(cells ...string) {
		for _, c := range cells {
			b.WriteString("| ")
			b.WriteString(strings.ReplaceAll(strings.ReplaceAll(c, "|", `\|`), "\n", " "))
			b.WriteByte(' ')
		}
		b.WriteString("|\n")
	}
	code := func(s string) string {
		if s == "" {
			return ""
		}
		return "`" + s + "`"
	}
	inTable := map[string]bool{}
	for _, s := range server.Settings() {
		flagName, rep := "none", ""
		if !s.NoFlag {
			flagName, inTable[s.Name] = "`--"+s.Name+"`", true
		}
		if s.Replicated {
			rep = "yes"
		}
		def := code(s.DefaultString())
		if s.DefaultText != "" {
			def = s.DefaultText
		}
		row(flagName, code(s.Env()), code(s.Field), def, s.Range(), rep, s.Doc)
	}
	fs.VisitAll(func(f *flag.Flag) {
		if !inTable[f.Name] {
			row("`--"+f.Name+"`", code(envName(f.Name)), "", code(f.DefValue), "", "", f.Usage)
		}
	})
	return b.String()
}

// The flag table of docs/configuration.md is the one the settings table
// and mlockd's flags make.
func TestDocsFlagTable(t *testing.T) {
	b, err := os.ReadFile(docsPath)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i, j := strings.Index(doc, docsBegin), strings.Index(doc, docsEnd)
	if i < 0 || j < i {
		t.Fatalf("%s has no generated flag table (its markers)", docsPath)
	}
	want := flagTable()
	if got := doc[i+len(docsBegin) : j]; got != want {
		if os.Getenv("MLOCK_UPDATE_DOCS") == "1" {
			doc = doc[:i+len(docsBegin)] + want + doc[j:]
			if err := os.WriteFile(docsPath, []byte(doc), 0o644); err != nil {
				t.Fatal(err)
			}
			return
		}
		t.Fatalf("the flag table of %s is not the settings' (MLOCK_UPDATE_DOCS=1 go test ./cmd/mlockd -run TestDocsFlagTable rewrites it); it should be:\n%s", docsPath, want)
	}
}
