// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/datastore"
)

// Labels and annotations poolpicker reads and writes.
const (
	// PickerLabel carries a deployment's picker name: on the objects it
	// provisions, on its own pods (the default PickerPodSelector) and, as the
	// flags' default pool selector, on the pools that opt in to it.
	PickerLabel = "poolpicker.io/picker"
	// PoolLabel, on provisioned Services and EndpointSlices, names the pool
	// (in their namespace) they were made for.
	PoolLabel = "poolpicker.io/pool"
	// ClaimAnnotation on an InferencePool names the deployment serving it,
	// as PickerNamespace/PickerName. A deployment that finds a pool claimed
	// by another does not serve it and reports the conflict; the claim goes
	// when its owner stops serving the pool (or by hand, when a deployment
	// was removed: kubectl annotate inferencepool NAME poolpicker.io/served-by-).
	ClaimAnnotation = "poolpicker.io/served-by"

	managedByLabel = "app.kubernetes.io/managed-by"
	managedBy      = "poolpicker"
	// sliceManagedBy keeps the EndpointSlice controller's hands off the
	// slices poolpicker writes.
	sliceManagedBy = "poolpicker.io"
	pickerPortName = "grpc-ext-proc"
	appProtocolH2C = "kubernetes.io/h2c"
)

// writerCacheObjects narrows the cache of Services and EndpointSlices to
// the ones this deployment provisioned: nothing else is ever read through it.
func writerCacheObjects(opts Options) map[client.Object]cache.ByObject {
	name := opts.PickerName
	if name == "" {
		name = DefaultPickerName
	}
	sel := labels.SelectorFromSet(labels.Set{PickerLabel: name})
	return map[client.Object]cache.ByObject{&corev1.Service{}: {Label: sel}, &discoveryv1.EndpointSlice{}: {Label: sel}}
}

// electedRequests maps a new term's event to what a new leader
// reconciles: every pool in the cache and, with provisioning, the pools
// named by the picker Services and EndpointSlices this deployment
// provisioned (a pool gone or no longer served since leaves objects to
// remove).
func electedRequests(c client.Reader, provisioning bool) handler.MapFunc {
	return func(ctx context.Context, _ client.Object) []reconcile.Request {
		reqs := allPools(ctx, c)
		if !provisioning {
			return reqs
		}
		seen := map[reconcile.Request]bool{}
		for _, r := range reqs {
			seen[r] = true
		}
		var svcs corev1.ServiceList
		var slices discoveryv1.EndpointSliceList
		var objs []client.Object
		if c.List(ctx, &svcs) == nil {
			for i := range svcs.Items {
				objs = append(objs, &svcs.Items[i])
			}
		}
		if c.List(ctx, &slices) == nil {
			for i := range slices.Items {
				objs = append(objs, &slices.Items[i])
			}
		}
		for _, obj := range objs {
			if name := obj.GetLabels()[PoolLabel]; name != "" {
				r := reconcile.Request{NamespacedName: datastore.PoolKey{Namespace: obj.GetNamespace(), Name: name}}
				if !seen[r] {
					seen[r] = true
					reqs = append(reqs, r)
				}
			}
		}
		return reqs
	}
}

// allPools lists every pool in the cache as requests.
func allPools(ctx context.Context, c client.Reader) []reconcile.Request {
	var list v1.InferencePoolList
	if err := c.List(ctx, &list); err != nil {
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return out
}

// ClaimReconciler claims, on the leader, the served pools that nobody
// claimed (ClaimAnnotation), releases the claims of pools no longer served,
// reports pools that another deployment claimed, and writes
// RequestsWaitingAnnotation on the served pools it holds requests for. Off the leader it does
// nothing; a new leader reconciles every pool.
type ClaimReconciler struct {
	// client reads the pool cache and writes the claims; apiReader reads
	// a pool the cache no longer holds.
	client    client.Client
	apiReader client.Reader
	selection *selection
	leader    *Leadership
	conflicts *conflicts
	// provisioning: a new leader also looks at the pools of provisioned
	// objects.
	provisioning            bool
	maxConcurrentReconciles int
	// waiting are the pools whose RequestsWaitingAnnotation it writes.
	waiting *WaitingPools
}

// SetupWithManager adds the reconciler to mgr, woken by pool changes and
// by each new term.
func (r *ClaimReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1.InferencePool{}).
		Named("inferencepool-claim").
		WatchesRawSource(source.Channel(r.leader.electedSource(), handler.EnqueueRequestsFromMapFunc(electedRequests(mgr.GetCache(), r.provisioning)))).
		WithOptions(controller.Options{MaxConcurrentReconciles: r.maxConcurrentReconciles}).
		Complete(r.leader.asLeader(r.reconcile))
}

// Reconcile claims or releases one pool, on the leader only.
func (r *ClaimReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	return r.leader.asLeader(r.reconcile)(ctx, req)
}

func (r *ClaimReconciler) reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	key := req.NamespacedName
	var pool v1.InferencePool
	err := r.client.Get(ctx, key, &pool)
	if apierrors.IsNotFound(err) {
		// Deleted, or out of this deployment's selection: the cache no
		// longer has it, so read it directly to release a claim.
		if err := r.apiReader.Get(ctx, key, &pool); err != nil {
			return reconcile.Result{}, client.IgnoreNotFound(err)
		}
		return reconcile.Result{}, r.setClaim(ctx, &pool, false)
	}
	if err != nil {
		return reconcile.Result{}, err
	}
	ok, _ := r.selection.servesSpec(&pool)
	if other, conflict := r.selection.claimedByOther(&pool); conflict {
		if ok {
			r.conflicts.conflict(ctx, key, "claim", fmt.Sprintf("InferencePool %s is claimed by poolpicker %s (annotation %s); this deployment (%s) does not serve it. Narrow one deployment's pool selection, or remove the annotation if %s is gone.", key, other, ClaimAnnotation, r.selection.claimID, other))
		}
		return reconcile.Result{}, nil
	}
	r.conflicts.resolved(ctx, key, "claim")
	if err := r.setClaim(ctx, &pool, ok); err != nil {
		return reconcile.Result{}, err
	}
	again, err := r.setWaiting(ctx, &pool, ok)
	return reconcile.Result{RequeueAfter: again}, err
}

// setClaim makes the pool's claim this deployment's (claim) or nobody's,
// touching only a claim that is absent or this deployment's own. The
// update is optimistic: of two leaders claiming at once, one fails and
// sees the other's claim on its next reconcile.
func (r *ClaimReconciler) setClaim(ctx context.Context, pool *v1.InferencePool, claim bool) error {
	id := r.selection.claimID
	cur, has := pool.Annotations[ClaimAnnotation]
	switch {
	case claim && has && cur == id, !claim && !has:
		return nil
	case has && cur != id:
		return nil // not ours to change
	}
	patch := client.MergeFromWithOptions(pool.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if claim {
		if pool.Annotations == nil {
			pool.Annotations = map[string]string{}
		}
		pool.Annotations[ClaimAnnotation] = id
	} else {
		delete(pool.Annotations, ClaimAnnotation)
	}
	if err := r.client.Patch(ctx, pool, patch); err != nil {
		return client.IgnoreNotFound(err)
	}
	log.FromContext(ctx).Info("pool claim changed", "pool", client.ObjectKeyFromObject(pool).String(), "claimed", claim, "by", id)
	return nil
}

// conflicts are the objects of others standing in the way of serving or
// provisioning a pool, as the writers found them: each is reported once
// per change (a log line, an Event on the pool) and held in
// poolpicker_pool_conflicts until resolved.
type conflicts struct {
	metrics *metrics
	events  *PoolEvents

	mu    sync.Mutex
	byKey map[conflictKey]string
}

type conflictKey struct {
	pool datastore.PoolKey
	kind string
}

// conflict reports that kind (claim, Service, EndpointSlice) stops this
// deployment from serving or provisioning the pool.
func (c *conflicts) conflict(ctx context.Context, key datastore.PoolKey, kind, msg string) {
	ck := conflictKey{key, kind}
	c.mu.Lock()
	last, seen := c.byKey[ck]
	c.byKey[ck] = msg
	c.mu.Unlock()
	c.metrics.conflicts.WithLabelValues(key.Namespace, key.Name, kind).Set(1)
	if seen && last == msg {
		return
	}
	log.FromContext(ctx).Info("conflict on a pool", "pool", key.String(), "kind", kind, "detail", msg)
	reason := map[string]string{"claim": "ClaimedByOtherPicker", "Service": "PickerServiceConflict", "EndpointSlice": "PickerEndpointSliceConflict"}[kind]
	c.events.record(ctx, key, corev1.EventTypeWarning, reason, msg)
}

// resolved clears a conflict reported by conflict.
func (c *conflicts) resolved(ctx context.Context, key datastore.PoolKey, kind string) {
	ck := conflictKey{key, kind}
	c.mu.Lock()
	_, seen := c.byKey[ck]
	delete(c.byKey, ck)
	c.mu.Unlock()
	if seen {
		c.metrics.conflicts.DeleteLabelValues(key.Namespace, key.Name, kind)
		log.FromContext(ctx).Info("conflict on a pool resolved", "pool", key.String(), "kind", kind)
	}
}

// forget clears the conflicts of a pool that is gone: they stand in the
// way of nothing any more, and their series go with the pool.
func (c *conflicts) forget(ctx context.Context, key datastore.PoolKey) {
	for _, kind := range []string{"claim", "Service", "EndpointSlice"} {
		c.resolved(ctx, key, kind)
	}
}
