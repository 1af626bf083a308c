// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/poolpicker/poolpicker/datastore"
)

// reflectorBurst is how long a reflector watch's store waits after a
// change before publishing: client-go's Reflector hands the store one event
// at a time and never says whether more are queued, so a burst is what
// arrives within this window.
const reflectorBurst = 2 * time.Millisecond

// reflectorWatch is a pool's own pod watch run by client-go's Reflector
// (Options.ReflectorPodWatch, bench/poolwatch's perpool-reflector mode):
// the Reflector lists (a streaming list where the API server has them),
// watches, resumes, relists on expiry and backs off; its store keeps the
// stripped pods and publishes them to the pool, a (re)list in one swap.
type reflectorWatch struct {
	owner    *servedPool
	selector string
	started  time.Time
	cancel   context.CancelFunc

	// publishMu orders publications: a snapshot is taken and published
	// under it, so a later state never loses to an earlier one.
	publishMu sync.Mutex

	mu   sync.Mutex // guards the fields below
	pods map[string]*endpointPod
	// listed: the first (re)list is in; until then nothing is published.
	listed bool
	// flush is the pending publication of a burst, if any.
	flush *time.Timer
	// failing: the last list or watch request failed.
	failing bool
}

func (r *reflectorWatch) serves(selector string, namespace bool) bool {
	return !namespace && r.selector == selector
}
func (r *reflectorWatch) describe() string {
	return fmt.Sprintf("with selector %q (reflector)", r.selector)
}
func (r *reflectorWatch) startedAt() time.Time { return r.started }
func (r *reflectorWatch) stop() {
	r.cancel()
	r.mu.Lock()
	if r.flush != nil {
		r.flush.Stop()
	}
	r.mu.Unlock()
}

// startOwnWatch starts a pool's own watch: poolpicker's loop, or a
// Reflector with Options.ReflectorPodWatch.
func (m *Manager) startOwnWatch(sp *servedPool, selector string) podSource {
	if m.opts.ReflectorPodWatch {
		return m.startReflectorWatch(sp, selector)
	}
	return m.startPoolWatch(sp, selector)
}

// startReflectorWatch starts a pool's own watch of the pods of its
// namespace matching selector on a Reflector.
func (m *Manager) startReflectorWatch(sp *servedPool, selector string) *reflectorWatch {
	rw := &reflectorWatch{owner: sp, selector: selector, started: time.Now(), pods: map[string]*endpointPod{}}
	pods := m.pods.Pods(sp.key.Namespace)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.LabelSelector = selector
			list, err := pods.List(ctx, opts)
			rw.requested(ctx, "list", err)
			return list, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.LabelSelector = selector
			w, err := pods.Watch(ctx, opts)
			rw.requested(ctx, "watch", err)
			return w, err
		},
	}
	var lister cache.ListerWatcher = lw
	if m.opts.DisableStreamingLists {
		lister = cache.ToListWatcherWithWatchListSemantics(lw, withoutStreamingLists{})
	}
	log := m.log.WithValues("pool", sp.key.String(), "selector", selector)
	refl := cache.NewReflectorWithOptions(lister, &corev1.Pod{}, rw, cache.ReflectorOptions{
		Name: "pods of " + sp.key.String(), Logger: &log, MinWatchTimeout: minWatchTimeout,
	})
	ctx, cancel := context.WithCancel(m.watchCtx)
	rw.cancel = cancel
	log.V(2).Info("starting pod watch (reflector)")
	m.metrics.liveWatches.Inc()
	m.watches.Go(func() {
		defer m.metrics.liveWatches.Dec()
		refl.RunWithContext(ctx)
	})
	return rw
}

// withoutStreamingLists tells a Reflector to list, then watch
// (Options.DisableStreamingLists).
type withoutStreamingLists struct{}

func (withoutStreamingLists) IsWatchListSemanticsUnSupported() bool { return true }

// requested reports a list or watch request's outcome to the pool: a
// failure as the per-pool watch reports one, and the first success after.
func (r *reflectorWatch) requested(ctx context.Context, what string, err error) {
	if ctx.Err() != nil {
		return
	}
	r.mu.Lock()
	was := r.failing
	r.failing = err != nil
	r.mu.Unlock()
	switch {
	case err != nil:
		r.owner.failed(r, what, err)
	case was:
		r.owner.recovered(r)
	}
}

// The Reflector's store: it keeps the stripped pods.

func (r *reflectorWatch) Add(obj any) error    { r.put(obj, false); return nil }
func (r *reflectorWatch) Update(obj any) error { r.put(obj, false); return nil }
func (r *reflectorWatch) Delete(obj any) error { r.put(obj, true); return nil }
func (r *reflectorWatch) Resync() error        { return nil }

// Replace is a (re)list: the pods are published at once, in one swap.
func (r *reflectorWatch) Replace(list []any, _ string) error {
	pods := make(map[string]*endpointPod, len(list))
	for _, obj := range list {
		if ep := stripped(obj); ep != nil {
			pods[ep.Name] = ep
		}
	}
	r.publishMu.Lock()
	defer r.publishMu.Unlock()
	r.mu.Lock()
	r.pods, r.listed = pods, true
	if r.flush != nil {
		r.flush.Stop()
		r.flush = nil
	}
	srcs := endpointSources(pods)
	r.mu.Unlock()
	r.publish(srcs)
	return nil
}

// put applies one event and, when it can change the endpoints, schedules
// the burst's publication.
func (r *reflectorWatch) put(obj any, deleted bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj, deleted = d.Obj, true
	}
	ep := stripped(obj)
	if ep == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	old, had := r.pods[ep.Name]
	relevant := false
	if deleted {
		delete(r.pods, ep.Name)
		relevant = had && old.isEndpoint()
	} else {
		r.pods[ep.Name] = ep
		relevant = !had || endpointRelevantChange(old, ep)
	}
	if relevant && r.listed && r.flush == nil {
		r.flush = time.AfterFunc(reflectorBurst, r.publishBurst)
	}
}

func (r *reflectorWatch) publishBurst() {
	r.publishMu.Lock()
	defer r.publishMu.Unlock()
	r.mu.Lock()
	r.flush = nil
	srcs := endpointSources(r.pods)
	r.mu.Unlock()
	r.publish(srcs)
}

func (r *reflectorWatch) publish(srcs []datastore.EndpointSource) {
	if old := r.owner.update(r, srcs); old != nil {
		old.stop()
	}
}

// stripped is the pod an object of the Reflector is, stripped; nil for
// anything else.
func stripped(obj any) *endpointPod {
	p, _ := stripPod(obj)
	ep, _ := p.(*endpointPod)
	return ep
}
