// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package requestcontrol

import (
	"github.com/poolpicker/poolpicker/datastore"
)

// rewriteModel applies the pool's rewrite rule for model (exact match),
// choosing a target by weight; targets all weighted 0 share equally. It
// returns the target model and the name of the rewrite that chose it (empty
// when none applied).
func rewriteModel(policy *datastore.Policy, model string, rnd func() uint64) (target, rewrite string) {
	if policy == nil || model == "" {
		return model, ""
	}
	targets := policy.Rewrites[model]
	if len(targets) == 0 {
		return model, ""
	}
	var total uint64
	for _, t := range targets {
		if t.Weight > 0 {
			total += uint64(t.Weight)
		}
	}
	var chosen *datastore.RewriteTarget
	if total == 0 {
		chosen = &targets[rnd()%uint64(len(targets))]
	} else {
		x := rnd() % total
		for i := range targets {
			t := &targets[i]
			if t.Weight <= 0 {
				continue
			}
			if x < uint64(t.Weight) {
				chosen = t
				break
			}
			x -= uint64(t.Weight)
		}
	}
	if chosen == nil || chosen.Model == "" {
		return model, ""
	}
	return chosen.Model, chosen.Rewrite
}
