// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	llmdv1alpha2 "github.com/poolpicker/poolpicker/api/llmd/v1alpha2"
	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/api/v1alpha2"
	"github.com/poolpicker/poolpicker/controllers/podsource"
	"github.com/poolpicker/poolpicker/datastore"
)

// Scheme returns the scheme the reconcilers read: core types, poolpicker's
// API types and the part of the Gateway API's HTTPRoute it reads.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, v1.AddToScheme, v1alpha2.AddToScheme, llmdv1alpha2.AddToScheme, addHTTPRouteToScheme} {
		if err := add(s); err != nil {
			panic(err) // static registration; cannot fail
		}
	}
	return s
}

// ManagerOptions are the options of the controller-runtime manager that
// Setup adds the reconcilers to: Scheme, and a cache that holds
// InferencePools (filtered on the API server by namespace, PoolSelector
// and, in single-pool mode, name), InferenceObjectives,
// InferenceModelRewrites, HTTPRoutes (their pool backendRefs only) and the
// objects this deployment provisioned; never
// pods, which package podsource watches on its own. Its metrics and probe
// servers are off: the process serves its own.
func ManagerOptions(opts Options) (manager.Options, error) {
	if err := opts.Validate(); err != nil {
		return manager.Options{}, err
	}
	opts.setDefaults()
	poolObject := cache.ByObject{}
	if opts.PoolSelector != "" {
		sel, _ := labels.Parse(opts.PoolSelector) // validated above
		poolObject.Label = sel
	}
	var namespaces []string
	if opts.PoolName != "" {
		poolObject.Field = fields.OneTermEqualSelector("metadata.name", opts.PoolName)
		namespaces = []string{opts.PoolNamespace}
	} else {
		namespaces = opts.Namespaces
	}
	stripManagedFields := cache.TransformStripManagedFields()
	cacheOpts := cache.Options{
		// HTTPRoutes (when their CRD is served) keep only their pool
		// backendRefs; a ByObject entry for them would fail the cache on a
		// cluster without the CRD.
		DefaultTransform: func(obj any) (any, error) {
			if _, ok := obj.(*httpRoute); ok {
				return leanRoute(obj)
			}
			return stripManagedFields(obj)
		},
		ByObject: map[client.Object]cache.ByObject{&v1.InferencePool{}: poolObject},
	}
	for obj, by := range writerCacheObjects(opts) {
		cacheOpts.ByObject[obj] = by
	}
	if len(namespaces) > 0 {
		cacheOpts.DefaultNamespaces = map[string]cache.Config{}
		for _, ns := range namespaces {
			cacheOpts.DefaultNamespaces[ns] = cache.Config{}
		}
	}
	return manager.Options{
		Scheme:                  Scheme(),
		Cache:                   cacheOpts,
		Logger:                  opts.Logger,
		Metrics:                 metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:  "0",
		GracefulShutdownTimeout: ptr.To(opts.GracefulShutdownTimeout),
		// Several managers may live in one process (tests, benchmarks);
		// their controllers share names. Every controller runs on every
		// replica; the writers write only while it leads (asLeader).
		Controller: config.Controller{SkipNameValidation: ptr.To(true), NeedLeaderElection: ptr.To(false),
			// A replica started while the API server is unreachable waits
			// for it, serving nothing yet but up: a timeout here would stop
			// the process and crash-loop it for the whole outage.
			CacheSyncTimeout: waitForAPIServer},
		// Leader election is Leadership's own: controller-runtime's exits
		// the process when the Lease is lost.
	}, nil
}

// waitForAPIServer is how long controllers wait for their caches' first
// lists: as long as the API server takes (controller-runtime's default, two
// minutes, would end the process).
const waitForAPIServer = 365 * 24 * time.Hour

// Parts are what Setup made beside the reconcilers: the runnables the
// process adds to the manager (Runnables) and the handles it talks to
// while they run. None of them starts anything on its own.
type Parts struct {
	// Sources feed the served pools their pods (package podsource). The
	// process stops them (Sources.Stop) once the manager has returned:
	// a reconcile may have started watches in a manager that then failed.
	Sources *podsource.Sources
	// Leader elects the replica that runs the writers.
	Leader *Leadership
	// InitialSync latches once the pools served at start have synced.
	InitialSync *InitialSync
	// Events records Events on served pools, for flow control.
	Events *PoolEvents
	// Waiting tells the leader which pools have requests waiting here.
	Waiting *WaitingPools
	// Peers, with Options.PeerPort, lists this deployment's ready
	// replicas for peer sync; nil without it.
	Peers *PeerReplicas
}

// Runnables are the parts to add to the manager: each runs on every
// replica, leader or not (what only the leader may do, the writers decide
// for themselves).
func (p *Parts) Runnables() []manager.Runnable {
	rs := []manager.Runnable{p.Sources, p.Leader, p.InitialSync}
	if p.Peers != nil {
		rs = append(rs, p.Peers)
	}
	return rs
}

// Setup adds the reconcilers (PoolReconciler, PolicyReconciler,
// ClaimReconciler and, with provisioning, ProvisionReconciler) to mgr, a
// manager made with ManagerOptions(opts), filling opts.Registry, and
// returns the parts they share, whose Runnables the caller adds to mgr.
// It asks the API server which policy API groups it serves and whether it
// serves HTTPRoutes before it registers anything, so that a Setup that failed on an
// API server not answering can be tried again on a new manager.
func Setup(mgr manager.Manager, opts Options) (*Parts, error) {
	if opts.Registry == nil {
		return nil, errors.New("controllers: Options.Registry is required")
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts.setDefaults()
	groups, err := detectPolicyGroups(mgr.GetRESTMapper())
	if err != nil {
		return nil, err
	}
	routes, err := servesHTTPRoutes(mgr.GetRESTMapper())
	if err != nil {
		return nil, err
	}
	if !routes {
		opts.Logger.Info("the API server serves no HTTPRoutes (gateway.networking.k8s.io/v1): a pool that no picker serves is reported for its objectives only; restart poolpicker once the Gateway API CRDs are installed")
	}
	met, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, fmt.Errorf("controllers: registering metrics: %w", err)
	}
	sel := newSelection(opts)
	p := &Parts{
		Events:  &PoolEvents{cache: mgr.GetCache(), recorder: mgr.GetEventRecorder("poolpicker")},
		Waiting: &WaitingPools{},
		Leader: &Leadership{opts: opts, cfg: mgr.GetConfig(), recorderFor: mgr.GetEventRecorderFor, //nolint:staticcheck // client-go's leader election records with the core Events API
			log: opts.Logger, metrics: met},
	}
	p.InitialSync = &InitialSync{cache: mgr.GetCache(), selection: sel, registry: opts.Registry, log: opts.Logger, changed: make(chan struct{}, 1)}
	p.Sources, err = podsource.New(mgr.GetConfig(), podsource.Options{
		Registry: opts.Registry, Plan: opts.PodWatchPlan, NamespaceWatchThreshold: opts.NamespaceWatchThreshold,
		DisableStreamingLists: opts.DisableStreamingLists, StaleEndpointsTimeout: opts.StaleEndpointsTimeout,
		CountServable: func(ctx context.Context, ns string) int { return servablePools(ctx, mgr.GetCache(), sel, ns) },
		Changed:       p.InitialSync.signal, Events: p.Events.record, Registerer: opts.Registerer, Logger: opts.Logger,
	})
	if err != nil {
		return nil, err
	}
	p.InitialSync.sources = p.Sources
	if opts.PeerPort > 0 {
		p.Peers = newPeerReplicas(opts, p.Sources)
	}

	cf := &conflicts{metrics: met, events: p.Events, byKey: map[conflictKey]string{}}
	policyEvents := make(chan event.GenericEvent, 1024)
	policy := &PolicyReconciler{client: mgr.GetClient(), apiReader: mgr.GetAPIReader(), registry: opts.Registry,
		groups: groups, routes: routes, selection: sel, leader: p.Leader, events: p.Events, pools: policyEvents}
	p.Leader.onElected = append(p.Leader.onElected, func(ctx context.Context) {
		if err := policy.requeue(ctx); err != nil && ctx.Err() == nil {
			// The conditions are then written as objectives and pools next
			// change; serving does not depend on them.
			opts.Logger.Error(err, "listing objectives and rewrites to write their Accepted conditions")
		}
	})
	reconcilers := []interface{ SetupWithManager(manager.Manager) error }{
		&PoolReconciler{client: mgr.GetClient(), selection: sel, sources: p.Sources, events: p.Events, conflicts: cf,
			policy: policyEvents, maxConcurrentReconciles: opts.MaxConcurrentReconciles, ignored: map[datastore.PoolKey]string{},
			started: p.InitialSync.HasSynced},
		policy,
		&ClaimReconciler{client: mgr.GetClient(), apiReader: mgr.GetAPIReader(), selection: sel, leader: p.Leader, conflicts: cf,
			provisioning: opts.ProvisionPickerServices, maxConcurrentReconciles: opts.MaxConcurrentReconciles, waiting: p.Waiting},
	}
	if opts.ProvisionPickerServices {
		reconcilers = append(reconcilers, &ProvisionReconciler{client: mgr.GetClient(), apiReader: mgr.GetAPIReader(), selection: sel,
			leader: p.Leader, conflicts: cf, sources: p.Sources, pickerName: opts.PickerName, pickerNamespace: opts.PickerNamespace,
			podSelector: opts.PickerPodSelector, port: opts.PickerPort, maxConcurrentReconciles: opts.MaxConcurrentReconciles})
	}
	reconcilers = append(reconcilers, &waitingWriter{client: mgr.GetClient(), selection: sel, waiting: p.Waiting,
		annotation: ReplicaWaitingAnnotationPrefix + opts.ReplicaName})
	for _, r := range reconcilers {
		if err := r.SetupWithManager(mgr); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// everyReplica marks a runnable as data plane: it runs without the lease.
type everyReplica struct{ manager.Runnable }

func (everyReplica) NeedLeaderElection() bool { return false }

// servablePools counts the pools of the namespace in the cache that this
// picker would serve (an estimate: claims may still change it).
func servablePools(ctx context.Context, c client.Reader, sel *selection, namespace string) int {
	var list v1.InferencePoolList
	if err := c.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return 0
	}
	n := 0
	for i := range list.Items {
		if ok, _ := sel.servesSpec(&list.Items[i]); ok {
			n++
		}
	}
	return n
}
