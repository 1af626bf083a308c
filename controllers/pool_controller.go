// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"context"
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/datastore"
)

func (m *Manager) setupPoolController() error {
	return ctrl.NewControllerManagedBy(m.mgr).
		For(&v1.InferencePool{}).
		Named("inferencepool").
		WithOptions(controller.Options{MaxConcurrentReconciles: m.opts.MaxConcurrentReconciles}).
		Complete(reconcile.Func(m.reconcilePool))
}

// reconcilePool makes the served state of one pool match the API server:
// served with a watch for its current selector, or not served at all.
func (m *Manager) reconcilePool(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	key := req.NamespacedName
	var pool v1.InferencePool
	if err := m.mgr.GetClient().Get(ctx, key, &pool); err != nil {
		if apierrors.IsNotFound(err) {
			m.forgetIgnored(key)
			m.forgetConflicts(key)
			m.unserve(ctx, key, "deleted or out of this picker's pool selection")
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	ok, reason := m.serves(&pool)
	if !ok {
		m.logIgnored(key, reason)
		m.unserve(ctx, key, reason)
		return reconcile.Result{}, nil
	}
	// The CRD, like upstream's, does not check label keys; a key that is no
	// label key would turn the selector string into another selector (a ','
	// starts a second requirement), so such a pool is reported, not watched.
	if _, err := labels.ValidatedSelectorFromSet(matchLabels(&pool)); err != nil {
		reason := fmt.Sprintf("spec.selector.matchLabels is not a valid label selector: %v", err)
		if m.logIgnored(key, reason) {
			m.poolEvent(key, corev1.EventTypeWarning, "InvalidSelector", reason+"; the pool is not served until it is fixed")
		}
		m.unserve(ctx, key, reason)
		return reconcile.Result{}, nil
	}
	m.forgetIgnored(key)
	spec, selector := poolSpec(&pool)
	m.serve(ctx, key, spec, selector, matchLabels(&pool))
	return reconcile.Result{}, nil
}

// serves says whether this picker serves the pool, and if not, why: the
// pool is for it (servesSpec) and no other deployment claimed it.
func (m *Manager) serves(pool *v1.InferencePool) (bool, string) {
	if ok, reason := m.servesSpec(pool); !ok {
		return false, reason
	}
	if other, conflict := m.claimedByOther(pool); conflict {
		return false, fmt.Sprintf("claimed by poolpicker %s (annotation %s), not this deployment %s", other, ClaimAnnotation, m.claimID())
	}
	return true, ""
}

// servesSpec says whether the pool is for this picker on its own terms.
// Namespace, pool label and single-pool filters are applied by the API
// server; they are checked again here so that a pool reaching the
// reconciler some other way is never served by mistake.
func (m *Manager) servesSpec(pool *v1.InferencePool) (bool, string) {
	if m.opts.PoolName != "" && (pool.Name != m.opts.PoolName || pool.Namespace != m.opts.PoolNamespace) {
		return false, "not the pool named by the single-pool options"
	}
	if m.opts.PoolName == "" && len(m.opts.Namespaces) > 0 && !slices.Contains(m.opts.Namespaces, pool.Namespace) {
		return false, "namespace not watched"
	}
	if m.opts.PoolSelector != "" {
		sel, _ := labels.Parse(m.opts.PoolSelector)
		if !sel.Matches(labels.Set(pool.Labels)) {
			return false, "labels do not match the pool selector"
		}
	}
	ref := pool.Spec.EndpointPickerRef
	if ref == nil {
		if len(m.opts.PickerServices) > 0 {
			return false, fmt.Sprintf("spec.endpointPickerRef is unset and this picker serves only pools naming its Services %v", m.opts.PickerServices)
		}
	} else {
		if ref.Group != nil && *ref.Group != "" {
			return false, fmt.Sprintf("spec.endpointPickerRef group %q is not the core group", *ref.Group)
		}
		if ref.Kind != "" && ref.Kind != "Service" {
			return false, fmt.Sprintf("spec.endpointPickerRef kind %q is not Service", ref.Kind)
		}
		if len(m.opts.PickerServices) > 0 && !slices.Contains(m.opts.PickerServices, string(ref.Name)) {
			return false, fmt.Sprintf("spec.endpointPickerRef names Service %q, not one of this picker's %v", ref.Name, m.opts.PickerServices)
		}
	}
	if len(pool.Spec.Selector.MatchLabels) == 0 {
		// An empty selector would watch every pod of the namespace.
		return false, "spec.selector.matchLabels is empty"
	}
	if len(pool.Spec.TargetPorts) == 0 {
		return false, "spec.targetPorts is empty"
	}
	return true, ""
}

func matchLabels(pool *v1.InferencePool) map[string]string {
	out := make(map[string]string, len(pool.Spec.Selector.MatchLabels))
	for k, v := range pool.Spec.Selector.MatchLabels {
		out[string(k)] = string(v)
	}
	return out
}

// poolSpec is the datastore's view of the pool and the label selector its
// pod watch sends to the API server.
func poolSpec(pool *v1.InferencePool) (*datastore.PoolSpec, string) {
	sel := matchLabels(pool)
	spec := &datastore.PoolSpec{
		Selector:    sel,
		Annotations: maps.Clone(pool.Annotations),
		Generation:  pool.Generation,
	}
	for _, p := range pool.Spec.TargetPorts {
		spec.TargetPorts = append(spec.TargetPorts, int32(p.Number))
	}
	if ref := pool.Spec.EndpointPickerRef; ref != nil {
		spec.PickerService = string(ref.Name)
		if ref.Port != nil {
			spec.PickerPort = int32(ref.Port.Number)
		}
	}
	return spec, labels.SelectorFromSet(sel).String()
}

func (m *Manager) serve(ctx context.Context, key datastore.PoolKey, spec *datastore.PoolSpec, selector string, match labels.Set) {
	m.mu.Lock()
	sp, existed := m.served[key]
	switched := false
	if !existed {
		sp = &servedPool{key: key, m: m}
		sp.plan, switched = m.joinPlanLocked(ctx, key.Namespace)
		m.served[key] = sp
	}
	// Set under mu: concurrent reconciles would otherwise publish counts
	// out of order and leave a stale value.
	m.metrics.servedPools.Set(float64(len(m.served)))
	m.mu.Unlock()

	// Upsert publishes the spec; a target-port change recomputes the
	// endpoints from the pods the active watch already has.
	pool := m.registry.Upsert(key, spec)
	sp.mu.Lock()
	sp.pool = pool
	sp.mu.Unlock()
	sp.setSelector(selector, match)
	if switched {
		m.replan(key.Namespace)
	}
	if !existed {
		m.log.Info("serving pool", "pool", key.String(), "selector", selector, "targetPorts", spec.TargetPorts)
		m.poolChanged(ctx, key)
	}
}

func (m *Manager) unserve(ctx context.Context, key datastore.PoolKey, reason string) {
	m.mu.Lock()
	sp, ok := m.served[key]
	delete(m.served, key)
	switched := ok && m.leavePlanLocked(key.Namespace)
	m.metrics.servedPools.Set(float64(len(m.served)))
	m.mu.Unlock()
	if !ok {
		return
	}
	sp.stop()
	if switched {
		m.replan(key.Namespace)
	}
	m.registry.Remove(key)
	m.metrics.forget(key.Namespace, key.Name)
	m.log.Info("stopped serving pool", "pool", key.String(), "reason", reason)
	m.signal()
	m.poolChanged(ctx, key)
}

func (m *Manager) isServed(key datastore.PoolKey) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.served[key]
	return ok
}

func (m *Manager) inCache(ctx context.Context, key datastore.PoolKey) bool {
	var pool v1.InferencePool
	if err := m.mgr.GetCache().Get(ctx, key, &pool); err != nil {
		return false
	}
	ok, _ := m.serves(&pool)
	return ok
}

// poolChanged wakes the policy reconciler for the pool.
func (m *Manager) poolChanged(ctx context.Context, key datastore.PoolKey) {
	obj := &v1.InferencePool{}
	obj.Namespace, obj.Name = key.Namespace, key.Name
	select {
	case m.poolEvents <- event.GenericEvent{Object: obj}:
	case <-ctx.Done():
	}
}

// logIgnored logs why the pool is not served, once per reason; it reports
// whether the reason is new.
func (m *Manager) logIgnored(key datastore.PoolKey, reason string) bool {
	m.mu.Lock()
	last, seen := m.ignored[key]
	m.ignored[key] = reason
	m.mu.Unlock()
	if seen && last == reason {
		return false
	}
	m.log.Info("ignoring pool", "pool", key.String(), "reason", reason)
	return true
}

func (m *Manager) forgetIgnored(key datastore.PoolKey) {
	m.mu.Lock()
	delete(m.ignored, key)
	m.mu.Unlock()
}
