package cluster

import (
	"context"
	"io"
	"log"
	"log/slog"
	"os"

	"github.com/hashicorp/go-hclog"
)

// raft-wal (v0.4.1) preallocates its segment files with etcd v3.3's fileutil, whose logger (capnslog)
// takes the standard library's log package over when the program starts: its output (its own
// format, or the systemd journal when the parent process is pid 1), flags and prefix. Nothing here
// logs through that package, but net/http and slog's default handler do: put its defaults back.
// This runs after capnslog's initialisation (a dependency's) and before main.
func init() {
	log.SetOutput(os.Stderr)
	log.SetFlags(log.LstdFlags)
	log.SetPrefix("")
}

type hclogLogger = hclog.Logger

// newHCLogger adapts l to the logger raft wants; nil l silences raft.
func newHCLogger(l *slog.Logger) hclog.Logger {
	if l == nil {
		return hclog.NewNullLogger()
	}
	return &slogAdapter{l: l}
}

// slogAdapter is an hclog.Logger writing to a *slog.Logger. hclog's Trace maps to slog.LevelDebug-4.
type slogAdapter struct {
	l    *slog.Logger
	name string
	args []any
}

const levelTrace = slog.LevelDebug - 4

func toSlog(level hclog.Level) slog.Level {
	switch level {
	case hclog.Trace:
		return levelTrace
	case hclog.Debug:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	case hclog.Error:
		return slog.LevelError
	default:
		return slog.LevelInfo
	}
}

func (a *slogAdapter) Log(level hclog.Level, msg string, args ...any) {
	if level == hclog.Off {
		return
	}
	a.l.Log(context.Background(), toSlog(level), msg, args...)
}

func (a *slogAdapter) Trace(msg string, args ...any) { a.Log(hclog.Trace, msg, args...) }
func (a *slogAdapter) Debug(msg string, args ...any) { a.Log(hclog.Debug, msg, args...) }
func (a *slogAdapter) Info(msg string, args ...any)  { a.Log(hclog.Info, msg, args...) }
func (a *slogAdapter) Warn(msg string, args ...any)  { a.Log(hclog.Warn, msg, args...) }
func (a *slogAdapter) Error(msg string, args ...any) { a.Log(hclog.Error, msg, args...) }

func (a *slogAdapter) enabled(level hclog.Level) bool {
	return a.l.Enabled(context.Background(), toSlog(level))
}

func (a *slogAdapter) IsTrace() bool { return a.enabled(hclog.Trace) }
func (a *slogAdapter) IsDebug() bool { return a.enabled(hclog.Debug) }
func (a *slogAdapter) IsInfo() bool  { return a.enabled(hclog.Info) }
func (a *slogAdapter) IsWarn() bool  { return a.enabled(hclog.Warn) }
func (a *slogAdapter) IsError() bool { return a.enabled(hclog.Error) }

func (a *slogAdapter) ImpliedArgs() []any { return a.args }

func (a *slogAdapter) With(args ...any) hclog.Logger {
	return &slogAdapter{l: a.l.With(args...), name: a.name, args: append(a.args[:len(a.args):len(a.args)], args...)}
}

func (a *slogAdapter) Name() string { return a.name }

func (a *slogAdapter) Named(name string) hclog.Logger {
	if a.name != "" {
		name = a.name + "." + name
	}
	return a.ResetNamed(name)
}

func (a *slogAdapter) ResetNamed(name string) hclog.Logger {
	return &slogAdapter{l: a.l.With("logger", name), name: name, args: a.args}
}

// SetLevel does nothing: the slog handler decides.
func (a *slogAdapter) SetLevel(hclog.Level) {}

func (a *slogAdapter) GetLevel() hclog.Level {
	for _, lv := range []hclog.Level{hclog.Trace, hclog.Debug, hclog.Info, hclog.Warn, hclog.Error} {
		if a.enabled(lv) {
			return lv
		}
	}
	return hclog.Off
}

func (a *slogAdapter) StandardLogger(*hclog.StandardLoggerOptions) *log.Logger {
	return slog.NewLogLogger(a.l.Handler(), slog.LevelInfo)
}

func (a *slogAdapter) StandardWriter(opts *hclog.StandardLoggerOptions) io.Writer {
	return a.StandardLogger(opts).Writer()
}
