// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package flowcontrol

import (
	"container/list"
	"time"

	"github.com/poolpicker/poolpicker/datastore"
)

// The bands and flows policy: bands are served strictly by priority,
// highest first; within a band, the flows served least go first, in turn,
// and a flow's requests oldest first.

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
		w.hold = w.req.Endpoints[0].Hold(w.req.Priority)
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
	w.hold.Release()
}

// drop forgets the flow at ring index i, now empty.
func (b *band) drop(i int) {
	delete(b.flows, b.ring[i].key)
	copy(b.ring[i:], b.ring[i+1:])
	b.ring[len(b.ring)-1] = nil
	b.ring = b.ring[:len(b.ring)-1]
}
