// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scheduling

import (
	"testing"
	"time"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/scheduling/internal/schedtest"
)

// TestPoolSaturated: a one-endpoint pool is saturated by its scrape's queue or
// KV cache, or by the requests in flight from this picker beyond what the
// scrape saw running; without a fresh scrape, by its requests in flight.
func TestPoolSaturated(t *testing.T) {
	s := mustScheduler(t, "", Options{QueueDepthThreshold: 2, KVCacheUtilThreshold: 0.8})
	stale := func(m *datastore.Metrics) *datastore.Metrics { m.ScrapedAt = time.Now().Add(-time.Minute); return m }
	for _, tc := range []struct {
		name     string
		metrics  *datastore.Metrics
		inFlight int64
		want     bool
	}{
		{"idle", schedtest.Load(0, 0), 0, false},
		{"queue below the threshold", schedtest.Load(1, 0), 0, false},
		{"queue at the threshold", schedtest.Load(2, 0), 0, true},
		{"KV cache at the threshold", schedtest.Load(0, 0.8), 0, true},
		{"in flight beyond running, below", &datastore.Metrics{RunningRequests: 4, ScrapedAt: time.Now()}, 5, false},
		{"in flight beyond running, at", &datastore.Metrics{RunningRequests: 4, ScrapedAt: time.Now()}, 6, true},
		{"no scrape, in flight below", nil, 1, false},
		{"stale scrape, in flight at", stale(schedtest.Load(0, 0)), 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tp := newTestPool(t, 1, s)
			e := tp.Ep(t, 1)
			e.SetMetrics(tc.metrics)
			e.AddInFlight(tc.inFlight)
			if got := s.PoolSaturated(tp.Pool); got != tc.want {
				t.Fatalf("PoolSaturated of a one-endpoint pool = %v, want %v", got, tc.want)
			}
		})
	}
}
