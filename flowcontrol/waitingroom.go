// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package flowcontrol

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The waiting room: requests to a pool without a ready endpoint wait for
// its first one (scale from zero), up to Options.NoEndpointTTL.

// waitingRoom is the requests waiting for a pool's first endpoint, and
// their gauge; guarded by the pool queue's mu.
type waitingRoom struct {
	waiters map[*roomWaiter]struct{}
	gauge   prometheus.Gauge
}

func newWaitingRoom(gauge prometheus.Gauge) waitingRoom {
	return waitingRoom{waiters: map[*roomWaiter]struct{}{}, gauge: gauge}
}

func (r *waitingRoom) len() int { return len(r.waiters) }

func (r *waitingRoom) add(w *roomWaiter) {
	r.waiters[w] = struct{}{}
	r.gauge.Set(float64(len(r.waiters)))
}

// take takes w out of the room; false when it was released meanwhile.
func (r *waitingRoom) take(w *roomWaiter) bool {
	if _, in := r.waiters[w]; !in {
		return false
	}
	delete(r.waiters, w)
	r.gauge.Set(float64(len(r.waiters)))
	return true
}

// releaseAll releases every waiter, telling each whether its pool was
// removed, and returns how many there were.
func (r *waitingRoom) releaseAll(removed bool) int {
	n := len(r.waiters)
	for w := range r.waiters {
		w.removed = removed
		close(w.ready)
	}
	clear(r.waiters)
	r.gauge.Set(0)
	return n
}

// roomWaiter is a request waiting for the pool's first endpoint.
type roomWaiter struct {
	ready   chan struct{}
	removed bool // the pool went away: written before ready is closed
}

// awaitEndpoints waits in the waiting room until the pool has an endpoint.
func (pq *poolQueue) awaitEndpoints(ctx context.Context, req Request) error {
	c := pq.c
	pq.mu.Lock()
	if pq.removed {
		pq.mu.Unlock()
		return errRemoved(pq.pool)
	}
	if pq.pool.Endpoints().Len() > 0 {
		// Checked under mu: an endpoint set published after this check
		// wakes the room (EndpointsChanged), which then holds w.
		pq.mu.Unlock()
		return nil
	}
	if err := pq.bytes.Acquire(req.Bytes); err != nil {
		pq.mu.Unlock()
		c.m.reject(pq.pool.Key, req.Priority, ReasonQueueBytesExceeded)
		return &Error{Code: http.StatusTooManyRequests, Reason: ReasonQueueBytesExceeded,
			Message: "pool " + pq.name + " has no ready endpoint and cannot queue more bytes: " + err.Error()}
	}
	w := &roomWaiter{ready: make(chan struct{})}
	pq.room.add(w)
	pq.waiting.Add(1)
	if pq.room.len() == 1 {
		c.opts.Logger.V(2).Info("request waiting for the pool's first ready endpoint", "pool", pq.name, "request", req.ID, "ttl", c.opts.NoEndpointTTL.String())
		if c.opts.Waiting != nil {
			c.opts.Waiting(pq.pool)
		}
	}
	pq.mu.Unlock()
	defer pq.bytes.Release(req.Bytes)

	timer := time.NewTimer(c.opts.NoEndpointTTL)
	defer timer.Stop()
	select {
	case <-w.ready:
		if w.removed {
			return errRemoved(pq.pool)
		}
		return nil
	case <-ctx.Done():
	case <-timer.C:
	}
	pq.mu.Lock()
	if !pq.room.take(w) {
		// Released meanwhile.
		pq.mu.Unlock()
		if w.removed {
			return errRemoved(pq.pool)
		}
		return ctx.Err() // nil on the TTL: go on, the endpoint came
	}
	pq.waiting.Add(-1)
	if pq.room.len() == 0 {
		pq.drainedLocked()
	}
	pq.mu.Unlock()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	c.m.reject(pq.pool.Key, req.Priority, ReasonNoEndpointsTimeout)
	return &Error{Code: http.StatusServiceUnavailable, Reason: ReasonNoEndpointsTimeout,
		Message: fmt.Sprintf("pool %s has had no ready endpoint for the waiting room's TTL of %v", pq.name, c.opts.NoEndpointTTL)}
}

// drainedLocked tells Options.Drained that the waiting room turned empty.
func (pq *poolQueue) drainedLocked() {
	if d := pq.c.opts.Drained; d != nil {
		d(pq.pool)
	}
}
