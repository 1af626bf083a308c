// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scheduling

import "golang.org/x/sys/unix"

// threadCPUTime is the CPU time of the calling OS thread in nanoseconds:
// unlike wall time it does not count time the thread spent preempted, so
// on a shared machine it shows the code's own latency.
func threadCPUTime() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0
	}
	return ts.Nano()
}
