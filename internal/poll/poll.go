// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package poll waits, in tests, for a state that nothing signals.
package poll

import (
	"testing"
	"time"
)

// maxGap bounds the time between two calls of cond: states reached quickly
// are seen within milliseconds, and a long wait (a process starting, an API
// server writing a status) does not ask many times a second.
const maxGap = 50 * time.Millisecond

// Until calls cond, at first every few milliseconds and then at most every
// 50 ms, until it holds; once within has passed it fails t, naming what it
// waited for. Only for states no event tells of: where one does, a test
// waits on the event. A caller that wants more said on failure defers a
// check of t.Failed (Fatalf runs the deferred calls).
func Until(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	gap := 2 * time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(gap)
		gap = min(2*gap, maxGap)
	}
}
