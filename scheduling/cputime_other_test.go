//go:build !linux

package scheduling

// threadCPUTime is not measured off Linux.
func threadCPUTime() int64 { return 0 }
