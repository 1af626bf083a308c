// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package lora holds the built-in LoRA affinity scorer.
package lora

import (
	"context"
	"encoding/json"

	"github.com/poolpicker/poolpicker/scheduling/framework"
)

// AffinityType is the type name of the LoRA affinity scorer.
const AffinityType = "lora-affinity-scorer"

// Scores of the LoRA affinity scorer, best first.
const (
	// loraRunning: the server is running requests for the adapter.
	loraRunning = 1.0
	// loraWaitingFree: requests for the adapter wait there and the server has
	// room for another running adapter, so it loads on the next step.
	loraWaitingFree = 0.8
	// loraFreeSlot: the adapter is not there, but a slot is free to load it
	// without evicting another (or the server does not say how many it holds).
	loraFreeSlot = 0.6
	// loraWaitingFull: requests for the adapter wait behind a full set of
	// running adapters.
	loraWaitingFull = 0.3
	// loraFull: loading the adapter would evict another one.
	loraFull = 0.0
)

// loraAffinityScorer prefers servers that already hold the request's target
// model as a LoRA adapter: running > waiting with a free slot (max_lora) >
// a free slot elsewhere > waiting behind full slots > full. For a model that
// is no adapter anywhere (a base model), every server scores alike unless
// its adapter slots differ, which then merely leaves room for adapters.
type loraAffinityScorer struct{ name framework.TypedName }

// NewAffinity is the factory of lora-affinity-scorer, which takes no
// parameters.
func NewAffinity(name string, params json.RawMessage, _ framework.Handle) (framework.Plugin, error) {
	if err := framework.NoParams(params); err != nil {
		return nil, err
	}
	return &loraAffinityScorer{name: framework.TypedName{Type: AffinityType, Name: name}}, nil
}

func (s *loraAffinityScorer) TypedName() framework.TypedName { return s.name }

func (s *loraAffinityScorer) Score(_ context.Context, cs *framework.CycleState, _ *framework.Request, c []framework.Candidate, scores []float64) *framework.Status {
	model := cs.TargetModel
	for i := range c {
		if model == "" {
			scores[i] = 1
			continue
		}
		if m := c[i].Metrics; !m.IsZero() {
			scores[i] = loraScore(m, model)
		}
	}
	return nil
}

func loraScore(m framework.Metrics, model string) float64 {
	running, waiting := m.HasAdapter(model)
	if running {
		return loraRunning
	}
	// The adapters a server holds: running ones plus those being loaded.
	held := m.NumRunningAdapters()
	for i := range m.NumWaitingAdapters() {
		if running, _ := m.HasAdapter(m.WaitingAdapter(i)); !running {
			held++
		}
	}
	unbounded := m.MaxAdapters() <= 0
	switch {
	case waiting && (unbounded || m.NumRunningAdapters() < m.MaxAdapters()):
		return loraWaitingFree
	case waiting:
		return loraWaitingFull
	case unbounded || held < m.MaxAdapters():
		return loraFreeSlot
	}
	return loraFull
}
