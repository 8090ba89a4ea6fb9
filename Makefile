.PHONY: run test bench fuzz

# Start the server on 127.0.0.1:12340.
run:
	go run ./cmd/mlockd

# The whole test suite.
test:
	go test -race ./...

bench:
	go test -run '^$$' -bench . -benchmem ./internal/locktable/ ./internal/core/ ./internal/protocol/ ./server/

# A short fuzzing pass over every parser.
fuzz:
	go test -run '^$$' -fuzz FuzzNext -fuzztime 30s ./internal/protocol/
	go test -run '^$$' -fuzz FuzzSplit -fuzztime 30s ./internal/protocol/
	go test -run '^$$' -fuzz FuzzParseMessage -fuzztime 30s ./internal/protocol/
	go test -run '^$$' -fuzz FuzzCommands -fuzztime 30s ./server/
