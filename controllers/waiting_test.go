// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/datastore"
)

// RequestsWaitingAnnotation says whether requests wait in the waiting room
// of any replica, not only the leader's: each replica writes its own
// signal and the leader writes the annotation from all of them. A request
// waiting only on a follower wakes a pool scaled to zero; the annotation
// goes once no replica has requests waiting, and a new leader keeps it
// while its own requests wait.
func TestRequestsWaitingAnnotation(t *testing.T) {
	pickerNS, ns := env.Namespace(t, "ppsys"), env.Namespace(t, "cold")
	name := uniquePickerName("wait")
	opts := haOptions(name, pickerNS, ns)
	opts.ProvisionPickerServices = false
	opts.ReplicaName = "replica-0"
	leader := start(t, nil, opts)
	leader.waitFor(t, "the first replica elected", leader.parts.Leader.IsLeader)
	opts.ReplicaName = "replica-1"
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
	leader.waitFor(t, "the annotation written for requests waiting on the follower alone", func() bool { v, ok := annotation(); return ok && v == "1" })
	signal := func(replica string) bool {
		var p v1.InferencePool
		_ = env.Client.Get(ctx(t), client.ObjectKey(key), &p)
		_, has := p.Annotations[ReplicaWaitingAnnotationPrefix+replica]
		return has
	}
	leader.parts.Waiting.SetRequestsWaiting(key, true)
	leader.waitFor(t, "the leader's own signal", func() bool { return signal("replica-0") })
	follower.parts.Waiting.SetRequestsWaiting(key, false)
	leader.waitFor(t, "the follower's signal gone", func() bool { return !signal("replica-1") })
	if _, ok := annotation(); !ok {
		t.Fatal("the annotation went while requests still wait on the leader")
	}
	leader.parts.Waiting.SetRequestsWaiting(key, false)
	leader.waitFor(t, "the annotation removed once no replica has requests waiting", func() bool { _, ok := annotation(); return !ok })

	follower.parts.Waiting.SetRequestsWaiting(key, true)
	leader.waitFor(t, "the annotation written again", func() bool { _, ok := annotation(); return ok })
	leader.stop(t)
	follower.waitFor(t, "the follower elected", follower.parts.Leader.IsLeader)
	if _, ok := annotation(); !ok {
		t.Fatal("the new leader removed the annotation while its own requests wait")
	}
	follower.parts.Waiting.SetRequestsWaiting(key, false)
	follower.waitFor(t, "the new leader removing the annotation once nothing waits", func() bool { _, ok := annotation(); return !ok })
}
