// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/datastore"
)

// The leader writes RequestsWaitingAnnotation while requests wait in its
// waiting room for a pool and removes it once none do; a follower's
// waiting room does not keep it, and a new leader with nothing waiting
// removes what its predecessor left.
func TestRequestsWaitingAnnotation(t *testing.T) {
	pickerNS, ns := env.Namespace(t, "ppsys"), env.Namespace(t, "cold")
	name := uniquePickerName("wait")
	opts := haOptions(name, pickerNS, ns)
	opts.ProvisionPickerServices = false
	leader := start(t, nil, opts)
	leader.waitFor(t, "the first replica elected", leader.parts.Leader.IsLeader)
	follower := start(t, nil, opts)
	key := datastore.PoolKey{Namespace: ns, Name: "pool"}
	createPool(t, ns, "pool", map[string]string{"app": "m"}, []int32{8000})
	annotation := func() (string, bool) {
		var p v1.InferencePool
		if err := env.Client.Get(ctx(t), client.ObjectKey(key), &p); err != nil {
			t.Fatal(err)
		}
		v, ok := p.Annotations[RequestsWaitingAnnotation]
		return v, ok
	}
	leader.waitFor(t, "the pool claimed", func() bool {
		var p v1.InferencePool
		return env.Client.Get(ctx(t), client.ObjectKey(key), &p) == nil && p.Annotations[ClaimAnnotation] != ""
	})

	follower.parts.Waiting.SetRequestsWaiting(key, true)
	leader.parts.Waiting.SetRequestsWaiting(key, true)
	leader.waitFor(t, "the annotation written", func() bool { v, ok := annotation(); return ok && v == "1" })
	leader.parts.Waiting.SetRequestsWaiting(key, false)
	leader.waitFor(t, "the annotation removed though the follower has requests waiting", func() bool { _, ok := annotation(); return !ok })

	leader.parts.Waiting.SetRequestsWaiting(key, true)
	leader.waitFor(t, "the annotation written again", func() bool { _, ok := annotation(); return ok })
	follower.parts.Waiting.SetRequestsWaiting(key, false)
	leader.stop(t)
	follower.waitFor(t, "the follower elected", follower.parts.Leader.IsLeader)
	follower.waitFor(t, "the new leader, with nothing waiting, removing the annotation", func() bool { _, ok := annotation(); return !ok })
}
