// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

//go:build !portablefetch

package fetch

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/poolpicker/poolpicker/internal/poll"
)

// A poller's thread runs at a lower priority than the process's, so that
// the kernel runs a pick's threads first.
func TestPollerThreadPriority(t *testing.T) {
	var kept atomic.Int64
	p, err := newPoller(Options{MaxPageBytes: 1 << 20, Timeout: time.Second, Kept: &kept,
		Parse: func(*Conn, []byte) error { return nil }, Complete: func(*Conn, Result) {}})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(p.Run)
	t.Cleanup(func() { p.Stop(); wg.Wait() })
	poll.Until(t, 10*time.Second, "the poller's thread", func() bool { return p.tid.Load() != 0 })
	nice := func(who int) int {
		prio, err := unix.Getpriority(unix.PRIO_PROCESS, who)
		if err != nil {
			t.Fatal(err)
		}
		return 20 - prio
	}
	process, poller := nice(0), nice(int(p.tid.Load()))
	if want := min(process+pollerNice, 19); poller != want {
		t.Errorf("the poller's thread runs at nice %d, the process at %d; want %d", poller, process, want)
	}
}
