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
	top    int
	hasTop bool
	// recent is, per endpoint, the Affinity keys of the requests released
	// to it last, most recent first: the prefixes it likely holds.
	recent    map[datastore.EndpointKey]*recentKeys
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

// Affinity order (Request.Affinity): a request is warm on an endpoint
// when its prefix was among the last affinityDepth released there. When the
// request that would go first is not warm on the endpoint it would take,
// the first warm one among the first affinityWindow of each flow that may
// go somewhere goes instead; the first is passed over at most
// affinityMaxSkips times.
const (
	affinityDepth    = 4
	affinityWindow   = 16
	affinityMaxSkips = 2
)

// recentKeys are an endpoint's last affinityDepth distinct Affinity keys,
// most recent first; zero: none.
type recentKeys [affinityDepth]uint64

// rank is key's place in r, affinityDepth when absent or zero.
func (r *recentKeys) rank(key uint64) int {
	if key == 0 || r == nil {
		return affinityDepth
	}
	for i, k := range r {
		if k == key {
			return i
		}
	}
	return affinityDepth
}

// note puts key first in r.
func (r *recentKeys) note(key uint64) {
	i := r.rank(key)
	if i == affinityDepth {
		i = affinityDepth - 1
	}
	copy(r[1:i+1], r[:i])
	r[0] = key
}

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
	// served counts the flow's released requests since it joined the
	// band's ring (where it starts at the least count of the flows there):
	// only the flows with the least count may take a slot, so the flows of
	// a band that are both backlogged are served one for one.
	served int64
}

// roomWaiter is a request waiting for the pool's first endpoint.
type roomWaiter struct {
	ready   chan struct{}
	removed bool // the pool went away: written before ready is closed
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

// freeLocked maps the pool's endpoints in pq.free, those with a free slot
// to themselves, the others to nil, and, when a request of priority lowest
// is below the pool's top (with Options.EndpointStartsAtOnce), in
// pq.startFree those that would start a request at once; false when none
// has a free slot.
func (pq *poolQueue) freeLocked(lowest int) bool {
	if pq.slotFree == nil {
		pq.slotFree = map[datastore.EndpointKey]*datastore.Endpoint{}
	}
	clear(pq.slotFree)
	pq.free = pq.slotFree
	var startsAtOnce func(*datastore.Endpoint) bool
	if pq.belowTopLocked(lowest) {
		startsAtOnce = pq.c.opts.EndpointStartsAtOnce
	}
	if startsAtOnce != nil {
		if pq.startFree == nil {
			pq.startFree = map[datastore.EndpointKey]*datastore.Endpoint{}
		}
		clear(pq.startFree)
	}
	any := false
	for _, e := range pq.pool.Endpoints().Endpoints {
		if pq.c.opts.EndpointSaturated(e) {
			pq.free[e.Key()] = nil
		} else {
			pq.free[e.Key()], any = e, true
		}
		if startsAtOnce != nil {
			if pq.free[e.Key()] != nil && startsAtOnce(e) {
				pq.startFree[e.Key()] = e
			} else {
				pq.startFree[e.Key()] = nil
			}
		}
	}
	if len(pq.recent) > 2*len(pq.free) {
		for k := range pq.recent {
			if _, in := pq.free[k]; !in {
				delete(pq.recent, k)
			}
		}
	}
	return any
}

// noteLocked records that a request of affinity key went to e.
func (pq *poolQueue) noteLocked(e *datastore.Endpoint, key uint64) {
	if e == nil || key == 0 {
		return
	}
	r := pq.recent[e.Key()]
	if r == nil {
		if pq.recent == nil {
			pq.recent = map[datastore.EndpointKey]*recentKeys{}
		}
		r = &recentKeys{}
		pq.recent[e.Key()] = r
	}
	r.note(key)
}

// rankLocked is w's Affinity rank on e: 0 when e was sent its prefix last.
func (pq *poolQueue) rankLocked(w *waiter, e *datastore.Endpoint) int {
	return pq.recent[e.Key()].rank(w.req.Affinity)
}

// warmOnLocked reports whether e was sent w's prefix among its last
// affinityDepth.
func (pq *poolQueue) warmOnLocked(w *waiter, e *datastore.Endpoint) bool {
	return pq.rankLocked(w, e) < affinityDepth
}

// warmLocked is the free endpoint that was sent w's prefix most recently,
// nil when none was among its last affinityDepth.
func (pq *poolQueue) warmLocked(w *waiter) *datastore.Endpoint {
	if w.req.Affinity == 0 {
		return nil
	}
	var best *datastore.Endpoint
	bestRank := affinityDepth
	for _, e := range pq.pool.Endpoints().Endpoints {
		if pq.free[e.Key()] == nil {
			continue
		}
		if r := pq.rankLocked(w, e); r < bestRank {
			best, bestRank = e, r
		}
	}
	return best
}

// homeLocked is the free endpoint that takes a request preferring prefs:
// its first preference while that one has a free slot; any free endpoint
// for a request without a preference, or whose first preference left the
// pool. Nil: it waits for its preference.
func (pq *poolQueue) homeLocked(w *waiter) *datastore.Endpoint { return pq.homeOf(w.req.Endpoints) }

func (pq *poolQueue) homeOf(prefs []*datastore.Endpoint) *datastore.Endpoint {
	if len(prefs) > 0 {
		if e := pq.free[prefs[0].Key()]; e != nil {
			return e
		}
		if _, in := pq.free[prefs[0].Key()]; in {
			return nil
		}
	}
	return pq.anyFreeLocked(nil)
}

// idleLocked is a free endpoint that may take a request preferring another,
// busy endpoint: one with fewer than StealBelow requests in flight, the
// earliest of prefs if several are; nil when none is.
func (pq *poolQueue) idleLocked(w *waiter) *datastore.Endpoint { return pq.idleOf(w.req.Endpoints) }

func (pq *poolQueue) idleOf(prefs []*datastore.Endpoint) *datastore.Endpoint {
	below := int64(pq.c.opts.StealBelow)
	for _, p := range prefs {
		if e := pq.free[p.Key()]; e != nil && e.InFlight() < below {
			return e
		}
	}
	for _, e := range pq.pool.Endpoints().Endpoints {
		if pq.free[e.Key()] != nil && e.InFlight() < below {
			return e
		}
	}
	return nil
}

// targetLocked is the endpoint a request that finds nobody waiting goes to
// at once: its preferred one with a free slot, else an idle one; nil: it
// waits.
func (pq *poolQueue) targetLocked(req *Request) *datastore.Endpoint {
	if !pq.freeLocked(req.Priority) {
		return nil
	}
	defer pq.freeForLocked(req.Priority)()
	if e := pq.homeOf(req.Endpoints); e != nil {
		return e
	}
	return pq.idleOf(req.Endpoints)
}

// nextLocked is the request to release and the endpoint it goes to, nil
// when none may go. Bands are served strictly, highest first. Within a
// band, the flows served least so far go first, in turn, and a flow's
// requests oldest first; a request goes to its preferred endpoint once that
// one has a free slot, or to an idle endpoint (fewer than StealBelow
// requests in flight), or, once it has waited StealAfter, to any endpoint
// with a free slot. When only a flow served more could use a free slot,
// the oldest request of a flow served least takes it instead, wherever it
// waits: flows that are both backlogged are served one for one. A band
// whose requests may go nowhere yet leaves the free slots to the bands
// below.
func (pq *poolQueue) nextLocked() (*waiter, *datastore.Endpoint) {
	lowest := pq.top
	for _, b := range pq.bands {
		if b.requests > 0 {
			lowest = min(lowest, b.priority)
		}
	}
	if !pq.freeLocked(lowest) {
		return nil, nil
	}
	var late time.Time
	if d := pq.c.opts.StealAfter; d > 0 {
		late = time.Now().Add(-d)
	}
	for _, b := range pq.bands {
		if b.requests == 0 {
			continue
		}
		restore := pq.freeForLocked(b.priority)
		w, e := pq.nextInBandLocked(b, late)
		restore()
		if w != nil {
			return w, e
		}
	}
	return nil, nil
}

// belowTopLocked reports whether a request of priority p may take only
// the endpoints that would start it at once.
func (pq *poolQueue) belowTopLocked(p int) bool {
	return pq.c.opts.EndpointStartsAtOnce != nil && pq.hasTop && p < pq.top
}

// freeForLocked makes pq.free the endpoints a request of priority p may
// take (startFree, filled by freeLocked, below the pool's top priority);
// the function it returns restores it.
func (pq *poolQueue) freeForLocked(p int) func() {
	if !pq.belowTopLocked(p) {
		return func() {}
	}
	pq.free = pq.startFree
	return func() { pq.free = pq.slotFree }
}

// nextInBandLocked is nextLocked's choice within band b (whose requests
// may take the endpoints in pq.free), nil when none of them may go.
func (pq *poolQueue) nextInBandLocked(b *band, late time.Time) (*waiter, *datastore.Endpoint) {
	anyFree := func(w *waiter) *datastore.Endpoint { return pq.anyFreeLocked(w.req.Endpoints) }
	lateFree := func(w *waiter) *datastore.Endpoint {
		if w.since.After(late) {
			return nil
		}
		return anyFree(w)
	}
	least := b.leastServed()
	behind := func(f *flow) bool { return f.served == least }
	if w, e := b.find(behind, pq.homeLocked, pq.warmOnLocked); w != nil {
		return w, e
	}
	if w, e := b.find(behind, pq.idleLocked, pq.warmOnLocked); w != nil {
		return w, e
	}
	if !late.IsZero() {
		if w, e := b.find(behind, lateFree, pq.warmOnLocked); w != nil {
			return w, e
		}
	}
	if w, e := b.find(behind, pq.warmLocked, pq.warmOnLocked); w != nil {
		return w, e
	}
	ahead := func(f *flow) bool { return f.served != least }
	if w, _ := b.find(ahead, pq.homeLocked, nil); w == nil {
		if w, _ = b.find(ahead, pq.idleLocked, nil); w == nil {
			return nil, nil
		}
	}
	// Only a flow ahead could use the slot: a flow behind takes it.
	if w, e := b.find(behind, anyFree, pq.warmOnLocked); w != nil {
		return w, e
	}
	return nil, nil
}

// anyFreeLocked is a free endpoint, the earliest of prefs if several are.
func (pq *poolQueue) anyFreeLocked(prefs []*datastore.Endpoint) *datastore.Endpoint {
	for _, p := range prefs {
		if e := pq.free[p.Key()]; e != nil {
			return e
		}
	}
	for _, e := range pq.pool.Endpoints().Endpoints {
		if pq.free[e.Key()] != nil {
			return e
		}
	}
	return nil
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
			pq.bytes.Release(w.req.Bytes)
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
		// A flow joins at the least count of those waiting: it gets its
		// share from now on, not for the time it had nothing waiting.
		f = &flow{key: w.req.Flow, served: b.leastServed()}
		b.flows[f.key] = f
		b.ring = append(b.ring, f)
	}
	w.flow = f
	w.elem = f.q.PushBack(w)
	b.requests++
	b.bytes += w.req.Bytes
	b.series.size.Inc()
	b.series.bytes.Add(float64(w.req.Bytes))
	if len(w.req.Endpoints) > 0 {
		// The scheduler weighs it as load on the endpoint it waits for.
		w.req.Endpoints[0].AddHeld(w.req.Priority, 1)
	}
}

// pop takes the oldest request of the flow whose turn it is; b has one.
func (b *band) pop() *waiter {
	if b.next >= len(b.ring) {
		b.next = 0
	}
	w := b.ring[b.next].q.Front().Value.(*waiter)
	b.take(w)
	return w
}

// find is the request that goes first of those to which where gives an
// endpoint, among the flows of which is true, and that endpoint: flows in
// turn from the one whose turn it is, oldest first within a flow. With
// warm, when that first request is not warm on its endpoint, the first
// that is among the first affinityWindow such requests of each flow goes
// instead, unless the first was passed over affinityMaxSkips times
// already.
func (b *band) find(which func(f *flow) bool, where func(w *waiter) *datastore.Endpoint, warm func(w *waiter, e *datastore.Endpoint) bool) (*waiter, *datastore.Endpoint) {
	var first *waiter
	var firstTo *datastore.Endpoint
	n := len(b.ring)
	for i := 0; i < n; i++ {
		f := b.ring[(b.next+i)%n]
		if !which(f) {
			continue
		}
		seen := 0
		for el := f.q.Front(); el != nil && seen < affinityWindow; el = el.Next() {
			w := el.Value.(*waiter)
			e := where(w)
			if e == nil {
				continue
			}
			if first == nil {
				first, firstTo = w, e
				if warm == nil || first.skipped >= affinityMaxSkips {
					return first, firstTo
				}
			}
			seen++
			if warm(w, e) {
				if w != first {
					first.skipped++
				}
				return w, e
			}
		}
	}
	return first, firstTo
}

// leastServed is the least served count of the band's flows with waiting
// requests; 0 when none has any.
func (b *band) leastServed() int64 {
	if len(b.ring) == 0 {
		return 0
	}
	least := b.ring[0].served
	for _, f := range b.ring[1:] {
		least = min(least, f.served)
	}
	return least
}

// take takes w out of its flow for release: the turn passes to the flow
// after w's.
func (b *band) take(w *waiter) {
	f := w.flow
	f.served++
	i := 0
	for b.ring[i] != f {
		i++
	}
	f.q.Remove(w.elem)
	if f.q.Len() == 0 {
		b.drop(i) // i now names the flow after it
		b.next = i
	} else {
		b.next = i + 1
	}
	if b.next >= len(b.ring) {
		b.next = 0
	}
	b.taken(w)
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
	if len(w.req.Endpoints) > 0 {
		w.req.Endpoints[0].AddHeld(w.req.Priority, -1)
	}
}

// drop forgets the flow at ring index i, now empty.
func (b *band) drop(i int) {
	delete(b.flows, b.ring[i].key)
	copy(b.ring[i:], b.ring[i+1:])
	b.ring[len(b.ring)-1] = nil
	b.ring = b.ring[:len(b.ring)-1]
}
