package controllers

import (
	"context"
	"errors"
	"fmt"
	"maps"
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
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/poolpicker/poolpicker/datastore"
)

// servedPool is the controllers' side of one served pool: the datastore pool
// and its pod watches. At most two watches exist: the active one, whose pods
// are published, and a pending one started for a new selector, which becomes
// active (replacing the endpoint set in one swap) when its first list is in.
type servedPool struct {
	key datastore.PoolKey
	m   *Manager
	// replicas marks the watch of this deployment's own pods, which is no
	// served pool: it has no pool metrics and no Events.
	replicas bool

	mu      sync.Mutex // guards everything below and serialises publishing
	pool    *datastore.Pool
	active  *podWatch
	pending *podWatch
	stopped bool
}

// podWatch is one list+watch of the pods matching one selector in one
// namespace, with its objects stripped to what an endpoint needs. It is one
// goroutine, which also decodes the stream (plus the HTTP/2 stream's
// writer): the pods are a map owned by that goroutine, published to the
// pool after each burst of events.
type podWatch struct {
	owner    *servedPool
	selector string
	pods     corev1client.PodInterface
	rest     rest.Interface
	cancel   context.CancelFunc
	started  time.Time
}

// ensureWatch makes a watch with selector active or pending. It never waits
// on the API server.
func (sp *servedPool) ensureWatch(selector string) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.stopped {
		return
	}
	if sp.active != nil && sp.active.selector == selector {
		// A change and a change back before the new watch synced: keep
		// the active watch and drop the pending one.
		if sp.pending != nil {
			sp.pending.cancel()
			sp.pending = nil
		}
		return
	}
	if sp.pending != nil {
		if sp.pending.selector == selector {
			return
		}
		sp.pending.cancel()
	}
	sp.pending = sp.m.startWatch(sp, selector)
}

// stop cancels the pool's watches; their goroutines end on their own and
// Manager.Start waits for them.
func (sp *servedPool) stop() {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	sp.stopped = true
	for _, w := range []*podWatch{sp.active, sp.pending} {
		if w != nil {
			w.cancel()
		}
	}
	sp.active, sp.pending = nil, nil
}

// synced is called once by w after its first complete list.
func (sp *servedPool) synced(w *podWatch, pods []datastore.EndpointSource) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if w != sp.pending {
		return // superseded or stopped while listing
	}
	old := sp.active
	sp.active, sp.pending = w, nil
	sp.publishLocked(pods)
	sp.pool.SetSynced(true)
	sp.clearFailureLocked()
	// Only now, with the new set published, may the old watch go.
	if old != nil {
		old.cancel()
	}
	sp.m.signal()
	sp.m.metrics.syncSeconds.Observe(time.Since(w.started).Seconds())
	sp.m.log.V(2).Info("pod watch synced", "pool", sp.key.String(), "selector", w.selector,
		"endpoints", sp.pool.Endpoints().Len(), "duration", time.Since(w.started))
}

// failed records that w could not list or watch: the reason goes on the
// pool (its requests are refused with it until it syncs), in a metric, a
// log line and an Event on the pool. Other pools are not affected.
func (sp *servedPool) failed(w *podWatch, what string, err error) {
	sp.mu.Lock()
	if (w != sp.pending && w != sp.active) || sp.pool == nil {
		sp.mu.Unlock()
		return
	}
	reason := fmt.Sprintf("pod %s with selector %q failed: %v", what, w.selector, err)
	first := sp.pool.SyncError() == ""
	sp.pool.SetSyncError(reason)
	synced := sp.pool.Synced()
	if !sp.replicas {
		sp.m.metrics.syncFailing.WithLabelValues(sp.key.Namespace, sp.key.Name).Set(1)
	}
	sp.mu.Unlock()
	// waitInitialSync counts a pool that failed as done: readiness must not
	// wait for one broken pool.
	sp.m.signal()
	if first {
		msg := "its requests are refused until its pods are listed"
		if synced {
			msg = "it keeps serving the endpoints last listed"
		}
		sp.m.log.Error(err, "cannot list or watch a pool's pods; "+msg, "pool", sp.key.String(), "selector", w.selector)
		sp.m.poolEvent(sp.key, corev1.EventTypeWarning, "PodsNotListed", reason+"; "+msg)
	}
}

// recovered clears a failure once w watches again.
func (sp *servedPool) recovered(w *podWatch) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if w == sp.active && sp.pool != nil && sp.pool.SyncError() != "" {
		sp.clearFailureLocked()
	}
}

func (sp *servedPool) clearFailureLocked() {
	if sp.pool.SyncError() != "" {
		sp.m.log.Info("pool's pods listed again", "pool", sp.key.String())
	}
	sp.pool.SetSyncError("")
	if !sp.replicas {
		sp.m.metrics.syncFailing.WithLabelValues(sp.key.Namespace, sp.key.Name).Set(0)
	}
}

// publish replaces the pool's pods if w is still the active watch.
func (sp *servedPool) publish(w *podWatch, pods []datastore.EndpointSource) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if w == sp.active {
		sp.publishLocked(pods)
	}
}

func (sp *servedPool) publishLocked(pods []datastore.EndpointSource) {
	sp.pool.SetPods(pods)
	if !sp.replicas {
		sp.m.metrics.readyPods.WithLabelValues(sp.key.Namespace, sp.key.Name).Set(float64(len(pods)))
	}
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
	p.ObjectMeta.DeepCopyInto(&cp.ObjectMeta)
	return &cp
}

// isEndpoint: Ready, not terminating, and addressable.
func (p *endpointPod) isEndpoint() bool {
	return p.DeletionTimestamp == nil && p.IP != "" && p.Ready
}

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
func endpointSources(pods map[string]*endpointPod) []datastore.EndpointSource {
	out := make([]datastore.EndpointSource, 0, len(pods))
	for _, pod := range pods {
		if !pod.isEndpoint() {
			continue
		}
		out = append(out, datastore.EndpointSource{
			Pod:    datastore.PoolKey{Namespace: pod.Namespace, Name: pod.Name},
			UID:    pod.UID,
			IP:     pod.IP,
			Labels: pod.Labels,
		})
	}
	slices.SortFunc(out, func(a, b datastore.EndpointSource) int { return strings.Compare(a.Pod.Name, b.Pod.Name) })
	return out
}

// startWatch creates and starts a watch of the pool's namespace's pods
// matching selector. Called with sp.mu held.
func (m *Manager) startWatch(sp *servedPool, selector string) *podWatch {
	w := &podWatch{owner: sp, selector: selector, pods: m.pods.Pods(sp.key.Namespace), rest: m.pods.RESTClient(), started: time.Now()}
	ctx, cancel := context.WithCancel(m.watchCtx)
	w.cancel = cancel
	m.metrics.watchStarts.WithLabelValues(sp.key.Namespace, sp.key.Name).Inc()
	m.log.V(2).Info("starting pod watch", "pool", sp.key.String(), "selector", selector)
	m.metrics.liveWatches.Inc()
	m.watches.Go(func() {
		defer m.metrics.liveWatches.Dec()
		w.run(ctx)
	})
	return w
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

// run gets the pods, then watches from their resource version, re-watching
// from the last version seen when a watch ends and starting afresh when that
// version has expired, until ctx is cancelled. The pods come from a
// streaming list (a watch that first sends every matching pod, then a
// bookmark): one request instead of a list and a watch, which halves what a
// thousand pools cost a rate-limited client at start. A server without
// streaming lists gets a plain list.
func (w *podWatch) run(ctx context.Context) {
	m := w.owner.m
	log := m.log.WithValues("pool", w.owner.key.String(), "selector", w.selector)
	var (
		pods    map[string]*endpointPod
		rv      string
		synced  bool
		backoff = watchRetryInitial
	)
	retry := func(what string, err error) bool {
		log.V(2).Info("pod "+what+" failed; retrying", "after", backoff, "err", err.Error())
		if err != errWatchEnded {
			w.owner.failed(w, what, err)
		}
		t := time.NewTimer(wait.Jitter(backoff, 0.2))
		defer t.Stop()
		backoff = min(2*backoff, watchRetryMax)
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		}
	}
	listed := func() {
		if !synced {
			synced = true
			w.owner.synced(w, endpointSources(pods))
		} else {
			w.owner.publish(w, endpointSources(pods))
		}
	}
	for ctx.Err() == nil {
		timeout := int64((minWatchTimeout + time.Duration(rand.Int64N(int64(minWatchTimeout)))).Seconds())
		opts := metav1.ListOptions{LabelSelector: w.selector, ResourceVersion: rv, AllowWatchBookmarks: true, TimeoutSeconds: &timeout}
		streaming := rv == "" && !m.noStreamingList.Load()
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
				m.noProtobufWatch.Store(true)
			case streaming && (apierrors.IsBadRequest(err) || apierrors.IsInvalid(err) || apierrors.IsForbidden(err) && strings.Contains(err.Error(), "sendInitialEvents")):
				log.Info("the API server does not offer streaming lists; listing instead", "err", err.Error())
				m.noStreamingList.Store(true)
			case expired(err):
				rv = ""
			default:
				if !retry("watch", err) {
					return
				}
			}
			continue
		}
		var healthy bool
		rv, healthy = w.follow(ctx, events, pods, rv, streaming, listed, log)
		events.stop()
		switch {
		case healthy:
			backoff = watchRetryInitial
			w.owner.recovered(w)
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
	if !w.owner.m.noProtobufWatch.Load() {
		return openStreamEvents(ctx, w.rest, w.owner.key.Namespace, opts)
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
			ep := p.(*endpointPod)
			pods[ep.Name] = ep
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
	dirty, got := false, false
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
			if ev.Type == watch.Deleted {
				delete(pods, ep.Name)
				dirty = dirty || (had && old.isEndpoint())
			} else {
				pods[ep.Name] = ep
				dirty = dirty || !had || endpointRelevantChange(old, ep)
			}
		case watch.Bookmark:
			o, err := meta.Accessor(ev.Object)
			if err != nil {
				continue
			}
			rv = o.GetResourceVersion()
			if !complete && o.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true" {
				complete, dirty = true, false
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
		if complete && dirty && !more {
			w.owner.publish(w, endpointSources(pods))
			dirty = false
		}
	}
}

var errWatchEnded = errors.New("watch ended without events or with an error")

// expired reports an error that means the resource version is too old (or
// too new) to watch from: only a new list helps.
func expired(err error) bool {
	return apierrors.IsResourceExpired(err) || apierrors.IsGone(err) || apierrors.HasStatusCause(err, metav1.CauseTypeResourceVersionTooLarge)
}
