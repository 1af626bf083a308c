// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"context"
	"fmt"
	"sync/atomic"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/poolpicker/poolpicker/api/v1"
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
	// Manager.mu.
	pools int
	// namespaceWatch: the namespace plan is in force. Written under
	// Manager.mu; read by the pools under their own lock.
	namespaceWatch atomic.Bool
}

// joinPlanLocked counts a newly served pool in its namespace and returns
// the namespace's plan, and whether the plan switched to the namespace
// watch (so the namespace's other pools must move). Called with m.mu held.
func (m *Manager) joinPlanLocked(ctx context.Context, namespace string) (*namespacePlan, bool) {
	p := m.plans[namespace]
	fresh := p == nil
	if fresh {
		p = &namespacePlan{}
		m.plans[namespace] = p
	}
	p.pools++
	want, inCache := false, 0
	switch m.opts.PodWatchPlan {
	case PodWatchPlanNamespace:
		want = true
	case PodWatchPlanAuto:
		// A namespace seen first is planned by the pools it will have (the
		// pool cache at start), so that a namespace of a thousand pools
		// does not start its first pools' own watches only to drop them.
		if fresh {
			inCache = m.servablePoolsLocked(ctx, namespace)
		}
		want = p.namespaceWatch.Load() || max(p.pools, inCache) >= m.opts.NamespaceWatchThreshold
	}
	switched := want && !p.namespaceWatch.Load()
	if switched {
		p.namespaceWatch.Store(true)
		m.log.Info("watching the namespace's pods once for all its pools", "namespace", namespace, "plan", m.opts.PodWatchPlan,
			"servedPools", p.pools, "poolsInCache", inCache)
	}
	return p, switched && !fresh
}

// leavePlanLocked uncounts a pool that is no longer served and reports
// whether the namespace switched back to per-pool watches. Called with m.mu
// held.
func (m *Manager) leavePlanLocked(namespace string) bool {
	p := m.plans[namespace]
	if p == nil {
		return false
	}
	p.pools--
	if p.pools <= 0 {
		delete(m.plans, namespace)
		return false
	}
	if m.opts.PodWatchPlan != PodWatchPlanAuto || !p.namespaceWatch.Load() || p.pools > m.opts.NamespaceWatchThreshold/2 {
		return false
	}
	p.namespaceWatch.Store(false)
	m.log.Info("watching the namespace's pools' pods each on its own again", "namespace", namespace, "pools", p.pools)
	return true
}

// servablePoolsLocked counts the pools of the namespace in the cache that
// this picker would serve (an estimate: claims may still change it).
func (m *Manager) servablePoolsLocked(ctx context.Context, namespace string) int {
	var list v1.InferencePoolList
	if err := m.mgr.GetCache().List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return 0
	}
	n := 0
	for i := range list.Items {
		if ok, _ := m.servesSpec(&list.Items[i]); ok {
			n++
		}
	}
	return n
}

// replan moves every served pool of the namespace to its current plan.
func (m *Manager) replan(namespace string) {
	m.mu.Lock()
	var pools []*servedPool
	for key, sp := range m.served {
		if key.Namespace == namespace {
			pools = append(pools, sp)
		}
	}
	m.mu.Unlock()
	for _, sp := range pools {
		sp.ensure()
	}
}

func validPlanError(p PodWatchPlan) error {
	return fmt.Errorf("pod watch plan %q: must be one of %v", p, PodWatchPlans)
}
