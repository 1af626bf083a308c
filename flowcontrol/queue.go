// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package flowcontrol

import (
	"container/list"
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/fairshare"
)

// poolQueue is one pool's bands and waiting room, guarded by mu.
type poolQueue struct {
	c    *Controller
	pool *datastore.Pool
	name string
	// bytes is the pool's account of the queued bytes (MaxQueuedBytes).
	bytes *fairshare.Party

	// waiting is queued plus len(room), readable without mu so that a
	// finishing request of an idle queue does not take the lock.
	waiting atomic.Int32

	mu sync.Mutex
	// bands are sorted by priority, highest first; kept once made (one per
	// priority the pool's objectives use).
	bands  []*band
	queued int
	// reserved: a released request has not been picked yet; the next waits
	// for it, so that saturation is judged with its in-flight count.
	reserved bool
	// free is dispatch's scratch: the pool's endpoints by key, those with
	// a free slot mapped to themselves, the others to nil. While a band
	// below top is looked at, it is startFree (freeForLocked).
	free map[datastore.EndpointKey]*datastore.Endpoint
	// slotFree and startFree are the two maps free is: any free slot, and
	// (with Options.EndpointStartsAtOnce) a slot that starts a request at
	// once.
	slotFree, startFree map[datastore.EndpointKey]*datastore.Endpoint
	// top is the highest priority of the pool's requests so far; hasTop
	// once there was one.
	top      int
	hasTop   bool
	affinity affinity
	room     waitingRoom
	removed  bool
}

type waitState int

const (
	stateQueued waitState = iota
	stateDispatched
	stateRemoved
)

// waiter is a queued request. state is written under the queue's mutex
// before ready is closed, so the waiting goroutine reads it after ready.
type waiter struct {
	req   Request
	since time.Time
	ready chan struct{}
	state waitState
	// to is the endpoint the request was released to (stateDispatched).
	to   *datastore.Endpoint
	band *band
	flow *flow
	elem *list.Element
	// skipped counts the releases that passed it over for a warm request
	// (affinity order).
	skipped int
	// hold counts it as load on its preferred endpoint while it waits
	// (nil: it prefers none).
	hold *datastore.Hold
}

// admit returns at once when nobody waits and an endpoint may take req
// (its preferred one with a free slot, or an idle one); else queues req
// until the queue releases it.
func (pq *poolQueue) admit(ctx context.Context, req Request) (*Ticket, error) {
	c := pq.c
	if pq.waiting.Load() == 0 {
		pq.mu.Lock()
		pq.seenLocked(req.Priority)
		var to *datastore.Endpoint
		if !pq.reserved && pq.queued == 0 && !pq.removed {
			to = pq.targetLocked(&req)
			pq.noteLocked(to, req.Affinity)
		}
		pq.mu.Unlock()
		if to != nil {
			return &Ticket{pq: pq, to: to}, nil
		}
	}

	pq.mu.Lock()
	if pq.removed {
		pq.mu.Unlock()
		return nil, errRemoved(pq.pool)
	}
	pq.seenLocked(req.Priority)
	b := pq.bandLocked(req.Priority)
	if b.requests >= c.opts.MaxBandRequests || b.bytes+req.Bytes > c.opts.MaxBandBytes {
		pq.mu.Unlock()
		c.m.reject(pq.pool.Key, req.Priority, ReasonQueueFull)
		return nil, &Error{Code: http.StatusTooManyRequests, Reason: ReasonQueueFull,
			Message: fmt.Sprintf("pool %s is saturated and its queue for priority %d is full (%d requests, %d bytes)", pq.name, req.Priority, b.requests, b.bytes)}
	}
	if err := pq.bytes.Acquire(req.Bytes); err != nil {
		pq.mu.Unlock()
		c.m.reject(pq.pool.Key, req.Priority, ReasonQueueBytesExceeded)
		return nil, &Error{Code: http.StatusTooManyRequests, Reason: ReasonQueueBytesExceeded,
			Message: "pool " + pq.name + " is saturated and cannot queue more bytes: " + err.Error()}
	}
	w := &waiter{req: req, since: time.Now(), ready: make(chan struct{}), band: b}
	b.push(w)
	pq.queued++
	pq.waiting.Add(1)
	pq.dispatchLocked()
	pq.mu.Unlock()
	if req.Queued != nil {
		req.Queued()
	}

	timer := time.NewTimer(c.opts.QueueTTL)
	defer timer.Stop()
	// Past StealAfter the request may take any free slot: the queue is
	// looked at then, not only on the pool's next event.
	var steal <-chan time.Time
	if c.opts.StealAfter > 0 && len(req.Endpoints) > 0 {
		st := time.NewTimer(c.opts.StealAfter)
		defer st.Stop()
		steal = st.C
	}
	var expired bool
wait:
	for {
		select {
		case <-w.ready:
			return pq.released(w)
		case <-steal:
			steal = nil
			pq.wake()
			continue
		case <-ctx.Done():
		case <-timer.C:
			expired = true
		}
		break wait
	}

	pq.mu.Lock()
	switch w.state {
	case stateDispatched, stateRemoved:
		pq.mu.Unlock()
		if ctx.Err() != nil && w.state == stateDispatched {
			// Released as the client left: hand the slot to the next.
			t := &Ticket{pq: pq, reserved: true, to: w.to}
			t.Done()
			return nil, ctx.Err()
		}
		return pq.released(w)
	}
	pq.removeLocked(w)
	pq.mu.Unlock()
	pq.bytes.Release(req.Bytes)
	if !expired {
		b.series.durations[2].Observe(time.Since(w.since).Seconds())
		c.opts.Logger.V(4).Info("request left the queue: its stream ended", "pool", pq.name, "request", req.ID)
		return nil, ctx.Err()
	}
	b.series.durations[1].Observe(time.Since(w.since).Seconds())
	c.m.reject(pq.pool.Key, req.Priority, ReasonQueueTTLExpired)
	return nil, &Error{Code: http.StatusTooManyRequests, Reason: ReasonQueueTTLExpired,
		Message: fmt.Sprintf("pool %s stayed saturated for the queue TTL of %v; request of priority %d not served", pq.name, c.opts.QueueTTL, req.Priority)}
}

// released is what a waiter gets once its ready channel closed.
func (pq *poolQueue) released(w *waiter) (*Ticket, error) {
	if w.state == stateRemoved {
		pq.c.m.reject(pq.pool.Key, w.req.Priority, ReasonPoolRemoved)
		return nil, errRemoved(pq.pool)
	}
	return &Ticket{pq: pq, reserved: true, to: w.to}, nil
}

// wake releases the waiting room when the pool has endpoints and
// dispatches what saturation allows.
func (pq *poolQueue) wake() {
	if pq.waiting.Load() == 0 {
		return
	}
	pq.mu.Lock()
	defer pq.mu.Unlock()
	if pq.removed {
		return
	}
	if pq.room.len() > 0 && pq.pool.Endpoints().Len() > 0 {
		pq.waiting.Add(-int32(pq.room.releaseAll(false)))
		pq.drainedLocked()
	}
	pq.dispatchLocked()
}

// dispatchLocked releases requests while an endpoint has a free slot for
// one of them and no released request is still being picked.
func (pq *poolQueue) dispatchLocked() {
	for !pq.reserved && pq.queued > 0 {
		w, to := pq.nextLocked()
		if w == nil {
			return
		}
		b := w.band
		b.take(w)
		pq.queued--
		pq.waiting.Add(-1)
		pq.bytes.Release(w.req.Bytes)
		b.series.dispatched.Inc()
		b.series.durations[0].Observe(time.Since(w.since).Seconds())
		pq.reserved = true
		pq.noteLocked(to, w.req.Affinity)
		w.state, w.to = stateDispatched, to
		close(w.ready)
	}
}

// seenLocked notes a request of priority p.
func (pq *poolQueue) seenLocked(p int) {
	if !pq.hasTop || p > pq.top {
		pq.top, pq.hasTop = p, true
	}
}

// removeLocked takes a waiter that gave up out of its band.
func (pq *poolQueue) removeLocked(w *waiter) {
	w.band.remove(w)
	pq.queued--
	pq.waiting.Add(-1)
}

// remove answers every waiter of a removed pool.
func (pq *poolQueue) remove() {
	pq.mu.Lock()
	defer pq.mu.Unlock()
	pq.removed = true
	for _, b := range pq.bands {
		for b.requests > 0 {
			w := b.pop()
			pq.bytes.Release(w.req.Bytes)
			w.state = stateRemoved
			close(w.ready)
		}
	}
	pq.queued = 0
	if pq.room.releaseAll(true) > 0 {
		pq.drainedLocked()
	}
	pq.waiting.Store(0)
}
