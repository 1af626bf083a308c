// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/labels"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/poolpicker/poolpicker/datastore"
)

// podSources feeds the served pools of a registry their pods: for each pool
// a source (its own selector-scoped watch, or its subscription to its
// namespace's watch) chosen by the namespace's watch plan, switched without
// a gap when the selector or the plan changes. The pool reconciler tells it
// which pools are served (serve, unserve); everything else happens on the
// watches' goroutines, which it owns: Start runs until its context ends,
// then stops every watch and waits for their goroutines.
//
// Lock order, for everything from here to the scraper:
//
//	podSources.mu
//	  → namespaceWatch.mu
//	    → podWatch.mu (its view) or servedPool.mu
//	      → the datastore's locks (Pool.SetPods and its observers: the
//	        scheduler, flow control and the scraper, which take only their
//	        own locks and never call back here)
//
// A source is never stopped with a servedPool's or a namespaceWatch's lock
// held: a subscription leaves its namespace's watch under podSources.mu and
// that watch's lock.
type podSources struct {
	registry *datastore.Registry
	pods     *corev1client.CoreV1Client
	metrics  *metrics
	log      logr.Logger
	events   *poolRecorder
	// plan and threshold are Options.PodWatchPlan and
	// Options.NamespaceWatchThreshold, defaulted.
	plan      PodWatchPlan
	threshold int
	// countServable estimates the pools of a namespace that will be served
	// (the pool cache at start), so that the auto plan plans a namespace by
	// the pools it will have.
	countServable func(ctx context.Context, namespace string) int
	// synced is told when a pool syncs, fails or stops being served.
	synced func()

	// watchCtx parents every watch; runMu orders starting a watch before
	// shutdown waits for them, and closed refuses watches after it.
	watchCtx context.Context
	cancel   context.CancelFunc
	runMu    sync.RWMutex
	closed   bool
	watches  sync.WaitGroup

	mu     sync.Mutex
	served map[datastore.PoolKey]*servedPool
	// plans are the watch plans of the namespaces with served pools, and
	// nsWatches their namespace watches (namespace plan, or a switch under
	// way).
	plans     map[string]*namespacePlan
	nsWatches map[string]*namespaceWatch

	// noStreamingList is set once the API server refused a streaming list.
	noStreamingList atomic.Bool
	// noProtobufWatch is set once the API server answered a protobuf watch
	// in another encoding.
	noProtobufWatch atomic.Bool
}

func newPodSources(reg *datastore.Registry, pods *corev1client.CoreV1Client, met *metrics, log logr.Logger, events *poolRecorder, opts Options,
	countServable func(context.Context, string) int, synced func()) *podSources {
	ps := &podSources{
		registry: reg, pods: pods, metrics: met, log: log, events: events,
		plan: opts.PodWatchPlan, threshold: opts.NamespaceWatchThreshold,
		countServable: countServable, synced: synced,
		served:    map[datastore.PoolKey]*servedPool{},
		plans:     map[string]*namespacePlan{},
		nsWatches: map[string]*namespaceWatch{},
	}
	ps.watchCtx, ps.cancel = context.WithCancel(context.Background())
	ps.noStreamingList.Store(opts.DisableStreamingLists)
	return ps
}

// Start runs until ctx ends, then stops every source and waits for the
// watches' goroutines. Watches may start before it (a reconcile that runs
// first); a watch asked for after it returned does not start.
func (ps *podSources) Start(ctx context.Context) error {
	<-ctx.Done()
	ps.shutdown()
	return nil
}

// NeedLeaderElection is false: every replica watches its pools' pods.
func (*podSources) NeedLeaderElection() bool { return false }

// shutdown stops every source and waits for the watches; it may be called
// more than once.
func (ps *podSources) shutdown() {
	ps.runMu.Lock()
	ps.closed = true
	ps.cancel()
	ps.runMu.Unlock()
	ps.mu.Lock()
	served := ps.served
	ps.served = map[datastore.PoolKey]*servedPool{}
	ps.mu.Unlock()
	for _, sp := range served {
		sp.stop()
	}
	ps.watches.Wait()
}

func (ps *podSources) signal() { ps.synced() }

// serve makes key a served pool fed by a source for selector (match, its
// labels, for the namespace plan's filtering), publishing spec; it reports
// whether the pool is newly served.
func (ps *podSources) serve(ctx context.Context, key datastore.PoolKey, spec *datastore.PoolSpec, selector string, match labels.Set) bool {
	ps.mu.Lock()
	sp, existed := ps.served[key]
	switched := false
	if !existed {
		sp = &servedPool{key: key, src: ps}
		sp.plan, switched = ps.joinPlanLocked(ctx, key.Namespace)
		ps.served[key] = sp
	}
	// Set under mu: concurrent reconciles would otherwise publish counts
	// out of order and leave a stale value.
	ps.metrics.servedPools.Set(float64(len(ps.served)))
	ps.mu.Unlock()

	// Upsert publishes the spec; a target-port change recomputes the
	// endpoints from the pods the active watch already has.
	pool := ps.registry.Upsert(key, spec)
	sp.mu.Lock()
	sp.pool = pool
	sp.mu.Unlock()
	sp.setSelector(selector, match)
	if switched {
		ps.replan(key.Namespace)
	}
	return !existed
}

// unserve stops the pool's source and removes it from the registry; it
// reports whether the pool was served.
func (ps *podSources) unserve(key datastore.PoolKey) bool {
	ps.mu.Lock()
	sp, ok := ps.served[key]
	delete(ps.served, key)
	switched := ok && ps.leavePlanLocked(key.Namespace)
	ps.metrics.servedPools.Set(float64(len(ps.served)))
	ps.mu.Unlock()
	if !ok {
		return false
	}
	sp.stop()
	if switched {
		ps.replan(key.Namespace)
	}
	ps.registry.Remove(key)
	ps.metrics.forget(key.Namespace, key.Name)
	ps.signal()
	return true
}

func (ps *podSources) isServed(key datastore.PoolKey) bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	_, ok := ps.served[key]
	return ok
}

// watchReplicas starts the watch of this deployment's own pods (selector,
// set-based allowed) into pool, which no registry of served pools holds;
// it has no pool metrics and no Events, and it is always its own watch.
func (ps *podSources) watchReplicas(key datastore.PoolKey, pool *datastore.Pool, selector string) *servedPool {
	sp := &servedPool{key: key, src: ps, pool: pool, replicas: true}
	sp.ensureWatch(selector)
	return sp
}
