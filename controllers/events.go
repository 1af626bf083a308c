// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/datastore"
)

// PoolEvents records Events on served pools, so that their owners see in
// `kubectl describe` what the picker makes of them.
type PoolEvents struct {
	cache    client.Reader
	recorder events.EventRecorder
}

// record records an Event on the pool; nothing when the pool is not in the
// cache (gone, or the cache not started or stopping). ctx bounds the cache
// read, which waits only while the pool cache has not synced.
func (r *PoolEvents) record(ctx context.Context, key datastore.PoolKey, eventType, reason, note string) {
	var pool v1.InferencePool
	if r.cache.Get(ctx, key, &pool) != nil {
		return
	}
	r.recorder.Eventf(&pool, nil, eventType, reason, "Serve", "%s", note)
}

// PoolEvent records an Event on the served pool key (a Warning when
// warning), such as flow control's note that requests wait for the pool's
// first endpoint; nothing when the pool is not in the cache. It never
// waits: flow control calls it from its queues.
func (r *PoolEvents) PoolEvent(key datastore.PoolKey, warning bool, reason, note string) {
	t := corev1.EventTypeNormal
	if warning {
		t = corev1.EventTypeWarning
	}
	// A pool with requests waiting is served, so the pool cache has synced,
	// and a read of a synced cache never waits on its context.
	r.record(doneContext, key, t, reason, note)
}

// doneContext is a context that has ended: reads with it never wait.
var doneContext = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()
