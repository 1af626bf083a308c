// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	llmdv1alpha2 "github.com/poolpicker/poolpicker/api/llmd/v1alpha2"
	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/api/v1alpha2"
	"github.com/poolpicker/poolpicker/datastore"
)

// poolRefIndex indexes objectives and rewrites by the name of the
// InferencePool they reference (in their own namespace).
const poolRefIndex = "spec.poolRef.name"

// refersToPool reports whether ref names an InferencePool of the
// inference.networking.k8s.io group; the CRDs default both fields.
func refersToPool(ref v1alpha2.PoolObjectReference) bool {
	return (ref.Group == "" || string(ref.Group) == v1.GroupVersion.Group) && (ref.Kind == "" || ref.Kind == "InferencePool") && ref.Name != ""
}

func poolRefName(ref v1alpha2.PoolObjectReference) []string {
	if !refersToPool(ref) {
		return nil
	}
	return []string{string(ref.Name)}
}

// PolicyReconciler publishes each served pool's InferenceObjectives and
// InferenceModelRewrites (of the API groups the API server serves) to its
// datastore pool on every replica and, on the leader, sets their Accepted
// condition. It is keyed by pool: one reconcile publishes the pool's whole
// policy.
type PolicyReconciler struct {
	// client reads the caches and writes status; apiReader asks whether a
	// pool that is not served exists.
	client    client.Client
	apiReader client.Reader
	registry  *datastore.Registry
	groups    policyGroups
	// routes: the API server serves HTTPRoutes, whose pool backendRefs
	// are read for the Warning on a pool that no picker serves.
	routes bool
	// selection says which namespaces the caches cover: a route's pool
	// elsewhere is not looked at.
	selection *selection
	leader    *Leadership
	// events records the Warning on a pool that objectives or HTTPRoutes
	// refer to but that no picker serves.
	events *PoolEvents
	// pools carries the pools that started or stopped being served, and
	// those a new leader looks at again.
	pools chan event.GenericEvent
}

// SetupWithManager indexes objectives and rewrites by pool and adds the
// reconciler to mgr.
func (r *PolicyReconciler) SetupWithManager(mgr ctrl.Manager) error {
	ctx := context.Background()
	groups := r.groups
	mgr.GetLogger().Info("reading InferenceObjectives and InferenceModelRewrites", v1alpha2.GroupVersion.Group, groups.xk8s, llmdv1alpha2.GroupVersion.Group, groups.llmd,
		"httpRoutes", r.routes)
	idx := mgr.GetFieldIndexer()
	indexes := map[client.Object]client.IndexerFunc{}
	if groups.xk8s {
		indexes[&v1alpha2.InferenceObjective{}] = func(o client.Object) []string {
			return poolRefName(o.(*v1alpha2.InferenceObjective).Spec.PoolRef)
		}
		indexes[&v1alpha2.InferenceModelRewrite{}] = func(o client.Object) []string {
			return poolRefName(o.(*v1alpha2.InferenceModelRewrite).Spec.PoolRef)
		}
	}
	if groups.llmd {
		indexes[&llmdv1alpha2.InferenceObjective{}] = func(o client.Object) []string {
			return poolRefNameLLMD(o.(*llmdv1alpha2.InferenceObjective).Spec.PoolRef)
		}
		indexes[&llmdv1alpha2.InferenceModelRewrite{}] = func(o client.Object) []string {
			return poolRefNameLLMD(o.(*llmdv1alpha2.InferenceModelRewrite).Spec.PoolRef)
		}
	}
	for obj, fn := range indexes {
		if err := idx.IndexField(ctx, obj, poolRefIndex, fn); err != nil {
			return fmt.Errorf("controllers: indexing %T: %w", obj, err)
		}
	}
	if r.routes {
		if err := idx.IndexField(ctx, &httpRoute{}, routePoolIndex, routePoolIndexValues); err != nil {
			return fmt.Errorf("controllers: indexing HTTPRoutes: %w", err)
		}
	}
	toPool := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		var names []string
		switch o := o.(type) {
		case *httpRoute:
			// A route may send traffic to pools of other namespaces.
			var reqs []reconcile.Request
			for _, key := range routedPools(o) {
				if r.selection.watchesNamespace(key.Namespace) {
					reqs = append(reqs, reconcile.Request{NamespacedName: key})
				}
			}
			return reqs
		case *v1alpha2.InferenceObjective:
			names = poolRefName(o.Spec.PoolRef)
		case *v1alpha2.InferenceModelRewrite:
			names = poolRefName(o.Spec.PoolRef)
		case *llmdv1alpha2.InferenceObjective:
			names = poolRefNameLLMD(o.Spec.PoolRef)
		case *llmdv1alpha2.InferenceModelRewrite:
			names = poolRefNameLLMD(o.Spec.PoolRef)
		case *v1.InferencePool:
			names = []string{o.Name}
		}
		var reqs []reconcile.Request
		for _, n := range names {
			reqs = append(reqs, reconcile.Request{NamespacedName: datastore.PoolKey{Namespace: o.GetNamespace(), Name: n}})
		}
		return reqs
	})
	// Keyed by pool: one reconcile publishes the pool's whole policy and
	// sets the Accepted condition of every object referring to it.
	b := ctrl.NewControllerManagedBy(mgr).Named("inferencepolicy")
	for obj := range indexes {
		b = b.Watches(obj, toPool)
	}
	if r.routes {
		// A route's status, which gateways write, changes no backendRef.
		b = b.Watches(&httpRoute{}, toPool, builder.WithPredicates(predicate.GenerationChangedPredicate{}))
	}
	return b.WatchesRawSource(source.Channel(r.pools, toPool)).Complete(r)
}

// Reconcile publishes the objectives and rewrites of one pool and, on
// the leader, sets their Accepted condition: True when this picker serves
// the pool, False (PoolNotFound) when no such pool exists. A pool that
// exists but is served by another picker is that picker's to report on;
// one that no picker serves gets a Warning naming the objectives and
// HTTPRoutes that refer to it (warnUnserved).
func (r *PolicyReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	key := req.NamespacedName
	objectives, rewrites, objs, err := r.listPolicy(ctx, key)
	if err != nil {
		return reconcile.Result{}, err
	}

	// Every replica publishes the policy; only the leader writes the
	// Accepted conditions (a newly elected one looks at every pool again:
	// requeuePolicy).
	ctx, done, leader := r.leader.leading(ctx)
	defer done()
	var cond metav1.Condition
	if pool, ok := r.registry.Get(key); ok {
		pool.SetPolicy(buildPolicy(objectives, rewrites))
		if !leader {
			return reconcile.Result{}, nil
		}
		cond = metav1.Condition{Type: v1alpha2.ConditionAccepted, Status: metav1.ConditionTrue, Reason: v1alpha2.ReasonAccepted,
			Message: fmt.Sprintf("InferencePool %s is served", key.Name)}
	} else {
		if !leader {
			return reconcile.Result{}, nil
		}
		routes, err := r.listRoutes(ctx, key)
		if err != nil {
			return reconcile.Result{}, err
		}
		if len(objs) == 0 && len(routes) == 0 {
			return reconcile.Result{}, nil
		}
		meta := &metav1.PartialObjectMetadata{}
		meta.SetGroupVersionKind(v1.GroupVersion.WithKind("InferencePool"))
		err = r.apiReader.Get(ctx, key, meta)
		switch {
		case apierrors.IsNotFound(err):
			cond = metav1.Condition{Type: v1alpha2.ConditionAccepted, Status: metav1.ConditionFalse, Reason: v1alpha2.ReasonPoolNotFound,
				Message: fmt.Sprintf("InferencePool %s not found in namespace %s", key.Name, key.Namespace)}
		case err != nil:
			return reconcile.Result{}, err
		default:
			r.warnUnserved(meta, objs, routes)
			return reconcile.Result{}, nil
		}
	}

	var errs []error
	for _, o := range objs {
		errs = append(errs, r.setAccepted(ctx, o.obj, o.conds, cond))
	}
	return reconcile.Result{}, errors.Join(errs...)
}

// setAccepted patches obj's status when its Accepted condition differs;
// conds points into obj.
func (r *PolicyReconciler) setAccepted(ctx context.Context, obj client.Object, conds *[]metav1.Condition, cond metav1.Condition) error {
	cond.ObservedGeneration = obj.GetGeneration()
	orig := obj.DeepCopyObject().(client.Object)
	if !meta.SetStatusCondition(conds, cond) {
		return nil
	}
	if err := r.client.Status().Patch(ctx, obj, client.MergeFrom(orig)); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("setting Accepted on %s: %w", client.ObjectKeyFromObject(obj), err)
	}
	return nil
}

// buildPolicy: objective name → priority (unset is 0); requested model →
// weighted targets, the oldest rewrite object winning a model claimed twice
// and, within one object, the first rule.
func buildPolicy(objectives []v1alpha2.InferenceObjective, rewrites []v1alpha2.InferenceModelRewrite) *datastore.Policy {
	pol := &datastore.Policy{Objectives: make(map[string]int, len(objectives)), Rewrites: map[string][]datastore.RewriteTarget{}}
	for _, o := range objectives {
		prio := 0
		if o.Spec.Priority != nil {
			prio = *o.Spec.Priority
		}
		pol.Objectives[o.Name] = prio
	}
	rewrites = slices.Clone(rewrites)
	slices.SortFunc(rewrites, func(a, b v1alpha2.InferenceModelRewrite) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	for _, rw := range rewrites {
		for _, rule := range rw.Spec.Rules {
			var targets []datastore.RewriteTarget
			for _, t := range rule.Targets {
				var w int32
				if t.Weight != nil {
					w = *t.Weight
				}
				targets = append(targets, datastore.RewriteTarget{Model: t.ModelRewrite, Weight: w, Rewrite: rw.Name})
			}
			for _, match := range rule.Matches {
				if match.Model.Type != nil && *match.Model.Type != v1alpha2.MatchExact {
					continue
				}
				if _, claimed := pol.Rewrites[match.Model.Value]; claimed || len(targets) == 0 {
					continue
				}
				pol.Rewrites[match.Model.Value] = targets
			}
		}
	}
	return pol
}

// requeue wakes the reconciler for every pool an objective or rewrite
// refers to, so that a newly elected leader writes the Accepted conditions
// that were left to it while it followed.
func (r *PolicyReconciler) requeue(ctx context.Context) error {
	c := r.client
	keys := map[datastore.PoolKey]bool{}
	add := func(ns string, names []string) {
		for _, n := range names {
			keys[datastore.PoolKey{Namespace: ns, Name: n}] = true
		}
	}
	if r.groups.xk8s {
		var ol v1alpha2.InferenceObjectiveList
		var rl v1alpha2.InferenceModelRewriteList
		if err := c.List(ctx, &ol); err != nil {
			return err
		}
		if err := c.List(ctx, &rl); err != nil {
			return err
		}
		for _, o := range ol.Items {
			add(o.Namespace, poolRefName(o.Spec.PoolRef))
		}
		for _, r := range rl.Items {
			add(r.Namespace, poolRefName(r.Spec.PoolRef))
		}
	}
	if r.groups.llmd {
		var ol llmdv1alpha2.InferenceObjectiveList
		var rl llmdv1alpha2.InferenceModelRewriteList
		if err := c.List(ctx, &ol); err != nil {
			return err
		}
		if err := c.List(ctx, &rl); err != nil {
			return err
		}
		for _, o := range ol.Items {
			add(o.Namespace, poolRefNameLLMD(o.Spec.PoolRef))
		}
		for _, r := range rl.Items {
			add(r.Namespace, poolRefNameLLMD(r.Spec.PoolRef))
		}
	}
	if r.routes {
		var routes httpRouteList
		if err := c.List(ctx, &routes); err != nil {
			return err
		}
		for i := range routes.Items {
			for _, key := range routedPools(&routes.Items[i]) {
				if r.selection.watchesNamespace(key.Namespace) {
					keys[key] = true
				}
			}
		}
	}
	for key := range keys {
		wakePolicy(ctx, r.pools, key)
	}
	return nil
}

// listRoutes lists the HTTPRoutes (of any watched namespace) whose rules
// send traffic to the pool key; none when HTTPRoutes are not served.
func (r *PolicyReconciler) listRoutes(ctx context.Context, key datastore.PoolKey) ([]httpRoute, error) {
	if !r.routes {
		return nil, nil
	}
	var routes httpRouteList
	if err := r.client.List(ctx, &routes, client.MatchingFields{routePoolIndex: key.String()}); err != nil {
		return nil, err
	}
	return routes.Items, nil
}

// warnUnserved records a Warning Event on a pool that objects or HTTPRoutes
// refer to but that did not opt in to any picker (no PickerLabel) and that
// no picker has claimed: such a pool is served by nobody, which its owner
// sees nowhere else. A pool served by another picker is that picker's to
// report on. Repeats on the same pool join one Event series (the events
// recorder keys them by pool and reason).
func (r *PolicyReconciler) warnUnserved(pool *metav1.PartialObjectMetadata, objs []policyObject, routes []httpRoute) {
	if r.events == nil || pool.GetLabels()[PickerLabel] != "" || pool.GetAnnotations()[ClaimAnnotation] != "" {
		return
	}
	names := make([]string, 0, len(routes)+len(objs))
	for _, rt := range routes {
		name := rt.Name
		if rt.Namespace != pool.GetNamespace() {
			name = rt.Namespace + "/" + rt.Name
		}
		names = append(names, "HTTPRoute "+name)
	}
	for _, o := range objs {
		names = append(names, policyKind(o.obj)+" "+o.obj.GetName())
	}
	slices.Sort(names)
	r.events.recorder.Eventf(pool, nil, corev1.EventTypeWarning, "PoolNotServed", "Serve",
		"InferencePool %s is referred to by %s but no poolpicker serves it: it lacks the opt-in label %s "+
			"(kubectl label inferencepool %s %s=<picker name>, by default %s=%s)",
		pool.GetName(), strings.Join(names, ", "), PickerLabel, pool.GetName(), PickerLabel, PickerLabel, DefaultPickerName)
}

// policyKind names an objective's or a rewrite's kind (the cache's objects
// carry no kind).
func policyKind(o client.Object) string {
	switch o.(type) {
	case *v1alpha2.InferenceObjective, *llmdv1alpha2.InferenceObjective:
		return "InferenceObjective"
	default:
		return "InferenceModelRewrite"
	}
}
