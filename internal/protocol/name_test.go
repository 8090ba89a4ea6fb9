package protocol

import (
	"encoding/json"
	"os"
	"testing"
)

// TestRulesFixture checks the name and owner rules against the cases the
// Node.js client is tested against too (js/test/fixtures/rules.json): one
// rule, two implementations, the same answers.
func TestRulesFixture(t *testing.T) {
	b, err := os.ReadFile("../../js/test/fixtures/rules.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []struct {
		Kind  string `json:"kind"`
		Value string `json:"value"`
		OK    bool   `json:"ok"`
	}
	if err := json.Unmarshal(b, &cases); err != nil {
		t.Fatal(err)
	}
	if len(cases) < 10 {
		t.Fatalf("only %d cases", len(cases))
	}
	for _, c := range cases {
		var got bool
		switch c.Kind {
		case "name":
			got = ValidName(c.Value, 0)
		case "owner":
			got = ValidOwner(c.Value, 0)
		default:
			t.Fatalf("unknown kind %q", c.Kind)
		}
		if got != c.OK {
			t.Errorf("%s %q: valid %v, the fixture says %v", c.Kind, c.Value, got, c.OK)
		}
	}
}
