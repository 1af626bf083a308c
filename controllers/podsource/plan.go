// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package podsource

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
)

// Plan is how the pods of a namespace's served pools are watched.
type Plan string

const (
	// PlanAuto chooses per namespace by its number of served pools:
	// the namespace plan from Options.NamespaceWatchThreshold pools, the per-pool
	// plan again at half of it or fewer.
	PlanAuto Plan = "auto"
	// PlanPerPool gives each pool its own watch, scoped on the API
	// server by the pool's selector: the API server sends only the pool's
	// pods, and keeps one watcher (and one list at start) per pool.
	PlanPerPool Plan = "per-pool"
	// PlanNamespace watches every pod of a namespace once, for all
	// its served pools, and filters by each pool's selector here: one
	// watcher and one list per namespace, whatever its number of pools.
	PlanNamespace Plan = "namespace"
)

// Plans are the valid values of Options.Plan.
var Plans = []Plan{PlanAuto, PlanPerPool, PlanNamespace}

// Validate reports a plan that is none of Plans.
func (p Plan) Validate() error {
	if slices.Contains(Plans, p) {
		return nil
	}
	return fmt.Errorf("pod watch plan %q: must be one of %v", p, Plans)
}

// namespacePlan is the watch plan of one namespace and the count it
// follows. A namespace's pools share it.
type namespacePlan struct {
	// pools is the number of served pools of the namespace; guarded by
	// Sources.mu.
	pools int
	// namespaceWatch: the namespace plan is in force. Written under
	// Sources.mu; read by the pools under their own lock.
	namespaceWatch atomic.Bool
}

// joinPlanLocked counts a newly served pool in its namespace and returns
// the namespace's plan, and whether the plan switched to the namespace
// watch (so the namespace's other pools must move). Called with ps.mu held.
func (ps *Sources) joinPlanLocked(ctx context.Context, namespace string) (*namespacePlan, bool) {
	p := ps.plans[namespace]
	fresh := p == nil
	if fresh {
		p = &namespacePlan{}
		ps.plans[namespace] = p
	}
	p.pools++
	want, inCache := false, 0
	switch ps.plan {
	case PlanNamespace:
		want = true
	case PlanAuto:
		// A namespace seen first is planned by the pools it will have (the
		// pool cache at start), so that a namespace of a thousand pools
		// does not start its first pools' own watches only to drop them.
		if fresh && ps.countServable != nil {
			inCache = ps.countServable(ctx, namespace)
		}
		want = p.namespaceWatch.Load() || max(p.pools, inCache) >= ps.threshold
	}
	switched := want && !p.namespaceWatch.Load()
	if switched {
		p.namespaceWatch.Store(true)
		ps.log.Info("watching the namespace's pods once for all its pools", "namespace", namespace, "plan", ps.plan,
			"servedPools", p.pools, "poolsInCache", inCache)
	}
	return p, switched && !fresh
}

// leavePlanLocked uncounts a pool that is no longer served and reports
// whether the namespace switched back to per-pool watches. Called with ps.mu
// held.
func (ps *Sources) leavePlanLocked(namespace string) bool {
	p := ps.plans[namespace]
	if p == nil {
		return false
	}
	p.pools--
	if p.pools <= 0 {
		delete(ps.plans, namespace)
		return false
	}
	if ps.plan != PlanAuto || !p.namespaceWatch.Load() || p.pools > ps.threshold/2 {
		return false
	}
	p.namespaceWatch.Store(false)
	ps.log.Info("watching the namespace's pools' pods each on its own again", "namespace", namespace, "pools", p.pools)
	return true
}

// replan moves every served pool of the namespace to its current plan.
func (ps *Sources) replan(namespace string) {
	ps.mu.Lock()
	var pools []*servedPool
	for key, sp := range ps.served {
		if key.Namespace == namespace {
			pools = append(pools, sp)
		}
	}
	ps.mu.Unlock()
	for _, sp := range pools {
		sp.ensure()
	}
}
