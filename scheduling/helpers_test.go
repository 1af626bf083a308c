// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scheduling

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/poolpicker/poolpicker/scheduling/internal/schedtest"
)

func TestMain(m *testing.M) {
	// The scheduler starts no goroutine; this keeps it so.
	goleak.VerifyTestMain(m)
}

// newTestPool is a pool of n endpoints whose registry tells sched (when
// not nil) of changes.
func newTestPool(t testing.TB, n int, sched *Scheduler) *schedtest.Pool {
	t.Helper()
	if sched == nil {
		return schedtest.NewPool(t, n)
	}
	return schedtest.NewPool(t, n, sched)
}

func mustScheduler(t testing.TB, cfgText string, opts Options) *Scheduler {
	t.Helper()
	var cfg *Config
	if cfgText != "" {
		var err error
		if cfg, err = LoadConfig([]byte(cfgText)); err != nil {
			t.Fatalf("LoadConfig: %v", err)
		}
	}
	if opts.Rand == nil {
		opts.Rand = schedtest.SeededRand(1)
	}
	s, err := New(cfg, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s
}
