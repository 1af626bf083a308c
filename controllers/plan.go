// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"context"
	"fmt"
	"sync/atomic"
)

// PodWatchPlan is how the pods of a namespace's served pools are watched.
type PodWatchPlan string

const (
	// PodWatchPlanAuto chooses per namespace by its number of served pools:
	// the namespace plan from NamespaceWatchThreshold pools, the per-pool
	// plan again at half of it or fewer.
	PodWatchPlanAuto PodWatchPlan = "auto"
	// PodWatchPlanPerPool gives each pool its own watch, scoped on the API
	// server by the pool's selector: the API server sends only the pool's
	// pods, and keeps one watcher (and one list at start) per pool.
	PodWatchPlanPerPool PodWatchPlan = "per-pool"
	// PodWatchPlanNamespace watches every pod of a namespace once, for all
	// its served pools, and filters by each pool's selector here: one
	// watcher and one list per namespace, whatever its number of pools.
	PodWatchPlanNamespace PodWatchPlan = "namespace"
)

// PodWatchPlans are the valid values of Options.PodWatchPlan.
var PodWatchPlans = []PodWatchPlan{PodWatchPlanAuto, PodWatchPlanPerPool, PodWatchPlanNamespace}

func (p PodWatchPlan) valid() bool {
	for _, v := range PodWatchPlans {
		if p == v {
			return true
		}
	}
	return false
}

// namespacePlan is the watch plan of one namespace and the count it
// follows. A namespace's pools share it.
type namespacePlan struct {
	// pools is the number of served pools of the namespace; guarded by
	// podSources.mu.
	pools int
	// namespaceWatch: the namespace plan is in force. Written under
	// podSources.mu; read by the pools under their own lock.
	namespaceWatch atomic.Bool
}

// joinPlanLocked counts a newly served pool in its namespace and returns
// the namespace's plan, and whether the plan switched to the namespace
// watch (so the namespace's other pools must move). Called with ps.mu held.
func (ps *podSources) joinPlanLocked(ctx context.Context, namespace string) (*namespacePlan, bool) {
	p := ps.plans[namespace]
	fresh := p == nil
	if fresh {
		p = &namespacePlan{}
		ps.plans[namespace] = p
	}
	p.pools++
	want, inCache := false, 0
	switch ps.plan {
	case PodWatchPlanNamespace:
		want = true
	case PodWatchPlanAuto:
		// A namespace seen first is planned by the pools it will have (the
		// pool cache at start), so that a namespace of a thousand pools
		// does not start its first pools' own watches only to drop them.
		if fresh {
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
func (ps *podSources) leavePlanLocked(namespace string) bool {
	p := ps.plans[namespace]
	if p == nil {
		return false
	}
	p.pools--
	if p.pools <= 0 {
		delete(ps.plans, namespace)
		return false
	}
	if ps.plan != PodWatchPlanAuto || !p.namespaceWatch.Load() || p.pools > ps.threshold/2 {
		return false
	}
	p.namespaceWatch.Store(false)
	ps.log.Info("watching the namespace's pools' pods each on its own again", "namespace", namespace, "pools", p.pools)
	return true
}

// replan moves every served pool of the namespace to its current plan.
func (ps *podSources) replan(namespace string) {
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

func validPlanError(p PodWatchPlan) error {
	return fmt.Errorf("pod watch plan %q: must be one of %v", p, PodWatchPlans)
}
