// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package scheduling

import (
	"fmt"
	"time"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/scheduling/framework"
)

// PoolSaturated reports whether pool has no free slot for one more request,
// as flow control asks before it releases a queued request: true when the
// pool has no endpoint or every endpoint is saturated by the thresholds that
// decide shedding (QueueDepthThreshold, KVCacheUtilThreshold). An endpoint's
// waiting requests are the larger of its last scrape's, less the requests of
// this picker that finished since, and its requests in flight from this
// picker beyond what the scrape saw running: between two scrapes, the
// picker's own counts say what it sent and saw finish since, so a queue
// released on one scrape does not flood the servers until the next, and a
// finished request frees its slot at once (nor does the scrape's KV-cache
// use count once one has finished). An
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

// EndpointSaturated reports whether e has no free slot for one more
// request, by the rule of PoolSaturated: flow control releases a request
// waiting for e once it is false.
func (s *Scheduler) EndpointSaturated(e *datastore.Endpoint) bool {
	return s.endpointSaturated(e, time.Now())
}

func (s *Scheduler) endpointSaturated(e *datastore.Endpoint, now time.Time) bool {
	return s.saturated(e.InFlight(), e.InFlightAtMetrics(), e.Metrics(), now)
}

// EndpointStartsAtOnce reports whether e would start one more request at
// once rather than queue it: not saturated and, once its running capacity
// is known (datastore.Endpoint.RunningCapacity), fewer requests on it than
// that. Flow control sends the requests of its lower bands only there, so
// that the places in the servers' queues stay free for the highest band.
func (s *Scheduler) EndpointStartsAtOnce(e *datastore.Endpoint) bool {
	now := time.Now()
	if s.endpointSaturated(e, now) {
		return false
	}
	capacity := e.RunningCapacity()
	if capacity == 0 {
		return true
	}
	n := e.InFlight()
	m := e.Metrics()
	if !m.Fresh(now, s.opts.MetricsStaleness) {
		return n < capacity
	}
	// As in saturated: requests finished since the scrape left its count.
	finished := max(e.InFlightAtMetrics()-n, 0)
	return max(int64(m.RunningRequests+m.WaitingRequests)-finished, n) < capacity
}

// saturated is the rule of PoolSaturated for an endpoint with inFlight
// requests from this picker, atScrape when m, its last scrape, was
// published.
func (s *Scheduler) saturated(n, atScrape int64, m *datastore.Metrics, now time.Time) bool {
	inFlight := int(n)
	if !m.Fresh(now, s.opts.MetricsStaleness) {
		return s.saturation().Saturated(inFlight, 0)
	}
	// Each request of this picker's that finished since the scrape took one
	// of the requests it saw waiting into the slot it left, or left a slot
	// free: so a slot counts as free the moment a request finishes, not a
	// scrape later, and flow control's next request runs at once.
	finished := int(max(atScrape-n, 0))
	waiting := max(m.WaitingRequests-finished, inFlight-m.RunningRequests)
	// The KV-cache use the scrape saw included the blocks of the requests
	// that finished since.
	kvCacheUse := m.KVCacheUsage
	if finished > 0 {
		kvCacheUse = 0
	}
	return s.saturation().Saturated(waiting, kvCacheUse)
}

// AdmissionSaturated reports whether pool is saturated by the rule under
// which sheddable requests are refused (Options.SaturationAdmission) and,
// when it is, why, in words for the refusal: under AdmissionAllSaturated
// when every endpoint is saturated or has no fresh metrics; under
// AdmissionPoolAverage when the endpoints' mean load, each the larger of
// its waiting requests over QueueDepthThreshold and its KV-cache use over
// KVCacheUtilThreshold (an endpoint without fresh metrics counting 1, so a
// pool without them still sheds), is at least 1. Both read the last scrape
// alone. A pool without endpoints is not: scheduling answers it. It reads
// snapshots only and takes no lock; the request's life
// (package requestcontrol) asks it before it schedules a sheddable request.
func (s *Scheduler) AdmissionSaturated(pool *datastore.Pool) (saturated bool, why string) {
	eps := pool.Endpoints()
	n := eps.Len()
	if n == 0 {
		return false, ""
	}
	sat := s.saturation()
	now := time.Now()
	full, load := 0, 0.0
	for _, e := range eps.Endpoints {
		m := e.Metrics()
		if !m.Fresh(now, s.opts.MetricsStaleness) {
			full++
			load++
			continue
		}
		if sat.Saturated(m.WaitingRequests, m.KVCacheUsage) {
			full++
		}
		load += sat.Load(m.WaitingRequests, m.KVCacheUsage)
	}
	switch {
	case s.opts.SaturationAdmission == AdmissionPoolAverage && load >= float64(n):
		return true, fmt.Sprintf("its endpoints' mean load, of %d waiting requests or %.0f%% KV cache each, is %.2f",
			s.opts.QueueDepthThreshold, s.opts.KVCacheUtilThreshold*100, load/float64(n))
	case s.opts.SaturationAdmission == AdmissionAllSaturated && full == n:
		return true, fmt.Sprintf("every endpoint has at least %d waiting requests, KV cache at least %.0f%% used, or no fresh metrics",
			s.opts.QueueDepthThreshold, s.opts.KVCacheUtilThreshold*100)
	}
	return false, ""
}

// saturation is the rule every judgement of saturation applies
// (framework.Saturation), with the scheduler's thresholds.
func (s *Scheduler) saturation() framework.Saturation {
	return framework.Saturation{QueueDepth: s.opts.QueueDepthThreshold, KVCacheUtil: s.opts.KVCacheUtilThreshold}
}
