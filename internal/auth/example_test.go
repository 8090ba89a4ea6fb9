package auth_test

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/mlock-dev/mlock/internal/auth"
)

func Example() {
	// What "mlock token" would print: a new token for the client, and the
	// line of the auth file, which holds only the token's hash.
	token := auth.NewToken()
	line, err := auth.Line("orders", token, "prefix=order:")
	if err != nil {
		panic(err)
	}

	file := "# name credential permissions\n" +
		line + "\n" +
		"legacy - prefix=batch: from=192.168.7.0/24\n"
	table, err := auth.Parse(strings.NewReader(file))
	if err != nil {
		panic(err)
	}

	client := netip.MustParseAddr("203.0.113.9")
	p, err := table.Token("orders", token, client)
	fmt.Println(p.Name, err, p.May("order:42"), p.May("batch:1"))

	_, err = table.Token("orders", "wrong", client)
	fmt.Println(err)

	// A 1.0 client, which sends no token, from the legacy network.
	p, ok := table.Address(netip.MustParseAddr("192.168.7.20"))
	fmt.Println(p.Name, ok)
	// Output:
	// orders <nil> true false
	// auth: authentication failed
	// legacy true
}
