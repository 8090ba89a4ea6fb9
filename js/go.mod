// This file keeps the Go tool out of js/: `go test ./...`, `go vet ./...`
// and staticcheck at the repository's root skip a directory that holds a
// module of its own, so nothing under js/node_modules is ever built, vetted or
// tested as part of github.com/mlock-dev/mlock, whatever npm packages ship.
module github.com/mlock-dev/mlock/js

go 1.26
