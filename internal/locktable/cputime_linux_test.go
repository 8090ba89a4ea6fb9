package locktable

import "syscall"

// threadCPU returns the CPU time (ns) the calling OS thread has used, or
// -1 if it cannot tell. The caller locks its goroutine to its thread.
func threadCPU() int64 {
	const rusageThread = 1 // RUSAGE_THREAD
	var ru syscall.Rusage
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		return -1
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
