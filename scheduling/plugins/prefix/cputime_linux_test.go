// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package prefix_test

import "golang.org/x/sys/unix"

// processCPUTime is the CPU time of the process in nanoseconds, every
// thread's: on a shared machine it counts the work, not the waits.
func processCPUTime() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_PROCESS_CPUTIME_ID, &ts); err != nil {
		return 0
	}
	return ts.Nano()
}
