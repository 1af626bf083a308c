// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package podsource

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/poolpicker/poolpicker/controllers/podsource/internal/podwatch"
	"github.com/poolpicker/poolpicker/datastore"
)

// servedPool is the controllers' side of one served pool: the datastore pool
// and the source of its pods. At most two sources exist: the active one,
// whose pods are published, and a pending one started for a new selector or
// watch plan, which becomes active (replacing the endpoint set in one swap)
// when its first list is in. A source is the pool's own selector-scoped
// watch (per-pool plan) or its subscription to its namespace's watch
// (namespace plan).
type servedPool struct {
	key datastore.PoolKey
	src *Sources
	// replicas marks the watch of this deployment's own pods, which is no
	// served pool: it has no pool metrics and no Events, and it is always
	// watched on its own.
	replicas bool
	// plan is the watch plan of the pool's namespace, shared by its pools;
	// nil for the replicas.
	plan *namespacePlan

	mu   sync.Mutex // guards everything below and serialises publishing
	pool *datastore.Pool
	// selector is the label selector wanted (kubectl syntax), match the
	// same as labels for the namespace plan's own filtering (nil for the
	// replicas, whose selector may be set-based).
	selector string
	match    labels.Set
	active   podSource
	pending  podSource
	stopped  bool
	// expired: the active source failed for longer than
	// Options.StaleEndpointsTimeout, and the pool's endpoints were
	// withdrawn until the source lists again.
	expired bool
	// lastPods are the pods last published, before the address book left
	// out those another namespace's pods hold; claimedIPs their IPs, as
	// claimed in the address book.
	lastPods   []sourcePod
	claimedIPs []string
}

// podSource is what feeds a pool its pods.
type podSource interface {
	// serves reports whether the source is the one wanted for selector
	// under the namespace plan (namespace) or the per-pool plan.
	serves(selector string, namespace bool) bool
	// describe names the source in errors and logs.
	describe() string
	// startedAt is when the source was started, for the sync metric.
	startedAt() time.Time
	// stop ends the source. Never called with a servedPool's or a
	// namespaceWatch's lock held: a subscription leaves its namespace's
	// watch under that watch's lock.
	stop()
}

// ensureWatch makes selector the pool's wanted selector (the replicas'
// path: any selector, always per-pool) and ensures a source for it.
func (sp *servedPool) ensureWatch(selector string) { sp.setSelector(selector, nil) }

// setSelector makes selector (with match, its labels, for the namespace
// plan) the pool's wanted selector and ensures a source for it.
func (sp *servedPool) setSelector(selector string, match labels.Set) {
	sp.mu.Lock()
	sp.selector, sp.match = selector, match
	sp.mu.Unlock()
	sp.ensure()
}

// ensure makes a source of the wanted selector under the namespace's
// current plan active or pending. It never waits on the API server. It is
// called on every selector change and plan switch; since it reads the plan
// under sp.mu, the last call leaves the pool on the last plan.
func (sp *servedPool) ensure() {
	var (
		stops []podSource
		sub   *nsSub
	)
	sp.mu.Lock()
	if sp.stopped || sp.selector == "" {
		sp.mu.Unlock()
		return
	}
	namespace := sp.plan != nil && sp.plan.namespaceWatch.Load() && sp.match != nil
	switch {
	case sp.active != nil && sp.active.serves(sp.selector, namespace):
		// A change and a change back before the new source synced: keep
		// the active source and drop the pending one.
		if sp.pending != nil {
			stops = append(stops, sp.pending)
			sp.pending = nil
		}
	case sp.pending != nil && sp.pending.serves(sp.selector, namespace):
	default:
		if sp.pending != nil {
			stops = append(stops, sp.pending)
		}
		if namespace {
			sub = &nsSub{owner: sp, selector: sp.selector, match: sp.match, started: time.Now()}
			sp.pending = sub
		} else {
			sp.pending = sp.src.startPoolWatch(sp, sp.selector)
		}
		if !sp.replicas {
			sp.src.metrics.watchStarts.WithLabelValues(sp.key.Namespace, sp.key.Name).Inc()
		}
	}
	sp.mu.Unlock()
	stopSources(stops)
	if sub != nil {
		sp.src.subscribe(sub)
	}
}

// stop ends the pool's sources; watch goroutines end on their own and
// Sources.Start waits for them.
func (sp *servedPool) stop() {
	sp.mu.Lock()
	sp.stopped = true
	stops := []podSource{sp.active, sp.pending}
	sp.active, sp.pending = nil, nil
	affected := sp.src.addresses.forget(sp, sp.claimedIPs)
	sp.claimedIPs, sp.lastPods = nil, nil
	sp.mu.Unlock()
	stopSources(stops)
	refilter(affected)
}

func stopSources(srcs []podSource) {
	for _, s := range srcs {
		if s != nil {
			s.stop()
		}
	}
}

// update publishes pods from src: a pending source's first list replaces
// the endpoint set in one swap and makes it active, returning the source
// it replaced, which the caller stops once it holds no lock (only then,
// with the new set published, may the old source go); the active source's
// pods are published as they come. Anything else is superseded or stopped.
func (sp *servedPool) update(src podSource, pods []sourcePod) (replaced podSource) {
	sp.mu.Lock()
	switch src {
	case sp.active:
		affected := sp.publishLocked(pods)
		if sp.expired {
			// Listed again: the pods are the API server's again.
			sp.expired = false
			sp.clearFailureLocked()
			sp.pool.SetSynced(true)
			sp.src.signal()
		}
		sp.mu.Unlock()
		refilter(affected)
		return nil
	case sp.pending:
	default:
		sp.mu.Unlock()
		return nil
	}
	old := sp.active
	sp.active, sp.pending = src, nil
	sp.expired = false
	// Cleared first: a reader that sees the pool synced sees no failure.
	sp.clearFailureLocked()
	affected := sp.publishLocked(pods)
	sp.pool.SetSynced(true)
	sp.src.signal()
	took := time.Since(src.startedAt())
	sp.src.metrics.syncSeconds.Observe(took.Seconds())
	// One line per pool: debug verbosity, since a start with thousands of
	// pools reports its progress in one line every few seconds instead.
	sp.src.log.V(4).Info("pod source synced", "pool", sp.key.String(), "source", src.describe(),
		"endpoints", sp.pool.Endpoints().Len(), "duration", took)
	sp.mu.Unlock()
	refilter(affected)
	return old
}

// failed records that src could not list or watch: the reason goes on the
// pool (its requests are refused with it until it syncs), in a metric, a
// log line and an Event on the pool. Other pools are not affected.
func (sp *servedPool) failed(src podSource, what string, err error) {
	sp.mu.Lock()
	if (src != sp.pending && src != sp.active) || sp.pool == nil {
		sp.mu.Unlock()
		return
	}
	reason := fmt.Sprintf("pod %s %s failed: %v", what, src.describe(), err)
	if sp.expired {
		reason += sp.expiredNote()
	}
	first := sp.pool.SyncError() == ""
	sp.pool.SetSyncError(reason)
	synced := sp.pool.Synced()
	if !sp.replicas {
		sp.src.metrics.syncFailing.WithLabelValues(sp.key.Namespace, sp.key.Name).Set(1)
	}
	sp.mu.Unlock()
	// A caller waiting for pools to sync (Options.Changed) counts a pool
	// that failed as done: readiness must not wait for one broken pool.
	sp.src.signal()
	if first {
		msg := "its requests are refused until its pods are listed"
		if synced && !sp.replicas {
			msg = fmt.Sprintf("it keeps serving the endpoints last listed for up to %s (--stale-endpoints-timeout)", sp.src.staleAfter)
		}
		sp.src.log.Error(err, "cannot list or watch a pool's pods; "+msg, "pool", sp.key.String(), "source", src.describe())
		sp.src.event(sp.key, corev1.EventTypeWarning, "PodsNotListed", reason+"; "+msg)
	}
}

// expire withdraws the endpoints of a pool whose active source src has
// failed for longer than Options.StaleEndpointsTimeout: they may be gone,
// and their addresses reused by pods of other pools, even other tenants'.
// Its requests are refused, naming why, until src lists again (update).
func (sp *servedPool) expire(src podSource) {
	sp.mu.Lock()
	if src != sp.active || sp.pool == nil || sp.replicas || sp.expired || !sp.pool.Synced() {
		sp.mu.Unlock()
		return
	}
	sp.expired = true
	reason := sp.pool.SyncError() + sp.expiredNote()
	sp.pool.SetSyncError(reason)
	sp.pool.SetSynced(false)
	affected := sp.publishLocked(nil)
	sp.src.metrics.endpointsExpired.WithLabelValues(sp.key.Namespace, sp.key.Name).Set(1)
	sp.mu.Unlock()
	refilter(affected)
	sp.src.log.Info("a pool's pods have not been listed for too long; refusing its requests until they are", "pool", sp.key.String(),
		"source", src.describe(), "staleEndpointsTimeout", sp.src.staleAfter)
	sp.src.event(sp.key, corev1.EventTypeWarning, "EndpointsExpired", reason+"; its requests are refused until its pods are listed")
}

func (sp *servedPool) expiredNote() string {
	return fmt.Sprintf("; its last endpoints expired after %s (--stale-endpoints-timeout)", sp.src.staleAfter)
}

// recovered clears a failure once src watches again. A pool whose
// endpoints expired waits for src's next list (update) instead.
func (sp *servedPool) recovered(src podSource) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if src == sp.active && sp.pool != nil && sp.pool.SyncError() != "" && !sp.expired {
		sp.clearFailureLocked()
	}
}

func (sp *servedPool) clearFailureLocked() {
	if sp.pool.SyncError() != "" {
		sp.src.log.Info("pool's pods listed again", "pool", sp.key.String())
	}
	sp.pool.SetSyncError("")
	if !sp.replicas {
		sp.src.metrics.syncFailing.WithLabelValues(sp.key.Namespace, sp.key.Name).Set(0)
		sp.src.metrics.endpointsExpired.WithLabelValues(sp.key.Namespace, sp.key.Name).Set(0)
	}
}

// publishLocked publishes pods, less those whose IP a pod of another
// namespace holds (addressBook), and returns the other pools whose
// published pods the change may alter, for refilter once sp.mu is
// released.
func (sp *servedPool) publishLocked(pods []sourcePod) (affected []*servedPool) {
	keep := pods
	if !sp.replicas {
		var ports []int32
		if spec := sp.pool.Spec(); spec != nil {
			ports = spec.TargetPorts
		}
		keep, affected, sp.claimedIPs = sp.src.addresses.claim(sp, pods, ports, sp.claimedIPs)
	}
	sp.lastPods = pods
	sp.setPodsLocked(pods, keep)
	return affected
}

func (sp *servedPool) setPodsLocked(pods, keep []sourcePod) {
	srcs := make([]datastore.EndpointSource, len(keep))
	for i, p := range keep {
		srcs[i] = p.EndpointSource
	}
	sp.pool.SetPods(srcs)
	if !sp.replicas {
		sp.src.metrics.readyPods.WithLabelValues(sp.key.Namespace, sp.key.Name).Set(float64(len(keep)))
		sp.src.metrics.addressesHeldElsewhere.WithLabelValues(sp.key.Namespace, sp.key.Name).Set(float64(len(pods) - len(keep)))
	}
}

// refilter republishes each pool's last pods against the address book,
// whose holders changed. Called with no servedPool's lock held.
func refilter(pools []*servedPool) {
	for _, sp := range pools {
		sp.mu.Lock()
		if !sp.stopped && sp.pool != nil {
			sp.setPodsLocked(sp.lastPods, sp.src.addresses.filter(sp, sp.lastPods))
		}
		sp.mu.Unlock()
	}
}

// poolWatch is a pool's own watch (the per-pool plan): a pod watch of its
// selector whose pods are all the pool's.
type poolWatch struct {
	*podWatch
	owner *servedPool
}

func (p *poolWatch) serves(selector string, namespace bool) bool {
	return !namespace && p.Selector() == selector
}
func (p *poolWatch) describe() string     { return fmt.Sprintf("with selector %q", p.Selector()) }
func (p *poolWatch) startedAt() time.Time { return p.started }
func (p *poolWatch) stop()                { p.cancel() }

// Listed implements podwatch.Sink.
func (p *poolWatch) Listed(_ *podwatch.Watch, pods map[string]*podwatch.Pod) {
	p.publish(pods)
}

// Changed implements podwatch.Sink.
func (p *poolWatch) Changed(_ *podwatch.Watch, pods map[string]*podwatch.Pod, _ map[string]*podwatch.Pod) {
	p.publish(pods)
}

func (p *poolWatch) publish(pods map[string]*podwatch.Pod) {
	if old := p.owner.update(p, endpointSources(pods)); old != nil {
		old.stop()
	}
}

// Failed, Recovered and Expired implement podwatch.Sink.
func (p *poolWatch) Failed(_ *podwatch.Watch, what string, err error) {
	p.owner.failed(p, what, err)
}
func (p *poolWatch) Recovered(*podwatch.Watch) { p.owner.recovered(p) }
func (p *poolWatch) Expired(*podwatch.Watch)   { p.owner.expire(p) }

// podWatch is a running podwatch.Watch and what podsource keeps of it.
type podWatch struct {
	*podwatch.Watch
	log     logr.Logger
	cancel  context.CancelFunc
	started time.Time
}

// endpointSources lists the endpoint pods of a watch's map, by name.
func endpointSources(pods map[string]*podwatch.Pod) []sourcePod {
	out := make([]sourcePod, 0, len(pods))
	for _, pod := range pods {
		if !pod.IsEndpoint() {
			continue
		}
		out = append(out, sourcePod{EndpointSource: datastore.EndpointSource{
			Pod:    datastore.PoolKey{Namespace: pod.Namespace, Name: pod.Name},
			UID:    pod.UID,
			IP:     pod.IP,
			Labels: pod.Labels,
		}, created: pod.CreationTimestamp.Time})
	}
	slices.SortFunc(out, func(a, b sourcePod) int { return strings.Compare(a.Pod.Name, b.Pod.Name) })
	return out
}

// startPoolWatch starts a pool's own watch of the pods of its namespace
// matching selector.
func (ps *Sources) startPoolWatch(sp *servedPool, selector string) *poolWatch {
	pw := &poolWatch{owner: sp}
	pw.podWatch = ps.newWatch(sp.key.Namespace, selector, pw, ps.log.WithValues("pool", sp.key.String(), "selector", selector))
	ps.runWatch(pw.podWatch)
	return pw
}

// newWatch makes a watch of the namespace's pods matching selector (all of
// them when empty), reporting to sink; runWatch starts it.
func (ps *Sources) newWatch(namespace, selector string, sink podwatch.Sink, log logr.Logger) *podWatch {
	return &podWatch{log: log, started: time.Now(), Watch: podwatch.New(podwatch.Config{Namespace: namespace, Selector: selector,
		Client: ps.pods, StaleAfter: ps.staleAfter, Capabilities: &ps.caps, Sink: sink, Log: log})}
}

func (ps *Sources) runWatch(w *podWatch) {
	ctx, cancel := context.WithCancel(ps.watchCtx)
	w.cancel = cancel
	ps.runMu.RLock()
	defer ps.runMu.RUnlock()
	if ps.closed {
		return // stopping: its context is done already
	}
	w.log.V(4).Info("starting pod watch")
	ps.metrics.liveWatches.Inc()
	ps.watches.Go(func() {
		defer ps.metrics.liveWatches.Dec()
		w.Run(ctx)
	})
}
