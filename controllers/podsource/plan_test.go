// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package podsource

import (
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/poolpicker/poolpicker/datastore"
)

// setRecorder sees every endpoint set published for the pools it was told
// to expect, and keeps those that were not one of the sets allowed for the
// pool at the time: an empty set while a pool is served, or a mix.
type setRecorder struct {
	mu      sync.Mutex
	allowed map[datastore.PoolKey][][]string
	bad     []string
	seen    int
}

func (r *setRecorder) allow(key datastore.PoolKey, set ...string) {
	slices.Sort(set)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.allowed[key] = append(r.allowed[key], set)
}

func (r *setRecorder) EndpointsChanged(p *datastore.Pool, _, _ []*datastore.Endpoint) {
	got := addrs(p.Endpoints())
	r.mu.Lock()
	defer r.mu.Unlock()
	allowed, watched := r.allowed[p.Key]
	if !watched {
		return
	}
	r.seen++
	if !slices.ContainsFunc(allowed, func(s []string) bool { return slices.Equal(s, got) }) && len(r.bad) < 10 {
		r.bad = append(r.bad, fmt.Sprintf("%s: %v", p.Key.Name, got))
	}
}

func (r *setRecorder) PoolRemoved(*datastore.Pool) {}

func (r *setRecorder) check(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.bad) > 0 {
		t.Fatalf("of %d published sets, these were neither empty-free nor whole: %v", r.seen, r.bad)
	}
}

// TestAutoPlanSwitchesInOneSwap adds pools to a namespace past the auto
// plan's threshold, then removes them below its lower mark: the namespace
// moves to one namespace watch and back to per-pool watches, and every
// endpoint set published meanwhile, as a datastore observer sees them all,
// is a pool's whole set: never empty, never mixed.
func TestAutoPlanSwitchesInOneSwap(t *testing.T) {
	ns := env.Namespace(t, "auto")
	const threshold = 4 // to the namespace plan at 4 pools, back at 2
	rec := &setRecorder{allowed: map[datastore.PoolKey][][]string{}}
	keys := make([]datastore.PoolKey, threshold)
	for i := range keys {
		keys[i] = datastore.PoolKey{Namespace: ns, Name: fmt.Sprintf("pool-%d", i)}
		sel := map[string]string{"app": fmt.Sprintf("m%d", i)}
		var want []string
		for j := range 2 {
			ip := fmt.Sprintf("10.15.%d.%d", i, j+1)
			createPod(t, ns, fmt.Sprintf("m%d-%d", i, j), sel, ready(ip))
			want = append(want, ip+":8000")
		}
		rec.allow(keys[i], want...)
	}
	// Pods no pool selects, which the namespace watch receives too.
	createPod(t, ns, "other", map[string]string{"app": "other"}, ready("10.15.9.1"))

	r := start(t, nil, Options{NamespaceWatchThreshold: threshold}, rec)
	liveWatches := func(n float64) func() bool {
		return func() bool { return r.metric("poolpicker_pod_watches") == n }
	}
	starts := func(key datastore.PoolKey) float64 {
		return r.metric("poolpicker_pool_watch_starts_total", key.Namespace, key.Name)
	}
	for i := range threshold - 1 {
		r.serve(t, keys[i], map[string]string{"app": fmt.Sprintf("m%d", i)}, 8000)
		r.waitEndpoints(t, keys[i], rec.allowed[keys[i]][0]...)
	}
	r.waitFor(t, "three per-pool watches", liveWatches(3))
	if r.s.namespaceWatched(ns) {
		t.Fatal("the namespace plan is in force below the threshold")
	}

	// The fourth pool switches the namespace: its pools move to the
	// namespace watch, each in one swap, and their own watches stop.
	r.serve(t, keys[3], map[string]string{"app": "m3"}, 8000)
	r.waitEndpoints(t, keys[3], rec.allowed[keys[3]][0]...)
	r.waitFor(t, "one namespace watch, no per-pool watch", liveWatches(1))
	if !r.s.namespaceWatched(ns) {
		t.Fatal("the namespace plan is not in force at the threshold")
	}
	for _, key := range keys[:3] {
		if got := starts(key); got != 2 {
			t.Errorf("%s: %v sources started, want 2 (its own watch, then the namespace's)", key.Name, got)
		}
	}
	// Pod events reach the pools through the namespace watch.
	rec.allow(keys[0], "10.15.0.1:8000", "10.15.0.2:8000", "10.15.0.3:8000")
	createPod(t, ns, "m0-new", map[string]string{"app": "m0"}, ready("10.15.0.3"))
	r.waitEndpoints(t, keys[0], "10.15.0.1:8000", "10.15.0.2:8000", "10.15.0.3:8000")

	// Down to the lower mark: back to per-pool watches, each in one swap.
	r.s.Unserve(keys[3])
	r.waitGone(t, keys[3])
	if !r.s.namespaceWatched(ns) {
		t.Fatal("the namespace plan left above the lower mark (no hysteresis)")
	}
	r.s.Unserve(keys[2])
	r.waitGone(t, keys[2])
	r.waitFor(t, "two per-pool watches, no namespace watch", liveWatches(2))
	if r.s.namespaceWatched(ns) {
		t.Fatal("the namespace plan is still in force at the lower mark")
	}
	for _, key := range keys[:2] {
		if got := starts(key); got != 3 {
			t.Errorf("%s: %v sources started, want 3", key.Name, got)
		}
	}
	rec.allow(keys[1], "10.15.1.1:8000")
	deletePod(t, ns, "m1-1")
	r.waitEndpoints(t, keys[1], "10.15.1.1:8000")
	r.waitEndpoints(t, keys[0], "10.15.0.1:8000", "10.15.0.2:8000", "10.15.0.3:8000")
	rec.check(t)
}
