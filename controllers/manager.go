// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
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

// doneContext is a context that has ended: reads with it never wait.
var doneContext = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// Manager runs the reconcilers (PoolReconciler, PolicyReconciler,
// ClaimReconciler and, with provisioning, ProvisionReconciler), the pod
// sources that feed the served pools their pods, and leader election, over
// one controller-runtime manager, filling Options.Registry. Its cache holds
// InferencePools (filtered on the API server by namespace, PoolSelector
// and, in single-pool mode, name), InferenceObjectives,
// InferenceModelRewrites and the objects this deployment provisioned; never
// pods.
type Manager struct {
	opts     Options
	mgr      manager.Manager
	registry *datastore.Registry
	metrics  *metrics
	log      logr.Logger

	selection *selection
	recorder  *poolRecorder
	sources   *podsource.Sources
	leader    *leadership
	waiting   *waitingPools

	started     atomic.Bool
	initialSync atomic.Bool
	// changed is poked when a pool syncs or stops being served, waking
	// waitInitialSync.
	changed chan struct{}
}

// Scheme returns the scheme the reconcilers read: core types and
// poolpicker's API types.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, v1.AddToScheme, v1alpha2.AddToScheme, llmdv1alpha2.AddToScheme} {
		if err := add(s); err != nil {
			panic(err) // static registration; cannot fail
		}
	}
	return s
}

// New builds a Manager over the API server at cfg. Nothing runs until Start.
func New(cfg *rest.Config, opts Options) (*Manager, error) {
	if opts.Registry == nil {
		return nil, errors.New("controllers: Options.Registry is required")
	}
	if err := opts.Validate(); err != nil {
		return nil, err
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
	cacheOpts := cache.Options{
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject:         map[client.Object]cache.ByObject{&v1.InferencePool{}: poolObject},
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
	mgr, err := manager.New(cfg, manager.Options{
		Scheme:                  Scheme(),
		Cache:                   cacheOpts,
		Logger:                  opts.Logger,
		Metrics:                 metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:  "0",
		GracefulShutdownTimeout: ptr.To(opts.GracefulShutdownTimeout),
		// Several Managers may live in one process (tests, benchmarks);
		// their controllers share names. Every controller runs on every
		// replica; the writers write only while it leads (asLeader).
		Controller: config.Controller{SkipNameValidation: ptr.To(true), NeedLeaderElection: ptr.To(false),
			// A replica started while the API server is unreachable waits
			// for it, serving nothing yet but up: a timeout here would stop
			// the process and crash-loop it for the whole outage.
			CacheSyncTimeout: waitForAPIServer},
		// Leader election is the Manager's own (elect): controller-runtime's
		// exits the process when the Lease is lost.
	})
	if err != nil {
		return nil, fmt.Errorf("controllers: creating manager: %w", err)
	}
	// The one question New asks the API server comes before anything is
	// registered, so that a New that failed on an API server not answering
	// can be called again.
	groups, err := detectPolicyGroups(mgr.GetRESTMapper())
	if err != nil {
		return nil, err
	}
	met, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, fmt.Errorf("controllers: registering metrics: %w", err)
	}
	m := &Manager{
		opts:      opts,
		mgr:       mgr,
		registry:  opts.Registry,
		metrics:   met,
		log:       opts.Logger,
		selection: newSelection(opts),
		changed:   make(chan struct{}, 1),
	}
	m.recorder = &poolRecorder{cache: mgr.GetCache(), recorder: mgr.GetEventRecorder("poolpicker")}
	m.sources, err = podsource.New(mgr.GetConfig(), podsource.Options{
		Registry: opts.Registry, Plan: opts.PodWatchPlan, NamespaceWatchThreshold: opts.NamespaceWatchThreshold,
		DisableStreamingLists: opts.DisableStreamingLists, CountServable: m.servablePools, Changed: m.signal,
		Events: m.recorder.record, Registerer: opts.Registerer, Logger: opts.Logger,
	})
	if err != nil {
		return nil, err
	}
	m.waiting = &waitingPools{}
	m.leader = &leadership{opts: opts, cfg: mgr.GetConfig(), recorderFor: mgr.GetEventRecorderFor, log: opts.Logger, metrics: met} //nolint:staticcheck // client-go's leader election records with the core Events API
	cf := &conflicts{metrics: met, events: m.recorder, byKey: map[conflictKey]string{}}
	policyEvents := make(chan event.GenericEvent, 1024)
	policy := &PolicyReconciler{client: mgr.GetClient(), apiReader: mgr.GetAPIReader(), registry: opts.Registry,
		groups: groups, leader: m.leader, pools: policyEvents}
	m.leader.onElected = append(m.leader.onElected, func(ctx context.Context) {
		if err := policy.requeue(ctx); err != nil && ctx.Err() == nil {
			// The conditions are then written as objectives and pools next
			// change; serving does not depend on them.
			m.log.Error(err, "listing objectives and rewrites to write their Accepted conditions")
		}
	})
	reconcilers := []interface{ SetupWithManager(manager.Manager) error }{
		&PoolReconciler{client: mgr.GetClient(), selection: m.selection, sources: m.sources, events: m.recorder, conflicts: cf,
			policy: policyEvents, maxConcurrentReconciles: opts.MaxConcurrentReconciles, ignored: map[datastore.PoolKey]string{}},
		policy,
		&ClaimReconciler{client: mgr.GetClient(), apiReader: mgr.GetAPIReader(), selection: m.selection, leader: m.leader, conflicts: cf,
			provisioning: opts.ProvisionPickerServices, maxConcurrentReconciles: opts.MaxConcurrentReconciles, waiting: m.waiting},
	}
	if opts.ProvisionPickerServices {
		reconcilers = append(reconcilers, &ProvisionReconciler{client: mgr.GetClient(), apiReader: mgr.GetAPIReader(), selection: m.selection,
			leader: m.leader, conflicts: cf, sources: m.sources, pickerName: opts.PickerName, pickerNamespace: opts.PickerNamespace,
			podSelector: opts.PickerPodSelector, port: opts.PickerPort, maxConcurrentReconciles: opts.MaxConcurrentReconciles})
	}
	for _, r := range reconcilers {
		if err := r.SetupWithManager(mgr); err != nil {
			return nil, err
		}
	}
	for _, r := range []manager.Runnable{m.sources, m.leader, manager.RunnableFunc(m.waitInitialSync)} {
		if err := m.add(r); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// waitForAPIServer is how long controllers wait for their caches' first
// lists: as long as the API server takes (controller-runtime's default, two
// minutes, would end the process).
const waitForAPIServer = 365 * 24 * time.Hour

// add adds a part of the Manager's own to run beside the reconcilers, on
// every replica, leader or not: what only the leader may do, the writers
// decide for themselves (leadership.asLeader).
func (m *Manager) add(r manager.Runnable) error {
	return m.mgr.Add(everyReplica{r})
}

// everyReplica marks a runnable as data plane: it runs without the lease.
type everyReplica struct{ manager.Runnable }

func (everyReplica) NeedLeaderElection() bool { return false }

// Start runs the reconcilers and pod watches until ctx is cancelled, then
// waits for every pod watch to end. It returns nil on a clean stop. A
// Manager starts once.
func (m *Manager) Start(ctx context.Context) error {
	if !m.started.CompareAndSwap(false, true) {
		return errors.New("controllers: Manager started twice")
	}
	err := m.mgr.Start(ctx)
	// Reconcilers have ended (or failed to start): no new watch can begin.
	// The sources' runnable stops them when it ran; this is for a manager
	// that failed before it.
	m.sources.Stop()
	return err
}

// HasSynced reports whether the Manager has seen every pool it serves at
// start-up and each of their pod watches has listed once: until then an
// empty or partial registry is not yet the truth. Once true it stays true;
// a pool added later reports its own Pool.Synced.
func (m *Manager) HasSynced() bool { return m.initialSync.Load() }

func (m *Manager) signal() {
	select {
	case m.changed <- struct{}{}:
	default:
	}
}

// waitInitialSync latches initialSync once the pools in the cache at start
// are all in the registry and synced.
func (m *Manager) waitInitialSync(ctx context.Context) error {
	if !m.mgr.GetCache().WaitForCacheSync(ctx) {
		return nil // stopping
	}
	var list v1.InferencePoolList
	if err := m.mgr.GetCache().List(ctx, &list); err != nil {
		return fmt.Errorf("controllers: listing pools: %w", err)
	}
	want := map[datastore.PoolKey]bool{}
	for i := range list.Items {
		if ok, _ := m.selection.serves(&list.Items[i]); ok {
			want[datastore.PoolKey{Namespace: list.Items[i].Namespace, Name: list.Items[i].Name}] = true
		}
	}
	m.log.Info("waiting for the pod watches of the served pools to sync", "pools", len(want))
	for {
		done := true
		for key := range want {
			p, ok := m.registry.Get(key)
			// A pool whose pods cannot be listed is reported and refused
			// on its own; it does not hold readiness back.
			if ok && (p.Synced() || p.SyncError() != "") {
				delete(want, key)
				continue
			}
			if !ok && !m.sources.IsServed(key) && !m.inCache(ctx, key) {
				delete(want, key) // deleted or no longer served since
				continue
			}
			// One pool left is enough to wait again; the rest are looked at
			// on later wake-ups. Looking at all of them on each one (a cache
			// read each) made a start with thousands of pools quadratic.
			done = false
			break
		}
		if done {
			m.initialSync.Store(true)
			m.log.Info("all served pools synced", "pools", m.registry.Len())
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-m.changed:
		}
	}
}

// PoolEvent records an Event on the served pool key (a Warning when
// warning), such as flow control's note that requests wait for the pool's
// first endpoint; nothing when the pool is not in the cache.
func (m *Manager) PoolEvent(key datastore.PoolKey, warning bool, reason, note string) {
	t := corev1.EventTypeNormal
	if warning {
		t = corev1.EventTypeWarning
	}
	// Flow control calls this from its queues, where it must not wait: a
	// pool with requests waiting is served, so the pool cache has synced,
	// and a read of a synced cache never waits on its context.
	m.recorder.record(doneContext, key, t, reason, note)
}

func (m *Manager) inCache(ctx context.Context, key datastore.PoolKey) bool {
	var pool v1.InferencePool
	if err := m.mgr.GetCache().Get(ctx, key, &pool); err != nil {
		return false
	}
	ok, _ := m.selection.serves(&pool)
	return ok
}

// servablePools counts the pools of the namespace in the cache that this
// picker would serve (an estimate: claims may still change it).
func (m *Manager) servablePools(ctx context.Context, namespace string) int {
	var list v1.InferencePoolList
	if err := m.mgr.GetCache().List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return 0
	}
	n := 0
	for i := range list.Items {
		if ok, _ := m.selection.servesSpec(&list.Items[i]); ok {
			n++
		}
	}
	return n
}
