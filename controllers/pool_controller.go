// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"context"
	"fmt"
	"maps"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/controllers/podsource"
	"github.com/poolpicker/poolpicker/datastore"
)

// PoolReconciler makes the served state of each InferencePool match the
// API server: served (in the registry, fed its pods by a source for its
// current selector) or not served at all, with the reason logged once and,
// for a pool this picker would serve but cannot, an Event on it.
type PoolReconciler struct {
	// client reads the pool cache.
	client    client.Client
	selection *selection
	sources   *podsource.Sources
	events    *PoolEvents
	conflicts *conflicts
	// policy wakes the policy reconciler for a pool that started or
	// stopped being served, so that it publishes the new pool's policy.
	policy                  chan<- event.GenericEvent
	maxConcurrentReconciles int
	// started reports whether the pools served at start have synced:
	// until then a pool starting to be served is logged at debug
	// verbosity, and InitialSync reports the progress.
	started func() bool

	mu      sync.Mutex
	ignored map[datastore.PoolKey]string // reason last logged, so each is logged once
}

// SetupWithManager adds the reconciler to mgr.
func (r *PoolReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1.InferencePool{}).
		Named("inferencepool").
		WithOptions(controller.Options{MaxConcurrentReconciles: r.maxConcurrentReconciles}).
		Complete(r)
}

// Reconcile serves the pool with a watch for its current selector, or
// stops serving it.
func (r *PoolReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	key := req.NamespacedName
	var pool v1.InferencePool
	if err := r.client.Get(ctx, key, &pool); err != nil {
		if apierrors.IsNotFound(err) {
			r.forgetIgnored(key)
			r.conflicts.forget(ctx, key)
			r.unserve(ctx, key, "deleted or out of this picker's pool selection")
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	ok, reason := r.selection.serves(&pool)
	if !ok {
		r.logIgnored(ctx, key, reason)
		r.unserve(ctx, key, reason)
		return reconcile.Result{}, nil
	}
	// The CRD, like upstream's, does not check label keys; a key that is no
	// label key would turn the selector string into another selector (a ','
	// starts a second requirement), so such a pool is reported, not watched.
	if _, err := labels.ValidatedSelectorFromSet(matchLabels(&pool)); err != nil {
		reason := fmt.Sprintf("spec.selector.matchLabels is not a valid label selector: %v", err)
		if r.logIgnored(ctx, key, reason) {
			r.events.record(ctx, key, corev1.EventTypeWarning, "InvalidSelector", reason+"; the pool is not served until it is fixed")
		}
		r.unserve(ctx, key, reason)
		return reconcile.Result{}, nil
	}
	r.forgetIgnored(key)
	spec, selector := poolSpec(&pool)
	if r.sources.Serve(ctx, key, spec) {
		l := log.FromContext(ctx)
		if r.started != nil && !r.started() {
			l = l.V(4)
		}
		l.Info("serving pool", "pool", key.String(), "selector", selector, "targetPorts", spec.TargetPorts)
		r.poolChanged(ctx, key)
	}
	return reconcile.Result{}, nil
}

func (r *PoolReconciler) unserve(ctx context.Context, key datastore.PoolKey, reason string) {
	if !r.sources.Unserve(key) {
		return
	}
	log.FromContext(ctx).Info("stopped serving pool", "pool", key.String(), "reason", reason)
	r.poolChanged(ctx, key)
}

// poolChanged wakes the policy reconciler for the pool.
func (r *PoolReconciler) poolChanged(ctx context.Context, key datastore.PoolKey) {
	wakePolicy(ctx, r.policy, key)
}

// wakePolicy sends the pool to the policy reconciler's channel source.
func wakePolicy(ctx context.Context, policy chan<- event.GenericEvent, key datastore.PoolKey) {
	obj := &v1.InferencePool{}
	obj.Namespace, obj.Name = key.Namespace, key.Name
	select {
	case policy <- event.GenericEvent{Object: obj}:
	case <-ctx.Done():
	}
}

// logIgnored logs why the pool is not served, once per reason; it reports
// whether the reason is new.
func (r *PoolReconciler) logIgnored(ctx context.Context, key datastore.PoolKey, reason string) bool {
	r.mu.Lock()
	last, seen := r.ignored[key]
	r.ignored[key] = reason
	r.mu.Unlock()
	if seen && last == reason {
		return false
	}
	log.FromContext(ctx).Info("ignoring pool", "pool", key.String(), "reason", reason)
	return true
}

func (r *PoolReconciler) forgetIgnored(key datastore.PoolKey) {
	r.mu.Lock()
	delete(r.ignored, key)
	r.mu.Unlock()
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
