package main

import (
	"fmt"
	"io"

	"github.com/mlock-dev/mlock/internal/auth"
)

// cmdToken prints a new random token for a principal and the line of the
// auth file that grants it: the file holds only the token's hash.
func cmdToken(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("token")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: mlock token NAME RIGHT...

Prints a new random token (256 bits) for principal NAME and the auth-file line
that grants it RIGHTs: prefix=P (may lock the resources starting with P,
repeatable; prefix=* is every resource), admin, from=CIDR (repeatable), cert,
and the principal's quotas max-locks=N, max-sessions=N, max-conns=N (N from 1
to 1000000000, or unlimited; without one, mlockd's --principal-max-* applies,
by default half of each server-wide cap). A line must grant a prefix or admin. Put the
line in mlockd's --auth-file (then send mlockd SIGHUP) and give the token to the
client (mlock://NAME:TOKEN@host:12340). The token is shown once; the file keeps
only its SHA-256. stdout has the two lines "token: TOKEN" and the auth-file
line; a reminder goes to stderr.

Exit status: 0 done, 2 usage error (a bad NAME or RIGHT).
`)
	}
	p := parse(fs, args, stdout, stderr)
	if p.done {
		return p.exit
	}
	if len(p.pos) < 2 {
		return usageError(fs, stderr, "want NAME and at least one RIGHT")
	}
	token := auth.NewToken()
	line, err := auth.Line(p.pos[0], token, p.pos[1:]...)
	if err != nil {
		return usageError(fs, stderr, err.Error())
	}
	// The reminder goes to stderr, between the two lines on a terminal:
	// scripts that read stdout get the two lines only.
	fmt.Fprintf(stdout, "token: %s\n", token)
	fmt.Fprintln(stderr, "(give it to the client; it is shown once)")
	fmt.Fprintf(stdout, "%s\n", line)
	return exitOK
}
