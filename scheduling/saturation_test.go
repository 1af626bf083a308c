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
// scrape saw running; a request of the picker's that finished since the
// scrape frees a slot at once (its queue place, and its KV-cache blocks);
// without a fresh scrape, by its requests in
// flight.
func TestPoolSaturated(t *testing.T) {
	s := mustScheduler(t, "", Options{QueueDepthThreshold: 2, KVCacheUtilThreshold: 0.8})
	stale := func(m *datastore.Metrics) *datastore.Metrics { m.ScrapedAt = time.Now().Add(-time.Minute); return m }
	for _, tc := range []struct {
		name     string
		metrics  *datastore.Metrics
		atScrape int64 // in flight when the metrics were published
		inFlight int64
		want     bool
	}{
		{"idle", schedtest.Load(0, 0), 0, 0, false},
		{"queue below the threshold", schedtest.Load(1, 0), 0, 0, false},
		{"queue at the threshold", schedtest.Load(2, 0), 0, 0, true},
		{"KV cache at the threshold", schedtest.Load(0, 0.8), 0, 0, true},
		{"in flight beyond running, below", &datastore.Metrics{RunningRequests: 4, ScrapedAt: time.Now()}, 0, 5, false},
		{"in flight beyond running, at", &datastore.Metrics{RunningRequests: 4, ScrapedAt: time.Now()}, 0, 6, true},
		{"queue at the threshold, one of ours finished since", &datastore.Metrics{RunningRequests: 4, WaitingRequests: 2, ScrapedAt: time.Now()}, 6, 5, false},
		{"queue at the threshold, one finished and one sent since", &datastore.Metrics{RunningRequests: 4, WaitingRequests: 2, ScrapedAt: time.Now()}, 6, 6, true},
		{"queue above the threshold, one of ours finished since", &datastore.Metrics{RunningRequests: 4, WaitingRequests: 3, ScrapedAt: time.Now()}, 7, 6, true},
		{"KV cache at the threshold, one of ours finished since", &datastore.Metrics{RunningRequests: 4, KVCacheUsage: 0.8, ScrapedAt: time.Now()}, 4, 3, false},
		{"KV cache at the threshold, one finished and one sent since", &datastore.Metrics{RunningRequests: 4, KVCacheUsage: 0.8, ScrapedAt: time.Now()}, 4, 4, true},
		{"no scrape, in flight below", nil, 0, 1, false},
		{"stale scrape, in flight at", stale(schedtest.Load(0, 0)), 0, 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tp := newTestPool(t, 1, s)
			e := tp.Ep(t, 1)
			e.AddInFlight(tc.atScrape)
			e.SetMetrics(tc.metrics)
			e.AddInFlight(tc.inFlight - tc.atScrape)
			if got := s.PoolSaturated(tp.Pool); got != tc.want {
				t.Fatalf("PoolSaturated of a one-endpoint pool = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestEndpointStartsAtOnce: an endpoint starts one more request at once
// while it is not saturated and runs fewer than its running capacity (the
// running count of the last scrape that showed a queue), counting the
// requests finished and sent since the last scrape.
func TestEndpointStartsAtOnce(t *testing.T) {
	s := mustScheduler(t, "", Options{QueueDepthThreshold: 1, KVCacheUtilThreshold: 0.8})
	queued := &datastore.Metrics{RunningRequests: 4, WaitingRequests: 3, ScrapedAt: time.Now()}
	for _, tc := range []struct {
		name     string
		learn    *datastore.Metrics // published first: the running capacity, if it shows a queue
		metrics  *datastore.Metrics
		atScrape int64
		inFlight int64
		want     bool
	}{
		{"capacity unknown, below the threshold", nil, &datastore.Metrics{RunningRequests: 4, ScrapedAt: time.Now()}, 4, 4, true},
		{"capacity unknown, at the threshold", nil, &datastore.Metrics{RunningRequests: 4, WaitingRequests: 1, ScrapedAt: time.Now()}, 5, 5, false},
		{"running at capacity", queued, &datastore.Metrics{RunningRequests: 4, ScrapedAt: time.Now()}, 4, 4, false},
		{"running below capacity", queued, &datastore.Metrics{RunningRequests: 3, ScrapedAt: time.Now()}, 3, 3, true},
		{"at capacity, one of ours finished since", queued, &datastore.Metrics{RunningRequests: 4, ScrapedAt: time.Now()}, 4, 3, true},
		{"below capacity, one of ours sent since", queued, &datastore.Metrics{RunningRequests: 3, ScrapedAt: time.Now()}, 3, 4, false},
		{"below capacity, others' requests running too", queued, &datastore.Metrics{RunningRequests: 4, ScrapedAt: time.Now()}, 2, 2, false},
		{"stale scrape, in flight below capacity", queued, &datastore.Metrics{ScrapedAt: time.Now().Add(-time.Minute)}, 0, 0, true},
		{"saturated", queued, queued, 7, 7, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tp := newTestPool(t, 1, s)
			e := tp.Ep(t, 1)
			if tc.learn != nil {
				e.SetMetrics(tc.learn)
			}
			e.AddInFlight(tc.atScrape)
			e.SetMetrics(tc.metrics)
			e.AddInFlight(tc.inFlight - tc.atScrape)
			if got := s.EndpointStartsAtOnce(e); got != tc.want {
				t.Fatalf("EndpointStartsAtOnce = %v, want %v (running capacity %d)", got, tc.want, e.RunningCapacity())
			}
		})
	}
}
