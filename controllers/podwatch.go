package controllers

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/poolpicker/poolpicker/datastore"
)

// servedPool is the controllers' side of one served pool: the datastore pool
// and its pod watches. At most two watches exist: the active one, whose pods
// are published, and a pending one started for a new selector, which becomes
// active (replacing the endpoint set in one swap) when its first list is in.
type servedPool struct {
	key datastore.PoolKey
	m   *Manager

	mu      sync.Mutex // guards everything below and serialises publishing
	pool    *datastore.Pool
	active  *podWatch
	pending *podWatch
	stopped bool
}

// podWatch is one list+watch of the pods matching one selector in one
// namespace, with its objects stripped to what an endpoint needs.
type podWatch struct {
	owner    *servedPool
	selector string
	store    toolscache.Store
	informer toolscache.Controller
	// notify coalesces pod events: the run loop republishes once per wake-up,
	// so a burst of events costs one endpoint-set rebuild.
	notify  chan struct{}
	cancel  context.CancelFunc
	started time.Time
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
func (sp *servedPool) synced(w *podWatch) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if w != sp.pending {
		return // superseded or stopped while listing
	}
	old := sp.active
	sp.active, sp.pending = w, nil
	sp.publishLocked()
	sp.pool.SetSynced(true)
	// Only now, with the new set published, may the old watch go.
	if old != nil {
		old.cancel()
	}
	sp.m.signal()
	sp.m.metrics.syncSeconds.Observe(time.Since(w.started).Seconds())
	sp.m.log.V(2).Info("pod watch synced", "pool", sp.key.String(), "selector", w.selector,
		"endpoints", sp.pool.Endpoints().Len(), "duration", time.Since(w.started))
}

func (sp *servedPool) publish(w *podWatch) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if w == sp.active {
		sp.publishLocked()
	}
}

func (sp *servedPool) publishLocked() {
	objs := sp.active.store.List()
	pods := make([]datastore.EndpointSource, 0, len(objs))
	for _, o := range objs {
		pod, ok := o.(*corev1.Pod)
		if !ok || !podIsEndpoint(pod) {
			continue
		}
		pods = append(pods, datastore.EndpointSource{
			Pod:    datastore.PoolKey{Namespace: pod.Namespace, Name: pod.Name},
			UID:    pod.UID,
			IP:     pod.Status.PodIP,
			Labels: pod.Labels,
		})
	}
	slices.SortFunc(pods, func(a, b datastore.EndpointSource) int { return strings.Compare(a.Pod.Name, b.Pod.Name) })
	sp.pool.SetPods(pods)
	sp.m.metrics.readyPods.WithLabelValues(sp.key.Namespace, sp.key.Name).Set(float64(len(pods)))
}

// podIsEndpoint: Ready, not terminating, and addressable.
func podIsEndpoint(pod *corev1.Pod) bool {
	return pod.DeletionTimestamp == nil && pod.Status.PodIP != "" && podReady(pod)
}

func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// stripPod keeps what an endpoint is made of; a full pod is several
// kilobytes (spec, managed fields), the stripped one a few hundred bytes.
func stripPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // tombstones carry an already stripped pod
	}
	out := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Name:              pod.Name,
		Namespace:         pod.Namespace,
		UID:               pod.UID,
		Labels:            pod.Labels,
		DeletionTimestamp: pod.DeletionTimestamp,
	}}
	out.Status.PodIP = pod.Status.PodIP
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			out.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: c.Status}}
			break
		}
	}
	return out, nil
}

// endpointRelevantChange reports whether an update can change the endpoint
// set: other status churn (container restarts counted, conditions other than
// Ready) is dropped by the transform and must not rebuild the set.
func endpointRelevantChange(oldObj, newObj any) bool {
	o, ok1 := oldObj.(*corev1.Pod)
	n, ok2 := newObj.(*corev1.Pod)
	if !ok1 || !ok2 {
		return true
	}
	return o.UID != n.UID || o.Status.PodIP != n.Status.PodIP || podIsEndpoint(o) != podIsEndpoint(n) ||
		!maps.Equal(o.Labels, n.Labels)
}

// startWatch creates and starts a watch of the pool's namespace's pods
// matching selector. Called with sp.mu held.
func (m *Manager) startWatch(sp *servedPool, selector string) *podWatch {
	w := &podWatch{owner: sp, selector: selector, notify: make(chan struct{}, 1), started: time.Now()}
	pods := m.pods.Pods(sp.key.Namespace)
	lw := &toolscache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.LabelSelector = selector
			return pods.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.LabelSelector = selector
			return pods.Watch(ctx, opts)
		},
	}
	poke := func() {
		select {
		case w.notify <- struct{}{}:
		default:
		}
	}
	w.store, w.informer = toolscache.NewInformerWithOptions(toolscache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &corev1.Pod{},
		Transform:     stripPod,
		Handler: toolscache.ResourceEventHandlerFuncs{
			AddFunc: func(any) { poke() },
			UpdateFunc: func(o, n any) {
				if endpointRelevantChange(o, n) {
					poke()
				}
			},
			DeleteFunc: func(any) { poke() },
		},
	})

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

func (w *podWatch) run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { w.informer.RunWithContext(ctx) })
	select {
	case <-ctx.Done():
		return
	case <-w.informer.HasSyncedChecker().Done():
	}
	// Drain a poke from the initial list: synced publishes it.
	select {
	case <-w.notify:
	default:
	}
	w.owner.synced(w)
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.notify:
			w.owner.publish(w)
		}
	}
}
