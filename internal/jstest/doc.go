// Package jstest runs the tests of the Node.js packages in js/ (the mlock
// client and the locking-mlock Medusa provider) from go test: its test
// builds mlockd from this repository and runs what npm test in js/ runs
// (the build steps, then each test file in its own node process, all
// files at once), whose suites start their servers from that binary on free
// loopback ports; and it runs the Node.js snippets of README.md and
// js/README.md as written (TestReadmeSnippets). It has no code of its own.
package jstest
