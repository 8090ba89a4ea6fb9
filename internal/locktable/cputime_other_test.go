//go:build !linux

package locktable

// threadCPU returns -1: the CPU time of one thread is read on Linux only.
func threadCPU() int64 { return -1 }
