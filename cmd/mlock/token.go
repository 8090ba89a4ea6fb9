package main

import (
	"fmt"
	"io"

	"github.com/mlock-dev/mlock/internal/auth"
)

// cmdToken prints a new random token for a principal and the line of the
// auth file that grants it: the file holds only the token's hash.
func cmdToken(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("token", stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: mlock token NAME RIGHT...

Prints a new random token (256 bits) for principal NAME and the auth-file line
that grants it RIGHTs (prefix=P, prefix=*, admin, from=CIDR, cert). Put the line
in mlockd's --auth-file (then send mlockd SIGHUP) and give the token to the
client (mlock://NAME:TOKEN@host:12340). The token is shown once; the file keeps
only its SHA-256.
`)
	}
	pos, err := parse(fs, args)
	if err != nil {
		return exitError
	}
	if len(pos) < 2 {
		fs.Usage()
		return exitError
	}
	token := auth.NewToken()
	line, err := auth.Line(pos[0], token, pos[1:]...)
	if err != nil {
		return fail(stderr, err)
	}
	fmt.Fprintf(stdout, "token: %s\n%s\n", token, line)
	return exitOK
}
