package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

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

func (m *Manager) setupPolicyController() error {
	ctx := context.Background()
	idx := m.mgr.GetFieldIndexer()
	if err := idx.IndexField(ctx, &v1alpha2.InferenceObjective{}, poolRefIndex, func(o client.Object) []string {
		return poolRefName(o.(*v1alpha2.InferenceObjective).Spec.PoolRef)
	}); err != nil {
		return fmt.Errorf("controllers: indexing objectives: %w", err)
	}
	if err := idx.IndexField(ctx, &v1alpha2.InferenceModelRewrite{}, poolRefIndex, func(o client.Object) []string {
		return poolRefName(o.(*v1alpha2.InferenceModelRewrite).Spec.PoolRef)
	}); err != nil {
		return fmt.Errorf("controllers: indexing rewrites: %w", err)
	}
	toPool := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		var names []string
		switch o := o.(type) {
		case *v1alpha2.InferenceObjective:
			names = poolRefName(o.Spec.PoolRef)
		case *v1alpha2.InferenceModelRewrite:
			names = poolRefName(o.Spec.PoolRef)
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
	return ctrl.NewControllerManagedBy(m.mgr).
		Named("inferencepolicy").
		Watches(&v1alpha2.InferenceObjective{}, toPool).
		Watches(&v1alpha2.InferenceModelRewrite{}, toPool).
		WatchesRawSource(source.Channel(m.poolEvents, toPool)).
		Complete(reconcile.Func(m.reconcilePolicy))
}

// reconcilePolicy publishes the objectives and rewrites of one pool and sets
// their Accepted condition: True when this picker serves the pool, False
// (PoolNotFound) when no such pool exists. A pool that exists but is served
// by another picker is that picker's to report on.
func (m *Manager) reconcilePolicy(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	key := req.NamespacedName
	c := m.mgr.GetClient()
	var objectives v1alpha2.InferenceObjectiveList
	if err := c.List(ctx, &objectives, client.InNamespace(key.Namespace), client.MatchingFields{poolRefIndex: key.Name}); err != nil {
		return reconcile.Result{}, err
	}
	var rewrites v1alpha2.InferenceModelRewriteList
	if err := c.List(ctx, &rewrites, client.InNamespace(key.Namespace), client.MatchingFields{poolRefIndex: key.Name}); err != nil {
		return reconcile.Result{}, err
	}

	var cond metav1.Condition
	if pool, ok := m.registry.Get(key); ok {
		pool.SetPolicy(buildPolicy(objectives.Items, rewrites.Items))
		cond = metav1.Condition{Type: v1alpha2.ConditionAccepted, Status: metav1.ConditionTrue, Reason: v1alpha2.ReasonAccepted,
			Message: fmt.Sprintf("InferencePool %s is served", key.Name)}
	} else {
		if len(objectives.Items)+len(rewrites.Items) == 0 {
			return reconcile.Result{}, nil
		}
		meta := &metav1.PartialObjectMetadata{}
		meta.SetGroupVersionKind(v1.GroupVersion.WithKind("InferencePool"))
		err := m.mgr.GetAPIReader().Get(ctx, key, meta)
		switch {
		case apierrors.IsNotFound(err):
			cond = metav1.Condition{Type: v1alpha2.ConditionAccepted, Status: metav1.ConditionFalse, Reason: v1alpha2.ReasonPoolNotFound,
				Message: fmt.Sprintf("InferencePool %s not found in namespace %s", key.Name, key.Namespace)}
		case err != nil:
			return reconcile.Result{}, err
		default:
			return reconcile.Result{}, nil
		}
	}

	var errs []error
	for i := range objectives.Items {
		o := &objectives.Items[i]
		errs = append(errs, m.setAccepted(ctx, o, &o.Status.Conditions, cond))
	}
	for i := range rewrites.Items {
		r := &rewrites.Items[i]
		errs = append(errs, m.setAccepted(ctx, r, &r.Status.Conditions, cond))
	}
	for _, err := range errs {
		if err != nil {
			return reconcile.Result{}, err
		}
	}
	return reconcile.Result{}, nil
}

// setAccepted patches obj's status when its Accepted condition differs;
// conds points into obj.
func (m *Manager) setAccepted(ctx context.Context, obj client.Object, conds *[]metav1.Condition, cond metav1.Condition) error {
	cond.ObservedGeneration = obj.GetGeneration()
	orig := obj.DeepCopyObject().(client.Object)
	if !meta.SetStatusCondition(conds, cond) {
		return nil
	}
	if err := m.mgr.GetClient().Status().Patch(ctx, obj, client.MergeFrom(orig)); err != nil {
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
				targets = append(targets, datastore.RewriteTarget{Model: t.ModelRewrite, Weight: w})
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
