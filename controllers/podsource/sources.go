// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package podsource

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/labels"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"

	"github.com/poolpicker/poolpicker/controllers/podsource/internal/podwatch"
	"github.com/poolpicker/poolpicker/datastore"
)

// Defaults of Options.
const (
	// DefaultNamespaceWatchThreshold is the number of served pools from
	// which PlanAuto watches a namespace's pods once for all of them.
	// Below it, per-pool watches cost the API server a few watchers and
	// selector-filtered lists, and poolpicker receives only the pools' pods
	// (a namespace may hold many other pods); from it, each pod event of
	// the namespace is filtered for every pool's watcher and each pool's
	// first list walks the namespace, so one namespace watch is cheaper on
	// both sides. The plan goes back to per-pool watches at half the
	// threshold or fewer pools, so that a namespace hovering around the
	// threshold does not switch back and forth.
	DefaultNamespaceWatchThreshold = 10
	// DefaultStaleEndpointsTimeout is how long a pool whose pods cannot be
	// listed or watched keeps serving the endpoints it last listed. A
	// minute rides out an API server restart or a short partition; much
	// longer and a deleted pod's address may by then belong to another
	// tenant's pod.
	DefaultStaleEndpointsTimeout = time.Minute
)

// Options configure Sources. The zero value of each field is its documented
// default.
type Options struct {
	// Registry receives the served pools. Required.
	Registry *datastore.Registry
	// Plan is how the pods of a namespace's served pools are watched.
	// Zero: PlanAuto.
	Plan Plan
	// NamespaceWatchThreshold is, for PlanAuto, the number of served pools
	// from which a namespace is watched once for all of them; it returns to
	// per-pool watches at NamespaceWatchThreshold/2 pools or fewer. Zero:
	// DefaultNamespaceWatchThreshold.
	NamespaceWatchThreshold int
	// DisableStreamingLists makes each pod watch start with a plain list
	// and a watch from its version, instead of one streaming list. Zero:
	// streaming lists, where the API server offers them.
	DisableStreamingLists bool
	// StaleEndpointsTimeout is how long a pool whose pods cannot be listed
	// or watched keeps serving the endpoints it last listed; then its
	// requests are refused (503) until its pods are listed again. Zero:
	// DefaultStaleEndpointsTimeout.
	StaleEndpointsTimeout time.Duration
	// CountServable estimates the pools of a namespace that will be served
	// (the pool cache at start), so that PlanAuto plans a namespace by the
	// pools it will have. Nil: the pools served so far.
	CountServable func(ctx context.Context, namespace string) int
	// Changed is told when a pool syncs, fails or stops being served, for
	// a caller that waits for pools to sync. Nil: nobody.
	Changed func()
	// Events records an Event on a served pool when its pods cannot be
	// listed; ctx ends when the Sources stop. Nil: none.
	Events func(ctx context.Context, key datastore.PoolKey, eventType, reason, note string)
	// Registerer receives inference_pool_ready_pods, poolpicker_served_pools
	// and the pod watch metrics. Nil: the metrics are kept but not exported.
	Registerer prometheus.Registerer
	// Logger receives structured logs keyed by pool. Zero: discard.
	Logger logr.Logger
}

// Validate reports every option that cannot work, joined, each named as the
// flag an operator would set. The Registry is not checked: it is wiring,
// not input.
func (o Options) Validate() error {
	var errs []error
	if o.Plan != "" {
		errs = append(errs, o.Plan.Validate())
	}
	if o.StaleEndpointsTimeout < 0 {
		errs = append(errs, fmt.Errorf("stale endpoints timeout %s: must not be negative", o.StaleEndpointsTimeout))
	}
	if o.NamespaceWatchThreshold < 0 {
		errs = append(errs, fmt.Errorf("namespace watch threshold %d: must not be negative", o.NamespaceWatchThreshold))
	}
	return errors.Join(errs...)
}

// Sources feeds the served pools of a registry their pods: for each pool a
// source (its own selector-scoped watch, or its subscription to its
// namespace's watch) chosen by the namespace's watch plan, switched without
// a gap when the selector or the plan changes. A reconciler tells it which
// pools are served (Serve, Unserve); everything else happens on the
// watches' goroutines, which it owns. It is a manager.Runnable: Start runs
// until its context ends, then stops every watch and waits for their
// goroutines. Its lock order is in the package doc.
type Sources struct {
	registry *datastore.Registry
	pods     *corev1client.CoreV1Client
	metrics  *metrics
	log      logr.Logger
	events   func(ctx context.Context, key datastore.PoolKey, eventType, reason, note string)
	// plan and threshold are Options.Plan and
	// Options.NamespaceWatchThreshold, defaulted.
	plan      Plan
	threshold int
	// staleAfter is Options.StaleEndpointsTimeout, defaulted.
	staleAfter    time.Duration
	countServable func(ctx context.Context, namespace string) int
	changed       func()

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

	// addresses knows which pools' pods hold each pod IP.
	addresses addressBook

	// caps are what the API server was found not to offer, shared by the
	// watches.
	caps podwatch.Capabilities
}

// New makes the Sources of the pods of the API server at cfg. No watch runs
// until a pool is served.
func New(cfg *rest.Config, opts Options) (*Sources, error) {
	if opts.Registry == nil {
		return nil, errors.New("podsource: Options.Registry is required")
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.Plan == "" {
		opts.Plan = PlanAuto
	}
	if opts.NamespaceWatchThreshold == 0 {
		opts.NamespaceWatchThreshold = DefaultNamespaceWatchThreshold
	}
	if opts.StaleEndpointsTimeout == 0 {
		opts.StaleEndpointsTimeout = DefaultStaleEndpointsTimeout
	}
	if opts.Logger.GetSink() == nil {
		opts.Logger = logr.Discard()
	}
	pods, err := corev1client.NewForConfig(podWatchConfig(cfg))
	if err != nil {
		return nil, fmt.Errorf("podsource: creating pod client: %w", err)
	}
	met, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, fmt.Errorf("podsource: registering metrics: %w", err)
	}
	ps := &Sources{
		registry: opts.Registry, pods: pods, metrics: met, log: opts.Logger, events: opts.Events,
		plan: opts.Plan, threshold: opts.NamespaceWatchThreshold, staleAfter: opts.StaleEndpointsTimeout,
		countServable: opts.CountServable, changed: opts.Changed,
		served:    map[datastore.PoolKey]*servedPool{},
		plans:     map[string]*namespacePlan{},
		nsWatches: map[string]*namespaceWatch{},
	}
	ps.watchCtx, ps.cancel = context.WithCancel(context.Background())
	ps.caps.NoStreamingList.Store(opts.DisableStreamingLists)
	return ps, nil
}

// podWatchConfig tunes the client of the per-pool pod watches, of which
// there are thousands, each a long-lived stream: a gzip reader holds some
// 40 KB per stream, more than a small pool's pods, so responses come
// uncompressed; and pods come as protobuf, smaller and cheaper to decode
// than JSON.
func podWatchConfig(cfg *rest.Config) *rest.Config {
	cp := rest.CopyConfig(cfg)
	cp.DisableCompression = true
	cp.ContentType = "application/vnd.kubernetes.protobuf"
	cp.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	return cp
}

// Start runs until ctx ends, then stops every source and waits for the
// watches' goroutines. Watches may start before it (a reconcile that runs
// first); a watch asked for after it returned does not start.
func (ps *Sources) Start(ctx context.Context) error {
	<-ctx.Done()
	ps.Stop()
	return nil
}

// NeedLeaderElection is false: every replica watches its pools' pods.
func (*Sources) NeedLeaderElection() bool { return false }

// Stop stops every source and waits for the watches; it may be called more
// than once, and before Start or without it (a manager that failed to
// start, after a reconcile served a pool). Sources stopped serve no more.
func (ps *Sources) Stop() {
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

func (ps *Sources) signal() {
	if ps.changed != nil {
		ps.changed()
	}
}

// event records an Event on the pool, bounded by the watches' context.
func (ps *Sources) event(key datastore.PoolKey, eventType, reason, note string) {
	if ps.events != nil {
		ps.events(ps.watchCtx, key, eventType, reason, note)
	}
}

// Serve makes key a served pool fed by a source for spec.Selector,
// publishing spec; it reports whether the pool is newly served. It never
// waits on the API server: the pool's watch starts in the background, and
// the pool reports Synced once it has listed.
func (ps *Sources) Serve(ctx context.Context, key datastore.PoolKey, spec *datastore.PoolSpec) bool {
	match := labels.Set(spec.Selector)
	selector := labels.SelectorFromSet(match).String()
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

// Unserve stops the pool's source and removes it from the registry; it
// reports whether the pool was served.
func (ps *Sources) Unserve(key datastore.PoolKey) bool {
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

// IsServed reports whether key is a served pool.
func (ps *Sources) IsServed(key datastore.PoolKey) bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	_, ok := ps.served[key]
	return ok
}

// WatchReplicas starts a watch of the pods matching selector (set-based
// allowed) in key's namespace into pool, which no registry of served pools
// holds (the picker's own replicas); it has no pool metrics and no Events,
// and it is always its own watch. stop ends it.
func (ps *Sources) WatchReplicas(key datastore.PoolKey, pool *datastore.Pool, selector string) (stop func()) {
	sp := &servedPool{key: key, src: ps, pool: pool, replicas: true}
	sp.ensureWatch(selector)
	return sp.stop
}
