// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package datastore

import "sync"

// Policy is a pool's request policy from InferenceObjective and
// InferenceModelRewrite objects; immutable once published.
type Policy struct {
	// Objectives maps an InferenceObjective name to its priority.
	Objectives map[string]int
	// Rewrites maps a requested model (exact match) to its weighted targets.
	// When several rewrite objects claim one model, the oldest wins.
	Rewrites map[string][]RewriteTarget

	// targets is every target model of Rewrites, made on first use.
	targetsOnce sync.Once
	targets     map[string]struct{}
}

// RewriteTarget is one weighted target model of a rewrite.
type RewriteTarget struct {
	Model  string
	Weight int32
	// Rewrite names the InferenceModelRewrite the target comes from.
	Rewrite string
}

// Priority returns the priority of the named objective, 0 when unknown or unnamed.
func (p *Policy) Priority(objective string) (priority int, found bool) {
	if p == nil || objective == "" {
		return 0, false
	}
	priority, found = p.Objectives[objective]
	return priority, found
}

// Mentions reports whether the rewrites name model, as a requested model or
// as a target: the names an operator declared, which metrics always admit
// as label values.
func (p *Policy) Mentions(model string) bool {
	if p == nil || model == "" {
		return false
	}
	if _, ok := p.Rewrites[model]; ok {
		return true
	}
	p.targetsOnce.Do(func() {
		p.targets = map[string]struct{}{}
		for _, ts := range p.Rewrites {
			for _, t := range ts {
				p.targets[t.Model] = struct{}{}
			}
		}
	})
	_, ok := p.targets[model]
	return ok
}
