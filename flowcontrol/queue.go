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

	"github.com/prometheus/client_golang/prometheus"

	"github.com/poolpicker/poolpicker/datastore"
)

// poolQueue is one pool's bands and waiting room, guarded by mu.
type poolQueue struct {
	c    *Controller
	pool *datastore.Pool
	name string

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
	reserved  bool
	room      map[*roomWaiter]struct{}
	roomGauge prometheus.Gauge
	removed   bool
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
	band  *band
	flow  *flow
	elem  *list.Element
}

// band is one priority's flows, served in turn.
type band struct {
	priority int
	flows    map[string]*flow
	// ring holds the flows with waiting requests in the order they are
	// served; next is the one served next.
	ring     []*flow
	next     int
	requests int
	bytes    int64
	series   bandSeries
}

type flow struct {
	key string
	q   list.List // of *waiter, oldest first
}

// roomWaiter is a request waiting for the pool's first endpoint.
type roomWaiter struct {
	ready   chan struct{}
	removed bool // the pool went away: written before ready is closed
}

// admit returns at once when the pool has a free slot and nobody waits;
// else queues req until the queue releases it.
func (pq *poolQueue) admit(ctx context.Context, req Request) (*Ticket, error) {
	c := pq.c
	if pq.waiting.Load() == 0 {
		pq.mu.Lock()
		free := !pq.reserved && pq.queued == 0 && !pq.removed && !c.opts.Saturated(pq.pool)
		pq.mu.Unlock()
		if free {
			return &Ticket{pq: pq}, nil
		}
	}

	pq.mu.Lock()
	if pq.removed {
		pq.mu.Unlock()
		return nil, errRemoved(pq.pool)
	}
	b := pq.bandLocked(req.Priority)
	if b.requests >= c.opts.MaxBandRequests || b.bytes+req.Bytes > c.opts.MaxBandBytes {
		pq.mu.Unlock()
		c.m.reject(pq.pool.Key, req.Priority, ReasonQueueFull)
		return nil, &Error{Code: http.StatusTooManyRequests, Reason: ReasonQueueFull,
			Message: fmt.Sprintf("pool %s is saturated and its queue for priority %d is full (%d requests, %d bytes)", pq.name, req.Priority, b.requests, b.bytes)}
	}
	if !c.reserveBytes(req.Bytes) {
		pq.mu.Unlock()
		c.m.reject(pq.pool.Key, req.Priority, ReasonQueueBytesExceeded)
		return nil, &Error{Code: http.StatusTooManyRequests, Reason: ReasonQueueBytesExceeded,
			Message: fmt.Sprintf("pool %s is saturated and the picker holds its limit of %d queued bytes", pq.name, c.opts.MaxQueuedBytes)}
	}
	w := &waiter{req: req, since: time.Now(), ready: make(chan struct{}), band: b}
	b.push(w)
	pq.queued++
	pq.waiting.Add(1)
	pq.dispatchLocked()
	pq.mu.Unlock()

	timer := time.NewTimer(c.opts.QueueTTL)
	defer timer.Stop()
	var expired bool
	select {
	case <-w.ready:
		return pq.released(w)
	case <-ctx.Done():
	case <-timer.C:
		expired = true
	}

	pq.mu.Lock()
	switch w.state {
	case stateDispatched, stateRemoved:
		pq.mu.Unlock()
		if ctx.Err() != nil && w.state == stateDispatched {
			// Released as the client left: hand the slot to the next.
			t := &Ticket{pq: pq, reserved: true}
			t.Done()
			return nil, ctx.Err()
		}
		return pq.released(w)
	}
	pq.removeLocked(w)
	pq.mu.Unlock()
	c.releaseBytes(req.Bytes)
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
	return &Ticket{pq: pq, reserved: true}, nil
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
	if !c.reserveBytes(req.Bytes) {
		pq.mu.Unlock()
		c.m.reject(pq.pool.Key, req.Priority, ReasonQueueBytesExceeded)
		return &Error{Code: http.StatusTooManyRequests, Reason: ReasonQueueBytesExceeded,
			Message: fmt.Sprintf("pool %s has no ready endpoint and the picker holds its limit of %d queued bytes", pq.name, c.opts.MaxQueuedBytes)}
	}
	w := &roomWaiter{ready: make(chan struct{})}
	pq.room[w] = struct{}{}
	pq.waiting.Add(1)
	pq.roomGauge.Set(float64(len(pq.room)))
	if len(pq.room) == 1 {
		c.opts.Logger.V(2).Info("request waiting for the pool's first ready endpoint", "pool", pq.name, "request", req.ID, "ttl", c.opts.NoEndpointTTL.String())
		if c.opts.Waiting != nil {
			c.opts.Waiting(pq.pool)
		}
	}
	pq.mu.Unlock()
	defer c.releaseBytes(req.Bytes)

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
	if _, in := pq.room[w]; !in {
		// Released meanwhile.
		pq.mu.Unlock()
		if w.removed {
			return errRemoved(pq.pool)
		}
		return ctx.Err() // nil on the TTL: go on, the endpoint came
	}
	delete(pq.room, w)
	pq.waiting.Add(-1)
	pq.roomGauge.Set(float64(len(pq.room)))
	if len(pq.room) == 0 {
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
	if len(pq.room) > 0 && pq.pool.Endpoints().Len() > 0 {
		for w := range pq.room {
			close(w.ready)
		}
		pq.waiting.Add(-int32(len(pq.room)))
		clear(pq.room)
		pq.roomGauge.Set(0)
		pq.drainedLocked()
	}
	pq.dispatchLocked()
}

// dispatchLocked releases the next request while the pool has a free slot
// and no released request is still being picked.
func (pq *poolQueue) dispatchLocked() {
	for !pq.reserved && pq.queued > 0 && !pq.c.opts.Saturated(pq.pool) {
		var b *band
		for _, x := range pq.bands {
			if x.requests > 0 {
				b = x
				break
			}
		}
		w := b.pop()
		pq.queued--
		pq.waiting.Add(-1)
		pq.c.releaseBytes(w.req.Bytes)
		b.series.dispatched.Inc()
		b.series.durations[0].Observe(time.Since(w.since).Seconds())
		pq.reserved = true
		w.state = stateDispatched
		close(w.ready)
	}
}

// drainedLocked tells Options.Drained that the waiting room turned empty.
func (pq *poolQueue) drainedLocked() {
	if d := pq.c.opts.Drained; d != nil {
		d(pq.pool)
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
			pq.c.releaseBytes(w.req.Bytes)
			w.state = stateRemoved
			close(w.ready)
		}
	}
	pq.queued = 0
	for w := range pq.room {
		w.removed = true
		close(w.ready)
	}
	if len(pq.room) > 0 {
		pq.drainedLocked()
	}
	clear(pq.room)
	pq.waiting.Store(0)
}

// bandLocked returns the band of priority, made if new.
func (pq *poolQueue) bandLocked(priority int) *band {
	i := 0
	for ; i < len(pq.bands); i++ {
		if pq.bands[i].priority == priority {
			return pq.bands[i]
		}
		if pq.bands[i].priority < priority {
			break
		}
	}
	b := &band{priority: priority, flows: map[string]*flow{}, series: pq.c.m.band(pq.pool.Key, priority)}
	pq.bands = append(pq.bands, nil)
	copy(pq.bands[i+1:], pq.bands[i:])
	pq.bands[i] = b
	return b
}

func (b *band) push(w *waiter) {
	f := b.flows[w.req.Flow]
	if f == nil {
		f = &flow{key: w.req.Flow}
		b.flows[f.key] = f
		b.ring = append(b.ring, f)
	}
	w.flow = f
	w.elem = f.q.PushBack(w)
	b.requests++
	b.bytes += w.req.Bytes
	b.series.size.Inc()
	b.series.bytes.Add(float64(w.req.Bytes))
}

// pop takes the oldest request of the flow whose turn it is; b has one.
func (b *band) pop() *waiter {
	if b.next >= len(b.ring) {
		b.next = 0
	}
	f := b.ring[b.next]
	w := f.q.Remove(f.q.Front()).(*waiter)
	if f.q.Len() == 0 {
		b.drop(b.next) // next now names the flow after it
	} else {
		b.next++
	}
	b.taken(w)
	return w
}

// remove takes w out of its flow, wherever it is.
func (b *band) remove(w *waiter) {
	f := w.flow
	f.q.Remove(w.elem)
	if f.q.Len() == 0 {
		for i, x := range b.ring {
			if x == f {
				b.drop(i)
				if i < b.next {
					b.next--
				}
				break
			}
		}
	}
	b.taken(w)
}

func (b *band) taken(w *waiter) {
	b.requests--
	b.bytes -= w.req.Bytes
	b.series.size.Dec()
	b.series.bytes.Sub(float64(w.req.Bytes))
}

// drop forgets the flow at ring index i, now empty.
func (b *band) drop(i int) {
	delete(b.flows, b.ring[i].key)
	copy(b.ring[i:], b.ring[i+1:])
	b.ring[len(b.ring)-1] = nil
	b.ring = b.ring[:len(b.ring)-1]
}
