// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

//go:build !windows

package testenv

import (
	"bytes"
	"os"

	"go.uber.org/goleak"
)

// LeakedGoroutines is what a test binary's TestMain checks once its stack
// has stopped: goroutines still running, apart from the process-wide ones
// klog and apimachinery start once and never stop.
func LeakedGoroutines() error {
	return goleak.Find(
		goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
		goleak.IgnoreAnyFunction("k8s.io/apimachinery/pkg/watch.(*Broadcaster).loop"),
	)
}

// RaceReported returns the log of a race-built process when that log holds
// a data race report, so that a race in a child process fails the run.
func RaceReported(logPath string) ([]byte, bool) {
	log, _ := os.ReadFile(logPath)
	return log, bytes.Contains(log, []byte("WARNING: DATA RACE"))
}
