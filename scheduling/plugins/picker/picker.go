// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package picker holds the built-in pickers: max-score, random, weighted
// random and round-robin.
package picker

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"

	"github.com/poolpicker/poolpicker/scheduling/framework"
)

// Type names of the pickers.
const (
	MaxScoreType       = "max-score-picker"
	RandomType         = "random-picker"
	WeightedRandomType = "weighted-random-picker"
	RoundRobinType     = "round-robin-picker"
)

// pickerParams are the parameters every picker takes.
type pickerParams struct {
	// MaxNumOfEndpoints caps the endpoints of a result below
	// scheduler's Options.MaxEndpoints; 0 or absent: no cap of the picker's own.
	MaxNumOfEndpoints int `json:"maxNumOfEndpoints"`
}

func decodePickerParams(params json.RawMessage) (pickerParams, error) {
	var p pickerParams
	if err := framework.DecodeParams(params, &p); err != nil {
		return p, err
	}
	if p.MaxNumOfEndpoints < 0 {
		return p, fmt.Errorf("parameters: maxNumOfEndpoints %d must be at least 1 (or 0 for the scheduler's MaxEndpoints)", p.MaxNumOfEndpoints)
	}
	return p, nil
}

// scoreTieEpsilon is the difference under which two weighted totals tie:
// sums of float weights differ in the last bits for equal inputs.
const scoreTieEpsilon = 1e-9

// maxScorePicker picks the highest totals, best first; among equal totals
// it chooses uniformly at random, so equal endpoints share the load.
type maxScorePicker struct {
	name framework.TypedName
	max  int
}

// NewMaxScore is the factory of max-score-picker (parameter
// maxNumOfEndpoints, as every picker).
func NewMaxScore(name string, params json.RawMessage, _ framework.Handle) (framework.Plugin, error) {
	p, err := decodePickerParams(params)
	if err != nil {
		return nil, err
	}
	return &maxScorePicker{name: framework.TypedName{Type: MaxScoreType, Name: name}, max: p.MaxNumOfEndpoints}, nil
}

func (p *maxScorePicker) TypedName() framework.TypedName { return p.name }
func (p *maxScorePicker) MaxEndpoints() int              { return p.max }

func (p *maxScorePicker) Pick(_ context.Context, cs *framework.CycleState, _ *framework.Request, c []framework.Candidate, scores []float64, n int, picked []int) []int {
	base := len(picked)
	for k := 0; k < n; k++ {
		best, ties := -1, 0
		for i := range c {
			if containsInt(picked[base:], i) {
				continue
			}
			switch {
			case best < 0 || scores[i] > scores[best]+scoreTieEpsilon:
				best, ties = i, 1
			case scores[i] >= scores[best]-scoreTieEpsilon:
				// Reservoir sampling: each of the tied is kept with
				// probability 1/ties, so the choice is uniform.
				ties++
				if cs.RandN(ties) == 0 {
					best = i
				}
			}
		}
		if best < 0 {
			break
		}
		picked = append(picked, best)
	}
	return picked
}

// randomPicker picks uniformly at random, ignoring scores: a baseline.
type randomPicker struct {
	name framework.TypedName
	max  int
}

// NewRandom is the factory of random-picker.
func NewRandom(name string, params json.RawMessage, _ framework.Handle) (framework.Plugin, error) {
	p, err := decodePickerParams(params)
	if err != nil {
		return nil, err
	}
	return &randomPicker{name: framework.TypedName{Type: RandomType, Name: name}, max: p.MaxNumOfEndpoints}, nil
}

func (p *randomPicker) TypedName() framework.TypedName { return p.name }
func (p *randomPicker) MaxEndpoints() int              { return p.max }

func (p *randomPicker) Pick(_ context.Context, cs *framework.CycleState, _ *framework.Request, c []framework.Candidate, _ []float64, n int, picked []int) []int {
	base := len(picked)
	for k := 0; k < n && k < len(c); k++ {
		r := cs.RandN(len(c) - k)
		for i := range c {
			if containsInt(picked[base:], i) {
				continue
			}
			if r == 0 {
				picked = append(picked, i)
				break
			}
			r--
		}
	}
	return picked
}

// weightedRandomPicker picks at random with probability proportional to the
// total score, without replacement: it spreads load where max-score would
// send a burst to one endpoint, yet still favours the better ones. When the
// remaining totals are all 0 it picks uniformly.
type weightedRandomPicker struct {
	name framework.TypedName
	max  int
}

// NewWeightedRandom is the factory of weighted-random-picker.
func NewWeightedRandom(name string, params json.RawMessage, _ framework.Handle) (framework.Plugin, error) {
	p, err := decodePickerParams(params)
	if err != nil {
		return nil, err
	}
	return &weightedRandomPicker{name: framework.TypedName{Type: WeightedRandomType, Name: name}, max: p.MaxNumOfEndpoints}, nil
}

func (p *weightedRandomPicker) TypedName() framework.TypedName { return p.name }
func (p *weightedRandomPicker) MaxEndpoints() int              { return p.max }

func (p *weightedRandomPicker) Pick(_ context.Context, cs *framework.CycleState, _ *framework.Request, c []framework.Candidate, scores []float64, n int, picked []int) []int {
	base := len(picked)
	for k := 0; k < n && k < len(c); k++ {
		total := 0.0
		for i := range c {
			if !containsInt(picked[base:], i) {
				total += scores[i]
			}
		}
		chosen := -1
		if total > 0 {
			x := cs.RandFloat() * total
			for i := range c {
				if containsInt(picked[base:], i) || scores[i] <= 0 {
					continue
				}
				chosen = i
				if x < scores[i] {
					break
				}
				x -= scores[i]
			}
		} else {
			r := cs.RandN(len(c) - k)
			for i := range c {
				if containsInt(picked[base:], i) {
					continue
				}
				if r == 0 {
					chosen = i
					break
				}
				r--
			}
		}
		if chosen < 0 {
			break
		}
		picked = append(picked, chosen)
	}
	return picked
}

// roundRobinPicker takes the candidates in turn, ignoring scores: a
// baseline that spreads load evenly and caches nothing on purpose. Its turn
// is shared by every pool and profile that names the instance.
type roundRobinPicker struct {
	name framework.TypedName
	max  int
	next atomic.Uint64
}

// NewRoundRobin is the factory of round-robin-picker.
func NewRoundRobin(name string, params json.RawMessage, _ framework.Handle) (framework.Plugin, error) {
	p, err := decodePickerParams(params)
	if err != nil {
		return nil, err
	}
	return &roundRobinPicker{name: framework.TypedName{Type: RoundRobinType, Name: name}, max: p.MaxNumOfEndpoints}, nil
}

func (p *roundRobinPicker) TypedName() framework.TypedName { return p.name }
func (p *roundRobinPicker) MaxEndpoints() int              { return p.max }

func (p *roundRobinPicker) Pick(_ context.Context, _ *framework.CycleState, _ *framework.Request, c []framework.Candidate, _ []float64, n int, picked []int) []int {
	if len(c) == 0 {
		return picked
	}
	start := int((p.next.Add(1) - 1) % uint64(len(c)))
	for k := 0; k < n && k < len(c); k++ {
		picked = append(picked, (start+k)%len(c))
	}
	return picked
}

func containsInt(list []int, x int) bool {
	for _, v := range list {
		if v == x {
			return true
		}
	}
	return false
}
