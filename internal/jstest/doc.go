// Package jstest runs the tests of the Node.js packages in js/ (the mlock
// client and the locking-mlock Medusa provider) from go test: its test
// builds mlockd from this repository and runs npm test in js/, which starts
// its servers from that binary on free loopback ports. It has no code of its
// own.
package jstest
