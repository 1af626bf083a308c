// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package podsource

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/poolpicker/poolpicker/controllers/podsource/internal/podwatch"
)

// namespaceWatch is the namespace plan's one watch of every pod of a
// namespace, fanned out to its pools' subscriptions by their selectors on
// this side: the API server keeps one watcher, and lists the namespace
// once, however many pools the namespace holds. It lives while it has
// subscriptions.
//
// Its lock's place in the order: see the package doc.
type namespaceWatch struct {
	src       *Sources
	namespace string
	watch     *podWatch

	mu sync.Mutex // guards everything below
	// hasListed is set at the watch's first complete list: from then on a
	// new subscription is filled from the watch's view at once.
	hasListed bool
	closed    bool
	// failure is the watch's last failure, until it watches again: a pool
	// subscribing meanwhile is told.
	failure *watchFailure
	subs    map[*nsSub]struct{}
	// bySelectorLabel indexes subscriptions by one label of their selector
	// ("key=value"), so that a pod is matched only against the pools that
	// may select it, not against every pool of the namespace.
	bySelectorLabel map[string]map[*nsSub]struct{}
}

type watchFailure struct {
	what string
	err  error
}

// nsSub is one pool's subscription to its namespace's watch: its pods are
// those of the namespace's that match selector.
type nsSub struct {
	owner    *servedPool
	selector string
	match    labels.Set
	started  time.Time
	// stopped is set before the subscription leaves its watch, so that a
	// subscribe racing with the stop does not join.
	stopped atomic.Bool

	// Guarded by the namespaceWatch's mu.
	ns *namespaceWatch
	// indexLabel is the selector label the subscription is indexed by.
	indexLabel string
	// members are the namespace's pods the selector matches, by name.
	members map[string]*podwatch.Pod
}

func (s *nsSub) serves(selector string, namespace bool) bool {
	return namespace && s.selector == selector
}
func (s *nsSub) describe() string {
	return fmt.Sprintf("of namespace %s (one watch for the namespace's pools) matching %q", s.owner.key.Namespace, s.selector)
}
func (s *nsSub) startedAt() time.Time { return s.started }
func (s *nsSub) stop() {
	if s.stopped.CompareAndSwap(false, true) {
		s.owner.src.unsubscribe(s)
	}
}

// matches reports whether the subscription's selector selects pod.
func (s *nsSub) matches(pod *podwatch.Pod) bool {
	if pod == nil {
		return false
	}
	for k, v := range s.match {
		if got, ok := pod.Labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// subscribe joins sub to its namespace's watch, starting the watch if the
// namespace has none. If the watch has listed, the pool gets its pods at
// once.
func (ps *Sources) subscribe(sub *nsSub) {
	namespace := sub.owner.key.Namespace
	ps.mu.Lock()
	ns := ps.nsWatches[namespace]
	if ns == nil {
		ns = &namespaceWatch{src: ps, namespace: namespace, subs: map[*nsSub]struct{}{}, bySelectorLabel: map[string]map[*nsSub]struct{}{}}
		ns.watch = ps.newWatch(namespace, "", ns, ps.log.WithValues("namespace", namespace))
		ps.nsWatches[namespace] = ns
		ps.runWatch(ns.watch)
	}
	ns.mu.Lock()
	ps.mu.Unlock()
	if sub.stopped.Load() {
		ns.mu.Unlock()
		// Stopped before it joined: the watch may now have no one.
		ps.closeIfUnused(ns)
		return
	}
	sub.ns = ns
	ns.subs[sub] = struct{}{}
	sub.indexLabel = indexLabel(sub.match)
	idx := ns.bySelectorLabel[sub.indexLabel]
	if idx == nil {
		idx = map[*nsSub]struct{}{}
		ns.bySelectorLabel[sub.indexLabel] = idx
	}
	idx[sub] = struct{}{}
	sub.members = map[string]*podwatch.Pod{}
	var replaced podSource
	if ns.hasListed {
		ns.watch.EachPod(func(name string, pod *podwatch.Pod) {
			if sub.matches(pod) {
				sub.members[name] = pod
			}
		})
		replaced = sub.owner.update(sub, endpointSources(sub.members))
	}
	if ns.failure != nil {
		// Served from the last list, if any, and reported as failing.
		sub.owner.failed(sub, ns.failure.what, ns.failure.err)
	}
	ns.mu.Unlock()
	if replaced != nil {
		replaced.stop()
	}
}

// unsubscribe removes sub from its watch, and stops the watch when no
// subscription is left.
func (ps *Sources) unsubscribe(sub *nsSub) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ns := ps.nsWatches[sub.owner.key.Namespace]
	if ns == nil {
		return
	}
	ns.mu.Lock()
	defer ns.mu.Unlock()
	if sub.ns != ns {
		return // never joined
	}
	delete(ns.subs, sub)
	if idx := ns.bySelectorLabel[sub.indexLabel]; idx != nil {
		delete(idx, sub)
		if len(idx) == 0 {
			delete(ns.bySelectorLabel, sub.indexLabel)
		}
	}
	sub.members = nil
	ps.closeLocked(ns)
}

func (ps *Sources) closeIfUnused(ns *namespaceWatch) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ns.mu.Lock()
	defer ns.mu.Unlock()
	ps.closeLocked(ns)
}

// closeLocked stops ns if no subscription is left. Called with ps.mu and
// ns.mu held.
func (ps *Sources) closeLocked(ns *namespaceWatch) {
	if len(ns.subs) > 0 || ns.closed {
		return
	}
	ns.closed = true
	ns.watch.cancel()
	if ps.nsWatches[ns.namespace] == ns {
		delete(ps.nsWatches, ns.namespace)
	}
}

// indexLabel is the label a selector is indexed by: its first key in order,
// so that the choice is stable.
func indexLabel(match labels.Set) string {
	keys := make([]string, 0, len(match))
	for k := range match {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if len(keys) == 0 {
		return ""
	}
	return keys[0] + "=" + match[keys[0]]
}

// candidates are the subscriptions that may select a pod with lbls.
func (ns *namespaceWatch) candidates(lbls map[string]string, into map[*nsSub]struct{}) {
	for k, v := range lbls {
		for sub := range ns.bySelectorLabel[k+"="+v] {
			into[sub] = struct{}{}
		}
	}
}

// listed recomputes every subscription's pods from a complete list and
// publishes them: a pending subscription's pool swaps to them in one
// publish, and the source it replaces stops.
func (ns *namespaceWatch) Listed(_ *podwatch.Watch, pods map[string]*podwatch.Pod) {
	var replaced []podSource
	ns.mu.Lock()
	if ns.closed {
		ns.mu.Unlock()
		return
	}
	ns.hasListed, ns.failure = true, nil
	for sub := range ns.subs {
		sub.members = map[string]*podwatch.Pod{}
	}
	into := map[*nsSub]struct{}{}
	for name, pod := range pods {
		ns.candidates(pod.Labels, into)
		for sub := range into {
			if sub.matches(pod) {
				sub.members[name] = pod
			}
		}
		clear(into)
	}
	for sub := range ns.subs {
		replaced = append(replaced, sub.owner.update(sub, endpointSources(sub.members)))
	}
	ns.mu.Unlock()
	stopSources(replaced)
}

// changed re-filters the pods of a burst and republishes the pools whose
// endpoints they change.
func (ns *namespaceWatch) Changed(_ *podwatch.Watch, pods map[string]*podwatch.Pod, before map[string]*podwatch.Pod) {
	var replaced []podSource
	ns.mu.Lock()
	if ns.closed {
		ns.mu.Unlock()
		return
	}
	dirty := map[*nsSub]struct{}{}
	into := map[*nsSub]struct{}{}
	for name, old := range before {
		cur := pods[name]
		if old != nil {
			ns.candidates(old.Labels, into)
		}
		if cur != nil {
			ns.candidates(cur.Labels, into)
		}
		for sub := range into {
			prev, was := sub.members[name]
			switch {
			case sub.matches(cur):
				sub.members[name] = cur
				if !was || podwatch.RelevantChange(prev, cur) {
					dirty[sub] = struct{}{}
				}
			case was:
				delete(sub.members, name)
				if prev.IsEndpoint() {
					dirty[sub] = struct{}{}
				}
			}
		}
		clear(into)
	}
	for sub := range dirty {
		replaced = append(replaced, sub.owner.update(sub, endpointSources(sub.members)))
	}
	ns.mu.Unlock()
	stopSources(replaced)
}

// failed tells every pool of the namespace: each is refused (or keeps its
// last endpoints) and reported on its own, as with per-pool watches.
func (ns *namespaceWatch) Failed(_ *podwatch.Watch, what string, err error) {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	ns.failure = &watchFailure{what: what, err: err}
	for sub := range ns.subs {
		sub.owner.failed(sub, what, err)
	}
}

// expired tells every pool of the namespace that the pods it holds are
// too old to serve; a pool subscribing meanwhile waits for the next list.
func (ns *namespaceWatch) Expired(*podwatch.Watch) {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	ns.hasListed = false
	for sub := range ns.subs {
		sub.owner.expire(sub)
	}
}

func (ns *namespaceWatch) Recovered(*podwatch.Watch) {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	ns.failure = nil
	for sub := range ns.subs {
		sub.owner.recovered(sub)
	}
}
