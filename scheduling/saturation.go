// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scheduling

import (
	"time"

	"github.com/poolpicker/poolpicker/datastore"
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
