package controllers

import (
	"context"
	"fmt"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

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

// setupWriters adds what runs only on the leader: the leadership gauge, pool
// claims and, when enabled, picker Service provisioning with its watch of
// this deployment's own pods (which runs on every replica: it is cheap, and
// a new leader then starts with the replicas already known).
func (m *Manager) setupWriters() error {
	if err := m.mgr.Add(manager.RunnableFunc(m.lead)); err != nil {
		return err
	}
	err := ctrl.NewControllerManagedBy(m.mgr).
		For(&v1.InferencePool{}).
		Named("inferencepool-claim").
		WithOptions(controller.Options{NeedLeaderElection: ptr.To(true), MaxConcurrentReconciles: m.opts.MaxConcurrentReconciles}).
		Complete(reconcile.Func(m.reconcileClaim))
	if err != nil || !m.opts.ProvisionPickerServices {
		return err
	}
	return m.setupProvisioning()
}

// lead runs while this replica is the leader.
func (m *Manager) lead(ctx context.Context) error {
	m.leader.Store(true)
	m.metrics.leader.Set(1)
	m.log.Info("elected leader: writing pool claims, picker Services and Accepted conditions", "lease", m.opts.PickerNamespace+"/"+m.opts.PickerName, "election", m.opts.LeaderElection)
	if err := m.requeuePolicy(ctx); err != nil && ctx.Err() == nil {
		// The conditions are then written as objectives and pools next
		// change; serving does not depend on them.
		m.log.Error(err, "listing objectives and rewrites to write their Accepted conditions")
	}
	<-ctx.Done()
	m.leader.Store(false)
	m.metrics.leader.Set(0)
	return nil
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

type conflictKey struct {
	pool datastore.PoolKey
	kind string
}

// leaderState is the part of Manager the writers keep.
type leaderState struct {
	leader    atomic.Bool
	conflicts map[conflictKey]string // guarded by Manager.mu
}
