package fence_test

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/mlock-dev/mlock/fence"
)

func TestResources(t *testing.T) {
	got, err := fence.Resources(7, []string{"sku:3", "sku:1", "sku:3"})
	if err != nil || !slices.Equal(got, []string{"sku:1", "sku:3"}) {
		t.Fatalf("Resources = %v, %v; want [sku:1 sku:3]", got, err)
	}
	for _, c := range []struct {
		token uint64
		res   []string
	}{{0, []string{"a"}}, {math.MaxInt64 + 1, []string{"a"}}, {1, nil}, {1, []string{"a", ""}}} {
		if _, err := fence.Resources(c.token, c.res); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("Resources(%d, %q) = %v; want ErrInvalid", c.token, c.res, err)
		}
	}
	if _, err := fence.Resources(math.MaxInt64, []string{"a"}); err != nil {
		t.Errorf("Resources(MaxInt64) = %v", err)
	}
}

func TestStaleError(t *testing.T) {
	var err error = fmt.Errorf("buying: %w", &fence.StaleError{Resource: "sku:1", Token: 4, Highest: 9})
	var se *fence.StaleError
	if !errors.Is(err, fence.ErrStale) || !errors.As(err, &se) || se.Highest != 9 {
		t.Fatalf("%v: not a StaleError of ErrStale", err)
	}
	if errors.Is(err, fence.ErrInvalid) {
		t.Fatal("a StaleError is ErrInvalid")
	}
	want := `buying: fence: stale token 4 for "sku:1": token 9 has written since`
	if err.Error() != want {
		t.Fatalf("%q, want %q", err, want)
	}
}

func ExampleSplit() {
	res, err := fence.Resources(42, fence.Split("sku:2|sku:1"))
	fmt.Println(res, err)
	_, err = fence.Resources(0, fence.Split("sku:1"))
	fmt.Println(err)
	// Output:
	// [sku:1 sku:2] <nil>
	// fence: invalid call: token 0 (the lock has no fencing token)
}
