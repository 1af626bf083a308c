// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package podwatch lists and watches the pods of one namespace matching a
// label selector, keeping each stripped to what an endpoint needs: a lean
// reflector, so that thousands of pools can each have a watch of their own.
// A Watch is one goroutine (Run), which also decodes its protobuf stream
// (watchstream.go); it hands its pods to its Sink after each burst of
// events, lists afresh when a watch cannot resume, backs off while the API
// server fails, and says when what it holds has gone stale.
package podwatch

import (
	"context"
	"errors"
	"maps"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
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
)

// Config is what a Watch watches and whom it tells.
type Config struct {
	// Namespace and Selector (a label selector; empty: every pod) name the
	// pods watched.
	Namespace string
	Selector  string
	// Client reaches the API server; its rate limits pace the watch.
	Client corev1client.CoreV1Interface
	// StaleAfter is how long the watch may fail before what it holds no
	// longer counts (Sink.Expired) and it lists afresh.
	StaleAfter time.Duration
	// Capabilities are shared by the watches of one API server.
	Capabilities *Capabilities
	Sink         Sink
	Log          logr.Logger
}

// Capabilities are what the API server was found not to offer, learnt by
// one watch and used by all of a process's from then on.
type Capabilities struct {
	// NoStreamingList is set once the API server refused a streaming list
	// (or at start, when streaming lists are turned off).
	NoStreamingList atomic.Bool
	// NoProtobufWatch is set once the API server answered a protobuf watch
	// in another encoding: watches are decoded by client-go from then on.
	NoProtobufWatch atomic.Bool
}

// New makes a watch of cfg; Run runs it.
func New(cfg Config) *Watch {
	return &Watch{cfg: cfg, pods: cfg.Client.Pods(cfg.Namespace), rest: cfg.Client.RESTClient()}
}

// Namespace is the namespace the watch lists.
func (w *Watch) Namespace() string { return w.cfg.Namespace }

// Selector is the label selector the watch lists by.
func (w *Watch) Selector() string { return w.cfg.Selector }

// EachPod calls fn with each pod of the watch's last complete list (as
// events changed it since), under the watch's lock: fn must not call back
// into the watch.
func (w *Watch) EachPod(fn func(name string, pod *Pod)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for name, pod := range w.view {
		fn(name, pod)
	}
}

// Sink receives what a pod watch sees. Its calls come from the
// watch's goroutine, one at a time; pods is the watch's map, which only
// that goroutine writes.
type Sink interface {
	// Listed: pods are complete, from the first list or a re-list.
	Listed(w *Watch, pods map[string]*Pod)
	// Changed: a burst of events changed the pods named in before, whose
	// values are what the pods were before (nil: they are new).
	Changed(w *Watch, pods map[string]*Pod, before map[string]*Pod)
	Failed(w *Watch, what string, err error)
	// Recovered: the watch lists or watches again after failing.
	Recovered(w *Watch)
	// Expired: the watch has failed for longer than
	// Options.StaleEndpointsTimeout; its pods are no longer to be trusted,
	// and it lists afresh when it can.
	Expired(w *Watch)
}

// Watch is one list+watch of the pods of one namespace (those matching
// selector; all of them when selector is empty), with its objects stripped
// to what an endpoint needs. It is one goroutine, which also decodes the
// stream (plus the HTTP/2 stream's writer): the pods are a map owned by that
// goroutine, handed to the sink after each burst of events.
type Watch struct {
	cfg  Config
	pods corev1client.PodInterface
	rest rest.Interface

	// mu guards view, the last complete pods, for readers on other
	// goroutines (a pool subscribing to a namespace's watch): the watch
	// changes view's pods under mu, and replaces view at each re-list.
	mu   sync.Mutex
	view map[string]*Pod
}

// Pod is what a pod watch keeps of a pod: name, namespace, UID,
// labels, deletion state, IP and readiness. It weighs about 300 bytes
// where a corev1.Pod, even emptied, weighs 1.2 KB.
type Pod struct {
	metav1.TypeMeta
	metav1.ObjectMeta
	IP    string
	Ready bool
}

// DeepCopyObject makes a Pod a runtime.Object; the metadata is what is
// copied deep.
func (p *Pod) DeepCopyObject() runtime.Object {
	cp := *p
	p.ObjectMeta.DeepCopyInto(&cp.ObjectMeta) //nolint:staticcheck // QF1008: the selector says that only the metadata is copied deep
	return &cp
}

// IsEndpoint reports whether the pod is Ready, not terminating, and
// addressable.
func (p *Pod) IsEndpoint() bool {
	return p.DeletionTimestamp == nil && p.IP != "" && p.Ready
}

// keep reports whether a watch keeps pod: only endpoints are. A
// Pending, unready or terminating pod is never routed to, and a namespace
// may hold thousands of them (a deployment waiting for GPUs) with large
// label sets; it is kept again when an update makes it an endpoint, which
// every update carries whole.
func keep(pod *Pod) bool { return pod.IsEndpoint() }

// Strip is the pod watch's transform: a full pod is several kilobytes
// (spec, status, managed fields), of which an endpoint needs a few fields.
func Strip(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // already stripped (tombstones, re-lists)
	}
	out := &Pod{ObjectMeta: metav1.ObjectMeta{
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

// RelevantChange reports whether an update can change the endpoint
// set: other status churn (restart counts, conditions other than Ready) is
// dropped by the transform and must not rebuild the set.
func RelevantChange(oldObj, newObj any) bool {
	o, ok1 := oldObj.(*Pod)
	n, ok2 := newObj.(*Pod)
	if !ok1 || !ok2 {
		return true
	}
	return o.UID != n.UID || o.IP != n.IP || o.IsEndpoint() != n.IsEndpoint() || !maps.Equal(o.Labels, n.Labels)
}

// RetryInitial is the first pause of a watch whose list or watch failed;
// each failure in a row doubles it up to watchRetryMax.
const RetryInitial = 500 * time.Millisecond

// Retry pacing of a pod watch whose list or watch fails.
const (
	watchRetryMax = 30 * time.Second
	// minWatchTimeout is the shortest server-side timeout of a watch
	// request; each request draws one in [1, 2) times it, as client-go's
	// reflector does, so that thousands of watches do not all end at once.
	minWatchTimeout = 5 * time.Minute
)

// newWatchBackoff paces a failing watch's retries: doubling from
// RetryInitial up to watchRetryMax, up to a fifth longer at random so
// that watches failing together drift apart.
func newWatchBackoff() wait.Backoff {
	return wait.Backoff{Duration: RetryInitial, Factor: 2, Jitter: 0.2, Cap: watchRetryMax, Steps: math.MaxInt32}
}

// Run gets the pods, then watches from their resource version, re-watching
// from the last version seen when a watch ends and starting afresh when that
// version has expired, until ctx is cancelled. The pods come from a
// streaming list (a watch that first sends every matching pod, then a
// bookmark): one request instead of a list and a watch, which halves what a
// thousand pools cost a rate-limited client at start. A server without
// streaming lists gets a plain list.
func (w *Watch) Run(ctx context.Context) {
	caps, log := w.cfg.Capabilities, w.cfg.Log
	var (
		pods    map[string]*Pod
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
			w.cfg.Sink.Failed(w, what, err)
		}
		t := time.NewTimer(after)
		defer t.Stop()
		for {
			var expiry <-chan time.Time
			if !failingSince.IsZero() && !stale {
				e := time.NewTimer(time.Until(failingSince.Add(w.cfg.StaleAfter)))
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
				w.cfg.Sink.Expired(w)
			}
		}
	}
	healthy := func() {
		if !failingSince.IsZero() {
			failingSince, stale = time.Time{}, false
			w.cfg.Sink.Recovered(w)
		}
	}
	listed := func() {
		w.mu.Lock()
		w.view = pods
		w.mu.Unlock()
		w.cfg.Sink.Listed(w, pods)
		healthy()
	}
	for ctx.Err() == nil {
		timeout := int64((minWatchTimeout + time.Duration(rand.Int64N(int64(minWatchTimeout)))).Seconds())
		opts := metav1.ListOptions{LabelSelector: w.cfg.Selector, ResourceVersion: rv, AllowWatchBookmarks: true, TimeoutSeconds: &timeout}
		streaming := rv == "" && !caps.NoStreamingList.Load()
		if streaming {
			pods = map[string]*Pod{}
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
				caps.NoProtobufWatch.Store(true)
			case streaming && (apierrors.IsBadRequest(err) || apierrors.IsInvalid(err) || apierrors.IsForbidden(err) && strings.Contains(err.Error(), "sendInitialEvents")):
				log.Info("the API server does not offer streaming lists; listing instead", "err", err.Error())
				caps.NoStreamingList.Store(true)
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
			w.cfg.Sink.Recovered(w)
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
func (w *Watch) open(ctx context.Context, opts metav1.ListOptions) (eventSource, error) {
	if !w.cfg.Capabilities.NoProtobufWatch.Load() {
		return openStreamEvents(ctx, w.rest, w.cfg.Namespace, opts)
	}
	wi, err := w.pods.Watch(ctx, opts)
	if err != nil {
		return nil, err
	}
	return chanEvents{wi}, nil
}

// list reads the pods matching the selector, in pages, and returns them
// stripped, keyed by name, with the list's resource version.
func (w *Watch) list(ctx context.Context) (map[string]*Pod, string, error) {
	pods := map[string]*Pod{}
	opts := metav1.ListOptions{LabelSelector: w.cfg.Selector, Limit: 500}
	for {
		list, err := w.pods.List(ctx, opts)
		if err != nil {
			return nil, "", err
		}
		for i := range list.Items {
			p, _ := Strip(&list.Items[i])
			if ep := p.(*Pod); keep(ep) {
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
func (w *Watch) follow(ctx context.Context, events eventSource, pods map[string]*Pod, rv string,
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
	changed, got := map[string]*Pod{}, false
	note := func(name string, before *Pod) {
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
			p, _ := Strip(pod)
			ep := p.(*Pod)
			old, had := pods[ep.Name]
			// Only endpoints are kept (see keep): a pod that is not one
			// is as good as deleted until an update makes it one.
			keep := ev.Type != watch.Deleted && keep(ep)
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
			if complete && (had && !keep || keep && (!had || RelevantChange(old, ep))) {
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
			w.cfg.Sink.Changed(w, pods, changed)
			changed = map[string]*Pod{}
		}
	}
}

var errWatchEnded = errors.New("watch ended without events or with an error")

// expired reports an error that means the resource version is too old (or
// too new) to watch from: only a new list helps.
func expired(err error) bool {
	return apierrors.IsResourceExpired(err) || apierrors.IsGone(err) || apierrors.HasStatusCause(err, metav1.CauseTypeResourceVersionTooLarge)
}
