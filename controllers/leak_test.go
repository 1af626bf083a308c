// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"testing"

	"go.uber.org/goleak"

	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/controllers/podsource"
	"github.com/poolpicker/poolpicker/datastore"
)

// TestStopEndsEveryGoroutine runs a picker through pools, a selector change
// and a removal, stops it, and checks that no goroutine it started is left.
func TestStopEndsEveryGoroutine(t *testing.T) {
	eachPlan(t, func(t *testing.T, plan podsource.Plan) {
		ns := env.Namespace(t, "leak")
		createPod(t, ns, "a", map[string]string{"app": "a"}, ready("10.12.0.1"))
		createPod(t, ns, "b", map[string]string{"app": "b"}, ready("10.12.0.2"))
		before := goleak.IgnoreCurrent()

		r := start(t, nil, Options{PodWatchPlan: plan, Namespaces: []string{ns}})
		k1, k2 := datastore.PoolKey{Namespace: ns, Name: "one"}, datastore.PoolKey{Namespace: ns, Name: "two"}
		createPool(t, ns, "one", map[string]string{"app": "a"}, []int32{8000})
		createPool(t, ns, "two", map[string]string{"app": "b"}, []int32{8000})
		r.waitEndpoints(t, k1, "10.12.0.1:8000")
		r.waitEndpoints(t, k2, "10.12.0.2:8000")
		updatePool(t, k1, func(p *v1.InferencePool) {
			p.Spec.Selector.MatchLabels = map[v1.LabelKey]v1.LabelValue{"app": "b"}
		})
		r.waitEndpoints(t, k1, "10.12.0.2:8000")
		// A pool left pending: its watch is cut mid-list by the stop.
		createPool(t, ns, "three", map[string]string{"app": "c"}, []int32{8000})
		r.stop(t)

		goleak.VerifyNone(t, before,
			// Idle keep-alive connections of the shared client-go transport
			// belong to the transport cache, not to the picker.
			goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
			goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
			goleak.IgnoreAnyFunction("golang.org/x/net/http2.(*ClientConn).readLoop"),
			goleak.IgnoreAnyFunction("net/http.(*http2ClientConn).readLoop"),
		)
	})
}
