// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scheduling

import (
	"time"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/scheduling/framework"
)

// PoolSaturated reports whether pool has no free slot for one more request,
// as flow control asks before it releases a queued request: true when the
// pool has no endpoint or every endpoint is saturated by the thresholds that
// decide shedding (QueueDepthThreshold, KVCacheUtilThreshold). An endpoint's
// waiting requests are the larger of its last scrape's and its requests in
// flight from this picker beyond what the scrape saw running: between two
// scrapes, the picker's own counts say what it sent since, so a queue
// released on one scrape does not flood the servers until the next. An
// endpoint without fresh metrics counts its requests in flight as waiting.
// It reads snapshots and atomic counts only.
func (s *Scheduler) PoolSaturated(pool *datastore.Pool) bool {
	eps := pool.Endpoints()
	if eps.Len() == 0 {
		return true
	}
	now := time.Now()
	for _, e := range eps.Endpoints {
		if !s.endpointSaturated(e, now) {
			return false
		}
	}
	return true
}

// EndpointSaturated reports whether e has no free slot for one more request,
// by the rule of PoolSaturated.
func (s *Scheduler) EndpointSaturated(e *datastore.Endpoint) bool {
	return s.endpointSaturated(e, time.Now())
}

// keepFree drops the saturated candidates, in place, unless every one is:
// a request flow control released goes where a slot is free.
func keepFree(s *Scheduler, cands []framework.Candidate, now time.Time) []framework.Candidate {
	free := 0
	for i := range cands {
		if e := cands[i].Endpoint; !s.saturated(e.InFlight(), e.Metrics(), now) {
			cands[free] = cands[i]
			free++
		}
	}
	if free == 0 {
		// Saturated again since the release (a scrape came): the pick
		// among all is no worse than waiting once more.
		return cands
	}
	return cands[:free]
}

func (s *Scheduler) endpointSaturated(e *datastore.Endpoint, now time.Time) bool {
	return s.saturated(e.InFlight(), e.Metrics(), now)
}

// saturated is the rule of PoolSaturated for an endpoint with inFlight
// requests from this picker and m its last scrape.
func (s *Scheduler) saturated(n int64, m *datastore.Metrics, now time.Time) bool {
	inFlight := int(n)
	if !m.Fresh(now, s.opts.MetricsStaleness) {
		return inFlight >= s.opts.QueueDepthThreshold
	}
	waiting := max(m.WaitingRequests, inFlight-m.RunningRequests)
	return waiting >= s.opts.QueueDepthThreshold || m.KVCacheUsage >= s.opts.KVCacheUtilThreshold
}
