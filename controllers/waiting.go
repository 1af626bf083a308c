// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"context"
	"sync"
	"sync/atomic"

	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/datastore"
)

// RequestsWaitingAnnotation is on a served InferencePool, value "1", while
// requests wait in the leader's flow-control waiting room for the pool's
// first ready endpoint: a cue for an autoscaler that scales the pool's
// model servers from zero. The leader removes it once nothing waits there
// (the requests went on, left, or timed out).
const RequestsWaitingAnnotation = "poolpicker.io/requests-waiting"

// WaitingPools are the pools whose waiting room in this replica holds
// requests, and the claim reconciler's queue, which writes them.
type WaitingPools struct {
	keys  sync.Map // datastore.PoolKey → struct{}
	queue atomic.Pointer[workqueue.TypedRateLimitingInterface[reconcile.Request]]
}

// source hands the claim reconciler's queue to set.
func (w *WaitingPools) source() source.Source {
	return source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		w.queue.Store(&q)
		return nil
	})
}

// SetRequestsWaiting records whether requests wait in this replica's
// waiting room for pool key's first ready endpoint, and has the claim
// reconciler look at the pool: the leader writes it as
// RequestsWaitingAnnotation. It returns at once (flow control calls it with
// a queue's lock held).
func (w *WaitingPools) SetRequestsWaiting(key datastore.PoolKey, waiting bool) {
	if waiting {
		w.keys.Store(key, struct{}{})
	} else {
		w.keys.Delete(key)
	}
	if q := w.queue.Load(); q != nil {
		(*q).Add(reconcile.Request{NamespacedName: key})
	}
}

// setWaiting makes RequestsWaitingAnnotation on a pool this deployment
// serves say whether requests wait in this replica for its first endpoint.
func (r *ClaimReconciler) setWaiting(ctx context.Context, pool *v1.InferencePool, serves bool) error {
	_, want := r.waiting.keys.Load(client.ObjectKeyFromObject(pool))
	want = want && serves
	if _, has := pool.Annotations[RequestsWaitingAnnotation]; has == want {
		return nil
	}
	patch := client.MergeFromWithOptions(pool.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if want {
		if pool.Annotations == nil {
			pool.Annotations = map[string]string{}
		}
		pool.Annotations[RequestsWaitingAnnotation] = "1"
	} else {
		delete(pool.Annotations, RequestsWaitingAnnotation)
	}
	if err := r.client.Patch(ctx, pool, patch); err != nil {
		return client.IgnoreNotFound(err)
	}
	log.FromContext(ctx).V(2).Info("pool's requests-waiting annotation changed", "pool", client.ObjectKeyFromObject(pool).String(), "waiting", want)
	return nil
}
