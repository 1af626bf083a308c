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

func (s *queueScorer) Score(_ context.Context, _ *framework.CycleState, _ *framework.Request, c []framework.Candidate, scores []float64) *framework.Status {
	for i := range c {
		if m := c[i].Metrics; !m.IsZero() {
			scores[i] = float64(int64(m.WaitingRequests()) + c[i].Held)
		} else {
			scores[i] = unknownLoad
		}
	}
	normaliseLowerBetter(scores)
	return nil
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

func (s *runningRequestsScorer) Score(_ context.Context, _ *framework.CycleState, _ *framework.Request, c []framework.Candidate, scores []float64) *framework.Status {
	for i := range c {
		if m := c[i].Metrics; !m.IsZero() {
			scores[i] = float64(m.RunningRequests())
		} else {
			scores[i] = unknownLoad
		}
	}
	normaliseLowerBetter(scores)
	return nil
}

// inFlightScorer ranks by the requests poolpicker itself sent to the
// endpoint and has not seen finish. Unlike scraped metrics it is exact and
// current, so it spreads a burst that arrives between two scrapes; it is
// known for every endpoint, scraped or not. The requests flow control holds
// for the endpoint (Candidate.Held) count too.
type inFlightScorer struct {
	name   framework.TypedName
	params InFlightParams
}

// InFlightParams are in-flight-scorer's parameters.
type InFlightParams struct {
	// PerCacheSize ranks by the requests in flight per token of the
	// server's KV cache (the scraped cache_config_info's blocks × block
	// size), the mean of the known for a server that has not said: on
	// unequal servers the larger runs more sequences at once, and the
	// same count is a lighter load there. Equal caches rank as the count
	// alone. Absent: true.
	PerCacheSize *bool `json:"perCacheSize"`
}

// NewInFlight is the factory of in-flight-scorer; its parameters are
// InFlightParams' fields.
func NewInFlight(name string, params json.RawMessage, _ framework.Handle) (framework.Plugin, error) {
	var p InFlightParams
	if err := framework.DecodeParams(params, &p); err != nil {
		return nil, err
	}
	if p.PerCacheSize == nil {
		t := true
		p.PerCacheSize = &t
	}
	return &inFlightScorer{name: framework.TypedName{Type: InFlightType, Name: name}, params: p}, nil
}

func (s *inFlightScorer) TypedName() framework.TypedName { return s.name }

func (s *inFlightScorer) Score(_ context.Context, _ *framework.CycleState, _ *framework.Request, c []framework.Candidate, scores []float64) *framework.Status {
	for i := range c {
		// Read once: the count moves while we score.
		scores[i] = float64(max(c[i].Endpoint.InFlight(), 0) + c[i].Held)
	}
	if *s.params.PerCacheSize {
		perCacheSize(c, scores)
	}
	normaliseLowerBetter(scores)
	return nil
}

// perCacheSize divides each candidate's load by its server's KV-cache
// size (in tokens), taken as the mean of the known where the server has
// not said; nothing changes when no size is known.
func perCacheSize(c []framework.Candidate, loads []float64) {
	var sum float64
	var known int
	for i := range c {
		if m := c[i].Metrics; !m.IsZero() && m.NumBlocks() > 0 && m.BlockSize() > 0 {
			sum += float64(m.NumBlocks()) * float64(m.BlockSize())
			known++
		}
	}
	if known == 0 {
		return
	}
	mean := sum / float64(known)
	for i := range c {
		size := mean
		if m := c[i].Metrics; !m.IsZero() && m.NumBlocks() > 0 && m.BlockSize() > 0 {
			size = float64(m.NumBlocks()) * float64(m.BlockSize())
		}
		// In units of the mean cache, so equal caches keep the counts.
		loads[i] *= mean / size
	}
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

func (s *kvCacheScorer) Score(_ context.Context, _ *framework.CycleState, _ *framework.Request, c []framework.Candidate, scores []float64) *framework.Status {
	for i := range c {
		if m := c[i].Metrics; !m.IsZero() {
			scores[i] = 1 - m.KVCacheUsage()
		}
	}
	return nil
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
