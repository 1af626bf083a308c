// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scheduling

import (
	"testing"
	"time"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/scheduling/internal/schedtest"
)

// TestEndpointSaturated: an endpoint is saturated by its scrape's queue or
// KV cache, or by the requests in flight from this picker beyond what the
// scrape saw running; without a fresh scrape, by its requests in flight.
func TestEndpointSaturated(t *testing.T) {
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
			if got := s.EndpointSaturated(e); got != tc.want {
				t.Fatalf("EndpointSaturated = %v, want %v", got, tc.want)
			}
			if got := s.PoolSaturated(tp.Pool); got != tc.want {
				t.Fatalf("PoolSaturated of a one-endpoint pool = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestReleasedGoesToAFreeSlot: a request flow control released is picked
// among the endpoints with a free slot, even where another holds its
// prompt's prefix; when every endpoint is saturated it is picked among all
// rather than refused.
func TestReleasedGoesToAFreeSlot(t *testing.T) {
	s := mustScheduler(t, "", Options{QueueDepthThreshold: 1})
	tp := newTestPool(t, 2, s)
	tp.SetAll(func() *datastore.Metrics { return schedtest.Load(0, 0) })
	holder, other := tp.Ep(t, 1), tp.Ep(t, 2)
	prompt := schedtest.Prompt("a long shared system prompt", 4096)
	res, err := s.Schedule(ctx, tp.Pool, &Request{Model: "m", Prompt: prompt})
	if err != nil {
		t.Fatal(err)
	}
	if res.Endpoints[0] != holder {
		// The prefix index now places the prompt on the first pick.
		holder, other = other, holder
	}
	holder.SetMetrics(schedtest.Load(1, 0)) // its queue at the threshold

	for _, tc := range []struct {
		name     string
		released bool
		want     *datastore.Endpoint
	}{
		{"not released: the prefix's holder", false, holder},
		{"released: the free endpoint", true, other},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := s.Schedule(ctx, tp.Pool, &Request{Model: "m", Prompt: prompt, Admitted: true, Released: tc.released})
			if err != nil {
				t.Fatal(err)
			}
			if res.Endpoints[0] != tc.want {
				t.Fatalf("picked %s, want %s", res.Endpoints[0].Address, tc.want.Address)
			}
		})
	}
	other.SetMetrics(schedtest.Load(3, 0))
	if _, err := s.Schedule(ctx, tp.Pool, &Request{Model: "m", Prompt: prompt, Admitted: true, Released: true}); err != nil {
		t.Fatalf("released into a pool saturated again: %v, want a pick", err)
	}
}
