// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
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

// claimID is the value of ClaimAnnotation for this deployment.
func (m *Manager) claimID() string { return m.opts.PickerNamespace + "/" + m.opts.PickerName }

// IsLeader reports whether this replica holds the lease (always, without
// leader election) and so runs the writers.
func (m *Manager) IsLeader() bool { return m.leader.Load() }

// setupWriters adds the writers: the leadership gauge, pool claims and,
// when enabled, picker Service provisioning with its watch of this
// deployment's own pods. They run on every replica and write only while it
// leads (asLeader), so that losing the Lease pauses them without stopping
// the process; a new leader starts with their caches warm.
func (m *Manager) setupWriters() error {
	if err := m.Add(manager.RunnableFunc(func(ctx context.Context) error {
		if m.opts.LeaderElection {
			return m.elect(ctx)
		}
		m.lead(ctx)
		return nil
	})); err != nil {
		return err
	}
	elected := make(chan event.GenericEvent, 1)
	m.elected = append(m.elected, elected)
	err := ctrl.NewControllerManagedBy(m.mgr).
		For(&v1.InferencePool{}).
		Named("inferencepool-claim").
		WatchesRawSource(source.Channel(elected, handler.EnqueueRequestsFromMapFunc(m.electedRequests))).
		WithOptions(controller.Options{MaxConcurrentReconciles: m.opts.MaxConcurrentReconciles}).
		Complete(m.asLeader(m.reconcileClaim))
	if err != nil || !m.opts.ProvisionPickerServices {
		return err
	}
	return m.setupProvisioning()
}

// lead runs one term as leader, until ctx ends: the writers write, and a
// newly elected leader looks at every pool again, so that nothing a
// predecessor left half done (or changed while nobody led) stays so.
func (m *Manager) lead(ctx context.Context) {
	t := &term{ctx: ctx}
	m.termMu.Lock()
	m.term = t
	m.termMu.Unlock()
	m.leader.Store(true)
	m.metrics.leader.Set(1)
	m.log.Info("elected leader: writing pool claims, picker Services and Accepted conditions", "lease", m.leaseName(), "election", m.opts.LeaderElection)
	for _, c := range m.elected {
		select {
		case c <- event.GenericEvent{Object: &v1.InferencePool{}}:
		default: // one already waiting does the same
		}
	}
	if err := m.requeuePolicy(ctx); err != nil && ctx.Err() == nil {
		// The conditions are then written as objectives and pools next
		// change; serving does not depend on them.
		m.log.Error(err, "listing objectives and rewrites to write their Accepted conditions")
	}
	<-ctx.Done()
	m.termMu.Lock()
	m.term = nil
	m.termMu.Unlock()
	m.leader.Store(false)
	m.metrics.leader.Set(0)
	t.writes.Wait()
	m.log.Info("leadership ended: writes paused", "lease", m.leaseName())
}

// electedRequests are what a new leader reconciles: every pool in the
// cache, and the pools named by the picker Services and EndpointSlices
// this deployment provisioned (a pool gone or no longer served since
// leaves objects to remove).
func (m *Manager) electedRequests(ctx context.Context, o client.Object) []reconcile.Request {
	reqs := m.allPools(ctx, o)
	if !m.opts.ProvisionPickerServices {
		return reqs
	}
	seen := map[reconcile.Request]bool{}
	for _, r := range reqs {
		seen[r] = true
	}
	var svcs corev1.ServiceList
	var slices discoveryv1.EndpointSliceList
	var objs []client.Object
	if m.mgr.GetCache().List(ctx, &svcs) == nil {
		for i := range svcs.Items {
			objs = append(objs, &svcs.Items[i])
		}
	}
	if m.mgr.GetCache().List(ctx, &slices) == nil {
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

// claimedByOther returns the pool's claim and whether another deployment
// holds it.
func (m *Manager) claimedByOther(pool *v1.InferencePool) (string, bool) {
	c := pool.Annotations[ClaimAnnotation]
	return c, c != "" && c != m.claimID()
}

// reconcileClaim, on the leader, claims the served pools that nobody
// claimed, releases the claims of pools no longer served, and reports
// pools that another deployment claimed.
func (m *Manager) reconcileClaim(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	key := req.NamespacedName
	var pool v1.InferencePool
	err := m.mgr.GetClient().Get(ctx, key, &pool)
	if apierrors.IsNotFound(err) {
		// Deleted, or out of this deployment's selection: the cache no
		// longer has it, so read it directly to release a claim.
		if err := m.mgr.GetAPIReader().Get(ctx, key, &pool); err != nil {
			return reconcile.Result{}, client.IgnoreNotFound(err)
		}
		return reconcile.Result{}, m.setClaim(ctx, &pool, false)
	}
	if err != nil {
		return reconcile.Result{}, err
	}
	ok, _ := m.servesSpec(&pool)
	if other, conflict := m.claimedByOther(&pool); conflict {
		if ok {
			m.conflict(key, "claim", fmt.Sprintf("InferencePool %s is claimed by poolpicker %s (annotation %s); this deployment (%s) does not serve it. Narrow one deployment's pool selection, or remove the annotation if %s is gone.", key, other, ClaimAnnotation, m.claimID(), other))
		}
		return reconcile.Result{}, nil
	}
	m.resolved(key, "claim")
	return reconcile.Result{}, m.setClaim(ctx, &pool, ok)
}

// setClaim makes the pool's claim this deployment's (claim) or nobody's,
// touching only a claim that is absent or this deployment's own. The
// update is optimistic: of two leaders claiming at once, one fails and
// sees the other's claim on its next reconcile.
func (m *Manager) setClaim(ctx context.Context, pool *v1.InferencePool, claim bool) error {
	cur, has := pool.Annotations[ClaimAnnotation]
	switch {
	case claim && has && cur == m.claimID(), !claim && !has:
		return nil
	case has && cur != m.claimID():
		return nil // not ours to change
	}
	patch := client.MergeFromWithOptions(pool.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if claim {
		if pool.Annotations == nil {
			pool.Annotations = map[string]string{}
		}
		pool.Annotations[ClaimAnnotation] = m.claimID()
	} else {
		delete(pool.Annotations, ClaimAnnotation)
	}
	if err := m.mgr.GetClient().Patch(ctx, pool, patch); err != nil {
		return client.IgnoreNotFound(err)
	}
	m.log.Info("pool claim changed", "pool", client.ObjectKeyFromObject(pool).String(), "claimed", claim, "by", m.claimID())
	return nil
}

// conflict reports, once per change, that kind (claim, Service,
// EndpointSlice) stops this deployment from serving or provisioning the
// pool: a log line, an Event on the pool and poolpicker_pool_conflicts.
func (m *Manager) conflict(key datastore.PoolKey, kind, msg string) {
	ck := conflictKey{key, kind}
	m.mu.Lock()
	last, seen := m.conflicts[ck]
	m.conflicts[ck] = msg
	m.mu.Unlock()
	m.metrics.conflicts.WithLabelValues(key.Namespace, key.Name, kind).Set(1)
	if seen && last == msg {
		return
	}
	m.log.Info("conflict on a pool", "pool", key.String(), "kind", kind, "detail", msg)
	reason := map[string]string{"claim": "ClaimedByOtherPicker", "Service": "PickerServiceConflict", "EndpointSlice": "PickerEndpointSliceConflict"}[kind]
	m.poolEvent(key, corev1.EventTypeWarning, reason, msg)
}

// resolved clears a conflict reported by conflict.
func (m *Manager) resolved(key datastore.PoolKey, kind string) {
	ck := conflictKey{key, kind}
	m.mu.Lock()
	_, seen := m.conflicts[ck]
	delete(m.conflicts, ck)
	m.mu.Unlock()
	if seen {
		m.metrics.conflicts.DeleteLabelValues(key.Namespace, key.Name, kind)
		m.log.Info("conflict on a pool resolved", "pool", key.String(), "kind", kind)
	}
}

// forgetConflicts clears the conflicts of a pool that is gone: they stand
// in the way of nothing any more, and their series go with the pool.
func (m *Manager) forgetConflicts(key datastore.PoolKey) {
	for _, kind := range []string{"claim", "Service", "EndpointSlice"} {
		m.resolved(key, kind)
	}
}

type conflictKey struct {
	pool datastore.PoolKey
	kind string
}

// leaderState is the part of Manager the writers keep.
type leaderState struct {
	leader atomic.Bool
	// term is the current term as leader; nil off the leader.
	term   *term
	termMu sync.RWMutex
	// elected wake each writer's reconciler when a term starts.
	elected   []chan event.GenericEvent
	conflicts map[conflictKey]string // guarded by Manager.mu
}
