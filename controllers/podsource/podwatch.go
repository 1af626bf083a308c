// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package podsource

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

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
	return !namespace && p.selector == selector
}
func (p *poolWatch) describe() string     { return fmt.Sprintf("with selector %q", p.selector) }
func (p *poolWatch) startedAt() time.Time { return p.started }
func (p *poolWatch) stop()                { p.cancel() }

func (p *poolWatch) listed(_ *podWatch, pods map[string]*endpointPod) {
	p.publish(pods)
}

func (p *poolWatch) changed(_ *podWatch, pods map[string]*endpointPod, _ map[string]*endpointPod) {
	p.publish(pods)
}

func (p *poolWatch) publish(pods map[string]*endpointPod) {
	if old := p.owner.update(p, endpointSources(pods)); old != nil {
		old.stop()
	}
}

func (p *poolWatch) failed(_ *podWatch, what string, err error) { p.owner.failed(p, what, err) }
func (p *poolWatch) recovered(*podWatch)                        { p.owner.recovered(p) }
func (p *poolWatch) expired(*podWatch)                          { p.owner.expire(p) }

// watchSink receives what a pod watch sees. Its calls come from the
// watch's goroutine, one at a time; pods is the watch's map, which only
// that goroutine writes.
type watchSink interface {
	// listed: pods are complete, from the first list or a re-list.
	listed(w *podWatch, pods map[string]*endpointPod)
	// changed: a burst of events changed the pods named in before, whose
	// values are what the pods were before (nil: they are new).
	changed(w *podWatch, pods map[string]*endpointPod, before map[string]*endpointPod)
	failed(w *podWatch, what string, err error)
	// recovered: the watch lists or watches again after failing.
	recovered(w *podWatch)
	// expired: the watch has failed for longer than
	// Options.StaleEndpointsTimeout; its pods are no longer to be trusted,
	// and it lists afresh when it can.
	expired(w *podWatch)
}

// podWatch is one list+watch of the pods of one namespace (those matching
// selector; all of them when selector is empty), with its objects stripped
// to what an endpoint needs. It is one goroutine, which also decodes the
// stream (plus the HTTP/2 stream's writer): the pods are a map owned by that
// goroutine, handed to the sink after each burst of events.
type podWatch struct {
	src       *Sources
	namespace string
	selector  string
	sink      watchSink
	log       logr.Logger
	pods      corev1client.PodInterface
	rest      rest.Interface
	cancel    context.CancelFunc
	started   time.Time

	// mu guards view, the last complete pods, for readers on other
	// goroutines (a pool subscribing to a namespace's watch): the watch
	// changes view's pods under mu, and replaces view at each re-list.
	mu   sync.Mutex
	view map[string]*endpointPod
}

// endpointPod is what a pod watch keeps of a pod: name, namespace, UID,
// labels, deletion state, IP and readiness. It weighs about 300 bytes
// where a corev1.Pod, even emptied, weighs 1.2 KB.
type endpointPod struct {
	metav1.TypeMeta
	metav1.ObjectMeta
	IP    string
	Ready bool
}

func (p *endpointPod) DeepCopyObject() runtime.Object {
	cp := *p
	p.ObjectMeta.DeepCopyInto(&cp.ObjectMeta) //nolint:staticcheck // QF1008: the selector says that only the metadata is copied deep
	return &cp
}

// isEndpoint: Ready, not terminating, and addressable.
func (p *endpointPod) isEndpoint() bool {
	return p.DeletionTimestamp == nil && p.IP != "" && p.Ready
}

// keepPod reports whether a watch keeps pod: only endpoints are. A
// Pending, unready or terminating pod is never routed to, and a namespace
// may hold thousands of them (a deployment waiting for GPUs) with large
// label sets; it is kept again when an update makes it an endpoint, which
// every update carries whole.
func keepPod(pod *endpointPod) bool { return pod.isEndpoint() }

// stripPod is the pod watch's transform: a full pod is several kilobytes
// (spec, status, managed fields), of which an endpoint needs a few fields.
func stripPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // already stripped (tombstones, re-lists)
	}
	out := &endpointPod{ObjectMeta: metav1.ObjectMeta{
		Name:              pod.Name,
		Namespace:         pod.Namespace,
		UID:               pod.UID,
		Labels:            pod.Labels,
		CreationTimestamp: pod.CreationTimestamp,
		DeletionTimestamp: pod.DeletionTimestamp,
	}, IP: pod.Status.PodIP}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			out.Ready = c.Status == corev1.ConditionTrue
			break
		}
	}
	return out, nil
}

// endpointRelevantChange reports whether an update can change the endpoint
// set: other status churn (restart counts, conditions other than Ready) is
// dropped by the transform and must not rebuild the set.
func endpointRelevantChange(oldObj, newObj any) bool {
	o, ok1 := oldObj.(*endpointPod)
	n, ok2 := newObj.(*endpointPod)
	if !ok1 || !ok2 {
		return true
	}
	return o.UID != n.UID || o.IP != n.IP || o.isEndpoint() != n.isEndpoint() || !maps.Equal(o.Labels, n.Labels)
}

// endpointSources lists the endpoint pods of a watch's map, by name.
func endpointSources(pods map[string]*endpointPod) []sourcePod {
	out := make([]sourcePod, 0, len(pods))
	for _, pod := range pods {
		if !pod.isEndpoint() {
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
func (ps *Sources) newWatch(namespace, selector string, sink watchSink, log logr.Logger) *podWatch {
	return &podWatch{src: ps, namespace: namespace, selector: selector, sink: sink, log: log,
		pods: ps.pods.Pods(namespace), rest: ps.pods.RESTClient(), started: time.Now()}
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
		w.run(ctx)
	})
}

// Retry pacing of a pod watch whose list or watch fails.
const (
	watchRetryInitial = 500 * time.Millisecond
	watchRetryMax     = 30 * time.Second
	// minWatchTimeout is the shortest server-side timeout of a watch
	// request; each request draws one in [1, 2) times it, as client-go's
	// reflector does, so that thousands of watches do not all end at once.
	minWatchTimeout = 5 * time.Minute
)

// newWatchBackoff paces a failing watch's retries: doubling from
// watchRetryInitial up to watchRetryMax, up to a fifth longer at random so
// that watches failing together drift apart.
func newWatchBackoff() wait.Backoff {
	return wait.Backoff{Duration: watchRetryInitial, Factor: 2, Jitter: 0.2, Cap: watchRetryMax, Steps: math.MaxInt32}
}

// run gets the pods, then watches from their resource version, re-watching
// from the last version seen when a watch ends and starting afresh when that
// version has expired, until ctx is cancelled. The pods come from a
// streaming list (a watch that first sends every matching pod, then a
// bookmark): one request instead of a list and a watch, which halves what a
// thousand pools cost a rate-limited client at start. A server without
// streaming lists gets a plain list.
func (w *podWatch) run(ctx context.Context) {
	ps, log := w.src, w.log
	var (
		pods    map[string]*endpointPod
		rv      string
		backoff = newWatchBackoff()
		// failingSince is when the sink was first told of the failure
		// under way (zero: none); stale, that it was told the pods
		// expired.
		failingSince time.Time
		stale        bool
	)
	retry := func(what string, err error) bool {
		after := backoff.Step()
		log.V(2).Info("pod "+what+" failed; retrying", "after", after, "err", err.Error())
		if !errors.Is(err, errWatchEnded) {
			if failingSince.IsZero() {
				failingSince = time.Now()
			}
			w.sink.failed(w, what, err)
		}
		t := time.NewTimer(after)
		defer t.Stop()
		for {
			var expiry <-chan time.Time
			if !failingSince.IsZero() && !stale {
				e := time.NewTimer(time.Until(failingSince.Add(ps.staleAfter)))
				defer e.Stop()
				expiry = e.C
			}
			select {
			case <-ctx.Done():
				return false
			case <-t.C:
				return true
			case <-expiry:
				// What the watch holds is too old to resume from: the
				// next attempt lists afresh.
				stale, rv = true, ""
				w.sink.expired(w)
			}
		}
	}
	healthy := func() {
		if !failingSince.IsZero() {
			failingSince, stale = time.Time{}, false
			w.sink.recovered(w)
		}
	}
	listed := func() {
		w.mu.Lock()
		w.view = pods
		w.mu.Unlock()
		w.sink.listed(w, pods)
		healthy()
	}
	for ctx.Err() == nil {
		timeout := int64((minWatchTimeout + time.Duration(rand.Int64N(int64(minWatchTimeout)))).Seconds())
		opts := metav1.ListOptions{LabelSelector: w.selector, ResourceVersion: rv, AllowWatchBookmarks: true, TimeoutSeconds: &timeout}
		streaming := rv == "" && !ps.noStreamingList.Load()
		if streaming {
			pods = map[string]*endpointPod{}
			opts.SendInitialEvents = ptr.To(true)
			opts.ResourceVersionMatch = metav1.ResourceVersionMatchNotOlderThan
		} else if rv == "" {
			var err error
			pods, rv, err = w.list(ctx)
			if err != nil {
				if ctx.Err() != nil || !retry("list", err) {
					return
				}
				continue
			}
			listed()
			opts.ResourceVersion = rv
		}
		events, err := w.open(ctx, opts)
		if err != nil {
			switch {
			case ctx.Err() != nil:
				return
			case errors.Is(err, errNotProtobuf):
				log.Info("the API server answered a protobuf watch in another encoding; decoding watches with client-go instead")
				ps.noProtobufWatch.Store(true)
			case streaming && (apierrors.IsBadRequest(err) || apierrors.IsInvalid(err) || apierrors.IsForbidden(err) && strings.Contains(err.Error(), "sendInitialEvents")):
				log.Info("the API server does not offer streaming lists; listing instead", "err", err.Error())
				ps.noStreamingList.Store(true)
			case expired(err):
				rv = ""
			default:
				if !retry("watch", err) {
					return
				}
			}
			continue
		}
		if !streaming {
			// Watching again from what the watch holds.
			healthy()
		}
		var ok bool
		rv, ok = w.follow(ctx, events, pods, rv, streaming, listed, log)
		events.stop()
		switch {
		case ok:
			backoff = newWatchBackoff()
			w.sink.recovered(w)
		case ctx.Err() == nil:
			// Ended at once, or with an error: do not hammer the server.
			if !retry("watch", errWatchEnded) {
				return
			}
		}
	}
}

// open starts a watch with opts: decoded on this goroutine unless the API
// server does not answer in protobuf.
func (w *podWatch) open(ctx context.Context, opts metav1.ListOptions) (eventSource, error) {
	if !w.src.noProtobufWatch.Load() {
		return openStreamEvents(ctx, w.rest, w.namespace, opts)
	}
	wi, err := w.pods.Watch(ctx, opts)
	if err != nil {
		return nil, err
	}
	return chanEvents{wi}, nil
}

// list reads the pods matching the selector, in pages, and returns them
// stripped, keyed by name, with the list's resource version.
func (w *podWatch) list(ctx context.Context) (map[string]*endpointPod, string, error) {
	pods := map[string]*endpointPod{}
	opts := metav1.ListOptions{LabelSelector: w.selector, Limit: 500}
	for {
		list, err := w.pods.List(ctx, opts)
		if err != nil {
			return nil, "", err
		}
		for i := range list.Items {
			p, _ := stripPod(&list.Items[i])
			if ep := p.(*endpointPod); keepPod(ep) {
				pods[ep.Name] = ep
			}
		}
		if list.Continue == "" {
			return pods, list.ResourceVersion, nil
		}
		opts.Continue = list.Continue
	}
}

// follow applies a watch's events to pods, publishing after each burst,
// until the watch ends. When initial, the watch is a streaming list: pods
// start empty and are complete (listed is called) at the bookmark that
// ends the initial events. It returns the resource version to resume from
// ("" to start afresh: expired, or a streaming list cut short) and whether
// the watch was healthy: it delivered events and did not end on an error.
func (w *podWatch) follow(ctx context.Context, events eventSource, pods map[string]*endpointPod, rv string,
	initial bool, listed func(), log logr.Logger) (string, bool) {
	complete := !initial
	restart := func(rv string) string {
		if !complete {
			return "" // a partial list is no list
		}
		return rv
	}
	// changed holds what each pod changed since the last hand-over was
	// before it (nil: new), for the sink's fan-out.
	changed, got := map[string]*endpointPod{}, false
	note := func(name string, before *endpointPod) {
		if _, seen := changed[name]; !seen {
			changed[name] = before
		}
	}
	for {
		ev, more, ok := events.next(ctx)
		if !ok || ctx.Err() != nil {
			return restart(rv), got
		}
		got = true
		switch ev.Type {
		case watch.Added, watch.Modified, watch.Deleted:
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			rv = pod.ResourceVersion
			p, _ := stripPod(pod)
			ep := p.(*endpointPod)
			old, had := pods[ep.Name]
			// Only endpoints are kept (see keepPod): a pod that is not one
			// is as good as deleted until an update makes it one.
			keep := ev.Type != watch.Deleted && keepPod(ep)
			// Once complete, pods is the view others read.
			if complete {
				w.mu.Lock()
			}
			if keep {
				pods[ep.Name] = ep
			} else {
				delete(pods, ep.Name)
			}
			if complete {
				w.mu.Unlock()
			}
			// Before the list is complete the sink gets it whole.
			if complete && (had && !keep || keep && (!had || endpointRelevantChange(old, ep))) {
				note(ep.Name, old)
			}
		case watch.Bookmark:
			o, err := meta.Accessor(ev.Object)
			if err != nil {
				continue
			}
			rv = o.GetResourceVersion()
			if !complete && o.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true" {
				complete = true
				listed()
			}
		case watch.Error:
			err := apierrors.FromObject(ev.Object)
			if expired(err) {
				return "", got
			}
			log.V(2).Info("pod watch ended with an error; resuming", "err", err.Error())
			return restart(rv), false
		}
		// Publish once the burst is drained: a restart of many pods costs
		// one endpoint-set rebuild, not one per event.
		if complete && len(changed) > 0 && !more {
			w.sink.changed(w, pods, changed)
			changed = map[string]*endpointPod{}
		}
	}
}

var errWatchEnded = errors.New("watch ended without events or with an error")

// expired reports an error that means the resource version is too old (or
// too new) to watch from: only a new list helps.
func expired(err error) bool {
	return apierrors.IsResourceExpired(err) || apierrors.IsGone(err) || apierrors.HasStatusCause(err, metav1.CauseTypeResourceVersionTooLarge)
}
