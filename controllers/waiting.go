// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/datastore"
)

// RequestsWaitingAnnotation is on a served InferencePool, value "1", while
// requests wait in the flow-control waiting room of any replica for the
// pool's first ready endpoint: a cue for an autoscaler that scales the
// pool's model servers from zero. The leader writes it from the replicas'
// own signals (ReplicaWaitingAnnotationPrefix) and removes it once no
// replica has requests waiting (they went on, left, or timed out) or the
// replicas that had are gone.
const RequestsWaitingAnnotation = "poolpicker.io/requests-waiting"

// ReplicaWaitingAnnotationPrefix, followed by a replica's name
// (Options.ReplicaName), is the annotation by which each replica says, with
// the time it last renewed it (RFC 3339), that requests wait in its own
// waiting room for the pool's first endpoint. A replica renews it every
// waitingRenewInterval while they wait; the leader ignores, and removes, a
// signal older than waitingStaleAfter (its replica died with requests
// waiting).
const ReplicaWaitingAnnotationPrefix = "requests-waiting.poolpicker.io/"

const (
	waitingRenewInterval = 10 * time.Second
	waitingStaleAfter    = 3 * waitingRenewInterval
)

// WaitingPools are the pools whose waiting room in this replica holds
// requests, and the queue of the replica's waiting writer, which writes
// them on the pools.
type WaitingPools struct {
	keys  sync.Map // datastore.PoolKey → struct{}
	queue atomic.Pointer[workqueue.TypedRateLimitingInterface[reconcile.Request]]
}

// source hands the waiting writer's queue to SetRequestsWaiting, and queues
// the pools whose requests began to wait before the writer started.
func (w *WaitingPools) source() source.Source {
	return source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		w.queue.Store(&q)
		w.keys.Range(func(k, _ any) bool {
			q.Add(reconcile.Request{NamespacedName: k.(datastore.PoolKey)})
			return true
		})
		return nil
	})
}

// SetRequestsWaiting records whether requests wait in this replica's
// waiting room for pool key's first ready endpoint, and has this replica
// write it on the pool (ReplicaWaitingAnnotationPrefix), from which the
// leader writes RequestsWaitingAnnotation. It returns at once (flow control
// calls it with a queue's lock held).
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

// waitingWriter runs on every replica: it writes, renews and removes the
// replica's own waiting signal on the pools it holds requests for.
type waitingWriter struct {
	client    client.Client
	selection *selection
	waiting   *WaitingPools
	// annotation is ReplicaWaitingAnnotationPrefix and the replica's name.
	annotation string
}

// SetupWithManager adds the writer to mgr, woken by this replica's waiting
// room and by pool changes (a pool this replica's cache had not seen yet
// when its requests began to wait, a signal removed by someone else).
func (r *waitingWriter) SetupWithManager(mgr manager.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1.InferencePool{}).
		Named("inferencepool-waiting").
		WatchesRawSource(r.waiting.source()).
		Complete(r)
}

func (r *waitingWriter) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var pool v1.InferencePool
	if err := r.client.Get(ctx, req.NamespacedName, &pool); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	_, want := r.waiting.keys.Load(req.NamespacedName)
	if ok, _ := r.selection.servesSpec(&pool); !ok {
		want = false
	}
	now := time.Now()
	cur, has := pool.Annotations[r.annotation]
	if want && has {
		if t, err := time.Parse(time.RFC3339, cur); err == nil && now.Sub(t) < waitingRenewInterval {
			return reconcile.Result{RequeueAfter: waitingRenewInterval - now.Sub(t)}, nil
		}
	}
	if !want && !has {
		return reconcile.Result{}, nil
	}
	patch := client.MergeFromWithOptions(pool.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if want {
		if pool.Annotations == nil {
			pool.Annotations = map[string]string{}
		}
		pool.Annotations[r.annotation] = now.UTC().Format(time.RFC3339)
	} else {
		delete(pool.Annotations, r.annotation)
	}
	if err := r.client.Patch(ctx, &pool, patch); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	if want {
		return reconcile.Result{RequeueAfter: waitingRenewInterval}, nil
	}
	return reconcile.Result{}, nil
}

// setWaiting, on the leader, makes RequestsWaitingAnnotation on a pool this
// deployment serves say whether any replica's fresh signal says requests
// wait for its first endpoint, and removes the signals gone stale. It
// returns when to look again: when the first fresh signal would go stale.
func (r *ClaimReconciler) setWaiting(ctx context.Context, pool *v1.InferencePool, serves bool) (time.Duration, error) {
	now := time.Now()
	want := false
	var stale []string
	var again time.Duration
	for k, v := range pool.Annotations {
		if !strings.HasPrefix(k, ReplicaWaitingAnnotationPrefix) {
			continue
		}
		t, err := time.Parse(time.RFC3339, v)
		if err != nil || now.Sub(t) >= waitingStaleAfter {
			stale = append(stale, k)
			continue
		}
		want = true
		if left := waitingStaleAfter - now.Sub(t); again == 0 || left < again {
			again = left
		}
	}
	want = want && serves
	if _, has := pool.Annotations[RequestsWaitingAnnotation]; has == want && len(stale) == 0 {
		return again, nil
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
	for _, k := range stale {
		delete(pool.Annotations, k)
	}
	if err := r.client.Patch(ctx, pool, patch); err != nil {
		return 0, client.IgnoreNotFound(err)
	}
	log.FromContext(ctx).V(2).Info("pool's requests-waiting annotation changed", "pool", client.ObjectKeyFromObject(pool).String(),
		"waiting", want, "staleSignalsRemoved", len(stale))
	return again, nil
}
