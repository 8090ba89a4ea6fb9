package scenario

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// LogLine is a line of the shared log the worker programs write (without
// its newline): kind, the worker's or session's id, at in Unix ns, then
// each arg as fmt.Sprint writes it, separated by single spaces. The test
// reads it with parseLine (log_test.go).
func LogLine(kind, id string, at time.Time, args ...any) string {
	var b strings.Builder
	b.WriteString(kind + " " + id + " " + strconv.FormatInt(at.UnixNano(), 10))
	for _, a := range args {
		b.WriteString(" " + fmt.Sprint(a))
	}
	return b.String()
}
