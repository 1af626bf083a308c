// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package podsource

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/poolpicker/poolpicker/datastore"
)

// TestWatchDecoders runs a pool's endpoint changes through both watch
// decoders (the watch's own goroutine, and client-go's watch.Interface,
// which the watches fall back to when the API server answers a protobuf
// watch in another encoding), under each plan, and counts what a pool
// costs in goroutines.
func TestWatchDecoders(t *testing.T) {
	for _, tc := range []struct {
		name     string
		clientGo bool
		plan     Plan
		// maxPerPool bounds the goroutines a pool adds.
		maxPerPool float64
	}{
		// The watch's goroutine and its HTTP/2 stream's writer.
		{"own goroutine", false, PlanPerPool, 2.5},
		// Plus client-go's decoding goroutine.
		{"client-go", true, PlanPerPool, 3.5},
		// The namespace's one watch serves the new pools too.
		{"own goroutine, namespace plan", false, PlanNamespace, 0.25},
		{"client-go, namespace plan", true, PlanNamespace, 0.25},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := env.Namespace(t, "decoder")
			sel := map[string]string{"app": "m"}
			createPod(t, ns, "a", sel, ready("10.14.0.1"))
			b := createPod(t, ns, "b", sel, podState{ip: "10.14.0.2"})
			// The fallback is taken as if the API server had answered the
			// first watch in JSON.
			r := start(t, nil, Options{Plan: tc.plan})
			r.s.caps.NoProtobufWatch.Store(tc.clientGo)
			key := datastore.PoolKey{Namespace: ns, Name: "pool"}
			r.serve(t, key, sel, 8000)
			r.waitEndpoints(t, key, "10.14.0.1:8000")
			setPodStatus(t, b, "10.14.0.2", true)
			r.waitEndpoints(t, key, "10.14.0.1:8000", "10.14.0.2:8000")
			deletePod(t, ns, "a")
			r.waitEndpoints(t, key, "10.14.0.2:8000")
			// A burst: ten pods at once end in one set with all of them.
			want := []string{"10.14.0.2:8000"}
			for i := range 10 {
				createPod(t, ns, fmt.Sprintf("burst-%d", i), sel, ready(fmt.Sprintf("10.14.1.%d", i+1)))
				want = append(want, fmt.Sprintf("10.14.1.%d:8000", i+1))
			}
			r.waitEndpoints(t, key, want...)

			// Goroutines per pool: twenty more pools, each synced.
			const pools = 20
			before := runtime.NumGoroutine()
			for i := range pools {
				l := map[string]string{"app": fmt.Sprintf("w%d", i)}
				createPod(t, ns, fmt.Sprintf("w%d", i), l, ready(fmt.Sprintf("10.14.2.%d", i+1)))
				r.serve(t, datastore.PoolKey{Namespace: ns, Name: fmt.Sprintf("w%d", i)}, l, 8000)
			}
			for i := range pools {
				r.waitEndpoints(t, datastore.PoolKey{Namespace: ns, Name: fmt.Sprintf("w%d", i)}, fmt.Sprintf("10.14.2.%d:8000", i+1))
			}
			per := float64(runtime.NumGoroutine()-before) / pools
			t.Logf("%.2f goroutines per pool", per)
			if per > tc.maxPerPool {
				t.Errorf("%.2f goroutines per pool, want at most %.2f", per, tc.maxPerPool)
			}
		})
	}
}
