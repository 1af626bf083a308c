// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"flag"
	"testing"

	"github.com/poolpicker/poolpicker/datastore"
)

// reflectorPodWatch runs the package's tests with every pool's own pod
// watch on client-go's Reflector (Options.ReflectorPodWatch):
//
//	go test ./controllers -args -reflector-pod-watch
var reflectorPodWatch = flag.Bool("reflector-pod-watch", false, "run the pools' own pod watches on client-go's Reflector")

// The Reflector-based watch is what runs with the option, and it serves a
// pool (the package's staleness tests run on it with -reflector-pod-watch).
func TestReflectorPodWatchServesPool(t *testing.T) {
	ns := env.Namespace(t, "reflector")
	sel := map[string]string{"app": "llama"}
	createPod(t, ns, "a", sel, ready("10.9.0.1"))
	r := start(t, nil, Options{PodWatchPlan: PodWatchPlanPerPool, Namespaces: []string{ns}, ReflectorPodWatch: true})
	key := datastore.PoolKey{Namespace: ns, Name: "pool"}
	createPool(t, ns, "pool", sel, []int32{8000})
	r.waitEndpoints(t, key, "10.9.0.1:8000")
	r.m.mu.Lock()
	sp := r.m.served[key]
	r.m.mu.Unlock()
	sp.mu.Lock()
	_, isReflector := sp.active.(*reflectorWatch)
	sp.mu.Unlock()
	if !isReflector {
		t.Fatalf("active source %T, want *reflectorWatch", sp.active)
	}
	createPod(t, ns, "b", sel, ready("10.9.0.2"))
	r.waitEndpoints(t, key, "10.9.0.1:8000", "10.9.0.2:8000")
}
