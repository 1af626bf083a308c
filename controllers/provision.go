// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/controllers/podsource"
	"github.com/poolpicker/poolpicker/datastore"
)

// ProvisionReconciler makes, on the leader, the picker Service of each
// served pool whose spec.endpointPickerRef Service does not exist (in the
// pool's namespace, selector-less, owned by the pool) and an EndpointSlice
// listing this deployment's ready replicas, and removes what it provisioned
// for pools it no longer serves. Objects it did not create are never
// modified; such a conflict is reported on the pool.
type ProvisionReconciler struct {
	// client reads the caches (pools, and the Services and EndpointSlices
	// this deployment provisioned) and writes; apiReader reads objects of
	// others, which the cache does not hold.
	client    client.Client
	apiReader client.Reader
	selection *selection
	leader    *Leadership
	conflicts *conflicts
	sources   *podsource.Sources
	// pickerName, pickerNamespace, podSelector and port are Options'
	// PickerName, PickerNamespace, PickerPodSelector and PickerPort.
	pickerName, pickerNamespace, podSelector string
	port                                     int32
	maxConcurrentReconciles                  int

	// replicaPool holds this deployment's ready replicas, fed by a watch
	// of its own pods that SetupWithManager's runnable runs; replicaEvents
	// wakes the reconciler when they change.
	replicaPool   *datastore.Pool
	replicaEvents chan event.GenericEvent
}

// SetupWithManager adds the watch of this deployment's own pods and the
// reconciler, woken by pools, provisioned objects, replica changes and
// each new term.
func (r *ProvisionReconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.replicaEvents = make(chan event.GenericEvent, 1)
	replicaReg := datastore.NewRegistry()
	replicaReg.AddObserver(replicaObserver{r.replicaEvents})
	key := datastore.PoolKey{Namespace: r.pickerNamespace, Name: r.pickerName + " replicas"}
	sel, _ := labels.Parse(r.podSelector) // validated
	r.replicaPool = replicaReg.Upsert(key, &datastore.PoolSpec{TargetPorts: []int32{r.port}})
	if err := mgr.Add(everyReplica{manager.RunnableFunc(func(ctx context.Context) error {
		stop := r.sources.WatchReplicas(key, r.replicaPool, sel.String())
		<-ctx.Done()
		stop()
		return nil
	})}); err != nil {
		return err
	}
	byPool := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		if name := o.GetLabels()[PoolLabel]; name != "" {
			return []reconcile.Request{{NamespacedName: datastore.PoolKey{Namespace: o.GetNamespace(), Name: name}}}
		}
		return nil
	})
	poolCache := mgr.GetCache()
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1.InferencePool{}).
		Named("pickerservice").
		Watches(&corev1.Service{}, byPool).
		Watches(&discoveryv1.EndpointSlice{}, byPool).
		WatchesRawSource(source.Channel(r.replicaEvents, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
			return allPools(ctx, poolCache) // the replicas are in every slice
		}))).
		WatchesRawSource(source.Channel(r.leader.electedSource(), handler.EnqueueRequestsFromMapFunc(electedRequests(poolCache, true)))).
		WithOptions(controller.Options{MaxConcurrentReconciles: r.maxConcurrentReconciles}).
		Complete(r)
}

// replicaObserver turns a change of the ready replicas into one wake-up of
// the provisioning reconciler (a burst collapses into one).
type replicaObserver struct{ events chan<- event.GenericEvent }

func (o replicaObserver) EndpointsChanged(*datastore.Pool, []*datastore.Endpoint, []*datastore.Endpoint) {
	select {
	case o.events <- event.GenericEvent{Object: &corev1.Pod{}}:
	default:
	}
}
func (o replicaObserver) PoolRemoved(*datastore.Pool) {}

// sliceName is the name of the EndpointSlice provisioned for a Service.
func (r *ProvisionReconciler) sliceName(service string) string { return service + "-" + r.pickerName }

// Reconcile makes, on the leader, the picker Service of a served pool and
// its EndpointSlice match the ready replicas, and removes what it
// provisioned for pools it no longer serves.
func (r *ProvisionReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	return r.leader.asLeader(r.reconcile)(ctx, req)
}

func (r *ProvisionReconciler) reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	key := req.NamespacedName
	var pool v1.InferencePool
	err := r.client.Get(ctx, key, &pool)
	if err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, err
	}
	served := false
	if err == nil {
		served, _ = r.selection.serves(&pool)
	}
	ref := pool.Spec.EndpointPickerRef
	if !served || ref == nil || ref.Port == nil {
		// Owner references would take them with a deleted pool; a pool that
		// is merely no longer served here keeps none of this deployment's.
		r.conflicts.resolved(ctx, key, "Service")
		r.conflicts.resolved(ctx, key, "EndpointSlice")
		return reconcile.Result{}, r.deprovision(ctx, key, "")
	}
	if !r.replicaPool.Synced() {
		// An empty slice written before the replicas are known would cut
		// the pool off; wait for the first list.
		return reconcile.Result{RequeueAfter: 200 * time.Millisecond}, nil
	}
	svcName := string(ref.Name)
	if err := r.deprovision(ctx, key, svcName); err != nil {
		return reconcile.Result{}, err
	}
	ok, err := r.ensureService(ctx, &pool, svcName, int32(ref.Port.Number))
	if err != nil {
		return reconcile.Result{}, err
	}
	if ok {
		ok, err = r.ensureSlice(ctx, &pool, svcName)
	}
	if !ok && err == nil {
		// Objects of others are not watched (the cache holds only this
		// deployment's): look again for the conflict to clear.
		return reconcile.Result{RequeueAfter: conflictRecheck}, nil
	}
	return reconcile.Result{}, err
}

// conflictRecheck is how often a picker Service or slice name taken by
// someone else is looked at again.
const conflictRecheck = 10 * time.Second

// ours reports whether obj was provisioned by this deployment.
func (r *ProvisionReconciler) ours(obj client.Object) bool {
	l := obj.GetLabels()
	return l[PickerLabel] == r.pickerName && l[managedByLabel] == managedBy
}

func (r *ProvisionReconciler) provisionedLabels(pool string) map[string]string {
	return map[string]string{PickerLabel: r.pickerName, managedByLabel: managedBy, PoolLabel: pool}
}

// getOwnOrForeign reads obj from the cache of provisioned objects, or, when
// absent there, from the API server: a name taken by someone else (or one
// of ours the cache has not seen yet). It returns whether obj exists.
func (r *ProvisionReconciler) getOwnOrForeign(ctx context.Context, key client.ObjectKey, obj client.Object) (bool, error) {
	err := r.client.Get(ctx, key, obj)
	if apierrors.IsNotFound(err) {
		err = r.apiReader.Get(ctx, key, obj)
	}
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

// ensureService creates the pool's picker Service when absent, or keeps
// one it created right; it reports false when the name is taken by a
// Service it did not create.
func (r *ProvisionReconciler) ensureService(ctx context.Context, pool *v1.InferencePool, name string, port int32) (bool, error) {
	key := datastore.PoolKey{Namespace: pool.Namespace, Name: pool.Name}
	want := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: pool.Namespace, Name: name, Labels: r.provisionedLabels(pool.Name),
			OwnerReferences: []metav1.OwnerReference{{APIVersion: v1.GroupVersion.String(), Kind: "InferencePool", Name: pool.Name, UID: pool.UID, Controller: ptr.To(true)}},
		},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{
			Name: pickerPortName, Protocol: corev1.ProtocolTCP, AppProtocol: ptr.To(appProtocolH2C),
			Port: port, TargetPort: intstr.FromInt32(r.port),
		}}},
	}
	var cur corev1.Service
	state, err := r.createOrCheckOwner(ctx, key, "Service", want, &cur,
		"it is left alone, and no EndpointSlice is provisioned for it (delete it to let poolpicker provision it, or route it to the picker yourself)")
	if state != existsOurs {
		return state == created, err
	}
	if maps.Equal(cur.Labels, want.Labels) && equality.Semantic.DeepEqual(cur.OwnerReferences, want.OwnerReferences) &&
		len(cur.Spec.Selector) == 0 && equality.Semantic.DeepEqual(cur.Spec.Ports, want.Spec.Ports) {
		return true, nil
	}
	cur.Labels, cur.OwnerReferences, cur.Spec.Selector, cur.Spec.Ports = want.Labels, want.OwnerReferences, nil, want.Spec.Ports
	if err := r.client.Update(ctx, &cur); err != nil {
		return false, err
	}
	log.FromContext(ctx).Info("updated picker Service", "pool", key.String(), "service", name, "port", port)
	return true, nil
}

// ensureSlice makes the Service's EndpointSlice list the ready replicas; it
// reports false when the name is taken by a slice it did not create.
func (r *ProvisionReconciler) ensureSlice(ctx context.Context, pool *v1.InferencePool, service string) (bool, error) {
	key := datastore.PoolKey{Namespace: pool.Namespace, Name: pool.Name}
	var svc corev1.Service
	if err := r.apiReader.Get(ctx, client.ObjectKey{Namespace: pool.Namespace, Name: service}, &svc); err != nil {
		return false, err
	}
	lbls := r.provisionedLabels(pool.Name)
	lbls[discoveryv1.LabelServiceName] = service
	lbls[discoveryv1.LabelManagedBy] = sliceManagedBy
	want := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: pool.Namespace, Name: r.sliceName(service), Labels: lbls,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: svc.Name, UID: svc.UID, Controller: ptr.To(true)}},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   r.replicaEndpoints(),
		Ports: []discoveryv1.EndpointPort{{
			Name: ptr.To(pickerPortName), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(r.port), AppProtocol: ptr.To(appProtocolH2C),
		}},
	}
	var cur discoveryv1.EndpointSlice
	state, err := r.createOrCheckOwner(ctx, key, "EndpointSlice", want, &cur, "it is left alone")
	if state != existsOurs {
		return state == created, err
	}
	if maps.Equal(cur.Labels, want.Labels) && equality.Semantic.DeepEqual(cur.OwnerReferences, want.OwnerReferences) &&
		equality.Semantic.DeepEqual(cur.Endpoints, want.Endpoints) && equality.Semantic.DeepEqual(cur.Ports, want.Ports) {
		return true, nil
	}
	cur.Labels, cur.OwnerReferences, cur.Endpoints, cur.Ports = want.Labels, want.OwnerReferences, want.Endpoints, want.Ports
	if err := r.client.Update(ctx, &cur); err != nil {
		return false, err
	}
	log.FromContext(ctx).V(2).Info("updated picker EndpointSlice", "pool", key.String(), "slice", want.Name, "replicas", len(want.Endpoints))
	return true, nil
}

// replicaEndpoints are the ready replicas as slice endpoints, by IP.
func (r *ProvisionReconciler) replicaEndpoints() []discoveryv1.Endpoint {
	eps := r.replicaPool.Endpoints().Endpoints
	out := make([]discoveryv1.Endpoint, 0, len(eps))
	for _, e := range eps {
		out = append(out, discoveryv1.Endpoint{
			Addresses:  []string{e.IP},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: e.Pod.Namespace, Name: e.Pod.Name, UID: e.PodUID},
		})
	}
	slices.SortFunc(out, func(a, b discoveryv1.Endpoint) int { return strings.Compare(a.Addresses[0], b.Addresses[0]) })
	return out
}

// deprovision deletes the Services (and their slices) this deployment made
// for the pool, except the one named keep.
func (r *ProvisionReconciler) deprovision(ctx context.Context, key datastore.PoolKey, keep string) error {
	sel := client.MatchingLabels(r.provisionedLabels(key.Name))
	var svcs corev1.ServiceList
	if err := r.client.List(ctx, &svcs, client.InNamespace(key.Namespace), sel); err != nil {
		return err
	}
	for i := range svcs.Items {
		svc := &svcs.Items[i]
		if svc.Name == keep || !r.ours(svc) {
			continue
		}
		if err := client.IgnoreNotFound(r.client.Delete(ctx, svc)); err != nil {
			return err
		}
		log.FromContext(ctx).Info("removed picker Service", "pool", key.String(), "service", svc.Name)
	}
	var eps discoveryv1.EndpointSliceList
	if err := r.client.List(ctx, &eps, client.InNamespace(key.Namespace), sel); err != nil {
		return err
	}
	for i := range eps.Items {
		s := &eps.Items[i]
		if s.Labels[discoveryv1.LabelServiceName] == keep || !r.ours(s) {
			continue
		}
		if err := client.IgnoreNotFound(r.client.Delete(ctx, s)); err != nil {
			return err
		}
	}
	return nil
}

// provisionState is what createOrCheckOwner found under an object's name.
type provisionState int

const (
	failed     provisionState = iota // reading or creating it failed
	created                          // absent, now created from want
	existsOurs                       // present and created by this picker: the caller brings it up to date
	foreign                          // present and not ours: left alone, reported as a conflict
)

// createOrCheckOwner reads the object named like want into cur, creates want
// when there is none, and reports a conflict when the one there was not
// created by this picker; the Service and its EndpointSlice share this rule.
func (r *ProvisionReconciler) createOrCheckOwner(ctx context.Context, key datastore.PoolKey, kind string, want, cur client.Object, leftAlone string) (provisionState, error) {
	exists, err := r.getOwnOrForeign(ctx, client.ObjectKeyFromObject(want), cur)
	if err != nil {
		return failed, err
	}
	if !exists {
		if err := r.client.Create(ctx, want); err != nil {
			return failed, err
		}
		log.FromContext(ctx).Info("provisioned picker "+kind, "pool", key.String(), "name", want.GetName())
		r.conflicts.resolved(ctx, key, kind)
		return created, nil
	}
	if !r.ours(cur) {
		r.conflicts.conflict(ctx, key, kind, fmt.Sprintf("%s %s/%s exists and was not created by poolpicker %s: %s", kind, want.GetNamespace(), want.GetName(), r.selection.claimID, leftAlone))
		return foreign, nil
	}
	r.conflicts.resolved(ctx, key, kind)
	return existsOurs, nil
}
