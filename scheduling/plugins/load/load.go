// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package load holds the built-in load scorers: queue, running requests,
// poolpicker's own in-flight count, and KV-cache use.
package load

import (
	"context"
	"encoding/json"

	"github.com/poolpicker/poolpicker/scheduling/framework"
)

// Type names of the load scorers.
const (
	QueueType              = "queue-scorer"
	KVCacheUtilizationType = "kv-cache-utilization-scorer"
	RunningRequestsType    = "running-requests-size-scorer"
	InFlightType           = "in-flight-scorer"
)

// The load scorers rank candidates by one load signal, lower being better.
// Count signals are normalised over the candidates, (max-v)/(max-min), so
// the least loaded scores 1, the most loaded 0, and equal loads all score 1;
// endpoints with unknown load score 0 and do not enter the min and max.

// queueScorer ranks by requests waiting in the model server's queue, and
// those flow control holds for it in the picker (Candidate.Held).
type queueScorer struct{ name framework.TypedName }

// NewQueue is the factory of queue-scorer, which takes no parameters.
func NewQueue(name string, params json.RawMessage, _ framework.Handle) (framework.Plugin, error) {
	if err := framework.NoParams(params); err != nil {
		return nil, err
	}
	return &queueScorer{name: framework.TypedName{Type: QueueType, Name: name}}, nil
}

func (s *queueScorer) TypedName() framework.TypedName { return s.name }

func (s *queueScorer) Score(_ context.Context, _ *framework.CycleState, _ *framework.Request, c []framework.Candidate, scores []float64) {
	for i := range c {
		if m := c[i].Metrics; !m.IsZero() {
			scores[i] = float64(int64(m.WaitingRequests()) + c[i].Held)
		} else {
			scores[i] = unknownLoad
		}
	}
	normaliseLowerBetter(scores)
}

// runningRequestsScorer ranks by requests the model server is decoding.
type runningRequestsScorer struct{ name framework.TypedName }

// NewRunningRequests is the factory of running-requests-size-scorer, which
// takes no parameters.
func NewRunningRequests(name string, params json.RawMessage, _ framework.Handle) (framework.Plugin, error) {
	if err := framework.NoParams(params); err != nil {
		return nil, err
	}
	return &runningRequestsScorer{name: framework.TypedName{Type: RunningRequestsType, Name: name}}, nil
}

func (s *runningRequestsScorer) TypedName() framework.TypedName { return s.name }

func (s *runningRequestsScorer) Score(_ context.Context, _ *framework.CycleState, _ *framework.Request, c []framework.Candidate, scores []float64) {
	for i := range c {
		if m := c[i].Metrics; !m.IsZero() {
			scores[i] = float64(m.RunningRequests())
		} else {
			scores[i] = unknownLoad
		}
	}
	normaliseLowerBetter(scores)
}

// inFlightScorer ranks by the requests poolpicker itself sent to the
// endpoint and has not seen finish. Unlike scraped metrics it is exact and
// current, so it spreads a burst that arrives between two scrapes; it is
// known for every endpoint, scraped or not. The requests flow control holds
// for the endpoint (Candidate.Held) count too.
type inFlightScorer struct{ name framework.TypedName }

// NewInFlight is the factory of in-flight-scorer, which takes no
// parameters.
func NewInFlight(name string, params json.RawMessage, _ framework.Handle) (framework.Plugin, error) {
	if err := framework.NoParams(params); err != nil {
		return nil, err
	}
	return &inFlightScorer{name: framework.TypedName{Type: InFlightType, Name: name}}, nil
}

func (s *inFlightScorer) TypedName() framework.TypedName { return s.name }

func (s *inFlightScorer) Score(_ context.Context, _ *framework.CycleState, _ *framework.Request, c []framework.Candidate, scores []float64) {
	for i := range c {
		// Read once: the count moves while we score.
		scores[i] = float64(max(c[i].Endpoint.InFlight(), 0) + c[i].Held)
	}
	normaliseLowerBetter(scores)
}

// kvCacheScorer scores 1 - KV-cache use: the fraction of the server's KV
// cache still free, an absolute measure (not normalised over candidates).
type kvCacheScorer struct{ name framework.TypedName }

// NewKVCacheUtilization is the factory of kv-cache-utilization-scorer,
// which takes no parameters.
func NewKVCacheUtilization(name string, params json.RawMessage, _ framework.Handle) (framework.Plugin, error) {
	if err := framework.NoParams(params); err != nil {
		return nil, err
	}
	return &kvCacheScorer{name: framework.TypedName{Type: KVCacheUtilizationType, Name: name}}, nil
}

func (s *kvCacheScorer) TypedName() framework.TypedName { return s.name }

func (s *kvCacheScorer) Score(_ context.Context, _ *framework.CycleState, _ *framework.Request, c []framework.Candidate, scores []float64) {
	for i := range c {
		if m := c[i].Metrics; !m.IsZero() {
			scores[i] = 1 - m.KVCacheUsage()
		}
	}
}

// unknownLoad marks a candidate without a load value in normaliseLowerBetter.
const unknownLoad = -1

// normaliseLowerBetter maps load values (>= 0, or unknownLoad) in place to
// (max-v)/(max-min); all equal → 1; unknown → 0.
func normaliseLowerBetter(v []float64) {
	lo, hi := 0.0, -1.0
	for _, x := range v {
		if x < 0 {
			continue
		}
		if hi < 0 {
			lo, hi = x, x
			continue
		}
		lo, hi = min(lo, x), max(hi, x)
	}
	for i, x := range v {
		switch {
		case x < 0:
			v[i] = 0
		case hi == lo:
			v[i] = 1
		default:
			v[i] = (hi - x) / (hi - lo)
		}
	}
}
