// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"context"

	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/datastore"
)

// poolRecorder records Events on served pools, so that their owners see in
// `kubectl describe` what the picker makes of them.
type poolRecorder struct {
	cache    client.Reader
	recorder events.EventRecorder
}

// record records an Event on the pool; nothing when the pool is not in the
// cache (gone, or the cache not started or stopping). ctx bounds the cache
// read, which waits only while the pool cache has not synced.
func (r *poolRecorder) record(ctx context.Context, key datastore.PoolKey, eventType, reason, note string) {
	var pool v1.InferencePool
	if r.cache.Get(ctx, key, &pool) != nil {
		return
	}
	r.recorder.Eventf(&pool, nil, eventType, reason, "Serve", "%s", note)
}
