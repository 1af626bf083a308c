// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package poll

import (
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestUntil(t *testing.T) {
	var n atomic.Int32
	Until(t, 10*time.Second, "three calls", func() bool { return n.Add(1) == 3 })
	if n.Load() != 3 {
		t.Fatalf("cond called %d times, want 3", n.Load())
	}

	rec := &recorder{TB: t}
	done := make(chan struct{})
	go func() { // Fatalf ends the goroutine it runs on
		defer close(done)
		Until(rec, 20*time.Millisecond, "never", func() bool { return false })
	}()
	<-done
	if !strings.Contains(rec.msg, "waiting for never") {
		t.Fatalf("failure %q, want it to name what was awaited", rec.msg)
	}
}

// recorder keeps a failure instead of failing the test.
type recorder struct {
	testing.TB
	msg string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
