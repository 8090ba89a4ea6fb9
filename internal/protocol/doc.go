// Package protocol is the mlock wire protocol and its vocabulary, known in
// this one place by the server, the engine and the client: frames, the
// command words, one typed struct per command (LockArgs, ExtendArgs, ...,
// with AppendArgs for the client and Parse for the server), the builders of
// every message the server sends, the parser of those messages, the table of
// failure codes and their texts, lock ids, modes, the name and owner rules,
// the status and locks documents, and the coalescing writer both ends use.
//
// # Layers
//
// The package is the lowest layer of the module: it imports no package of
// the module (internal/layers checks it), so that the client links it
// without the engine and the server without the client. The engine
// (internal/locktable) takes its ID and Mode from here; the server maps the
// engine's errors to codes, not the other way.
//
// A lock request travels: the client (package mlock) fills a LockArgs and
// appends its frame with AppendTyped into its Outbox; the server reads frames
// with Next, splits them with Split, looks the command up with ParseVerb,
// parses the arguments with LockArgs.Parse and applies them to the lock
// service core (internal/core, over the engine internal/locktable); the
// engine's answer or error becomes a frame built by AppendOK, AppendFailed or
// AppendLocked/AppendPush; the client reads it with ReadFrame, parses it with
// ParseMessage and maps its Code to a typed error through Code.Class. No side
// compares texts.
//
// # Framing
//
// A frame is a big-endian int32 L, then L-5 bytes of payload, then '\n'. L
// counts the 4 header bytes and the trailing newline. The payload is text
// split on single spaces; only the command word is case-insensitive.
//
// Everything here parses in place and encodes by appending; nothing
// allocates on the hot paths (building and parsing results and pushes). The
// package does no network I/O of its own: it reads from a bufio.Reader and
// writes to an io.Writer.
package protocol
